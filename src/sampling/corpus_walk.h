// Seeded random walks through a token constraint, for the schema corpus' test
// (schema_corpus_test.cc) and benchmark (bench/schema_corpus_bench.cc), header-only: at each step
// the walk asks Allowed(), picks an allowed id — uniformly at first, then more and more often
// one whose text holds a quote or a closing bracket (alternately), so that strings and
// containers get closed — and accepts it, until the constraint is done or the step budget ends.
// It records whether the constraint ever allowed nothing (stranded) or refused an id it had
// allowed, and optionally the time of each Allowed() call (wall clock, and the thread's CPU
// time, which a loaded machine's other work does not inflate).
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "sampling/json_constraint.h"
#include "sampling/token_constraint.h"

namespace ember {

struct WalkBias {
  std::vector<uint8_t> quotes, closers;  // per id: its text holds '"' / one of "}]"
  static WalkBias For(const TokenTexts& texts) {
    WalkBias b;
    b.quotes.assign(texts.bytes.size(), 0);
    b.closers.assign(texts.bytes.size(), 0);
    for (size_t id = 0; id < texts.bytes.size(); ++id) {
      if (!texts.bytes[id]) continue;
      b.quotes[id] = texts.bytes[id]->find('"') != std::string::npos;
      b.closers[id] = texts.bytes[id]->find_first_of("}]") != std::string::npos;
    }
    return b;
  }
};

struct WalkResult {
  std::string text;
  bool done = false;
  bool stranded = false;            // Allowed() was 0 before Done()
  bool refused = false;             // Accept() refused an allowed id
  bool miscounted = false;          // Allowed()'s count differs from its mask
  std::vector<double> mask_us;      // each Allowed() call's wall time (when asked for)
  std::vector<double> mask_cpu_us;  // ... and its thread CPU time
};

inline double ThreadCpuMicros() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) * 1e-3;
}

inline WalkResult RandomWalk(TokenConstraint& c, const TokenTexts& texts, const WalkBias& bias,
                             std::mt19937& rng, bool time_masks, int max_steps = 1500) {
  using Clock = std::chrono::steady_clock;
  WalkResult walk;
  std::vector<uint8_t> allowed;
  std::vector<int32_t> ids, preferred;
  for (int step = 0; step < max_steps && !c.Done(); ++step) {
    const auto start = Clock::now();
    const double cpu_start = time_masks ? ThreadCpuMicros() : 0;
    const int64_t count = c.Allowed(allowed);
    if (time_masks) {
      walk.mask_cpu_us.push_back(ThreadCpuMicros() - cpu_start);
      walk.mask_us.push_back(
          std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    }
    if (count <= 0) {
      walk.stranded = true;
      return walk;
    }
    ids.clear();
    preferred.clear();
    const std::vector<uint8_t>& prefer = step % 2 ? bias.quotes : bias.closers;
    for (size_t id = 0; id < allowed.size(); ++id) {
      if (!allowed[id]) continue;
      ids.push_back(static_cast<int32_t>(id));
      if (prefer[id]) preferred.push_back(static_cast<int32_t>(id));
    }
    walk.miscounted |= static_cast<int64_t>(ids.size()) != count;
    const bool biased = !preferred.empty() && static_cast<int>(rng() % 200) < 20 + step;
    const std::vector<int32_t>& from = biased ? preferred : ids;
    const int32_t id = from[rng() % from.size()];
    if (!c.Accept(id)) {
      walk.refused = true;
      return walk;
    }
    if (texts.bytes[static_cast<size_t>(id)]) walk.text += *texts.bytes[static_cast<size_t>(id)];
  }
  walk.done = c.Done();
  return walk;
}

}  // namespace ember
