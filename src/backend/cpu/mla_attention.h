// Multi-head latent attention on the CPU (Backend::MlaAttention, deepseek_v3) over the latent KV
// pool: each token of a layer keeps only [c | k_rope] (latent_dim + rope_dim floats), never
// per-head K and V. The scores and the output are computed with the up-projection absorbed:
//   q_lat_h = W_uk[h]^T q_nope_h                    [latent_dim]
//   score_t = scale * (q_lat_h . c_t + q_rope_h . k_rope_t)
//   out_h   = W_uv[h] (sum_t p_t c_t)               [v_dim]
// which equals attention over the expanded k_nope_h = W_uk[h] c_t and v_h = W_uv[h] c_t (up to
// float rounding; mla_attention_test.cc checks it against the expanded form). Each (row, head)
// is computed in a fixed order whatever the other rows of the step (batch-invariant).
// Thread-safety: one call at a time (it uses the given pool).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/batch_plan.h"
#include "backend/cpu/thread_pool.h"

namespace ember::cpu {

// One layer's slice of the latent pool: [num_slots, width] floats, width = latent + rope dims.
struct LatentKv {
  float* data = nullptr;
  int64_t num_slots = 0;
  int32_t block_size = 0;
};

// A rope table (backend/rope_table.h): cos and sin [max_positions, rope_dim / 2].
struct RopeRows {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int32_t max_positions = 0;
};

// Backend::MlaAttention's contract for `plan`: q [rows, heads, nope + rope] (its rope dims
// rotated in place), c [rows, latent], k_rope [rows, rope], out [rows, heads * v_dim].
void MlaAttention(const BatchPlan& plan, const MlaParams& p, const RopeRows& rope, float* q,
                  const float* c, const float* k_rope, LatentKv kv, float* out, ThreadPool& pool);

}  // namespace ember::cpu
