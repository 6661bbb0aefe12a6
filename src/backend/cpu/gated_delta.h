// The CPU kernels of the recurrent ops (Backend::CausalConv1dSilu, Backend::GatedDeltaRule): one
// sequence's rows at a time, over plain float32 host memory. The backend loops over sequences
// (and heads) and owns the state slots. Pure functions; thread-safe for disjoint outputs.
#pragma once

#include <cstdint>

namespace ember::cpu {

// Causal depthwise conv1d + SiLU over `rows` rows of x [rows, channels] (in place), continuing
// from `window` [kernel - 1, channels] (the previous inputs, oldest first), which it then
// replaces by the last kernel - 1 inputs. weight [channels, kernel].
void CausalConv1dSiluRows(float* x, int64_t rows, int64_t channels, const float* weight,
                          int32_t kernel, float* window);

struct DeltaHeadShape {
  int32_t num_k_heads = 0, num_v_heads = 0, k_dim = 0, v_dim = 0;
  int64_t qkv_stride() const {
    return 2 * int64_t{num_k_heads} * k_dim + int64_t{num_v_heads} * v_dim;
  }
};

// The gated delta rule (backend.h, Backend::GatedDeltaRule) of value head `head` over `rows`
// rows: qkv [rows, qkv_stride], ba [rows, 2 * num_v_heads], a_log and dt_bias [num_v_heads],
// state [k_dim, v_dim] (updated), out [rows, num_v_heads * v_dim] (this head's columns).
void GatedDeltaRuleHead(const DeltaHeadShape& s, int32_t head, const float* qkv, const float* ba,
                        const float* a_log, const float* dt_bias, int64_t rows, float* state,
                        float* out);

}  // namespace ember::cpu
