// Test helper (header-only, tests only): a random walk through a token constraint that checks,
// at every step, that Allowed() is exactly the set of pieces `prefix_ok` accepts after the text
// so far (and AllowedBits() the same set packed), then accepts one allowed piece chosen by `pick`.
// The constraint tests of JSON mode, JSON schemas and forced tool calls share it, with a `pick`
// that leans on structure.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "sampling/token_constraint.h"

namespace ember::testing {

using Pieces = std::vector<std::optional<std::string>>;

// Returns the text written; stops when the constraint is done or after max_steps. A failed
// check is a gtest failure (the walk then stops early).
inline std::string CheckedWalk(TokenConstraint& walk, const Pieces& pieces,
                               const std::function<bool(const std::string&)>& prefix_ok,
                               const std::function<int32_t(const std::vector<int32_t>&)>& pick,
                               int max_steps) {
  std::string text;
  std::vector<uint8_t> allowed;
  std::vector<uint32_t> bits, packed;
  for (int step = 0; step < max_steps && !walk.Done(); ++step) {
    // Both forms of the mask, each asked first on alternate steps (the first computes it, the
    // second may come from the constraint's cache): the bits are the bytes, packed.
    int64_t count = 0, bits_count = 0;
    if (step % 2 == 0) {
      count = walk.Allowed(allowed);
      bits_count = walk.AllowedBits(bits);
    } else {
      bits_count = walk.AllowedBits(bits);
      count = walk.Allowed(allowed);
    }
    PackAllowedBits(allowed, &packed);
    EXPECT_EQ(bits, packed) << "after '" << text << "'";
    EXPECT_EQ(bits_count, count) << "after '" << text << "'";
    std::vector<int32_t> ids;
    for (size_t id = 0; id < pieces.size(); ++id) {
      const bool ok =
          pieces[id].has_value() && !pieces[id]->empty() && prefix_ok(text + *pieces[id]);
      EXPECT_EQ(allowed[id], ok) << "after '" << text << "', piece " << id;
      if (ok) ids.push_back(static_cast<int32_t>(id));
    }
    EXPECT_EQ(count, static_cast<int64_t>(ids.size())) << text;
    if (ids.empty() || count != static_cast<int64_t>(ids.size())) {
      ADD_FAILURE() << "the walk is stuck after '" << text << "'";
      break;
    }
    const int32_t id = pick(ids);
    EXPECT_TRUE(walk.Accept(id)) << text;
    text += *pieces[static_cast<size_t>(id)];
  }
  if (walk.Done()) {
    EXPECT_EQ(walk.Allowed(allowed), 0) << "something may follow " << text;
    EXPECT_EQ(walk.AllowedBits(bits), 0) << "something may follow " << text;
    EXPECT_EQ(bits, std::vector<uint32_t>((pieces.size() + 31) / 32, 0u)) << text;
  }
  return text;
}

// A `pick` for CheckedWalk that leans on structure so that walks close what they open: a random
// allowed piece, replaced (with odds 1/3 each, in order) by any allowed piece longer than one byte
// or in `closers`.
inline std::function<int32_t(const std::vector<int32_t>&)> StructureLeaningPick(
    const Pieces& pieces, std::mt19937& rng, std::vector<std::string> closers) {
  return [&pieces, &rng, closers = std::move(closers)](const std::vector<int32_t>& ids) {
    int32_t pick = ids[rng() % ids.size()];
    for (int32_t id : ids) {
      const std::string& p = *pieces[static_cast<size_t>(id)];
      const bool closer = std::find(closers.begin(), closers.end(), p) != closers.end();
      if ((p.size() > 1 || closer) && rng() % 3 == 0) pick = id;
    }
    return pick;
  };
}

}  // namespace ember::testing
