// Paged attention and KV-pool tests of the CUDA backend against a double-precision reference
// (prefill, decode, split-K over long contexts, sliding windows, soft-capping, GQA, attention
// sinks), the bf16 KV pool's rounding, and the batch-invariant attention kernel's bitwise
// guarantees (also with sinks). Tolerances as in cuda_ops_test.cc. Skips when no CUDA device is
// present (CI has none).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_test_util.h"
#include "backend/cuda/kernels.h"
#include "backend/kv_format.h"
#include "util/half.h"

namespace ember {
namespace {

using namespace cuda_test;  // the fixture and helpers shared with the other GPU test binary

// Double-precision attention of one query head at position `pos` over keys [lo, pos]: q(d),
// k(j, d), v(j, d) give the operands; soft-capping when softcap > 0. `sink` (-inf: none) is the
// head's attention sink, a logit in the scaled (and capped) scores' units that joins the softmax
// without a value (transformers' gpt_oss: softmax over [scores, sink], the sink's column dropped).
// Returns [head_dim].
template <typename Q, typename K, typename V>
std::vector<double> ReferenceHead(int32_t head_dim, int32_t lo, int32_t pos, double scale,
                                  double softcap, Q q, K k, V v, double sink = -INFINITY) {
  std::vector<double> s;
  for (int32_t j = lo; j <= pos; ++j) {
    double dot = 0;
    for (int32_t d = 0; d < head_dim; ++d) dot += static_cast<double>(q(d)) * k(j, d);
    dot *= scale;
    if (softcap > 0) dot = softcap * std::tanh(dot / softcap);
    s.push_back(dot);
  }
  const double mx = std::max(*std::max_element(s.begin(), s.end()), sink);
  double sum = std::exp(sink - mx);  // 0 without a sink
  for (double& x : s) sum += (x = std::exp(x - mx));
  std::vector<double> out(static_cast<size_t>(head_dim));
  for (int32_t d = 0; d < head_dim; ++d) {
    double acc = 0;
    for (int32_t j = lo; j <= pos; ++j) acc += s[static_cast<size_t>(j - lo)] * v(j, d);
    out[static_cast<size_t>(d)] = acc / sum;
  }
  return out;
}

// The worst relative L2 error over the (row, head) vectors of head_dim values: a head whose
// output is tiny (a large sink) is held to the tolerance on its own scale.
double WorstHeadRelL2(const std::vector<float>& got, const std::vector<double>& ref,
                      int32_t head_dim) {
  EXPECT_EQ(got.size(), ref.size());
  double worst = 0;
  const size_t hd = static_cast<size_t>(head_dim);
  for (size_t at = 0; at + hd <= std::min(got.size(), ref.size()); at += hd) {
    worst = std::max(worst, RelL2(std::vector<float>(got.begin() + static_cast<int64_t>(at),
                                                     got.begin() + static_cast<int64_t>(at + hd)),
                                  std::vector<double>(ref.begin() + static_cast<int64_t>(at),
                                                      ref.begin() + static_cast<int64_t>(at + hd))));
  }
  return worst;
}

// Sink logits for `num_heads` heads: large positive ones (a head whose keys keep almost no
// weight), large negative ones (no effect), and values near the scores' own range.
std::vector<float> TestSinks(int32_t num_heads) {
  static constexpr float kValues[] = {-30.f, 30.f, 0.f, 2.5f, -2.f, 8.f, -8.f, 1.f,
                                      15.f,  -0.5f, 4.f, -60.f, 0.75f, 5.f, -4.f, 3.f};
  std::vector<float> sinks(static_cast<size_t>(num_heads));
  for (size_t h = 0; h < sinks.size(); ++h) sinks[h] = kValues[h % std::size(kValues)];
  return sinks;
}

// ---- paged attention ----

struct AttnCase {
  int32_t head_dim, num_heads, num_kv_heads, window;
  float softcap;
};

std::string AttnCaseName(const ::testing::TestParamInfo<AttnCase>& info) {
  const AttnCase& c = info.param;
  char name[96];
  std::snprintf(name, sizeof(name), "D%d_H%d_KV%d_W%d_cap%d", c.head_dim, c.num_heads,
                c.num_kv_heads, c.window, static_cast<int>(c.softcap));
  return std::string(name);
}

// Host K/V per sequence and position: [pos][num_kv_heads * head_dim].
using SeqKv = std::vector<std::vector<float>>;

class AttentionTest : public CudaOpsTest, public ::testing::WithParamInterface<AttnCase> {
 protected:
  static constexpr int32_t kBlocks = 256, kLayers = 2, kLayer = 1;

  // Runs one step: each entry (seq id, first_pos, n) adds n rows. Returns the rel-L2 error.
  double Step(Backend& b, const std::vector<std::array<int32_t, 3>>& rows, uint32_t seed) {
    const AttnCase c = GetParam();
    BatchPlan plan;
    for (const auto& [seq, first, n] : rows) {
      std::vector<int32_t> tokens(static_cast<size_t>(n), 1);
      plan.AddSequence(tokens, first, blocks_[static_cast<size_t>(seq)], false);
    }
    EXPECT_TRUE(b.BeginStep(plan).ok());
    const int32_t T = plan.num_tokens(), D = c.head_dim;
    const int64_t kvw = static_cast<int64_t>(c.num_kv_heads) * D;
    const std::vector<float> q = Random(static_cast<size_t>(T * c.num_heads * D), seed);
    const std::vector<float> k = Random(static_cast<size_t>(T * kvw), seed + 1);
    const std::vector<float> v = Random(static_cast<size_t>(T * kvw), seed + 2);
    Tensor qt = Upload(b, q, {T, c.num_heads, D});
    Tensor kt = Upload(b, k, {T, c.num_kv_heads, D});
    Tensor vt = Upload(b, v, {T, c.num_kv_heads, D});
    b.WriteKv(kLayer, kt, vt);
    AttentionParams p{kLayer, c.num_heads, c.num_kv_heads, D, 1.0f / std::sqrt(float(D)),
                      c.window, c.softcap};
    if (sinks_) p.sinks = &*sinks_;
    Tensor out = b.Alloc({T, c.num_heads * D});
    b.Attention(p, qt, out);
    // Reference: append this step's K/V, then attend.
    int32_t row = 0;
    for (const auto& [seq, first, n] : rows)
      for (int32_t i = 0; i < n; ++i, ++row) {
        SeqKv& ks = k_[static_cast<size_t>(seq)];
        SeqKv& vs = v_[static_cast<size_t>(seq)];
        EXPECT_EQ(static_cast<int32_t>(ks.size()), first + i);
        ks.emplace_back(k.begin() + row * kvw, k.begin() + (row + 1) * kvw);
        vs.emplace_back(v.begin() + row * kvw, v.begin() + (row + 1) * kvw);
      }
    std::vector<double> ref(static_cast<size_t>(T * c.num_heads * D));
    row = 0;
    for (const auto& [seq, first, n] : rows)
      for (int32_t i = 0; i < n; ++i, ++row) {
        const int32_t pos = first + i;
        const int32_t lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
        for (int32_t h = 0; h < c.num_heads; ++h) {
          const int32_t kvh = h / (c.num_heads / c.num_kv_heads);
          const float* qh = &q[static_cast<size_t>((row * c.num_heads + h) * D)];
          const SeqKv& ks = k_[static_cast<size_t>(seq)];
          const SeqKv& vs = v_[static_cast<size_t>(seq)];
          const std::vector<double> head = ReferenceHead(
              D, lo, pos, p.scale, c.softcap, [&](int32_t d) { return qh[d]; },
              [&](int32_t j, int32_t d) { return ks[static_cast<size_t>(j)][static_cast<size_t>(kvh * D + d)]; },
              [&](int32_t j, int32_t d) { return vs[static_cast<size_t>(j)][static_cast<size_t>(kvh * D + d)]; },
              sink_values_.empty() ? -INFINITY : sink_values_[static_cast<size_t>(h)]);
          std::copy(head.begin(), head.end(), ref.begin() + (row * c.num_heads + h) * D);
        }
      }
    const std::vector<float> got = Download(b, out);
    worst_head_ = WorstHeadRelL2(got, ref, D);
    return RelL2(got, ref);
  }

  // f32: the parity mode (f32 kernels: split-K decode, f32 prefill); else bf16 mode, whose
  // attention is always the batch-invariant kernel. Tolerance: 1e-5 / 2e-2 relative L2.
  // Non-empty sinks [num_heads] become every Step's AttentionParams::sinks.
  std::unique_ptr<Backend> Setup(int32_t num_seqs, bool f32, std::vector<float> sinks = {}) {
    const AttnCase c = GetParam();
    CudaBackendOptions options;
    options.f32_compute = f32;
    auto created = CreateCudaBackend(0, options);
    EXPECT_TRUE(created.ok()) << created.status().message();
    auto b = std::move(created).value();
    EXPECT_TRUE(b->AllocateKvPool(kLayers, kBlocks, 16, c.num_kv_heads, c.head_dim).ok());
    // Shuffled, disjoint block ids per sequence so a wrong block table shows.
    std::vector<int32_t> ids(kBlocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(42));
    const size_t per_seq = kBlocks / static_cast<size_t>(num_seqs);
    blocks_.clear();
    for (int32_t s = 0; s < num_seqs; ++s)
      blocks_.emplace_back(ids.begin() + static_cast<int64_t>(s * per_seq),
                           ids.begin() + static_cast<int64_t>((s + 1) * per_seq));
    k_.assign(static_cast<size_t>(num_seqs), {});
    v_.assign(static_cast<size_t>(num_seqs), {});
    sink_values_ = std::move(sinks);
    sinks_.reset();
    if (!sink_values_.empty()) sinks_ = Weight(*b, sink_values_, {c.num_heads});
    return b;
  }

  std::vector<std::vector<int32_t>> blocks_;
  std::vector<SeqKv> k_, v_;
  std::vector<float> sink_values_;  // [num_heads] or empty
  std::optional<Tensor> sinks_;     // their upload
  double worst_head_ = 0;           // the last Step's WorstHeadRelL2
};

// mode 0: f32, 1: bf16 (the batch-invariant kernel).
TEST_P(AttentionTest, PrefillMixedAndDecode) {
  for (int mode : {0, 1}) {
    auto b = Setup(3, mode == 0);
    const double tol = mode == 0 ? 1e-5 : 2e-2;
    EXPECT_LT(Step(*b, {{0, 0, 40}, {1, 0, 23}}, 100), tol) << "prefill, mode " << mode;
    EXPECT_LT(Step(*b, {{0, 40, 1}, {1, 23, 9}, {2, 0, 5}}, 200), tol) << "mixed, mode " << mode;
    EXPECT_LT(Step(*b, {{0, 41, 1}, {1, 32, 1}, {2, 5, 1}}, 300), tol) << "decode, mode " << mode;
    EXPECT_LT(Step(*b, {{0, 42, 1}, {1, 33, 1}, {2, 6, 1}}, 400), tol) << "decode 2";
    // A chunk continuing a long history (its first rows see keys of earlier steps).
    EXPECT_LT(Step(*b, {{0, 43, 100}, {2, 7, 70}}, 450), tol) << "chunk, mode " << mode;
  }
}

TEST_P(AttentionTest, LongContextSplitK) {
  for (int mode : {0, 1}) {
    auto b = Setup(2, mode == 0);
    const double tol = mode == 0 ? 1e-5 : 2e-2;
    EXPECT_LT(Step(*b, {{0, 0, 1300}}, 500), tol) << "long prefill, mode " << mode;
    EXPECT_LT(Step(*b, {{0, 1300, 1}}, 600), tol) << "split-K decode, mode " << mode;
    EXPECT_LT(Step(*b, {{0, 1301, 1}, {1, 0, 1}}, 700), tol) << "split-K decode, short + long";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Values(AttnCase{64, 8, 2, 0, 0.f}, AttnCase{128, 8, 8, 16, 0.f},
                      AttnCase{80, 4, 1, 0, 30.f}, AttnCase{256, 4, 2, 100, 50.f},
                      AttnCase{96, 6, 3, 0, 0.f}, AttnCase{128, 32, 2, 0, 0.f},
                      AttnCase{256, 8, 1, 0, 0.f}, AttnCase{64, 4, 2, 24, 20.f}),
    AttnCaseName);

// Attention sinks against the reference with each head's sink in its denominator, both modes:
// a prefill and a chunk crossing the 512-key splits (bf16: direct rows and the sequential mode's
// final fold), decode of a long context (bf16: split mode and its combine kernel; f32: split-K
// and its combine) beside a short one (a single split: the direct normalisation), and decode of
// short contexts only (f32: one split). Each (row, head) is also held to a tolerance alone, so
// a head whose sink leaves its keys almost no weight is checked on its own scale.
class AttentionSinksTest : public AttentionTest {};

TEST_P(AttentionSinksTest, MatchReferenceBothModes) {
  const AttnCase c = GetParam();
  for (int mode : {0, 1}) {
    auto b = Setup(3, mode == 0, TestSinks(c.num_heads));
    const double tol = mode == 0 ? 1e-5 : 2e-2;
    const double head_tol = mode == 0 ? 1e-4 : 5e-2;
    auto check = [&](double err, const char* what) {
      EXPECT_LT(err, tol) << what << ", mode " << mode;
      EXPECT_LT(worst_head_, head_tol) << what << " (worst head), mode " << mode;
    };
    check(Step(*b, {{0, 0, 600}, {1, 0, 40}}, 1100), "prefill");
    check(Step(*b, {{0, 600, 700}, {2, 0, 9}}, 1200), "chunk");
    check(Step(*b, {{0, 1300, 1}, {1, 40, 1}}, 1300), "long decode");
    check(Step(*b, {{1, 41, 1}, {2, 9, 1}}, 1400), "short decode");
    check(Step(*b, {{0, 1301, 1}}, 1500), "long decode alone");
  }
}

// gpt-oss's shapes (head dim 64, 64 query heads over 8 KV heads, full and 128-key sliding
// window), head dim 128 with a group of 8, and sinks beside a soft-cap (the units agree).
INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionSinksTest,
    ::testing::Values(AttnCase{64, 64, 8, 0, 0.f}, AttnCase{64, 64, 8, 128, 0.f},
                      AttnCase{128, 16, 2, 0, 0.f}, AttnCase{128, 16, 2, 200, 0.f},
                      AttnCase{64, 8, 1, 0, 30.f}),
    AttnCaseName);

// ---- the bf16 KV pool ----

TEST_F(CudaOpsTest, KvElementBytes) {
  EXPECT_EQ(Make(false)->KvElementBytes(128), 2);  // bf16 mode, batch-invariant kernel: bf16
  EXPECT_EQ(Make(false)->KvElementBytes(72), 4);   // no invariant kernel: the f32 kernels
  EXPECT_EQ(Make(true)->KvElementBytes(128), 4);   // parity mode
  CudaBackendOptions options;
  options.kv_f32 = true;
  EXPECT_EQ(CreateCudaBackend(0, options).value()->KvElementBytes(128), 4);
}

// WriteKv stores V rounded to bf16 to nearest even, as the kernel's staging of an f32 pool does:
// a row at position 0 attends to its own key only (weight exactly 1), so its output is the
// stored V. Ties and near-ties of both mantissa parities, then random values.
TEST_F(CudaOpsTest, KvPoolStoresBf16RoundedToNearestEven) {
  const int32_t heads = 4, kv_heads = 2, D = 64, kvw = kv_heads * D;
  std::vector<float> v = Random(static_cast<size_t>(kvw), 77);
  const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u,
                              0xbf808000u, 0xbf818000u, 0x40490fdbu, 0x3eaaaaabu,
                              0x477fffffu, 0x00000001u, 0xc0a00001u, 0x41200000u};
  for (size_t i = 0; i < std::size(special); ++i) std::memcpy(&v[i], &special[i], 4);
  size_t rn_differs_from_truncation = 0;
  for (float x : v) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    float truncated;
    const uint32_t t = u & 0xffff0000u;
    std::memcpy(&truncated, &t, 4);
    rn_differs_from_truncation += RoundBf16(x) != truncated;
  }
  ASSERT_GT(rn_differs_from_truncation, 20u);  // the data can tell RN from truncation
  const std::vector<float> k = Random(static_cast<size_t>(kvw), 78);
  const std::vector<float> q = Random(static_cast<size_t>(heads * D), 79);
  for (bool kv_f32 : {false, true}) {
    CudaBackendOptions options;
    options.kv_f32 = kv_f32;
    auto created = CreateCudaBackend(0, options);
    ASSERT_TRUE(created.ok()) << created.status().message();
    Backend& b = **created;
    ASSERT_TRUE(b.AllocateKvPool(1, 4, 16, kv_heads, D).ok());
    ASSERT_TRUE(b.BeginStep(SimplePlan(1)).ok());
    Tensor qt = Upload(b, q, {1, heads, D});
    b.WriteKv(0, Upload(b, k, {1, kv_heads, D}), Upload(b, v, {1, kv_heads, D}));
    Tensor out = b.Alloc({1, heads * D});
    b.Attention(AttentionParams{0, heads, kv_heads, D, 0.125f, 0, 0.f}, qt, out);
    const std::vector<float> got = Download(b, out);
    size_t mismatches = 0;
    for (int32_t h = 0; h < heads; ++h)
      for (int32_t d = 0; d < D; ++d) {
        const float want = RoundBf16(v[static_cast<size_t>(h / (heads / kv_heads) * D + d)]);
        const float g = got[static_cast<size_t>(h * D + d)];
        if (g != want && ++mismatches <= 5)
          ADD_FAILURE() << "kv_f32 " << kv_f32 << " head " << h << " d " << d << ": " << g
                        << " != " << want;
      }
    EXPECT_EQ(mismatches, 0u) << "kv_f32 " << kv_f32;
  }
}

// ---- batch-invariant attention ----

using InvCase = AttnCase;

// Deterministic values for (kind, seq, pos, index): the same row gets the same Q/K/V whichever
// step computes it.
float HashValue(uint64_t kind, uint64_t seq, uint64_t pos, uint64_t idx) {
  uint64_t z = (kind << 60) ^ (seq << 44) ^ (pos << 20) ^ idx;
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) / 9007199254740992.0 * 4.0 - 2.0);
}

// The same query rows computed in different steps (decode alone, decode among 127 others, a
// prefill chunk among other chunks, prefills split at different chunk boundaries) are bitwise
// equal in the bf16 mode, across fixed key splits, and within tolerance of a double reference.
class AttentionInvariantTest : public CudaOpsTest,
                               public ::testing::WithParamInterface<InvCase> {
 protected:
  static constexpr int32_t kTargetPos = 1100;  // spans three 512-key splits
  static constexpr int32_t kTargetBlocks = 80, kOtherBlocks = 8, kOthers = 130;

  std::vector<int32_t> Blocks(int32_t seq) const {
    std::vector<int32_t> ids(static_cast<size_t>(seq == 0 ? kTargetBlocks : kOtherBlocks));
    std::iota(ids.begin(), ids.end(), seq == 0 ? 0 : kTargetBlocks + (seq - 1) * kOtherBlocks);
    std::reverse(ids.begin(), ids.end());  // non-contiguous order shows a wrong table
    return ids;
  }

  // The pool every case uses: the target's blocks and kOthers other sequences' blocks.
  static Status AllocatePool(Backend& b) {
    const InvCase c = GetParam();
    return b.AllocateKvPool(1, kTargetBlocks + kOthers * kOtherBlocks, 16, c.num_kv_heads,
                            c.head_dim);
  }

  // One step of (seq, first_pos, n) entries; returns out [num_tokens, heads * D].
  std::vector<float> Run(Backend& b, const std::vector<std::array<int32_t, 3>>& entries) {
    const InvCase c = GetParam();
    const int32_t D = c.head_dim;
    BatchPlan plan;
    std::vector<float> q, k, v;
    for (const auto& [seq, first, n] : entries) {
      plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(n), 1), first, Blocks(seq),
                       false);
      for (int32_t pos = first; pos < first + n; ++pos) {
        for (int32_t i = 0; i < c.num_heads * D; ++i) q.push_back(HashValue(1, seq, pos, i));
        for (int32_t i = 0; i < c.num_kv_heads * D; ++i) {
          k.push_back(HashValue(2, seq, pos, i));
          v.push_back(HashValue(3, seq, pos, i));
        }
      }
    }
    EXPECT_TRUE(b.BeginStep(plan).ok());
    const int32_t T = plan.num_tokens();
    Tensor qt = Upload(b, q, {T, c.num_heads, D});
    Tensor kt = Upload(b, k, {T, c.num_kv_heads, D});
    Tensor vt = Upload(b, v, {T, c.num_kv_heads, D});
    b.WriteKv(0, kt, vt);
    AttentionParams p{0, c.num_heads, c.num_kv_heads, D, 1.0f / std::sqrt(float(D)), c.window,
                      c.softcap};
    if (sinks_) p.sinks = &*sinks_;
    Tensor out = b.Alloc({T, c.num_heads * D});
    b.Attention(p, qt, out);
    return Download(b, out);
  }

  // Row `index` of a step's output.
  std::vector<float> Row(const std::vector<float>& out, int32_t index) const {
    const size_t w = static_cast<size_t>(GetParam().num_heads * GetParam().head_dim);
    return std::vector<float>(out.begin() + static_cast<int64_t>(index * w),
                              out.begin() + static_cast<int64_t>((index + 1) * w));
  }

  // Double-precision attention of the target sequence's row at `pos` over keys [lo, pos].
  std::vector<double> Reference(int32_t pos) const {
    const InvCase c = GetParam();
    const int32_t D = c.head_dim, group = c.num_heads / c.num_kv_heads;
    const int32_t lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
    std::vector<double> ref(static_cast<size_t>(c.num_heads * D));
    for (int32_t h = 0; h < c.num_heads; ++h) {
      const int32_t kvh = h / group;
      const std::vector<double> head = ReferenceHead(
          D, lo, pos, 1.0 / std::sqrt(static_cast<double>(D)), c.softcap,
          [&](int32_t d) { return HashValue(1, 0, pos, h * D + d); },
          [&](int32_t j, int32_t d) { return HashValue(2, 0, j, kvh * D + d); },
          [&](int32_t j, int32_t d) { return HashValue(3, 0, j, kvh * D + d); },
          sink_values_.empty() ? -INFINITY : sink_values_[static_cast<size_t>(h)]);
      std::copy(head.begin(), head.end(), ref.begin() + h * D);
    }
    return ref;
  }

  // Run's and Reference's sinks (AttentionParams::sinks) from now on, uploaded to `b`.
  void UseSinks(Backend& b, std::vector<float> sinks) {
    sink_values_ = std::move(sinks);
    sinks_ = Weight(b, sink_values_, {GetParam().num_heads});
  }

  // The target's rows are bitwise the same whatever the step: its one-chunk prefill [0, P]
  // (`whole`) against each of `chunkings` of it (the later chunks attend to the cached earlier
  // part), then row P decoded alone (few blocks: the split-mode path with the combine kernel),
  // among 127 other sequences, and inside a prefill chunk [P - 20, P] between other sequences'.
  void CheckRowsIndependentOfTheStep(
      Backend& b, const std::vector<std::vector<std::array<int32_t, 2>>>& chunkings,
      std::vector<float>* whole_out) {
    const int32_t P = kTargetPos;
    const std::vector<float> whole = Run(b, {{0, 0, P + 1}});
    for (size_t ci = 0; ci < chunkings.size(); ++ci) {
      std::vector<float> joined;
      for (const auto& [begin, end] : chunkings[ci]) {
        const std::vector<float> part = Run(b, {{0, begin, end - begin}});
        joined.insert(joined.end(), part.begin(), part.end());
      }
      ASSERT_EQ(joined.size(), whole.size());
      size_t mismatches = 0;
      for (size_t i = 0; i < whole.size(); ++i) mismatches += joined[i] != whole[i];
      EXPECT_EQ(mismatches, 0u) << "chunking " << ci << " differs from the one-chunk prefill";
    }
    const std::vector<float> row_p = Row(whole, P);
    EXPECT_EQ(Row(Run(b, {{0, P, 1}}), 0), row_p) << "decode alone";
    std::vector<std::array<int32_t, 3>> batch;
    for (int32_t s = 1; s <= 127; ++s) batch.push_back({s, (s * 7) % 100, 1});
    batch.insert(batch.begin() + 60, {0, P, 1});
    EXPECT_EQ(Row(Run(b, batch), 60), row_p) << "decode with 127 others";
    EXPECT_EQ(Row(Run(b, {{128, 0, 30}, {0, P - 20, 21}, {129, 0, 50}}), 30 + 20), row_p)
        << "prefill chunk among others";
    // Mixed steps, one launch per run of sequences of one block shape: decode rows, the target's
    // chunk, decode rows, another prefill chunk; then the target's decode row in such a step.
    std::vector<std::array<int32_t, 3>> mixed;
    for (int32_t s = 1; s <= 80; ++s) mixed.push_back({s, (s * 7) % 100, 1});
    mixed.insert(mixed.begin() + 40, {0, P - 20, 21});
    mixed.push_back({129, 0, 50});
    EXPECT_EQ(Row(Run(b, mixed), 40 + 20), row_p) << "prefill chunk in a mixed step";
    mixed[40] = {0, P, 1};
    EXPECT_EQ(Row(Run(b, mixed), 40), row_p) << "decode row in a mixed step";
    *whole_out = whole;
  }

  // 128 decode rows of the target sequence (one step) against its one-chunk prefill, bitwise.
  void CheckDecodeRowsEqualPrefill(Backend& b);

  std::vector<float> sink_values_;  // [num_heads] or empty
  std::optional<Tensor> sinks_;     // their upload
};

// The runs of one block shape a mixed step launches separately (group 4, D 128: up to 4 rows per
// KV head take the key-split decode shape, up to 64 the decode shape, more the prefill shape).
TEST(AttentionInvariantRunsTest, RunsOfOneShape) {
  using cuda::AttentionInvariantRuns;
  const auto runs = AttentionInvariantRuns({1, 1, 0, 1, 512, 200, 1, 12}, 4, 128);
  ASSERT_EQ(runs.size(), 4u);
  const int32_t want[4][3] = {{0, 4, 1}, {4, 2, 512}, {6, 1, 1}, {7, 1, 12}};
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].first_seq, want[i][0]) << "run " << i;
    EXPECT_EQ(runs[i].num_seqs, want[i][1]) << "run " << i;
    EXPECT_EQ(runs[i].max_query_len, want[i][2]) << "run " << i;
  }
  EXPECT_TRUE(AttentionInvariantRuns({1, 1, 1}, 4, 128).empty()) << "one shape: one launch";
  EXPECT_TRUE(AttentionInvariantRuns({1, 512, 1, 512, 1}, 4, 128).empty()) << "over the cap";
}

TEST_P(AttentionInvariantTest, RowsIndependentOfTheStep) {
  auto b = Make(false);
  ASSERT_TRUE(AllocatePool(*b).ok());
  const int32_t P = kTargetPos;
  std::vector<float> whole;
  CheckRowsIndependentOfTheStep(
      *b, {{{0, 700}, {700, P + 1}}, {{0, 64}, {64, 513}, {513, 1000}, {1000, P + 1}}}, &whole);
  if (HasFatalFailure()) return;
  // Against the double reference (the bf16 mode's tolerance), rows across the split bounds.
  for (int32_t pos : {0, 37, 511, 512, 700, 1023, 1024, P}) {
    EXPECT_LT(RelL2(Row(whole, pos), Reference(pos)), 2e-2) << "pos " << pos;
  }
}

// A prefill takes the kernel's two-m-tile block shape (Q in shared memory, mask-free whole tiles),
// a step of single rows the one-m-tile decode shape: every row lands in a different warp, m-tile
// and block position in the two, yet each row is bitwise the same. 128 decode rows of the target
// sequence (one step; the entries share its block table) against the one-chunk prefill: the first
// 48 rows (one tile), rows across the split and tile bounds, the last 64.
TEST_P(AttentionInvariantTest, PrefillRowsEqualDecodeRows) {
  auto b = Make(false);
  ASSERT_TRUE(AllocatePool(*b).ok());
  CheckDecodeRowsEqualPrefill(*b);
}

// The quantized pools (int8 and FP8 rows; at head dim 128 the kernel's direct f16 operands, else
// its bf16 tiles) keep every row bitwise the same whatever the step, as the bf16 pool does, and
// near the double reference of the unquantized values (their rounding: int8 ~0.7%, E4M3 ~4% a
// value).
TEST_P(AttentionInvariantTest, QuantizedPoolRowsIndependentOfTheStep) {
  const InvCase c = GetParam();
  for (const char* direct : {"1", "0"}) {
    if (c.head_dim != 128 && direct[0] == '0') continue;  // (only head dim 128 has both paths)
    const ScopedEnv env("EMBER_KV_DIRECT", direct);
    for (KvDType dtype : {KvDType::kInt8, KvDType::kFP8}) {
      SCOPED_TRACE(::testing::Message() << KvDTypeName(dtype) << " EMBER_KV_DIRECT=" << direct);
      auto b = Make(false);
      ASSERT_TRUE(b->SetKvFormat(KvFormat{{dtype}, true}, c.head_dim).ok());
      ASSERT_TRUE(AllocatePool(*b).ok());
      std::vector<float> whole;
      CheckRowsIndependentOfTheStep(*b, {{{0, 700}, {700, kTargetPos + 1}}}, &whole);
      if (HasFatalFailure()) return;
      for (int32_t pos : {0, 37, 511, 512, 1024, kTargetPos}) {
        EXPECT_LT(RelL2(Row(whole, pos), Reference(pos)), dtype == KvDType::kInt8 ? 2e-2 : 8e-2)
            << "pos " << pos;
      }
      CheckDecodeRowsEqualPrefill(*b);
    }
  }
}

// Shared by the two tests above: see PrefillRowsEqualDecodeRows.
void AttentionInvariantTest::CheckDecodeRowsEqualPrefill(Backend& b) {
  const int32_t P = kTargetPos;
  const std::vector<float> whole = Run(b, {{0, 0, P + 1}});
  std::vector<int32_t> positions;
  for (int32_t pos = 0; pos < 48; ++pos) positions.push_back(pos);
  for (int32_t pos : {63, 64, 65, 127, 128, 200, 511, 512, 513, 575, 576, 700, 1023, 1024, 1025,
                      1030}) {
    positions.push_back(pos);
  }
  for (int32_t pos = P - 63; pos <= P; ++pos) positions.push_back(pos);
  ASSERT_EQ(positions.size(), 128u);
  std::vector<std::array<int32_t, 3>> batch;
  for (int32_t pos : positions) batch.push_back({0, pos, 1});
  const std::vector<float> decode = Run(b, batch);
  size_t mismatched_rows = 0;
  for (size_t i = 0; i < positions.size(); ++i) {
    const bool same = Row(decode, static_cast<int32_t>(i)) == Row(whole, positions[i]);
    mismatched_rows += !same;
    EXPECT_TRUE(same) << "pos " << positions[i];
  }
  EXPECT_EQ(mismatched_rows, 0u);
}

// The bf16 pool (WriteKv rounds RN once) gives bitwise the attention of an f32 pool (the kernel
// rounds RN as it stages the tiles): prefill chunks, decode alone (split mode), decode in a batch.
TEST_P(AttentionInvariantTest, Bf16PoolMatchesF32Pool) {
  const InvCase c = GetParam();
  std::vector<std::vector<float>> outs[2];
  for (int f32_pool = 0; f32_pool < 2; ++f32_pool) {
    CudaBackendOptions options;
    options.kv_f32 = f32_pool == 1;
    auto created = CreateCudaBackend(0, options);
    ASSERT_TRUE(created.ok()) << created.status().message();
    Backend& b = **created;
    EXPECT_EQ(b.KvElementBytes(c.head_dim), f32_pool == 1 ? 4 : 2);
    ASSERT_TRUE(AllocatePool(b).ok());
    outs[f32_pool].push_back(Run(b, {{0, 0, 700}}));
    outs[f32_pool].push_back(Run(b, {{0, 700, kTargetPos + 1 - 700}, {1, 0, 40}}));
    outs[f32_pool].push_back(Run(b, {{0, kTargetPos, 1}}));
    std::vector<std::array<int32_t, 3>> batch;
    for (int32_t s = 2; s <= 127; ++s) batch.push_back({s, (s * 7) % 100, 1});
    batch.push_back({0, kTargetPos, 1});
    batch.push_back({1, 40, 1});
    outs[f32_pool].push_back(Run(b, batch));
  }
  ASSERT_EQ(outs[0].size(), outs[1].size());
  for (size_t step = 0; step < outs[0].size(); ++step) {
    ASSERT_EQ(outs[0][step].size(), outs[1][step].size());
    size_t mismatches = 0;
    for (size_t i = 0; i < outs[0][step].size(); ++i)
      mismatches += std::memcmp(&outs[0][step][i], &outs[1][step][i], 4) != 0;
    EXPECT_EQ(mismatches, 0u) << "step " << step << " of " << outs[0][step].size() << " values";
  }
}

// With attention sinks the bf16 mode's rows stay bitwise independent of the step: the sink enters
// the direct normalisation, the sequential mode's last fold and the combine kernel alike. The
// target's one-chunk prefill (rows in one split: direct; across splits: the sequential fold)
// against a chunked prefill, decode alone (split mode, the combine kernel), decode among 127 other
// sequences (sequential mode: 128 sequences x >= 2 KV heads fill the SMs), a prefill chunk among
// others, and one step of decode rows of the target at positions across the split bounds; rows
// against the double reference with sinks, per (row, head) too.
class AttentionInvariantSinksTest : public AttentionInvariantTest {};

TEST_P(AttentionInvariantSinksTest, RowsIndependentOfTheStep) {
  const InvCase c = GetParam();
  auto b = Make(false);
  ASSERT_TRUE(AllocatePool(*b).ok());
  UseSinks(*b, TestSinks(c.num_heads));
  const int32_t P = kTargetPos;
  std::vector<float> whole;
  CheckRowsIndependentOfTheStep(*b, {{{0, 700}, {700, P + 1}}}, &whole);
  if (HasFatalFailure()) return;
  const std::vector<int32_t> positions = {0, 37, 511, 512, 700, 1023, 1024, P};
  std::vector<std::array<int32_t, 3>> rows;
  for (int32_t pos : positions) rows.push_back({0, pos, 1});
  const std::vector<float> decode = Run(*b, rows);
  for (size_t i = 0; i < positions.size(); ++i) {
    const int32_t pos = positions[i];
    EXPECT_EQ(Row(decode, static_cast<int32_t>(i)), Row(whole, pos)) << "decode row, pos " << pos;
    const std::vector<double> ref = Reference(pos);
    EXPECT_LT(RelL2(Row(whole, pos), ref), 2e-2) << "pos " << pos;
    EXPECT_LT(WorstHeadRelL2(Row(whole, pos), ref, c.head_dim), 5e-2) << "pos " << pos;
  }
}

// gpt-oss's shapes (full and 128-key window), head dim 128 with groups of 8 (one with a
// soft-cap), head dim 64 with a group of 4 and a long window.
INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionInvariantSinksTest,
    ::testing::Values(InvCase{64, 64, 8, 0, 0.f}, InvCase{64, 64, 8, 128, 0.f},
                      InvCase{128, 16, 2, 0, 0.f}, InvCase{128, 32, 4, 300, 20.f},
                      InvCase{64, 8, 2, 700, 0.f}),
    AttnCaseName);

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionInvariantTest,
    ::testing::Values(InvCase{16, 8, 1, 0, 0.f}, InvCase{16, 4, 4, 100, 30.f},
                      InvCase{32, 4, 2, 0, 50.f}, InvCase{32, 8, 1, 700, 0.f},
                      InvCase{64, 8, 2, 0, 0.f}, InvCase{64, 8, 8, 300, 20.f},
                      InvCase{128, 32, 8, 0, 0.f}, InvCase{128, 8, 1, 600, 30.f},
                      InvCase{256, 8, 4, 0, 50.f}, InvCase{256, 4, 4, 600, 0.f},
                      InvCase{256, 16, 2, 100, 30.f}, InvCase{80, 4, 1, 0, 0.f}),
    AttnCaseName);

}  // namespace
}  // namespace ember
