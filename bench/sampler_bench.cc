// sampler_bench: time per row of ember::Sample() at a Qwen-sized vocabulary for common
// parameter mixes. Usage: sampler_bench [vocab_size=151936] [iterations=200]
// Logits are N(0, 2) with a few peaked entries, roughly like a real LM head.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <time.h>

#include "sampling/sampler.h"

namespace {

// CPU time of this thread: the numbers stay meaningful on a shared, oversubscribed machine.
double ThreadCpuMicros() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
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
  return 0;
}
