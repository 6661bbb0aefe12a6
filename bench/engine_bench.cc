// engine_bench: end-to-end engine throughput and latency on one model (no HTTP).
//   1. total generated tokens/s with C concurrent sequences (distinct random prompts of P tokens,
//      G new tokens each, EOS ignored) for each C in --concurrency, over the whole run (prefill
//      included) and in the decode phase (tokens after the last request's first token, over the
//      time from then to the end: the rate with every sequence decoding);
//   2. with --sustain N, the same load as serve_bench makes it: a closed loop of C clients that
//      each submit their next request as soon as the last one finished, N requests in all per
//      level; output tokens/s over the whole run and over the steady window (from the C-th
//      request's end to the (N-C)-th's, past the first wave's ramp and before the drain);
//   3. time to first token for a prompt with a long shared prefix, cold (nothing cached) and warm
//      (the prefix cached by an earlier request with a different suffix).
// --spec-method ngram|draft (draft: --draft-model DIR) runs every test with speculative decoding;
// each level's line then adds the drafted and accepted tokens, the acceptance rate and the tokens per target step (a sequence's
// tokens per step it sampled in). --copy-prompt makes each prompt a random quarter repeated four
// times (copy-heavy text, where prompt lookup finds its drafts).
// --schema FILE constrains every request to that JSON schema over the model folder's tokenizer
// (structured output; a vocabulary without "{" / "}" tokens, as TinyStories', spells them with
// its "<" / ">" tokens, said in the header); each level's lines then add the engine steps per
// request and the tokens jump-forward appended without sampling (--no-jump-forward: none).
// Results go to docs/perf.md with the machine, the command and the date.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/common.h"  // ApplyCpuMatmulFlag
#include "backend/kv_format.h"
#include "bench_engine.h"
#include "engine/engine.h"
#include "engine/model_draft_source.h"
#include "sampling/json_schema.h"
#include "tokenizer/tokenizer.h"
#include "util/mapped_file.h"
#include "util/flags.h"

namespace ember {
namespace {

double Seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

std::vector<int32_t> RandomPrompt(std::mt19937& rng, int32_t len, int32_t vocab,
                                  bool copy = false) {
  std::vector<int32_t> ids(len);
  for (int32_t& id : ids) id = 3 + static_cast<int32_t>(rng() % (vocab - 3));
  const int32_t period = std::max(1, len / 4);
  if (copy)
    for (int32_t i = period; i < len; ++i) ids[i] = ids[i % period];
  return ids;
}

// --schema: the JSON-schema constraint over the model folder's tokenizer. A vocabulary without
// "{" or "}" (TinyStories) spells them with its "<" and ">" tokens (*spelled says so).
Result<std::shared_ptr<TokenConstraint>> SchemaConstraint(const std::string& model_dir,
                                                          const std::string& schema_path,
                                                          bool* spelled) {
  auto tokenizer = Tokenizer::Load(model_dir);
  if (!tokenizer.ok()) return Status::Error(tokenizer.message());
  auto text = ReadFileToString(schema_path);
  if (!text.ok()) return Status::Error(text.message());
  const auto parsed = nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return Status::Error("--schema: " + schema_path + " is not JSON");
  auto schema = CompileJsonSchema(parsed, "--schema");
  if (!schema.ok()) return Status::Error(schema.message());
  std::vector<std::optional<std::string>> bytes =
      (*tokenizer)->TokenBytesTable((*tokenizer)->vocab_size());
  *spelled = std::find(bytes.begin(), bytes.end(), std::optional<std::string>("{")) == bytes.end();
  for (auto& b : bytes) {
    if (*spelled && b == "<") b = "{";
    if (*spelled && b == ">") b = "}";
  }
  return MakeJsonSchemaConstraint(TokenTexts::Build(std::move(bytes)), *schema);
}

struct RunResult {
  double wall_s = 0, gen_tps = 0, mean_ttft_ms = 0, decode_tps = 0;
  int64_t generated = 0;
  std::vector<int32_t> lengths;  // tokens each request generated
};

// Drains one stream: appends its generated tokens' stamps to *times; returns its first one's.
int64_t Drain(ResponseStream& stream, std::vector<int64_t>* times) {
  std::vector<TokenEvent> events;
  int64_t first = 0;
  while (stream.Next(&events)) {
    for (const TokenEvent& e : events) {
      if (e.token_id < 0) continue;
      if (first == 0) first = e.time_ns;
      times->push_back(e.time_ns);
    }
    events.clear();
  }
  return first;
}

struct SustainedResult {
  double wall_s = 0, whole_tps = 0, steady_tps = 0, steady_s = 0, mean_ttft_ms = 0;
};

// The closed loop serve_bench runs against a server: `clients` threads each submit a request,
// read it to the end and submit the next, until all of `requests` were served.
SustainedResult RunSustained(Engine& engine, const std::vector<GenerationRequest>& requests,
                             int32_t clients) {
  std::atomic<size_t> next{0};
  std::vector<std::vector<int64_t>> times(clients), ends(clients);
  std::vector<double> ttft_ms(clients, 0.0);
  const int64_t start = NowNs();
  std::vector<std::thread> threads;
  for (int32_t c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      for (size_t i = next++; i < requests.size(); i = next++) {
        const int64_t submitted = NowNs();
        auto stream = SubmitOrExit(engine, requests[i]);
        ttft_ms[c] += Seconds(Drain(*stream, &times[c]) - submitted) * 1e3;
        ends[c].push_back(NowNs());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  SustainedResult result;
  result.wall_s = Seconds(NowNs() - start);
  std::vector<int64_t> all_times, all_ends;
  for (int32_t c = 0; c < clients; ++c) {
    all_times.insert(all_times.end(), times[c].begin(), times[c].end());
    all_ends.insert(all_ends.end(), ends[c].begin(), ends[c].end());
    result.mean_ttft_ms += ttft_ms[c];
  }
  result.mean_ttft_ms /= static_cast<double>(requests.size());
  result.whole_tps = static_cast<double>(all_times.size()) / result.wall_s;
  std::sort(all_ends.begin(), all_ends.end());
  const size_t n = all_ends.size(), c = static_cast<size_t>(clients);
  if (n > 2 * c) {
    const int64_t from = all_ends[c - 1], to = all_ends[n - c - 1];
    const auto in_window = std::count_if(all_times.begin(), all_times.end(),
                                         [&](int64_t t) { return t > from && t <= to; });
    result.steady_s = Seconds(to - from);
    if (to > from) result.steady_tps = static_cast<double>(in_window) / result.steady_s;
  }
  return result;
}

// Submits all requests at once and waits for them; returns throughput and mean TTFT.
RunResult RunConcurrent(Engine& engine, const std::vector<GenerationRequest>& requests) {
  int64_t start = NowNs();
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (const GenerationRequest& r : requests) streams.push_back(SubmitOrExit(engine, r));
  RunResult result;
  double ttft_sum = 0;
  std::vector<int64_t> times;  // every generated token's stamp
  int64_t last_first = 0;      // when the last request got its first token
  for (auto& stream : streams) {
    const size_t before = times.size();
    const int64_t first = Drain(*stream, &times);
    result.lengths.push_back(static_cast<int32_t>(times.size() - before));
    ttft_sum += Seconds(first - start) * 1e3;
    last_first = std::max(last_first, first);
  }
  result.generated = static_cast<int64_t>(times.size());
  result.wall_s = Seconds(NowNs() - start);
  result.gen_tps = result.generated / result.wall_s;
  const int64_t end = times.empty() ? 0 : *std::max_element(times.begin(), times.end());
  const auto after = std::count_if(times.begin(), times.end(),
                                   [&](int64_t t) { return t > last_first; });
  if (end > last_first) result.decode_tps = static_cast<double>(after) / Seconds(end - last_first);
  result.mean_ttft_ms = ttft_sum / static_cast<double>(streams.size());
  return result;
}

int Main(int argc, char** argv) {
  std::string model_dir, device = "cpu";
  std::vector<int64_t> levels = {1, 4, 16, 64};
  int64_t prompt_len = 512, gen_len = 128, prefix_len = 2000, threads = 0, kv_bytes = 0;
  int64_t step_tokens = 0, max_batch = 0, sustain = 0;
  double temperature = 0.0, top_p = 1.0;
  FlagParser flags(
      "usage: engine_bench --model DIR [--concurrency 1,4,16,64] [--prompt-len 512]\n"
      "       [--gen-len 128] [--prefix-len 2000] [--threads N] [--kv-cache-bytes B]\n"
      "       [--max-step-tokens N] [--max-batch N] [--sustain N] [--device cpu|cuda]");
  flags.AddString("--model", &model_dir, "model folder");
  flags.AddIntList("--concurrency", &levels, "comma-separated concurrency levels");
  flags.AddInt("--prompt-len", &prompt_len, "prompt tokens per request");
  flags.AddInt("--gen-len", &gen_len, "generated tokens per request");
  flags.AddInt("--prefix-len", &prefix_len, "shared prefix for the TTFT test (0: skip)");
  flags.AddInt("--threads", &threads, "CPU threads (0: all)");
  flags.AddInt("--kv-cache-bytes", &kv_bytes, "KV cache cap (0: auto)");
  flags.AddInt("--max-step-tokens", &step_tokens,
               "tokens per engine step (default 0: the engine's default for the device)");
  flags.AddInt("--sustain", &sustain,
               "also run each level as a closed loop of C clients, N requests in all (0: off)");
  flags.AddInt("--max-batch", &max_batch,
               "sequences decoded together (default 0: the largest concurrency level)");
  flags.AddString("--device", &device, "cpu | cuda");
  flags.AddDouble("--temperature", &temperature, "sampling temperature (default 0: greedy)");
  flags.AddDouble("--top-p", &top_p, "nucleus sampling mass (default 1: off)");
  std::string spec_method = "none", draft_model;
  int64_t num_spec_tokens = 4, spec_max_batch = 0;
  bool copy_prompt = false;
  flags.AddString("--spec-method", &spec_method,
                  "none | ngram | draft: speculative decoding (default none)");
  flags.AddString("--draft-model", &draft_model, "the draft model of --spec-method draft");
  flags.AddInt("--num-spec-tokens", &num_spec_tokens, "most drafts per sequence and step (4)");
  flags.AddInt("--spec-max-batch", &spec_max_batch,
               "no drafts while more sequences than this run (0: the device default, 8 on "
               "CUDA, 16 on the CPU)");
  flags.AddBool("--copy-prompt", &copy_prompt,
                "each prompt is a random quarter repeated four times (copy-heavy)");
  std::string schema_path;
  bool no_jump_forward = false, same_lengths = false;
  flags.AddString("--schema", &schema_path,
                  "constrain every request to this JSON schema (structured output)");
  flags.AddBool("--same-lengths", &same_lengths,
                "with --schema: after each level, the same prompts unconstrained, each generating "
                "as many tokens as its constrained run did (the like-for-like baseline)");
  flags.AddBool("--no-jump-forward", &no_jump_forward,
                "sample every constrained token (EngineConfig::jump_forward off)");
  std::string kv_cache_dtype = "auto";
  flags.AddString("--kv-cache-dtype", &kv_cache_dtype,
                  "auto | bf16 | fp8 | int8 | ...: the KV cache's element type (see ember run --help)");
  std::string cpu_matmul = "exact";
  flags.AddString("--cpu-matmul", &cpu_matmul,
                  "exact | f32 | bf16 | auto: the CPU's prompt GEMMs (see ember run --help; default exact)");
  bool invariant = false, no_overlap = false;
  flags.AddBool("--batch-invariant", &invariant, "CUDA: the fixed-order (batch-invariant) GEMM");
  flags.AddBool("--no-overlap", &no_overlap,
                "each step waits for the previous step's tokens (EngineConfig::overlap_steps off)");
  bool help = false;
  Status st = flags.Parse(argc, argv, 1, &help);
  if (st.ok() && max_batch < 0) st = Status::Error("--max-batch: must be >= 0");
  Result<KvDType> kv_dtype = ParseKvDType(kv_cache_dtype, "--kv-cache-dtype");
  if (st.ok() && !kv_dtype.ok()) st = Status::Error(kv_dtype.message());
  if (st.ok() && sustain < 0) st = Status::Error("--sustain: must be >= 0");
  if (st.ok() && spec_method != "none" && spec_method != "ngram" && spec_method != "draft")
    st = Status::Error("--spec-method must be none, ngram or draft");
  ModelLoadOptions opts;
  if (st.ok()) st = app::ApplyCpuMatmulFlag(cpu_matmul, opts);
  if (help || !st.ok() || model_dir.empty()) {
    std::fprintf(stderr, "%s%s\n", st.ok() ? "" : (st.message() + "\n").c_str(),
                 flags.Help().c_str());
    return help ? 0 : 2;
  }
  opts.num_threads = static_cast<int32_t>(threads);
  opts.device = device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
  opts.cuda_batch_invariant = invariant;
  opts.kv_cache.dtype = *kv_dtype;
  auto model = Model::Load(model_dir, opts);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.message().c_str());
    return 1;
  }
  const int32_t vocab = (*model)->config().vocab_size;
  std::mt19937 rng(42);

  int64_t max_level = *std::max_element(levels.begin(), levels.end());
  EngineConfig config;
  config.max_running = static_cast<int32_t>(max_batch > 0 ? max_batch : max_level);
  config.max_step_tokens = static_cast<int32_t>(step_tokens);
  config.kv_cache_bytes = kv_bytes;
  config.max_queue = static_cast<int32_t>(max_level) + 8;
  config.enable_prefix_caching = false;  // distinct prompts: measure computation, not cache hits
  config.overlap_steps = !no_overlap;
  config.jump_forward = !no_jump_forward;
  config.speculation.method = spec_method == "ngram"   ? SpeculationConfig::Method::kNgram
                              : spec_method == "draft" ? SpeculationConfig::Method::kDraft
                                                       : SpeculationConfig::Method::kNone;
  config.speculation.num_spec_tokens = static_cast<int32_t>(num_spec_tokens);
  config.speculation.max_batch = static_cast<int32_t>(spec_max_batch);
  config.speculation.invariant_steps = true;  // as `--batch-invariant auto` (or `on`: the flag)
  config.speculation.draft_model = draft_model;
  std::unique_ptr<DraftSource> draft;
  if (config.speculation.method == SpeculationConfig::Method::kDraft) {
    auto loaded = LoadDraftSource(config.speculation, opts, vocab);
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", loaded.message().c_str());
      return 1;
    }
    draft = std::move(*loaded);
  }
  auto engine = Engine::Create(model->get(), config, std::move(draft));
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.message().c_str());
    return 1;
  }
  std::shared_ptr<TokenConstraint> constraint;
  bool spelled = false;
  if (!schema_path.empty()) {
    auto made = SchemaConstraint(model_dir, schema_path, &spelled);
    if (!made.ok()) return std::fprintf(stderr, "%s\n", made.message().c_str()), 1;
    constraint = *made;
  }
  std::printf("model %s, prompt %lld, gen %lld, temperature %.2f, top_p %.2f, KV cache %.1f MiB\n",
              model_dir.c_str(), static_cast<long long>(prompt_len),
              static_cast<long long>(gen_len), temperature, top_p,
              (*engine)->kv_cache_bytes() / 1048576.0);
  if (constraint != nullptr) {
    std::printf("JSON schema %s%s, jump-forward %s\n", schema_path.c_str(),
                spelled ? " (no brace in the vocabulary: \"<\" and \">\" spell them)" : "",
                no_jump_forward ? "off" : "on");
  }
  std::printf("| concurrency | generated tok/s (whole run) | decode tok/s (all running) | wall s | "
              "mean TTFT ms |\n|---|---|---|---|---|\n");
  auto make_requests = [&](int64_t count) {
    std::vector<GenerationRequest> requests;
    for (int64_t i = 0; i < count; ++i) {
      GenerationRequest r;
      r.prompt_ids = RandomPrompt(rng, static_cast<int32_t>(prompt_len), vocab, copy_prompt);
      r.max_tokens = static_cast<int32_t>(gen_len);
      r.sampling.temperature = static_cast<float>(temperature);
      r.sampling.top_p = static_cast<float>(top_p);
      r.sampling.seed = static_cast<uint64_t>(i);
      r.ignore_eos = true;
      r.constraint = constraint;
      requests.push_back(std::move(r));
    }
    return requests;
  };
  // Where the engine thread's time went between two Stats(), a line printed after a table.
  auto step_line = [&](int64_t level, const EngineStats& before, const EngineStats& after) {
    const int64_t steps = std::max<int64_t>(1, after.steps - before.steps);
    auto per_step_ms = [&](int64_t ns) { return static_cast<double>(ns) / 1e6 / steps; };
    const int64_t decode_steps = after.decode_steps - before.decode_steps;
    const double decode_div = static_cast<double>(std::max<int64_t>(1, decode_steps));
    char line[512];
    std::snprintf(line, sizeof(line),
                  "concurrency %lld: %lld engine steps, per step: schedule %.3f ms, forward %.3f "
                  "ms, rest %.3f ms; %lld decode-only steps (%.1f rows each): forward %.3f ms; "
                  "%lld steps overlapped\n",
                  static_cast<long long>(level), static_cast<long long>(steps),
                  per_step_ms(after.schedule_ns - before.schedule_ns),
                  per_step_ms(after.forward_ns - before.forward_ns),
                  per_step_ms(after.finish_ns - before.finish_ns),
                  static_cast<long long>(decode_steps),
                  static_cast<double>(after.decode_rows - before.decode_rows) / decode_div,
                  static_cast<double>(after.decode_forward_ns - before.decode_forward_ns) / 1e6 /
                      decode_div,
                  static_cast<long long>(after.overlapped_steps - before.overlapped_steps));
    const int64_t drafted = after.spec_draft_tokens - before.spec_draft_tokens;
    const int64_t accepted = after.spec_accepted_tokens - before.spec_accepted_tokens;
    const int64_t seq_steps = after.sampled_seq_steps - before.sampled_seq_steps;
    const int64_t tokens = after.sampled_tokens - before.sampled_tokens;
    char spec[256];
    std::snprintf(spec, sizeof(spec),
                  "  speculation: %lld drafted, %lld accepted (%.1f%%), %.3f tokens per target "
                  "step\n",
                  static_cast<long long>(drafted), static_cast<long long>(accepted),
                  drafted > 0 ? 100.0 * static_cast<double>(accepted) / drafted : 0.0,
                  seq_steps > 0 ? static_cast<double>(tokens) / seq_steps : 0.0);
    std::string out = std::string(line) + spec;
    if (constraint != nullptr) {
      const int64_t requests = after.requests_finished - before.requests_finished;
      const int64_t generated = after.generated_tokens - before.generated_tokens;
      std::snprintf(spec, sizeof(spec),
                    "  constrained: %.1f engine steps per request (%lld requests), %.1f tokens per "
                    "request, %lld forced (jump-forward)\n",
                    static_cast<double>(steps) / static_cast<double>(std::max<int64_t>(1, requests)),
                    static_cast<long long>(requests),
                    static_cast<double>(generated) / static_cast<double>(std::max<int64_t>(1, requests)),
                    static_cast<long long>(after.forced_tokens - before.forced_tokens));
      out += spec;
    }
    return out;
  };
  std::string step_lines;
  for (int64_t level : levels) {
    const std::vector<GenerationRequest> requests = make_requests(level);
    const EngineStats before = (*engine)->Stats();
    RunResult r = RunConcurrent(**engine, requests);
    const EngineStats after = (*engine)->Stats();
    std::printf("| %lld | %.1f | %.1f | %.1f | %.0f |\n", static_cast<long long>(level), r.gen_tps,
                r.decode_tps, r.wall_s, r.mean_ttft_ms);
    std::fflush(stdout);
    step_lines += step_line(level, before, after);
    if (same_lengths && constraint != nullptr) {
      std::vector<GenerationRequest> plain = requests;
      for (size_t i = 0; i < plain.size(); ++i) {
        plain[i].constraint = nullptr;
        plain[i].max_tokens = std::max(1, r.lengths[i]);
      }
      const EngineStats b2 = (*engine)->Stats();
      const RunResult u = RunConcurrent(**engine, plain);
      const EngineStats a2 = (*engine)->Stats();
      std::printf("| %lld, unconstrained, same lengths | %.1f | %.1f | %.1f | %.0f |\n",
                  static_cast<long long>(level), u.gen_tps, u.decode_tps, u.wall_s,
                  u.mean_ttft_ms);
      std::printf("| %lld, constrained / unconstrained | %.3fx | | | |\n",
                  static_cast<long long>(level), r.gen_tps / u.gen_tps);
      std::fflush(stdout);
      step_lines += "(unconstrained, same lengths) " + step_line(level, b2, a2);
    }
  }
  std::printf("\n%s", step_lines.c_str());
  if (sustain > 0) {
    std::printf(
        "\nclosed loop, %lld requests per level (each client submits its next request when "
        "its last one ends):\n| clients | output tok/s (whole run) | output tok/s (steady) | "
        "steady s | wall s | mean TTFT ms | steps | rows per step | preemptions |\n"
        "|---|---|---|---|---|---|---|---|---|\n",
        static_cast<long long>(sustain));
    step_lines.clear();
    for (int64_t level : levels) {
      const EngineStats before = (*engine)->Stats();
      const SustainedResult r =
          RunSustained(**engine, make_requests(sustain), static_cast<int32_t>(level));
      const EngineStats after = (*engine)->Stats();
      const int64_t steps = std::max<int64_t>(1, after.steps - before.steps);
      std::printf("| %lld | %.1f | %.1f | %.1f | %.1f | %.0f | %lld | %.1f | %lld |\n",
                  static_cast<long long>(level), r.whole_tps, r.steady_tps, r.steady_s, r.wall_s,
                  r.mean_ttft_ms, static_cast<long long>(steps),
                  static_cast<double>(after.computed_tokens - before.computed_tokens) / steps,
                  static_cast<long long>(after.preemptions - before.preemptions));
      std::fflush(stdout);
      step_lines += step_line(level, before, after);
    }
    std::printf("\n%s", step_lines.c_str());
  }
  (*engine)->Shutdown(true);
  engine->reset();  // give the KV pool back before the second engine sizes its own
  model->reset();

  if (prefix_len > 0) {
    // Fresh model + engine with prefix caching on.
    auto model2 = Model::Load(model_dir, opts);
    EngineConfig c2;
    c2.max_running = 1;
    c2.max_step_tokens = static_cast<int32_t>(step_tokens);
    c2.kv_cache_bytes = kv_bytes;
    c2.overlap_steps = !no_overlap;
    auto engine2 = Engine::Create(model2->get(), c2);
    if (!engine2.ok()) {
      std::fprintf(stderr, "%s\n", engine2.message().c_str());
      return 1;
    }
    auto with_suffix = [&](const std::vector<int32_t>& prefix, int32_t salt) {
      GenerationRequest r;
      r.prompt_ids = prefix;
      for (int32_t i = 0; i < 16; ++i) r.prompt_ids.push_back(3 + (salt * 31 + i) % (vocab - 3));
      r.max_tokens = 1;
      r.sampling.temperature = 0.0f;
      r.ignore_eos = true;
      return r;
    };
    // A first cold + cached pair on another prefix warms both paths (kernels, graphs, cuBLAS
    // heuristics) so the measured pair sees only the cache's effect.
    const std::vector<int32_t> warmup = RandomPrompt(rng, static_cast<int32_t>(prefix_len), vocab);
    RunConcurrent(**engine2, {with_suffix(warmup, 1)});
    RunConcurrent(**engine2, {with_suffix(warmup, 2)});
    const std::vector<int32_t> prefix = RandomPrompt(rng, static_cast<int32_t>(prefix_len), vocab);
    RunResult cold = RunConcurrent(**engine2, {with_suffix(prefix, 1)});
    RunResult warm = RunConcurrent(**engine2, {with_suffix(prefix, 2)});
    std::printf("\nTTFT, %lld-token shared prefix + 16-token suffix: cold %.0f ms, cached %.0f ms "
                "(%.1fx)\n",
                static_cast<long long>(prefix_len), cold.mean_ttft_ms, warm.mean_ttft_ms,
                cold.mean_ttft_ms / warm.mean_ttft_ms);
    (*engine2)->Shutdown(true);
  }
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) { return ember::Main(argc, argv); }
