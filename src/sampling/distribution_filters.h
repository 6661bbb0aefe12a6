// The distribution filters Ember takes from llama.cpp that WeightedRow (weighted_row.h) does not
// express as a prefix of its rank order: top-n-sigma (on the logits), locally typical sampling and
// XTC (on an explicit list of kept tokens), and the inverse-CDF draw over such a list. Sample()
// (sampler.h) fixes where each applies. Pure functions on caller-owned data; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ember {

// Top-n-sigma (Tang et al., llama.cpp's top_n_sigma): over the finite logits, max and the
// population standard deviation sigma (double sums); every logit < max - n * sigma becomes -inf.
// The argmax always stays. n <= 0 or fewer than two finite logits: nothing changes.
void ApplyTopNSigma(std::span<float> logits, float n);

// One kept token and its unnormalised weight (> 0). A list's order is the caller's (the sampler
// uses ascending ids); the filters keep it and the draw follows it. "Rank order" below is
// (weight desc, id asc), the tie-break wherever one is needed.
struct KeptToken {
  int32_t id;
  float weight;
};

// Locally typical sampling (Meister et al.; llama.cpp's typical_p with min_keep 1): with
// p_i = w_i / sum(w) and the entropy H = -sum p_i ln p_i, tokens are taken in order of
// |-ln p_i - H| (ties: rank order) until their cumulative probability exceeds typical_p (the
// token that crosses it is kept). The survivors keep their list order. typical_p >= 1: no change.
void ApplyTypicalP(std::vector<KeptToken>& kept, float typical_p);

// XTC (exclude top choices; llama.cpp's xtc with min_keep 1), once triggered: with
// p_i = w_i / sum(w), when at least two tokens have p_i >= threshold, all of them but the least
// likely (the last of them in rank order) are removed; the rest keep their order. One pass (two
// when something is removed). Returns whether anything was removed.
bool ApplyXtc(std::vector<KeptToken>& kept, float threshold);

// Inverse CDF in list order: the first token at which the running weight exceeds u * sum(w)
// (the last one when rounding runs off the end). u in [0, 1); `kept` non-empty.
int32_t DrawKept(std::span<const KeptToken> kept, double u);

}  // namespace ember
