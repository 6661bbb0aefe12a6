// The CUDA backend's ops of qwen3_next and deepseek_v3 against the CPU backend's on random
// inputs: CausalConv1dSilu, GatedDeltaRule and SigmoidGateMul over steps that carry the state
// (prefill chunks, decode rows, padding sequences sharing a slot, decode steps replayed from
// graphs, verification steps keeping per-row state snapshots); MlaAttention over the latent pool
// (prefill then decode, both rope layouts) and its pool rows; MoeMlp with deepseek_v3's grouped
// sigmoid routing. f32 compute mode, relative L2 within 1e-5 (1e-4 for MLA, whose sums run in
// another order); MLA also in the bf16 mode (its tensor-core path, 2e-2, and row-invariant
// bitwise). Skips when no CUDA device is present (CI has none). One of the sources of the
// cuda_ops_test binary.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_test_util.h"

namespace ember {
namespace {

using namespace cuda_test;

class CudaArchOpsTest : public CudaOpsTest {
 protected:
  // The CPU twin (one thread: the reference's order is the kernels' per-sequence order).
  static std::unique_ptr<Backend> MakeCpu() {
    CpuBackendOptions options;
    options.num_threads = 1;
    return MakeCpuBackend(options);
  }
  // A step buffer holding `host` on either backend.
  Tensor Put(Backend& b, const std::vector<float>& host, std::initializer_list<int64_t> shape) {
    if (b.name() != "cpu") return Upload(b, host, shape);
    Tensor t = b.Alloc(shape);
    std::memcpy(t.data, host.data(), host.size() * sizeof(float));
    return t;
  }
  static std::vector<double> D(const std::vector<float>& v) { return {v.begin(), v.end()}; }
  static MlaParams Mla(int32_t layer, int32_t heads, int32_t nope, int32_t rope, int32_t v,
                       int32_t latent, float scale, bool interleave, const Tensor& kv_b) {
    MlaParams p;
    p.layer = layer;
    p.num_heads = heads;
    p.nope_dim = nope;
    p.rope_dim = rope;
    p.v_dim = v;
    p.latent_dim = latent;
    p.scale = scale;
    p.rope_interleave = interleave;
    p.kv_b = &kv_b;
    return p;
  }
  // A float32 weight an own kernel reads as float32 (MLA's kv_b), as the loader uploads it.
  Tensor F32Weight(Backend& b, const std::vector<float>& host, std::vector<int64_t> shape) {
    auto r = b.UploadF32Weight("kv_b", shape, host.data());
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.value();
  }
};

// (state slot, first position, rows) per sequence of a step.
using StepSeqs = std::vector<std::tuple<int32_t, int32_t, int32_t>>;

// The step's plan; snapshots[i] >= 0 gives sequence i that snapshot slot.
BatchPlan RecurrentPlan(const StepSeqs& seqs, const std::vector<int32_t>& snapshots = {}) {
  BatchPlan plan;
  int32_t next_block = 0;
  for (const auto& [slot, first, len] : seqs) {
    std::vector<int32_t> tokens(static_cast<size_t>(len), 1);
    std::vector<int32_t> blocks;
    for (int32_t b = 0; b <= (first + len) / plan.block_size; ++b) blocks.push_back(next_block++);
    plan.AddSequence(tokens, first, blocks, true);
    plan.seqs.back().state_slot = slot;
    const size_t i = plan.seqs.size() - 1;
    if (i < snapshots.size()) plan.seqs.back().snapshot_slot = snapshots[i];
  }
  return plan;
}

// On two CUDA backends, the f32 (parity) mode and the bf16 mode, whose steps need not be
// batch-invariant: there a long sequence's delta rule takes the chunked form (kernels.h's
// GatedDeltaArgs::chunked_min_rows), within 1e-4 of the recurrence and not its bits.
TEST_F(CudaArchOpsTest, RecurrentOpsMatchCpuAcrossSteps) {
  // Prefill chunks, a later chunk continuing, a new sequence, padding sequences sharing slot 3
  // (walked in plan order), then all-decode steps (captured, then replayed as graphs: steps of
  // one shape two steps apart share the staging half), then a prefill chunk again.
  const std::vector<StepSeqs> steps = {
      {{0, 0, 5}, {1, 0, 3}},
      {{0, 5, 1}, {1, 3, 4}, {2, 0, 2}},
      {{0, 6, 1}, {1, 7, 1}, {3, 0, 1}, {3, 0, 1}},
      {{0, 7, 1}, {1, 8, 1}, {2, 2, 1}},
      {{0, 8, 1}, {1, 9, 1}, {2, 3, 1}},
      {{0, 9, 1}, {1, 10, 1}, {2, 4, 1}},  // the same shapes again: graph replays
      {{0, 10, 1}, {1, 11, 1}, {2, 5, 1}},
      {{2, 6, 6}, {0, 11, 1}},
  };
  struct Shape {
    int32_t k_heads, v_heads, dk, dv, kernel;
  };
  for (const Shape& sh : {Shape{2, 4, 16, 16, 4}, Shape{2, 4, 64, 48, 4}, Shape{1, 2, 128, 128, 3}}) {
    SCOPED_TRACE(::testing::Message() << "dk " << sh.dk << " dv " << sh.dv);
    const int64_t conv_dim = 2 * int64_t{sh.k_heads} * sh.dk + int64_t{sh.v_heads} * sh.dv;
    const int64_t v_width = int64_t{sh.v_heads} * sh.dv;
    const int64_t window = (sh.kernel - 1) * conv_dim;
    const int64_t slot_floats = 7 + window + v_width * sh.dk;  // an offset before the layer
    const std::vector<float> conv_w = Random(static_cast<size_t>(conv_dim * sh.kernel), 1, 0.5f);
    const std::vector<float> a_log = Random(static_cast<size_t>(sh.v_heads), 2, 0.5f);
    const std::vector<float> dt_bias = Random(static_cast<size_t>(sh.v_heads), 3, 0.5f);
    std::unique_ptr<Backend> cpu = MakeCpu(), gpu = Make(true), gpu_bf16;
    {
      const ScopedEnv env("EMBER_DELTA_CHUNKED", "1");
      gpu_bf16 = Make(false);
    }
    constexpr int32_t kSlots = 10;  // 0-3 the sequences', 4-9 snapshots
    constexpr int kBackends = 3;    // the CPU, the reference; the GPU's two modes
    struct Weights {
      Tensor conv, a_log, dt_bias;
    } w[kBackends];
    Backend* be[kBackends] = {cpu.get(), gpu.get(), gpu_bf16.get()};
    for (int i = 0; i < kBackends; ++i) {
      ASSERT_TRUE(be[i]->AllocateKvPool(1, 64, 16, 1, 16).ok());
      ASSERT_TRUE(be[i]->AllocateStateSlots(kSlots, slot_floats).ok());
      w[i] = {F32Weight(*be[i], conv_w, {conv_dim, sh.kernel}),
              F32Weight(*be[i], a_log, {sh.v_heads}), F32Weight(*be[i], dt_bias, {sh.v_heads})};
    }
    // One step of `seqs` on the backends, compared (s seeds its inputs). `chunked`: the bf16
    // mode takes the chunked form for some sequence of the step.
    auto run_step = [&](const StepSeqs& seqs, size_t s, const std::vector<int32_t>& snaps = {},
                        bool chunked = false) {
      SCOPED_TRACE(::testing::Message() << "step " << s);
      const BatchPlan plan = RecurrentPlan(seqs, snaps);
      const int64_t n = plan.num_tokens();
      const std::vector<float> qkv = Random(static_cast<size_t>(n * conv_dim), 10 + s);
      const std::vector<float> ba = Random(static_cast<size_t>(n * 2 * sh.v_heads), 20 + s);
      const std::vector<float> gate = Random(static_cast<size_t>(n * sh.v_heads), 30 + s);
      std::vector<float> conv_out[kBackends], core[kBackends];
      for (int i = 0; i < kBackends; ++i) {
        Backend& b = *be[i];
        ASSERT_TRUE(b.BeginStep(plan).ok());
        Tensor x = Put(b, qkv, {n, conv_dim});
        Tensor tba = Put(b, ba, {n, 2 * int64_t{sh.v_heads}});
        Tensor tg = Put(b, gate, {n, int64_t{sh.v_heads}});
        Tensor out = b.Alloc({n, v_width});
        ASSERT_TRUE(b.CausalConv1dSilu(x, w[i].conv, 7).ok());
        GatedDeltaParams p;
        p.num_k_heads = sh.k_heads;
        p.num_v_heads = sh.v_heads;
        p.k_head_dim = sh.dk;
        p.v_head_dim = sh.dv;
        p.a_log = &w[i].a_log;
        p.dt_bias = &w[i].dt_bias;
        p.state_offset = 7 + window;
        ASSERT_TRUE(b.GatedDeltaRule(p, x, tba, out).ok());
        ASSERT_TRUE(b.SigmoidGateMul(out, tg).ok());
        conv_out[i] = Download(b, x);
        core[i] = Download(b, out);
      }
      for (int i = 1; i < kBackends; ++i) {
        EXPECT_LT(RelL2(conv_out[i], D(conv_out[0])), 1e-5) << "conv, backend " << i;
        EXPECT_LT(RelL2(core[i], D(core[0])), chunked && i == 2 ? 1e-4 : 1e-5)
            << "delta rule, backend " << i;
      }
      // Both GPU modes run the same row-by-row kernels (the same bits) unless chunked.
      EXPECT_EQ(core[1] == core[2], !chunked)
          << "the chunked form " << (chunked ? "not " : "") << "taken";
    };
    for (size_t s = 0; s < steps.size(); ++s) run_step(steps[s], s);
    // The decode steps ran from captured graphs, two of them replayed.
    EXPECT_GE(CudaGetGraphStats(*gpu).replays, 2);
    EXPECT_GE(CudaGetGraphStats(*gpu_bf16).replays, 2);
    // A checkpoint copy (CopyStateSlot, the prefix cache's) continues where its source was.
    for (int i = 0; i < kBackends; ++i) ASSERT_TRUE(be[i]->CopyStateSlot(0, 3).ok());
    run_step({{3, 12, 2}}, steps.size());
    EXPECT_FALSE(gpu->CopyStateSlot(0, kSlots).ok());  // outside the slots
    // The tiers' host copies: slot 3 read back equals the CPU's, and written into slot 1 it
    // continues as slot 3 does.
    std::vector<uint8_t> host[kBackends];
    auto expect_slot_equal = [&](int32_t slot, const char* what, double tol = 1e-5) {
      for (int i = 0; i < kBackends; ++i) {
        host[i].resize(static_cast<size_t>(slot_floats) * 4);
        ASSERT_TRUE(be[i]->CopyStateSlotToHost(slot, host[i]).ok());
      }
      std::vector<float> got(static_cast<size_t>(slot_floats)), want(got.size());
      std::memcpy(want.data(), host[0].data(), host[0].size());
      for (int i = 1; i < kBackends; ++i) {
        std::memcpy(got.data(), host[i].data(), host[i].size());
        EXPECT_LT(RelL2(got, D(want)), i == 2 ? tol : 1e-5)
            << what << ", slot " << slot << ", backend " << i;
      }
    };
    expect_slot_equal(3, "state read back");
    for (int i = 0; i < kBackends; ++i) ASSERT_TRUE(be[i]->CopyStateSlotFromHost(1, host[i]).ok());
    run_step({{1, 14, 1}}, steps.size() + 1);
    EXPECT_FALSE(gpu->CopyStateSlotToHost(kSlots, host[1]).ok());
    EXPECT_FALSE(gpu->CopyStateSlotFromHost(1, std::span<const uint8_t>(host[1]).first(4)).ok());
    // Verification steps with snapshots (speculative decoding): slot 0 verifies 4 rows into
    // snapshots 4-6, slot 1 one row (none kept), slot 2 3 rows into 7-8; each snapshot equals
    // the CPU's, and a rollback (CopyStateSlot from a snapshot) continues from it. Then the same
    // shapes again with other snapshot slots: a graph replay reads them from the plan.
    run_step({{0, 12, 4}, {1, 15, 1}, {2, 12, 3}}, steps.size() + 2, {4, 9, 7});
    for (int32_t slot = 4; slot <= 8; ++slot) expect_slot_equal(slot, "snapshot");
    for (int i = 0; i < kBackends; ++i) ASSERT_TRUE(be[i]->CopyStateSlot(5, 0).ok());
    for (int i = 0; i < kBackends; ++i) ASSERT_TRUE(be[i]->CopyStateSlot(7, 2).ok());
    run_step({{0, 14, 4}, {1, 16, 1}, {2, 13, 3}}, steps.size() + 3, {6, -1, 4});
    for (int32_t slot : {6, 7, 8, 4, 5}) expect_slot_equal(slot, "snapshot after rollback");
    for (int32_t slot = 0; slot < 3; ++slot) expect_slot_equal(slot, "state after rollback");
    // Long chunks (the bf16 mode's chunked form: 300 rows = 4 whole chunks and one of 44, 128 =
    // the least it takes) beside decode rows and a verification step's snapshots (row by row),
    // then decode and a fresh long sequence; the states they leave.
    run_step({{0, 18, 300}, {2, 16, 128}, {1, 17, 1}}, steps.size() + 4, {}, true);
    for (int32_t slot = 0; slot < 3; ++slot) expect_slot_equal(slot, "state after chunks", 1e-4);
    run_step({{0, 318, 1}, {2, 144, 130}, {1, 18, 3}}, steps.size() + 5, {-1, -1, 4}, true);
    run_step({{3, 0, 200}, {0, 319, 1}}, steps.size() + 6, {}, true);
    for (int32_t slot : {0, 1, 2, 3, 4, 5}) expect_slot_equal(slot, "state after chunks", 1e-4);
  }
}

TEST_F(CudaArchOpsTest, MlaAttentionMatchesCpu) {
  struct Shape {
    int32_t heads, nope, rope, v, latent;
    bool interleave;
  };
  for (const bool f32 : {true, false})
  for (const Shape& sh : {Shape{4, 16, 8, 16, 16, true}, Shape{3, 32, 16, 24, 64, false},
                          Shape{2, 128, 64, 128, 512, true}}) {
    SCOPED_TRACE(::testing::Message() << (f32 ? "f32" : "bf16") << " latent " << sh.latent
                                      << " rope " << sh.rope);
    const int32_t width = sh.latent + sh.rope, qd = sh.nope + sh.rope;
    const std::vector<float> kv_b = Random(
        static_cast<size_t>(sh.heads * (sh.nope + sh.v) * sh.latent), 40, 0.2f);
    std::unique_ptr<Backend> cpu = MakeCpu(), gpu = Make(f32);
    Backend* be[2] = {cpu.get(), gpu.get()};
    Tensor wkv[2];
    int32_t rope_id[2];
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(be[i]->AllocateLatentKvPool(2, 8, 16, width).ok());
      wkv[i] = F32Weight(*be[i], kv_b, {int64_t{sh.heads} * (sh.nope + sh.v), sh.latent});
      RopeSpec spec;
      spec.head_dim = sh.rope;
      spec.rotary_dim = sh.rope;
      spec.max_positions = 256;
      auto id = be[i]->CreateRope(spec);
      ASSERT_TRUE(id.ok()) << id.message();
      rope_id[i] = *id;
    }
    ASSERT_EQ(gpu->KvBlockBytes(), cpu->KvBlockBytes());
    // A prefill of 20 and of 5 rows, then a decode row beside a 3-row chunk.
    const std::vector<std::vector<std::tuple<int32_t, int32_t, std::vector<int32_t>>>> steps = {
        {{0, 20, {0, 1}}, {0, 5, {2, 3}}}, {{20, 1, {0, 1}}, {5, 3, {2, 3}}}};
    for (size_t s = 0; s < steps.size(); ++s) {
      SCOPED_TRACE(::testing::Message() << "step " << s);
      BatchPlan plan;
      for (const auto& [first, len, blocks] : steps[s])
        plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(len), 1), first, blocks, true);
      const int64_t n = plan.num_tokens();
      const std::vector<float> q = Random(static_cast<size_t>(n * sh.heads * qd), 50 + s);
      const std::vector<float> c = Random(static_cast<size_t>(n * sh.latent), 60 + s);
      const std::vector<float> k_rope = Random(static_cast<size_t>(n * sh.rope), 70 + s);
      std::vector<float> out[2], q_rot[2];
      for (int i = 0; i < 2; ++i) {
        Backend& b = *be[i];
        ASSERT_TRUE(b.BeginStep(plan).ok());
        Tensor tq = Put(b, q, {n, sh.heads, qd});
        Tensor tc = Put(b, c, {n, sh.latent});
        Tensor tk = Put(b, k_rope, {n, sh.rope});
        Tensor to = b.Alloc({n, int64_t{sh.heads} * sh.v});
        b.MlaAttention(rope_id[i],
                       Mla(1, sh.heads, sh.nope, sh.rope, sh.v, sh.latent, 0.3f, sh.interleave,
                           wkv[i]),
                       tq, tc, tk, to);
        out[i] = Download(b, to);
        q_rot[i] = Download(b, tq);
      }
      EXPECT_LT(RelL2(q_rot[1], D(q_rot[0])), 1e-5) << "rotated q";
      // (bf16: the tensor-core path, bf16 operands)
      EXPECT_LT(RelL2(out[1], D(out[0])), f32 ? 1e-4 : 2e-2) << "attention";
    }
    // The pool's rows (layer 1 written, layer 0 zeros), as the block copies lay them out.
    for (int32_t block : {0, 3}) {
      std::vector<uint8_t> bytes[2];
      for (int i = 0; i < 2; ++i) {
        bytes[i].resize(static_cast<size_t>(be[i]->KvBlockBytes()));
        ASSERT_TRUE(be[i]->CopyKvBlockToHost(block, bytes[i]).ok());
      }
      std::vector<float> f[2];
      for (int i = 0; i < 2; ++i) {
        f[i].resize(bytes[i].size() / 4);
        std::memcpy(f[i].data(), bytes[i].data(), bytes[i].size());
      }
      EXPECT_LT(RelL2(f[1], D(f[0])), 1e-5) << "pool block " << block;
    }
  }
}

// The bf16 mode's tensor-core MLA (LaunchMlaAttentionFlash) at DeepSeek-V3's head shape: within
// bf16 rounding of the CPU's f32 result over prefills spanning several 32-key tiles, and each row's
// result independent of the step around it: token 79 decoded alone (one 16-row m-tile per block,
// a 1-row absorb product) gives the bits it had as the last row of an 80-token prefill batched
// with another sequence (two m-tiles per block, an 85-row product); both without and with key
// splits.
TEST_F(CudaArchOpsTest, MlaAttentionBf16MatchesCpuAndIsRowInvariant) {
  const int32_t heads = 128, nope = 128, rope = 64, v = 128, latent = 512;
  const int32_t width = latent + rope, qd = nope + rope;
  const std::vector<float> kv_b =
      Random(static_cast<size_t>(heads * (nope + v) * latent), 41, 0.05f);
  const int32_t len_a = 80, len_b = 5;
  const std::vector<float> q_a = Random(static_cast<size_t>(len_a * heads * qd), 51);
  const std::vector<float> c_a = Random(static_cast<size_t>(len_a * latent), 61);
  const std::vector<float> k_a = Random(static_cast<size_t>(len_a * rope), 71);
  const std::vector<float> q_b = Random(static_cast<size_t>(len_b * heads * qd), 52);
  const std::vector<float> c_b = Random(static_cast<size_t>(len_b * latent), 62);
  const std::vector<float> k_b = Random(static_cast<size_t>(len_b * rope), 72);
  struct Part {  // rows [first, first + len) of sequence a (0) or b (1)
    int seq;
    int32_t first, len;
  };
  const std::vector<int32_t> blocks_a = {0, 1, 2, 3, 4}, blocks_b = {8};
  auto slice = [](const std::vector<float>& x, int32_t first, int32_t len, int64_t per_row) {
    return std::vector<float>(x.begin() + first * per_row, x.begin() + (first + len) * per_row);
  };
  // Runs the steps on a fresh backend; returns the last step's output.
  auto run = [&](Backend& b, const std::vector<std::vector<Part>>& steps) {
    EXPECT_TRUE(b.AllocateLatentKvPool(1, 16, 16, width).ok());
    const Tensor wkv = F32Weight(b, kv_b, {int64_t{heads} * (nope + v), latent});
    RopeSpec spec;
    spec.head_dim = rope;
    spec.rotary_dim = rope;
    spec.max_positions = 256;
    auto rope_id = b.CreateRope(spec);
    EXPECT_TRUE(rope_id.ok());
    std::vector<float> out;
    for (const std::vector<Part>& step : steps) {
      BatchPlan plan;
      std::vector<float> q, c, k;
      for (const Part& part : step) {
        plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(part.len), 1), part.first,
                         part.seq == 0 ? blocks_a : blocks_b, true);
        const auto& [qs, cs, ks] = part.seq == 0 ? std::tie(q_a, c_a, k_a) : std::tie(q_b, c_b, k_b);
        for (auto [dst, src, per] : {std::tuple{&q, &qs, int64_t{heads} * qd},
                                     std::tuple{&c, &cs, int64_t{latent}},
                                     std::tuple{&k, &ks, int64_t{rope}}}) {
          const std::vector<float> rows = slice(*src, part.first, part.len, per);
          dst->insert(dst->end(), rows.begin(), rows.end());
        }
      }
      const int64_t n = plan.num_tokens();
      EXPECT_TRUE(b.BeginStep(plan).ok());
      Tensor tq = Put(b, q, {n, heads, qd});
      Tensor tc = Put(b, c, {n, latent});
      Tensor tk = Put(b, k, {n, rope});
      Tensor to = b.Alloc({n, int64_t{heads} * v});
      b.MlaAttention(*rope_id, Mla(0, heads, nope, rope, v, latent, 0.07f, true, wkv), tq, tc,
                     tk, to);
      if (b.name() == "cpu") {
        out.assign(static_cast<const float*>(to.data),
                   static_cast<const float*>(to.data) + to.numel());
      } else {
        out = Download(b, to);
      }
    }
    return out;
  };
  const std::vector<std::vector<Part>> batched = {{{0, 0, len_a}, {1, 0, len_b}}};
  const std::vector<std::vector<Part>> decoded = {{{0, 0, len_a - 1}}, {{0, len_a - 1, 1}}};
  std::unique_ptr<Backend> cpu = MakeCpu();
  const std::vector<float> ref = run(*cpu, batched);
  // The default key splits (1,024 keys: none at these lengths), then splits of 32 keys (rows
  // past key 31 folded from up to three split states by MlaSplitFoldKernel). Batch-invariant
  // steps split every row by position: a decoded row is its prefill row's bits. The default
  // steps split only the decode step (8 blocks): both within bf16 rounding of the CPU.
  const size_t row = static_cast<size_t>(heads) * v;
  const std::vector<float> ref_last(ref.begin() + (len_a - 1) * row, ref.begin() + len_a * row);
  for (const char* split_keys : {"", "32"}) {
    SCOPED_TRACE(::testing::Message() << "EMBER_MLA_SPLIT_KEYS=" << split_keys);
    std::unique_ptr<Backend> inv, inv2, plain, plain2;
    {
      const ScopedEnv env("EMBER_MLA_SPLIT_KEYS", split_keys);
      inv = MakeInvariant();
      inv2 = MakeInvariant();
      plain = Make(false);
      plain2 = Make(false);
    }
    const std::vector<float> got = run(*inv, batched);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_LT(RelL2(got, D(ref)), 2e-2) << "bf16 MLA against the CPU's f32";
    const std::vector<float> last = run(*inv2, decoded);
    ASSERT_EQ(last.size(), row);
    const std::vector<float> in_prefill(got.begin() + (len_a - 1) * row, got.begin() + len_a * row);
    EXPECT_EQ(std::memcmp(last.data(), in_prefill.data(), row * sizeof(float)), 0)
        << "token 79 decoded alone differs from its row in the batched prefill";
    EXPECT_LT(RelL2(run(*plain, batched), D(ref)), 2e-2) << "default steps, prefill";
    EXPECT_LT(RelL2(run(*plain2, decoded), D(ref_last)), 2e-2) << "default steps, decode";
  }
}

TEST_F(CudaArchOpsTest, GroupedRoutingMoeMatchesCpu) {
  const int32_t num_experts = 16, d = 64, inter = 32;
  std::unique_ptr<Backend> cpu = MakeCpu(), gpu = Make(true);
  const std::vector<float> router = Random(static_cast<size_t>(num_experts * d), 80, 0.3f);
  const std::vector<float> bias = Random(static_cast<size_t>(num_experts), 81, 0.1f);
  std::vector<std::vector<float>> gate, up, down;
  for (int32_t e = 0; e < num_experts; ++e) {
    gate.push_back(Random(static_cast<size_t>(inter * d), 100 + e, 0.2f));
    up.push_back(Random(static_cast<size_t>(inter * d), 200 + e, 0.2f));
    down.push_back(Random(static_cast<size_t>(d * inter), 300 + e, 0.2f));
  }
  auto upload = [&](Backend& b) {
    MoeExperts x;
    x.router = Weight(b, router, {num_experts, d});
    for (int32_t e = 0; e < num_experts; ++e) {
      x.gate.push_back(Weight(b, gate[static_cast<size_t>(e)], {inter, d}));
      x.up.push_back(Weight(b, up[static_cast<size_t>(e)], {inter, d}));
      x.down.push_back(Weight(b, down[static_cast<size_t>(e)], {d, inter}));
    }
    x.routing = MoeRouting::kSigmoidGrouped;
    x.score_bias = Weight(b, bias, {num_experts});
    x.groups = 4;
    x.top_groups = 2;
    x.top_k = 3;
    x.normalize = true;
    x.scale = 2.5f;
    return x;
  };
  MoeExperts e_cpu = upload(*cpu), e_gpu = upload(*gpu);
  for (Backend* b : {cpu.get(), gpu.get()}) ASSERT_TRUE(b->AllocateKvPool(1, 16, 16, 1, 16).ok());
  for (const int32_t rows : {1, 5, 100}) {  // by pair, the fused route, the route kernel
    SCOPED_TRACE(::testing::Message() << "rows " << rows);
    const BatchPlan plan = SimplePlan(rows);
    const std::vector<float> x = Random(static_cast<size_t>(rows * d), 90 + rows);
    std::vector<float> out[2];
    int i = 0;
    for (Backend* b : {cpu.get(), gpu.get()}) {
      ASSERT_TRUE(b->BeginStep(plan).ok());
      Tensor tx = Put(*b, x, {rows, d});
      Tensor to = b->Alloc({rows, d});
      b->MoeMlp(tx, i == 0 ? e_cpu : e_gpu, to);
      out[i++] = Download(*b, to);
    }
    EXPECT_LT(RelL2(out[1], D(out[0])), 1e-5);
  }
}

}  // namespace
}  // namespace ember
