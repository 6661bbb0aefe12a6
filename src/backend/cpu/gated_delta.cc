#include "backend/cpu/gated_delta.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace ember::cpu {
namespace {

float Silu(float x) { return x / (1.0f + std::exp(-x)); }
float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20).
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// y = x / sqrt(sum x^2 + 1e-6) * scale (the FLA l2norm's epsilon).
void L2Normalize(const float* x, int32_t n, float scale, float* y) {
  float sum = 0.0f;
  for (int32_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = scale / std::sqrt(sum + 1e-6f);
  for (int32_t i = 0; i < n; ++i) y[i] = x[i] * inv;
}

}  // namespace

void CausalConv1dSiluRows(float* x, int64_t rows, int64_t channels, const float* weight,
                          int32_t kernel, float* window) {
  const int64_t hist = kernel - 1;
  // The inputs this step sees: the window, then the rows (kept before x is overwritten).
  std::vector<float> in(static_cast<size_t>((hist + rows) * channels));
  std::memcpy(in.data(), window, static_cast<size_t>(hist * channels) * sizeof(float));
  std::memcpy(in.data() + hist * channels, x, static_cast<size_t>(rows * channels) * sizeof(float));
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      float acc = 0.0f;
      for (int32_t j = 0; j < kernel; ++j)
        acc += weight[c * kernel + j] * in[static_cast<size_t>((t + j) * channels + c)];
      x[t * channels + c] = Silu(acc);
    }
  }
  std::memcpy(window, in.data() + rows * channels,
              static_cast<size_t>(hist * channels) * sizeof(float));
}

void GatedDeltaRuleHead(const DeltaHeadShape& s, int32_t head, const float* qkv, const float* ba,
                        const float* a_log, const float* dt_bias, int64_t rows, float* state,
                        float* out) {
  const int32_t dk = s.k_dim, dv = s.v_dim;
  const int32_t kh = head / (s.num_v_heads / s.num_k_heads);
  const int64_t key_width = int64_t{s.num_k_heads} * dk;
  const int64_t stride = s.qkv_stride();
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  const float decay_rate = -std::exp(a_log[head]);
  std::vector<float> q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk));
  std::vector<float> delta(static_cast<size_t>(dv));
  const int64_t out_stride = int64_t{s.num_v_heads} * dv;
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = qkv + t * stride;
    L2Normalize(row + int64_t{kh} * dk, dk, scale, q.data());
    L2Normalize(row + key_width + int64_t{kh} * dk, dk, 1.0f, k.data());
    const float* v = row + 2 * key_width + int64_t{head} * dv;
    const float beta = Sigmoid(ba[t * 2 * s.num_v_heads + head]);
    const float a = ba[t * 2 * s.num_v_heads + s.num_v_heads + head];
    const float decay = std::exp(decay_rate * Softplus(a + dt_bias[head]));
    // S *= exp(g); delta = beta (v - S^T k)
    for (int32_t j = 0; j < dv; ++j) delta[static_cast<size_t>(j)] = 0.0f;
    for (int32_t i = 0; i < dk; ++i) {
      float* srow = state + int64_t{i} * dv;
      const float ki = k[static_cast<size_t>(i)];
      for (int32_t j = 0; j < dv; ++j) {
        srow[j] *= decay;
        delta[static_cast<size_t>(j)] += srow[j] * ki;
      }
    }
    for (int32_t j = 0; j < dv; ++j)
      delta[static_cast<size_t>(j)] = (v[j] - delta[static_cast<size_t>(j)]) * beta;
    // S += k delta^T; out = S^T q
    float* o = out + t * out_stride + int64_t{head} * dv;
    for (int32_t j = 0; j < dv; ++j) o[j] = 0.0f;
    for (int32_t i = 0; i < dk; ++i) {
      float* srow = state + int64_t{i} * dv;
      const float ki = k[static_cast<size_t>(i)], qi = q[static_cast<size_t>(i)];
      for (int32_t j = 0; j < dv; ++j) {
        srow[j] += ki * delta[static_cast<size_t>(j)];
        o[j] += srow[j] * qi;
      }
    }
  }
}

}  // namespace ember::cpu
