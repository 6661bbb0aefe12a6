#include "backend/cpu/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "util/check.h"

namespace ember::cpu {
namespace {

// Rotates v [dim] (HF rotate-half) with the table row of its position; with `interleave` its
// pairs (v0, v1), (v2, v3), ... are first de-interleaved to [v0, v2, ... | v1, v3, ...].
void RotateRope(float* v, int32_t dim, const float* cos, const float* sin, bool interleave) {
  const int32_t half = dim / 2;
  float tmp[512];
  CHECK_LE(dim, 512) << "rope dims";
  if (interleave) {
    for (int32_t j = 0; j < half; ++j) {
      tmp[j] = v[2 * j];
      tmp[half + j] = v[2 * j + 1];
    }
    std::memcpy(v, tmp, static_cast<size_t>(dim) * sizeof(float));
  }
  for (int32_t j = 0; j < half; ++j) {
    const float x1 = v[j], x2 = v[j + half];
    v[j] = x1 * cos[j] - x2 * sin[j];
    v[j + half] = x2 * cos[j] + x1 * sin[j];
  }
}

float DotF(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += a[j] * b[j];
  return sum;
}

}  // namespace

void MlaAttention(const BatchPlan& plan, const MlaParams& p, const RopeRows& rope, float* q,
                  const float* c, const float* k_rope, LatentKv kv, float* out, ThreadPool& pool) {
  const int64_t n = plan.num_tokens(), heads = p.num_heads, lat = p.latent_dim;
  const int64_t nope = p.nope_dim, rd = p.rope_dim, vd = p.v_dim, qd = nope + rd;
  const int64_t width = lat + rd;
  CHECK(p.kv_b != nullptr && p.kv_b->dtype == DType::kF32 &&
        p.kv_b->rows() == heads * (nope + vd) && p.kv_b->cols() == lat)
      << "kv_b " << (p.kv_b ? ShapeString(*p.kv_b) : "null");
  const float* kv_b = static_cast<const float*>(p.kv_b->data);
  // Rotate, then write each row's [c | k_rope] at its slot (before any row attends: the rows of
  // a prefill chunk see each other).
  for (int64_t i = 0; i < n; ++i) {
    const int32_t pos = plan.positions[static_cast<size_t>(i)];
    CHECK(pos >= 0 && pos < rope.max_positions) << "position " << pos << " beyond the rope table";
    const float* cs = rope.cos + static_cast<int64_t>(pos) * (rd / 2);
    const float* sn = rope.sin + static_cast<int64_t>(pos) * (rd / 2);
    for (int64_t h = 0; h < heads; ++h)
      RotateRope(q + (i * heads + h) * qd + nope, static_cast<int32_t>(rd), cs, sn,
                 p.rope_interleave);
    const int64_t slot = plan.slot_mapping[static_cast<size_t>(i)];
    CHECK(slot >= 0 && slot < kv.num_slots) << "slot " << slot;
    float* row = kv.data + slot * width;
    std::memcpy(row, c + i * lat, static_cast<size_t>(lat) * sizeof(float));
    std::memcpy(row + lat, k_rope + i * rd, static_cast<size_t>(rd) * sizeof(float));
    RotateRope(row + lat, static_cast<int32_t>(rd), cs, sn, p.rope_interleave);
  }
  std::vector<int32_t> row_seq(static_cast<size_t>(n));
  int64_t max_ctx = 1;
  for (int32_t s = 0; s < plan.num_seqs(); ++s) {
    for (int32_t i = 0; i < plan.seqs[s].query_len; ++i) row_seq[plan.seqs[s].query_start + i] = s;
    max_ctx = std::max<int64_t>(max_ctx, plan.seqs[s].context_len);
  }
  // Per thread: scores [max_ctx], q_lat [lat], o_lat [lat].
  std::vector<std::vector<float>> scratch(static_cast<size_t>(pool.num_threads()));
  pool.ParallelFor(
      n * heads,
      [&](int64_t item, int thread) {
        std::vector<float>& buf = scratch[static_cast<size_t>(thread)];
        if (buf.empty()) buf.resize(static_cast<size_t>(max_ctx + 2 * lat));
        float* scores = buf.data();
        float* q_lat = scores + max_ctx;
        float* o_lat = q_lat + lat;
        const int64_t i = item / heads, h = item % heads;
        const SequenceSlice& s = plan.seqs[static_cast<size_t>(row_seq[static_cast<size_t>(i)])];
        const int32_t* blocks = plan.block_tables.data() + s.block_table_start;
        const int64_t pos = plan.positions[static_cast<size_t>(i)];
        const float* qh = q + (i * heads + h) * qd;
        const float* w_uk = kv_b + h * (nope + vd) * lat;  // [nope, lat]
        const float* w_uv = w_uk + nope * lat;             // [vd, lat]
        std::fill(q_lat, q_lat + lat, 0.0f);
        for (int64_t j = 0; j < nope; ++j)
          for (int64_t r = 0; r < lat; ++r) q_lat[r] += qh[j] * w_uk[j * lat + r];
        const auto key = [&](int64_t t) {
          const int64_t slot =
              static_cast<int64_t>(blocks[t / kv.block_size]) * kv.block_size + t % kv.block_size;
          return kv.data + slot * width;
        };
        float max_score = -INFINITY;
        for (int64_t t = 0; t <= pos; ++t) {
          const float* row = key(t);
          scores[t] = (DotF(q_lat, row, lat) + DotF(qh + nope, row + lat, rd)) * p.scale;
          max_score = std::max(max_score, scores[t]);
        }
        float sum = 0.0f;
        for (int64_t t = 0; t <= pos; ++t) {
          scores[t] = std::exp(scores[t] - max_score);
          sum += scores[t];
        }
        const float inv = 1.0f / sum;
        std::fill(o_lat, o_lat + lat, 0.0f);
        for (int64_t t = 0; t <= pos; ++t) {
          const float w = scores[t] * inv;
          const float* row = key(t);
          for (int64_t r = 0; r < lat; ++r) o_lat[r] += w * row[r];
        }
        float* oh = out + (i * heads + h) * vd;
        for (int64_t v = 0; v < vd; ++v) oh[v] = DotF(w_uv + v * lat, o_lat, lat);
      },
      n * heads * max_ctx * lat < (1 << 16) ? 1 : pool.num_threads());
}

}  // namespace ember::cpu
