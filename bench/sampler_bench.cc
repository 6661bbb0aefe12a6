// sampler_bench: time per row of ember::Sample() at a Qwen-sized vocabulary for common
// parameter mixes (llama.cpp's top_n_sigma / typical_p / XTC / DRY included; the DRY prompt is
// random ids, i.e. few repeats). Usage: sampler_bench [vocab_size=151936] [iterations=200]
// Logits are N(0, 2) with a few peaked entries, roughly like a real LM head.
// Then a full-vocabulary logit_bias request: parsing its body (ordered_json::parse against
// ParseOrderedJsonBounded, at a few sizes: the first is quadratic in the keys), Validate, and one
// step's AppendLogitEdits with the list in request order and sorted by id.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <time.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "sampling/logit_edits.h"
#include "sampling/sampler.h"
#include "util/json_bounds.h"

namespace {

// CPU time of this thread: the numbers stay meaningful on a shared, oversubscribed machine.
double ThreadCpuMicros() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// A body {"logit_bias": {"0": 1, ..., "n-1": 1}} and its entries in the order a parsed
// nlohmann::json object yields them (keys as strings, sorted: "0", "1", "10", "100", ...).
std::string BiasBody(int n, std::vector<std::pair<int32_t, float>>* entries) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(std::to_string(i));
  std::sort(keys.begin(), keys.end());
  std::string body = "{\"logit_bias\": {";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0) body += ", ";
    body += '"';
    body += keys[i];
    body += "\": 1";
    entries->emplace_back(std::stoi(keys[i]), 1.0f);
  }
  return body + "}}";
}

void BenchLogitBias(int vocab) {
  std::printf("\nlogit_bias for every id, one request\n");
  for (int n : {10000, 20000, 40000, vocab}) {
    std::vector<std::pair<int32_t, float>> entries;
    const std::string body = BiasBody(n, &entries);
    auto start = std::chrono::steady_clock::now();
    const bool ok = ember::ParseOrderedJsonBounded(body, 64).ok();
    const double bounded_ms = MillisSince(start);
    double ordered_ms = -1.0;
    if (n <= 40000) {  // ~13 s at 152k
      start = std::chrono::steady_clock::now();
      const nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(body);
      if (parsed.empty()) std::printf("  (empty)\n");
      ordered_ms = MillisSince(start);
    }
    std::printf("  %6d keys: ParseOrderedJsonBounded %8.1f ms (%s), ordered_json::parse %8.1f ms\n",
                n, bounded_ms, ok ? "ok" : "FAILED", ordered_ms);
  }
  ember::SamplingParams p;
  BiasBody(vocab, &p.logit_bias);
  auto start = std::chrono::steady_clock::now();
  const bool valid = p.Validate(vocab).ok();
  std::printf("  Validate: %.2f ms (%s)\n", MillisSince(start), valid ? "ok" : "FAILED");
  ember::SamplerState state(p, 0, {});
  std::vector<ember::LogitEdit> edits;
  for (const char* order : {"request order", "sorted by id"}) {
    if (order[0] == 's') p.SortLogitBias();
    edits.clear();
    start = std::chrono::steady_clock::now();
    ember::AppendLogitEdits(p, state, 0, edits);
    std::printf("  AppendLogitEdits, %s: %.2f ms, %zu edits\n", order, MillisSince(start),
                edits.size());
  }
}

struct Case {
  const char* name;
  ember::SamplingParams params;
  int num_seen_ids;  // prompt ids for penalties
};

}  // namespace

int main(int argc, char** argv) {
  const int vocab = argc > 1 ? std::atoi(argv[1]) : 151936;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 200;
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> base(static_cast<size_t>(vocab));
  for (float& x : base) x = dist(gen);
  for (int i = 0; i < 20; ++i) base[static_cast<size_t>(gen() % vocab)] = 12.0f + dist(gen);

  auto make = [](auto edit) {
    ember::SamplingParams p;
    p.seed = 7;
    edit(p);
    return p;
  };
  const std::vector<Case> cases = {
      {"greedy", make([](auto& p) { p.temperature = 0.0f; }), 0},
      {"temperature 1 (no filter)", make([](auto&) {}), 0},
      {"temperature 0.7 top_k 50", make([](auto& p) {
         p.temperature = 0.7f;
         p.top_k = 50;
       }),
       0},
      {"top_p 0.9", make([](auto& p) { p.top_p = 0.9f; }), 0},
      {"top_p 0.999 (wide nucleus)", make([](auto& p) { p.top_p = 0.999f; }), 0},
      {"min_p 0.05", make([](auto& p) { p.min_p = 0.05f; }), 0},
      {"top_k 40 top_p 0.9 min_p 0.05", make([](auto& p) {
         p.top_k = 40;
         p.top_p = 0.9f;
         p.min_p = 0.05f;
       }),
       0},
      {"penalties, 4096 seen ids", make([](auto& p) {
         p.repetition_penalty = 1.1f;
         p.presence_penalty = 0.5f;
         p.frequency_penalty = 0.5f;
       }),
       4096},
      {"logprobs 20 + top_p 0.9", make([](auto& p) {
         p.top_p = 0.9f;
         p.top_logprobs = 20;
       }),
       0},
      // llama.cpp's samplers (host only but DRY; see sampler.h for the order).
      {"top_n_sigma 1", make([](auto& p) { p.top_n_sigma = 1.0f; }), 0},
      {"typical_p 0.9 (whole vocabulary)", make([](auto& p) { p.typical_p = 0.9f; }), 0},
      {"top_k 40 typical_p 0.9", make([](auto& p) {
         p.top_k = 40;
         p.typical_p = 0.9f;
       }),
       0},
      {"xtc 1.0 / 0.1 (always on)", make([](auto& p) {
         p.xtc_probability = 1.0f;
         p.xtc_threshold = 0.1f;
       }),
       0},
      {"min_p 0.05 xtc 0.5 / 0.1", make([](auto& p) {
         p.min_p = 0.05f;
         p.xtc_probability = 0.5f;
         p.xtc_threshold = 0.1f;
       }),
       0},
      {"dry 0.8, 4096-token prompt", make([](auto& p) { p.dry_multiplier = 0.8f; }), 4096},
  };

  std::printf("vocab %d, %d iterations per case, single thread\n", vocab, iterations);
  std::vector<float> row(base.size());
  for (const Case& c : cases) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < c.num_seen_ids; ++i) prompt.push_back(static_cast<int32_t>(gen() % vocab));
    ember::SamplerState state(c.params, 0, prompt);
    double wall_us = 0.0, cpu_us = 0.0;
    for (int it = 0; it < iterations; ++it) {
      row = base;
      const auto start = std::chrono::steady_clock::now();
      const double cpu_start = ThreadCpuMicros();
      const auto out = ember::Sample(row, c.params, state);
      cpu_us += ThreadCpuMicros() - cpu_start;
      wall_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                     .count();
      state.Accept(out.token_id);
    }
    std::printf("  %-32s %8.1f us/row cpu %8.1f us/row wall\n", c.name, cpu_us / iterations,
                wall_us / iterations);
  }
  BenchLogitBias(vocab);
  return 0;
}
