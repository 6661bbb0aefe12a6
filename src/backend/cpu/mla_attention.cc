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

// Rotates q's rope dims and k_rope (per row, at its position) and writes each row's
// [c | rotated k_rope] at its slot: before any row attends (a prefill chunk's rows see each
// other).
void RopeAndWrite(const BatchPlan& plan, const MlaParams& p, const RopeRows& rope, float* q,
                  const float* c, const float* k_rope, LatentKv kv) {
  const int64_t heads = p.num_heads, lat = p.latent_dim, rd = p.rope_dim;
  const int64_t qd = p.nope_dim + rd, width = lat + rd;
  for (int64_t i = 0; i < plan.num_tokens(); ++i) {
    const int32_t pos = plan.positions[static_cast<size_t>(i)];
    CHECK(pos >= 0 && pos < rope.max_positions) << "position " << pos << " beyond the rope table";
    const float* cs = rope.cos + static_cast<int64_t>(pos) * (rd / 2);
    const float* sn = rope.sin + static_cast<int64_t>(pos) * (rd / 2);
    for (int64_t h = 0; h < heads; ++h)
      RotateRope(q + (i * heads + h) * qd + p.nope_dim, static_cast<int32_t>(rd), cs, sn,
                 p.rope_interleave);
    const int64_t slot = plan.slot_mapping[static_cast<size_t>(i)];
    CHECK(slot >= 0 && slot < kv.num_slots) << "slot " << slot;
    float* row = kv.data + slot * width;
    std::memcpy(row, c + i * lat, static_cast<size_t>(lat) * sizeof(float));
    std::memcpy(row + lat, k_rope + i * rd, static_cast<size_t>(rd) * sizeof(float));
    RotateRope(row + lat, static_cast<int32_t>(rd), cs, sn, p.rope_interleave);
  }
}

// One query head qh [nope + rope] of a row at `pos` over its sequence's latent rows (`blocks`),
// absorbed: out [v_dim]. scratch: [pos + 1 + 2 * latent] floats.
void AttendHead(const MlaParams& p, const float* qh, const float* kv_b_head, int64_t pos,
                const int32_t* blocks, LatentKv kv, float* scratch, float* out) {
  const int64_t lat = p.latent_dim, nope = p.nope_dim, rd = p.rope_dim, width = lat + rd;
  float* q_lat = scratch;
  float* o_lat = q_lat + lat;
  float* scores = o_lat + lat;
  const float* w_uk = kv_b_head;              // [nope, lat]
  const float* w_uv = kv_b_head + nope * lat;  // [v_dim, lat]
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
  for (int64_t v = 0; v < p.v_dim; ++v) out[v] = DotF(w_uv + v * lat, o_lat, lat);
}

}  // namespace

void MlaAttention(const BatchPlan& plan, const MlaParams& p, const RopeRows& rope, float* q,
                  const float* c, const float* k_rope, LatentKv kv, float* out, ThreadPool& pool) {
  const int64_t n = plan.num_tokens(), heads = p.num_heads, lat = p.latent_dim;
  const int64_t qd = p.nope_dim + p.rope_dim, vd = p.v_dim;
  CHECK(p.kv_b != nullptr && p.kv_b->dtype == DType::kF32 &&
        p.kv_b->rows() == heads * (p.nope_dim + vd) && p.kv_b->cols() == lat)
      << "kv_b " << (p.kv_b ? ShapeString(*p.kv_b) : "null");
  const float* kv_b = static_cast<const float*>(p.kv_b->data);
  RopeAndWrite(plan, p, rope, q, c, k_rope, kv);
  std::vector<int32_t> row_seq(static_cast<size_t>(n));
  int64_t max_ctx = 1;
  for (int32_t s = 0; s < plan.num_seqs(); ++s) {
    for (int32_t i = 0; i < plan.seqs[s].query_len; ++i) row_seq[plan.seqs[s].query_start + i] = s;
    max_ctx = std::max<int64_t>(max_ctx, plan.seqs[s].context_len);
  }
  std::vector<std::vector<float>> scratch(static_cast<size_t>(pool.num_threads()));
  pool.ParallelFor(
      n * heads,
      [&](int64_t item, int thread) {
        std::vector<float>& buf = scratch[static_cast<size_t>(thread)];
        if (buf.empty()) buf.resize(static_cast<size_t>(max_ctx + 2 * lat));
        const int64_t i = item / heads, h = item % heads;
        const SequenceSlice& s = plan.seqs[static_cast<size_t>(row_seq[static_cast<size_t>(i)])];
        AttendHead(p, q + (i * heads + h) * qd, kv_b + h * (p.nope_dim + vd) * lat,
                   plan.positions[static_cast<size_t>(i)],
                   plan.block_tables.data() + s.block_table_start, kv, buf.data(),
                   out + (i * heads + h) * vd);
      },
      n * heads * max_ctx * lat < (1 << 16) ? 1 : pool.num_threads());
}

}  // namespace ember::cpu
