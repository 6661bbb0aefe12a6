// Metrics: histogram buckets/quantiles and the Prometheus text carry the observed values.
#include "serve/metrics.h"

#include <gtest/gtest.h>

namespace ember::serve {
namespace {

TEST(HistogramTest, QuantilesFollowTheBuckets) {
  Histogram h({1.0, 2.0, 4.0});
  for (int i = 0; i < 50; ++i) h.Observe(0.5);
  for (int i = 0; i < 50; ++i) h.Observe(3.0);
  EXPECT_EQ(h.count(), 100);
  EXPECT_LE(h.Quantile(0.25), 1.0);
  EXPECT_GT(h.Quantile(0.9), 2.0);
  EXPECT_LE(h.Quantile(0.9), 4.0);
  std::string text;
  h.AppendPrometheus("x_seconds", "help", &text);
  EXPECT_NE(text.find("x_seconds_bucket{le=\"1\"} 50\n"), std::string::npos) << text;
  EXPECT_NE(text.find("x_seconds_bucket{le=\"4\"} 100\n"), std::string::npos) << text;
  EXPECT_NE(text.find("x_seconds_count 100\n"), std::string::npos) << text;
}

TEST(MetricsTest, PrometheusAndJsonCarryCountersAndEngineGauges) {
  Metrics m;
  m.CountRequest("/v1/completions", 200);
  m.CountRequest("/v1/completions", 200);
  m.CountRequest("/v1/completions", 400);
  m.CountTokens(10, 5);
  m.ObserveTimeToFirstToken(0.02);
  EngineStats e;
  e.num_queued = 3;
  e.num_running = 7;
  e.kv_blocks_total = 10;
  e.kv_blocks_used = 5;
  e.prefix_query_tokens = 100;
  e.prefix_hit_tokens = 25;
  e.decode_padding_rows = 6;
  e.overlapped_steps = 9;
  e.forced_tokens = 11;
  e.masked_rows_host = 12;
  e.masked_rows_edits = 13;
  e.masked_rows_bits = 14;
  e.forward_ns = 1500000000;
  e.state_checkpoints = 2;
  e.state_checkpoint_bytes = 200;
  e.state_checkpoint_capacity_bytes = 500;
  e.state_checkpoint_saves = 4;
  e.state_checkpoint_evictions = 1;
  const std::string text = m.Prometheus(e);
  EXPECT_NE(text.find("ember_engine_decode_padding_rows_total 6\n"), std::string::npos);
  EXPECT_NE(text.find("ember_engine_forward_seconds_total 1.5\n"), std::string::npos);
  EXPECT_NE(text.find("ember_engine_overlapped_steps_total 9\n"), std::string::npos);
  EXPECT_NE(text.find("ember_engine_forced_tokens_total 11\n"), std::string::npos);
  EXPECT_NE(text.find("ember_engine_masked_rows_host_total 12\n"), std::string::npos);
  EXPECT_NE(text.find("ember_engine_masked_rows_edits_total 13\n"), std::string::npos);
  EXPECT_NE(text.find("ember_engine_masked_rows_bits_total 14\n"), std::string::npos);
  EXPECT_NE(text.find("ember_http_requests_total{route=\"/v1/completions\",status=\"200\"} 2"),
            std::string::npos);
  EXPECT_NE(text.find("ember_queue_depth 3\n"), std::string::npos);
  EXPECT_NE(text.find("ember_running_sequences 7\n"), std::string::npos);
  EXPECT_NE(text.find("ember_kv_cache_usage_ratio 0.5\n"), std::string::npos);
  EXPECT_NE(text.find("ember_prefix_cache_hit_ratio 0.25\n"), std::string::npos);
  EXPECT_NE(text.find("ember_time_to_first_token_seconds_count 1\n"), std::string::npos);
  nlohmann::json j = m.Json(e);
  EXPECT_EQ(j["tokens"]["generated"], 5);
  EXPECT_EQ(j["engine"]["queue_depth"], 3);
  EXPECT_EQ(j["engine"]["decode_padding_rows"], 6);
  EXPECT_EQ(j["engine"]["overlapped_steps"], 9);
  EXPECT_EQ(j["engine"]["forced_tokens"], 11);
  EXPECT_EQ(j["engine"]["masked_rows_host"], 12);
  EXPECT_EQ(j["engine"]["masked_rows_edits"], 13);
  EXPECT_EQ(j["engine"]["masked_rows_bits"], 14);
  EXPECT_DOUBLE_EQ(j["prefix_cache"]["hit_rate"].get<double>(), 0.25);
  EXPECT_EQ(j["prefix_cache"]["state_checkpoints"], 2);
  EXPECT_EQ(j["prefix_cache"]["state_checkpoint_bytes"], 200);
  EXPECT_EQ(j["prefix_cache"]["state_checkpoint_capacity_bytes"], 500);
  EXPECT_EQ(j["prefix_cache"]["state_checkpoint_saves"], 4);
  EXPECT_EQ(j["prefix_cache"]["state_checkpoint_evictions"], 1);
  // No disk tier: no disk metrics, and /stats shows the pool only.
  EXPECT_EQ(text.find("ember_prompt_cache_"), std::string::npos);
  EXPECT_FALSE(j["prompt_cache"]["tiers"].contains("disk"));
}

TEST(MetricsTest, PromptCacheDiskTier) {
  Metrics m;
  EngineStats e;
  e.kv_blocks_cached = 4;
  PromptCacheStats& p = e.prompt_cache;
  p.enabled = true;
  p.bytes = 4096;
  p.records = 2;
  p.hits = 5;
  p.lookup_misses = 1;
  p.promotions = 5;
  p.evictions = 3;
  p.bytes_read = 10240;
  p.bytes_written = 8192;
  p.corrupt_dropped = 2;
  p.loads = 4;
  p.recomputes = 1;
  p.last_choice = PromptCacheStats::Choice::kRecompute;
  const std::string text = m.Prometheus(e);
  EXPECT_NE(text.find("ember_prompt_cache_bytes{tier=\"disk\"} 4096\n"), std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_hits_total{tier=\"disk\"} 5\n"), std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_misses_total{tier=\"disk\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_evictions_total{tier=\"disk\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_corrupt_dropped_total{tier=\"disk\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_reuse_decisions_total{choice=\"recompute\"} 1\n"),
            std::string::npos);
  const nlohmann::json j = m.Json(e)["prompt_cache"];
  EXPECT_EQ(j["tiers"]["pool"]["blocks_cached"], 4);
  EXPECT_EQ(j["tiers"]["disk"]["bytes_written"], 8192);
  EXPECT_EQ(j["tiers"]["disk"]["promotions"], 5);
  EXPECT_EQ(j["reuse"]["last_choice"], "recompute");
  EXPECT_FALSE(j["tiers"].contains("ram"));
  EXPECT_EQ(text.find("tier=\"ram\""), std::string::npos);
}

// A hybrid model's tiers keep its state checkpoints: their counts, bytes and hits per tier, and
// the sequences resumed from them; absent for other models.
TEST(MetricsTest, PromptCacheStateCheckpoints) {
  Metrics m;
  EngineStats e;
  PromptCacheStats& p = e.prompt_cache;
  p.enabled = true;
  p.ram.enabled = true;
  EXPECT_EQ(m.Prometheus(e).find("state_checkpoint"), std::string::npos);
  EXPECT_FALSE(m.Json(e)["prompt_cache"]["tiers"]["disk"].contains("state_bytes"));
  p.state_checkpoints = true;
  p.state_records = 3;
  p.state_bytes = 51276;
  p.state_hits = 2;
  p.state_restores = 2;
  p.state_misses = 1;
  p.ram.state_records = 1;
  p.ram.state_bytes = 17092;
  p.ram.state_prefetched = 4;
  const std::string text = m.Prometheus(e);
  EXPECT_NE(text.find("ember_prompt_cache_state_checkpoints{tier=\"disk\"} 3\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("ember_prompt_cache_state_checkpoint_bytes{tier=\"ram\"} 17092\n"),
            std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_state_checkpoint_hits_total{tier=\"disk\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_state_checkpoints_prefetched_total{tier=\"ram\"} 4\n"),
            std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_state_restores_total 2\n"), std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_state_misses_total 1\n"), std::string::npos);
  const nlohmann::json j = m.Json(e)["prompt_cache"];
  EXPECT_EQ(j["tiers"]["disk"]["state_checkpoints"], 3);
  EXPECT_EQ(j["tiers"]["disk"]["state_bytes"], 51276);
  EXPECT_EQ(j["tiers"]["ram"]["state_bytes"], 17092);
  EXPECT_EQ(j["tiers"]["ram"]["state_prefetched"], 4);
  EXPECT_EQ(j["reuse"]["state_restores"], 2);
  EXPECT_EQ(j["reuse"]["state_misses"], 1);
}

TEST(MetricsTest, PromptCacheRamAndDiskTiers) {
  Metrics m;
  EngineStats e;
  PromptCacheStats& p = e.prompt_cache;
  p.enabled = true;
  p.bytes = 4096;
  p.hits = 2;
  PromptCacheRamStats& r = p.ram;
  r.enabled = true;
  r.bytes = 2048;
  r.capacity_bytes = 1 << 20;
  r.records = 1;
  r.hits = 7;
  r.lookup_misses = 3;
  r.promotions = 7;
  r.demotions = 9;
  r.evictions = 4;
  r.spills = 1;
  r.bytes_read = 700;
  r.bytes_written = 900;
  const std::string text = m.Prometheus(e);
  // One HELP/TYPE per metric, one sample per tier.
  const std::string bytes = "# TYPE ember_prompt_cache_bytes gauge\n"
                            "ember_prompt_cache_bytes{tier=\"ram\"} 2048\n"
                            "ember_prompt_cache_bytes{tier=\"disk\"} 4096\n";
  EXPECT_NE(text.find(bytes), std::string::npos) << text;
  EXPECT_NE(text.find("ember_prompt_cache_hits_total{tier=\"ram\"} 7\n"), std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_hits_total{tier=\"disk\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_misses_total{tier=\"ram\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_promotions_total{tier=\"ram\"} 7\n"),
            std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_demotions_total{tier=\"ram\"} 9\n"),
            std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_evictions_total{tier=\"ram\"} 4\n"),
            std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_spills_total{tier=\"ram\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_read_bytes_total{tier=\"ram\"} 700\n"),
            std::string::npos);
  EXPECT_NE(text.find("ember_prompt_cache_written_bytes_total{tier=\"ram\"} 900\n"),
            std::string::npos);
  nlohmann::json j = m.Json(e)["prompt_cache"];
  EXPECT_EQ(j["tiers"]["ram"]["hits"], 7);
  EXPECT_EQ(j["tiers"]["ram"]["capacity_bytes"], 1 << 20);
  EXPECT_EQ(j["tiers"]["ram"]["spills"], 1);
  EXPECT_EQ(j["tiers"]["disk"]["bytes"], 4096);
  // RAM alone: no disk samples, no disk-only metrics.
  p.enabled = false;
  const std::string ram_only = m.Prometheus(e);
  EXPECT_EQ(ram_only.find("tier=\"disk\""), std::string::npos);
  EXPECT_EQ(ram_only.find("ember_prompt_cache_write_drops_total"), std::string::npos);
  EXPECT_NE(ram_only.find("ember_prompt_cache_bytes{tier=\"ram\"} 2048\n"), std::string::npos);
  j = m.Json(e)["prompt_cache"];
  EXPECT_TRUE(j["tiers"].contains("ram"));
  EXPECT_FALSE(j["tiers"].contains("disk"));
}

}  // namespace
}  // namespace ember::serve
