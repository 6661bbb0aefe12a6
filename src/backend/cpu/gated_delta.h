// The CPU kernels of the recurrent ops (Backend::CausalConv1dSilu, Backend::GatedDeltaRule): one
// sequence's rows at a time, over plain float32 host memory. The backend loops over sequences
// (and heads) and owns the state slots. Pure functions (the chunked delta rule keeps per-thread
// scratch buffers, thread_local, which only grow); thread-safe for disjoint outputs.
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
// Per row t, with q and k l2-normed (q also times 1 / sqrt(k_dim)), a = exp(g_t) the decay and
// beta_t = sigmoid(b): S = a S; d = beta_t (v - S^T k); S += k d^T; out_t = S^T q.
// With `chunked`, runs GatedDeltaRuleChunked (kDeltaChunk rows per chunk) when
// rows >= kDeltaChunkMinRows and v_dim % 8 == 0, else GatedDeltaRuleTokens. The two agree to
// float rounding, not bitwise: a sequence's results then depend in the last bits on how its rows
// were split into steps (the backend's CpuBackendOptions::chunked_delta_rule).
void GatedDeltaRuleHead(const DeltaHeadShape& s, int32_t head, const float* qkv, const float* ba,
                        const float* a_log, const float* dt_bias, int64_t rows, float* state,
                        float* out, bool chunked);

inline constexpr int32_t kDeltaChunk = 64;
inline constexpr int64_t kDeltaChunkMinRows = 2 * kDeltaChunk;

// The recurrence row by row (rank-1 updates of the state; decode and short steps). A run split
// in two with the state carried equals the run in one piece, bitwise.
void GatedDeltaRuleTokens(const DeltaHeadShape& s, int32_t head, const float* qkv, const float* ba,
                          const float* a_log, const float* dt_bias, int64_t rows, float* state,
                          float* out);

// The same recurrence over chunks of `chunk` rows (a multiple of 8; the last chunk may be
// shorter; v_dim % 8 == 0), each by matrix products (the WY form of the gated delta rule): with
// S0 the state at the chunk's start, gamma_t the product of the decays of rows 0..t of the chunk
// and E_ts = gamma_t / gamma_s (a product of decays, never a division),
//   D = (I + strict_lower(diag(beta) (K K^T o E)))^-1 diag(beta) (V - diag(gamma) K S0)
//   out = diag(gamma) Q S0 + lower(Q K^T o E) D
//   S = gamma_last S0 + (diag(E_last,s) K)^T D
// D's rows are the rows' d above (D = U - W S0 in the paper's terms, solved by blocked forward
// substitution instead of forming U and W).
void GatedDeltaRuleChunked(const DeltaHeadShape& s, int32_t head, const float* qkv, const float* ba,
                           const float* a_log, const float* dt_bias, int64_t rows, int32_t chunk,
                           float* state, float* out);

}  // namespace ember::cpu
