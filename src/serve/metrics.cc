#include "serve/metrics.h"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

namespace ember::serve {

namespace {

std::string Fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

void Gauge(const std::string& name, const std::string& help, double value, std::string* out) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " +
          Fmt(value) + "\n";
}

void Counter(const std::string& name, const std::string& help, double value, std::string* out) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " +
          Fmt(value) + "\n";
}

double Ratio(int64_t num, int64_t den) { return den > 0 ? double(num) / double(den) : 0.0; }

// One metric of the tiers below the pool, one sample per tier that is on, labelled
// tier="ram" / tier="disk" (the pool's are the kv/prefix metrics). Nothing when no tier is on.
using TierValues = std::vector<std::pair<const char*, double>>;
void Tier(const char* type, const std::string& name, const std::string& help,
          const TierValues& values, std::string* out) {
  if (values.empty()) return;
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  for (const auto& [tier, value] : values)
    *out += name + "{tier=\"" + tier + "\"} " + Fmt(value) + "\n";
}

// The prompt cache below the pool (--prompt-cache-ram-bytes, --prompt-cache-dir): nothing when
// both tiers are off.
void AppendPromptCache(const PromptCacheStats& p, std::string* out) {
  const PromptCacheRamStats& r = p.ram;
  if (!p.enabled && !r.enabled) return;
  // The samples of the tiers that are on, RAM first.
  auto of = [&](double ram, double disk) {
    TierValues v;
    if (r.enabled) v.emplace_back("ram", ram);
    if (p.enabled) v.emplace_back("disk", disk);
    return v;
  };
  auto d = [](int64_t x) { return static_cast<double>(x); };
  Tier("gauge", "ember_prompt_cache_bytes", "Bytes of KV blocks stored in the tier.",
       of(d(r.bytes), d(p.bytes)), out);
  Tier("gauge", "ember_prompt_cache_capacity_bytes", "The tier's byte cap.",
       of(d(r.capacity_bytes), d(p.capacity_bytes)), out);
  Tier("gauge", "ember_prompt_cache_blocks", "KV blocks stored in the tier.",
       of(d(r.records), d(p.records)), out);
  Tier("counter", "ember_prompt_cache_hits_total", "Blocks read from the tier and verified.",
       of(d(r.hits), d(p.hits)), out);
  Tier("counter", "ember_prompt_cache_misses_total",
       "Admissions that looked in the tier past the pool's hit and found no next block.",
       of(d(r.lookup_misses), d(p.lookup_misses)), out);
  Tier("counter", "ember_prompt_cache_promotions_total",
       "Blocks copied from the tier into the KV pool.", of(d(r.promotions), d(p.promotions)), out);
  Tier("counter", "ember_prompt_cache_evictions_total", "Blocks evicted to stay under the cap.",
       of(d(r.evictions), d(p.evictions)), out);
  Tier("counter", "ember_prompt_cache_read_bytes_total", "Bytes read from the tier.",
       of(d(r.bytes_read), d(p.bytes_read)), out);
  Tier("counter", "ember_prompt_cache_written_bytes_total", "Bytes written to the tier.",
       of(d(r.bytes_written), d(p.bytes_written)), out);
  Tier("counter", "ember_prompt_cache_corrupt_dropped_total",
       "Records refused (size, header, tokens or checksum) and removed.",
       of(d(r.corrupt_dropped), d(p.corrupt_dropped)), out);
  if (r.enabled) {
    Tier("counter", "ember_prompt_cache_demotions_total",
         "Blocks evicted from the KV pool and copied into the tier.", {{"ram", d(r.demotions)}},
         out);
    Tier("counter", "ember_prompt_cache_spills_total",
         "Blocks the tier evicted that were queued for the disk tier.", {{"ram", d(r.spills)}},
         out);
    Tier("counter", "ember_prompt_cache_prefetched_total",
         "Blocks of waiting requests moved from the disk tier into the tier.",
         {{"ram", d(r.prefetched)}}, out);
  }
  if (p.enabled) {
    Tier("counter", "ember_prompt_cache_write_drops_total",
         "Blocks not written because the write queue was full.", {{"disk", d(p.write_drops)}},
         out);
    Tier("counter", "ember_prompt_cache_write_errors_total", "Writes that failed.",
         {{"disk", d(p.write_errors)}}, out);
  }
  if (p.state_checkpoints) {  // a hybrid model's recurrent-state checkpoints (part of the bytes)
    Tier("gauge", "ember_prompt_cache_state_checkpoints",
         "Recurrent-state checkpoints stored in the tier.",
         of(d(r.state_records), d(p.state_records)), out);
    Tier("gauge", "ember_prompt_cache_state_checkpoint_bytes",
         "Bytes of recurrent-state checkpoints stored in the tier (part of its bytes).",
         of(d(r.state_bytes), d(p.state_bytes)), out);
    Tier("counter", "ember_prompt_cache_state_checkpoint_hits_total",
         "Recurrent-state checkpoints read from the tier and verified.",
         of(d(r.state_hits), d(p.state_hits)), out);
    if (r.enabled)
      Tier("counter", "ember_prompt_cache_state_checkpoints_prefetched_total",
           "Recurrent-state checkpoints of waiting requests moved from the disk tier into the tier.",
           {{"ram", d(r.state_prefetched)}}, out);
    *out += "# HELP ember_prompt_cache_state_restores_total Sequences resumed from a lower "
            "tier's state checkpoint.\n# TYPE ember_prompt_cache_state_restores_total counter\n"
            "ember_prompt_cache_state_restores_total " +
            Fmt(d(p.state_restores)) +
            "\n# HELP ember_prompt_cache_state_misses_total Lower-tier hits recomputed: no "
            "readable state checkpoint at their blocks.\n"
            "# TYPE ember_prompt_cache_state_misses_total counter\n"
            "ember_prompt_cache_state_misses_total " +
            Fmt(d(p.state_misses)) + "\n";
  }
  *out += "# HELP ember_prompt_cache_reuse_decisions_total Lower-tier hits loaded or recomputed, "
          "by the measured rates.\n# TYPE ember_prompt_cache_reuse_decisions_total counter\n"
          "ember_prompt_cache_reuse_decisions_total{choice=\"load\"} " +
          Fmt(static_cast<double>(p.loads)) +
          "\nember_prompt_cache_reuse_decisions_total{choice=\"recompute\"} " +
          Fmt(static_cast<double>(p.recomputes)) + "\n";
}

nlohmann::json PromptCacheJson(const EngineStats& e) {
  const PromptCacheStats& p = e.prompt_cache;
  const PromptCacheRamStats& r = p.ram;
  nlohmann::json tiers = {
      {"pool", {{"blocks_cached", e.kv_blocks_cached}, {"hit_tokens", e.prefix_hit_tokens},
                {"query_tokens", e.prefix_query_tokens}}}};
  if (!p.enabled && !r.enabled) return {{"tiers", tiers}};
  if (r.enabled) {
    tiers["ram"] = {{"blocks", r.records},
                    {"bytes", r.bytes},
                    {"capacity_bytes", r.capacity_bytes},
                    {"pinned_bytes", r.pinned_bytes},
                    {"misses", r.lookup_misses},
                    {"hits", r.hits},
                    {"gone_on_read", r.misses},
                    {"promotions", r.promotions},
                    {"demotions", r.demotions},
                    {"demote_failures", r.demote_failures},
                    {"evictions", r.evictions},
                    {"spills", r.spills},
                    {"prefetched", r.prefetched},
                    {"prefetch_failed", r.prefetch_failed},
                    {"prefetch_dropped", r.prefetch_dropped},
                    {"insert_drops", r.insert_drops},
                    {"corrupt_dropped", r.corrupt_dropped},
                    {"bytes_read", r.bytes_read},
                    {"bytes_written", r.bytes_written},
                    {"read_bytes_per_s", r.read_bytes_per_s}};
    if (p.state_checkpoints) {
      tiers["ram"]["state_checkpoints"] = r.state_records;
      tiers["ram"]["state_bytes"] = r.state_bytes;
      tiers["ram"]["state_hits"] = r.state_hits;
      tiers["ram"]["state_prefetched"] = r.state_prefetched;
    }
  }
  if (p.enabled) {
    tiers["disk"] = {{"blocks", p.records},
                     {"bytes", p.bytes},
                     {"capacity_bytes", p.capacity_bytes},
                     {"queued_bytes", p.queued_bytes},
                     {"lookups", p.lookups},
                     {"misses", p.lookup_misses},
                     {"hits", p.hits},
                     {"gone_on_read", p.misses},
                     {"promotions", p.promotions},
                     {"evictions", p.evictions},
                     {"writes", p.writes},
                     {"write_drops", p.write_drops},
                     {"write_errors", p.write_errors},
                     {"corrupt_dropped", p.corrupt_dropped},
                     {"stale_temps_removed", p.stale_temps_removed},
                     {"bytes_read", p.bytes_read},
                     {"bytes_written", p.bytes_written},
                     {"read_bytes_per_s", p.read_bytes_per_s}};
    if (p.state_checkpoints) {
      tiers["disk"]["state_checkpoints"] = p.state_records;
      tiers["disk"]["state_bytes"] = p.state_bytes;
      tiers["disk"]["state_hits"] = p.state_hits;
    }
  }
  nlohmann::json out = {{"tiers", tiers},
          {"reuse",
           {{"lookups", p.lookups},
            {"misses", p.lookup_misses},
            {"loads", p.loads},
            {"recomputes", p.recomputes},
            {"read_bytes_per_s", p.read_bytes_per_s},
            {"prefill_tokens_per_s", p.prefill_tokens_per_s},
            {"last_choice", PromptCacheChoiceName(p.last_choice)},
            {"last_read_bytes_per_s", p.last_read_bytes_per_s},
            {"last_prefill_tokens_per_s", p.last_prefill_tokens_per_s}}}};
  if (p.state_checkpoints) {
    out["reuse"]["state_restores"] = p.state_restores;
    out["reuse"]["state_misses"] = p.state_misses;
  }
  return out;
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[bucket];
  ++count_;
  sum_ += value;
}

double Histogram::Quantile(double q) const {
  if (count_ == 0) return 0.0;
  const double rank = q * double(count_);
  int64_t seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (counts_[i] == 0) continue;
    if (double(seen + counts_[i]) >= rank) {
      const double lo = i == 0 ? 0.0 : bounds_[i - 1];
      if (i == bounds_.size()) return lo;  // +Inf bucket: report its lower edge
      const double frac = (rank - double(seen)) / double(counts_[i]);
      return lo + (bounds_[i] - lo) * std::clamp(frac, 0.0, 1.0);
    }
    seen += counts_[i];
  }
  return bounds_.empty() ? 0.0 : bounds_.back();
}

void Histogram::AppendPrometheus(const std::string& name, const std::string& help,
                                 std::string* out) const {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    *out += name + "_bucket{le=\"" + Fmt(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  *out += name + "_sum " + Fmt(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

nlohmann::json Histogram::ToJson() const {
  return {{"count", count_},
          {"mean", count_ > 0 ? sum_ / double(count_) : 0.0},
          {"p50", Quantile(0.5)},
          {"p90", Quantile(0.9)},
          {"p99", Quantile(0.99)}};
}

namespace {
std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
          0.5,   0.75,   1.0,   2.5,  5.0,   10.0, 20.0,  40.0, 80.0};
}
}  // namespace

Metrics::Metrics() : ttft_(LatencyBuckets()), itl_(LatencyBuckets()), e2e_(LatencyBuckets()) {}

void Metrics::CountRequest(const std::string& route, int status) {
  MutexLock lock(&mu_);
  ++requests_[{route, status}];
}

void Metrics::CountTokens(int64_t prompt_tokens, int64_t completion_tokens) {
  MutexLock lock(&mu_);
  prompt_tokens_ += prompt_tokens;
  completion_tokens_ += completion_tokens;
}

void Metrics::ObserveTimeToFirstToken(double seconds) {
  MutexLock lock(&mu_);
  ttft_.Observe(seconds);
}

void Metrics::ObserveInterTokenLatency(double seconds) {
  MutexLock lock(&mu_);
  itl_.Observe(seconds);
}

void Metrics::ObserveRequestLatency(double seconds) {
  MutexLock lock(&mu_);
  e2e_.Observe(seconds);
}

void Metrics::StreamOpened() {
  MutexLock lock(&mu_);
  ++open_streams_;
}

void Metrics::StreamClosed() {
  MutexLock lock(&mu_);
  --open_streams_;
}

void Metrics::CountDisconnect() {
  MutexLock lock(&mu_);
  ++disconnects_;
}

void Metrics::CountConnectionEvent(const std::string& event) {
  MutexLock lock(&mu_);
  if (event == "disconnect") {
    ++disconnects_;
  } else if (event == "stalled") {
    ++stalled_clients_;
  } else if (event == "rejected") {
    ++rejected_connections_;
  } else if (event == "timeout") {
    ++request_timeouts_;
  }
}

std::string Metrics::Prometheus(const EngineStats& e) const {
  MutexLock lock(&mu_);
  std::string out;
  out += "# HELP ember_http_requests_total HTTP requests by route and status code.\n"
         "# TYPE ember_http_requests_total counter\n";
  for (const auto& [key, count] : requests_) {
    out += "ember_http_requests_total{route=\"" + key.first + "\",status=\"" +
           std::to_string(key.second) + "\"} " + std::to_string(count) + "\n";
  }
  Counter("ember_prompt_tokens_total", "Prompt tokens of finished requests.", prompt_tokens_, &out);
  Counter("ember_generation_tokens_total", "Generated tokens of finished requests.",
          completion_tokens_, &out);
  Counter("ember_client_disconnects_total", "Requests cancelled because the client went away.",
          disconnects_, &out);
  Counter("ember_http_stalled_clients_total",
          "Connections cut off because the client read nothing for --stall-timeout seconds.",
          stalled_clients_, &out);
  Counter("ember_http_rejected_connections_total",
          "Connections answered 503 and closed because --max-connections were open.",
          rejected_connections_, &out);
  Counter("ember_http_request_timeouts_total",
          "Requests whose header or body missed its deadline (408).", request_timeouts_, &out);
  Counter("ember_engine_requests_finished_total", "Requests the engine finished.",
          e.requests_finished, &out);
  Counter("ember_engine_requests_cancelled_total", "Requests the engine cancelled.",
          e.requests_cancelled, &out);
  Counter("ember_engine_steps_total", "Engine steps run.", e.steps, &out);
  Counter("ember_engine_preemptions_total", "Sequences preempted for KV space.", e.preemptions,
          &out);
  Counter("ember_engine_forward_seconds_total",
          "Engine-thread time in model forward steps (launch and wait).", e.forward_ns / 1e9, &out);
  Counter("ember_engine_decode_steps_total", "Engine steps whose rows were all decode rows.",
          e.decode_steps, &out);
  Counter("ember_engine_decode_padding_rows_total",
          "Rows added to decode steps to reach a captured batch-size bucket.",
          e.decode_padding_rows, &out);
  Counter("ember_engine_overlapped_steps_total",
          "Engine steps launched before the previous step's tokens were read.",
          e.overlapped_steps, &out);
  Counter("ember_engine_forced_tokens_total",
          "Tokens appended without sampling because the output constraint allowed only them "
          "(jump-forward).",
          e.forced_tokens, &out);
  Counter("ember_engine_masked_rows_host_total",
          "Structured-output rows whose token mask the host applied (logprobs, a host-sampled "
          "draw, or a mask that allows nothing).",
          e.masked_rows_host, &out);
  Counter("ember_engine_masked_rows_edits_total",
          "Structured-output rows whose token mask the backend applied as logit edits (few ids "
          "masked).",
          e.masked_rows_edits, &out);
  Counter("ember_engine_masked_rows_bits_total",
          "Structured-output rows whose token mask the backend applied as packed bits.",
          e.masked_rows_bits, &out);
  Counter("ember_spec_draft_tokens_total",
          "Draft tokens proposed and verified (speculative decoding).", e.spec_draft_tokens, &out);
  Counter("ember_spec_accepted_tokens_total", "Draft tokens accepted (speculative decoding).",
          e.spec_accepted_tokens, &out);
  Counter("ember_spec_verify_steps_total",
          "Sequence-steps that verified drafts (speculative decoding).", e.spec_verify_steps,
          &out);
  Gauge("ember_spec_acceptance_ratio", "Draft tokens accepted / proposed.",
        Ratio(e.spec_accepted_tokens, e.spec_draft_tokens), &out);
  Gauge("ember_tokens_per_target_step",
        "Tokens generated per sequence-step that sampled (above 1 with accepted drafts).",
        Ratio(e.sampled_tokens, e.sampled_seq_steps), &out);
  Gauge("ember_open_streams", "Streaming responses in progress.", open_streams_, &out);
  Gauge("ember_queue_depth", "Requests waiting for admission.", e.num_queued, &out);
  Gauge("ember_running_sequences", "Sequences in the running batch.", e.num_running, &out);
  Gauge("ember_kv_blocks_total", "KV blocks in the pool.", e.kv_blocks_total, &out);
  Gauge("ember_kv_blocks_used", "KV blocks held by sequences.", e.kv_blocks_used, &out);
  Gauge("ember_kv_cache_usage_ratio", "Fraction of KV blocks held by sequences.",
        Ratio(e.kv_blocks_used, e.kv_blocks_total), &out);
  Gauge("ember_prefix_cache_hit_ratio", "Prompt tokens served from the prefix cache / queried.",
        Ratio(e.prefix_hit_tokens, e.prefix_query_tokens), &out);
  AppendPromptCache(e.prompt_cache, &out);
  ttft_.AppendPrometheus("ember_time_to_first_token_seconds",
                         "Request arrival to its first generated token.", &out);
  itl_.AppendPrometheus("ember_inter_token_latency_seconds",
                        "Time between consecutive tokens of one sample.", &out);
  e2e_.AppendPrometheus("ember_request_latency_seconds", "Request arrival to its last token.",
                        &out);
  return out;
}

nlohmann::json Metrics::Json(const EngineStats& e) const {
  MutexLock lock(&mu_);
  nlohmann::json requests = nlohmann::json::array();
  for (const auto& [key, count] : requests_)
    requests.push_back({{"route", key.first}, {"status", key.second}, {"count", count}});
  return {
      {"http", {{"requests", requests}, {"open_streams", open_streams_},
                {"client_disconnects", disconnects_}, {"stalled_clients", stalled_clients_},
                {"rejected_connections", rejected_connections_},
                {"request_timeouts", request_timeouts_}}},
      {"tokens", {{"prompt", prompt_tokens_}, {"generated", completion_tokens_}}},
      {"engine",
       {{"requests_submitted", e.requests_submitted},
        {"requests_finished", e.requests_finished},
        {"requests_cancelled", e.requests_cancelled},
        {"queue_depth", e.num_queued},
        {"running_sequences", e.num_running},
        {"steps", e.steps},
        {"preemptions", e.preemptions},
        {"computed_tokens", e.computed_tokens},
        {"forward_seconds", e.forward_ns / 1e9},
        {"decode_steps", e.decode_steps},
        {"decode_rows", e.decode_rows},
        {"decode_padding_rows", e.decode_padding_rows},
        {"overlapped_steps", e.overlapped_steps},
        {"forced_tokens", e.forced_tokens},
        {"masked_rows_host", e.masked_rows_host},
        {"masked_rows_edits", e.masked_rows_edits},
        {"masked_rows_bits", e.masked_rows_bits}}},
      {"kv_cache",
       {{"blocks_total", e.kv_blocks_total},
        {"blocks_used", e.kv_blocks_used},
        {"blocks_cached", e.kv_blocks_cached},
        {"block_size", e.block_size},
        {"usage", Ratio(e.kv_blocks_used, e.kv_blocks_total)}}},
      {"speculative",
       {{"verify_steps", e.spec_verify_steps},
        {"draft_tokens", e.spec_draft_tokens},
        {"accepted_tokens", e.spec_accepted_tokens},
        {"acceptance_rate", Ratio(e.spec_accepted_tokens, e.spec_draft_tokens)},
        {"sampled_sequence_steps", e.sampled_seq_steps},
        {"tokens_per_target_step", Ratio(e.sampled_tokens, e.sampled_seq_steps)}}},
      {"prefix_cache",
       {{"enabled", e.prefix_caching},
        {"recurrent_state_bytes", e.recurrent_state_bytes},
        {"state_checkpoints", e.state_checkpoints},
        {"state_checkpoint_bytes", e.state_checkpoint_bytes},
        {"state_checkpoint_capacity_bytes", e.state_checkpoint_capacity_bytes},
        {"state_checkpoint_saves", e.state_checkpoint_saves},
        {"state_checkpoint_evictions", e.state_checkpoint_evictions},
        {"query_tokens", e.prefix_query_tokens},
        {"hit_tokens", e.prefix_hit_tokens},
        {"hit_rate", Ratio(e.prefix_hit_tokens, e.prefix_query_tokens)}}},
      {"prompt_cache", PromptCacheJson(e)},
      {"latency_seconds",
       {{"time_to_first_token", ttft_.ToJson()},
        {"inter_token", itl_.ToJson()},
        {"request", e2e_.ToJson()}}},
  };
}

}  // namespace ember::serve
