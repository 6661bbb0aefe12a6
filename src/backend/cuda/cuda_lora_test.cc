// The CUDA LoraDelta (cuda_lora.cc, lora.cu) against the CPU backend's on random segments: mixed
// ranks (1 to 64), rows left outside every segment (untouched), a call with no segments, row
// counts and widths that are not multiples of the kernels' tiles, f32 and bf16 x and out, the
// adapters uploaded through UploadLoraSlot (a slot reloaded in place with a larger adapter);
// each row's result equal to its segment run alone (bitwise); decode steps replayed from one
// CUDA graph with segments that change between steps.
// Tolerances, relative L2 of the update (out after - out before): f32 mode 1e-5; bf16 mode 1e-5
// against a CPU reference over the bf16-rounded weights (and x, where x is bf16), 1e-2 where out
// is bf16 (the sum is rounded once to bf16). Skips when no CUDA device is present (CI has none).
// One of the sources of the cuda_ops_test binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_test_util.h"

namespace ember {
namespace {

using namespace cuda_test;

struct HostAdapter {
  int64_t rank = 0;
  std::vector<float> a, b;  // [rank, k], [m, rank]
};

HostAdapter RandomAdapter(int64_t rank, int64_t k, int64_t m, uint32_t seed, bool round_bf16) {
  HostAdapter h{rank, Random(static_cast<size_t>(rank * k), seed, 0.1f),
                Random(static_cast<size_t>(m * rank), seed + 1, 0.1f)};
  if (round_bf16) {
    for (float& v : h.a) v = RoundBf16(v);
    for (float& v : h.b) v = RoundBf16(v);
  }
  return h;
}

// The adapters as one backend's slot tensors: tensors[i] = {a, b} of adapter i (slot i).
std::vector<std::vector<Tensor>> UploadSlots(Backend& be, const std::vector<HostAdapter>& ads,
                                             int64_t k, int64_t m) {
  std::vector<std::vector<Tensor>> out;
  for (size_t i = 0; i < ads.size(); ++i) {
    const LoraHostMatrix mats[] = {{ads[i].a.data(), ads[i].rank, k},
                                   {ads[i].b.data(), m, ads[i].rank}};
    auto r = be.UploadLoraSlot(static_cast<int32_t>(i), mats);
    EXPECT_TRUE(r.ok()) << r.status().message();
    out.push_back(std::move(r).value());
  }
  return out;
}

struct Span {
  int64_t first, rows;
  int adapter;
};

std::vector<LoraSegment> Segments(const std::vector<Span>& spans,
                                  const std::vector<std::vector<Tensor>>& slots) {
  std::vector<LoraSegment> segs;
  for (const Span& s : spans)
    segs.push_back(LoraSegment{s.first, s.rows, &slots[static_cast<size_t>(s.adapter)][0],
                               &slots[static_cast<size_t>(s.adapter)][1]});
  return segs;
}

// out0 + the CPU LoraDelta of `spans` (x and the adapters as given).
std::vector<float> CpuReference(const std::vector<float>& x, const std::vector<float>& out0,
                                int64_t n, int64_t k, int64_t m,
                                const std::vector<HostAdapter>& ads,
                                const std::vector<Span>& spans) {
  auto cpu = MakeCpuBackend(CpuBackendOptions{});
  const auto slots = UploadSlots(*cpu, ads, k, m);
  BatchPlan plan;
  std::vector<int32_t> blocks(static_cast<size_t>(n / plan.block_size + 1));
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(n), 1), 0, blocks, false);
  EXPECT_TRUE(
      cpu->AllocateKvPool(1, static_cast<int32_t>(blocks.size()), plan.block_size, 1, 8).ok());
  EXPECT_TRUE(cpu->BeginStep(plan).ok());
  Tensor xt = cpu->Alloc({n, k}), ot = cpu->Alloc({n, m});
  std::memcpy(xt.data, x.data(), x.size() * 4);
  std::memcpy(ot.data, out0.data(), out0.size() * 4);
  cpu->LoraDelta(xt, Segments(spans, slots), ot);
  const float* o = static_cast<const float*>(ot.data);
  return std::vector<float>(o, o + n * m);
}

// got equals want bitwise (exact), else within relative L2 `tol` of it.
void ExpectSameOrClose(const std::vector<float>& got, const std::vector<float>& want, bool exact,
                       double tol) {
  ASSERT_EQ(got.size(), want.size());
  if (exact) {
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  } else {
    EXPECT_LT(RelL2(got, std::vector<double>(want.begin(), want.end())), tol);
  }
}

// The update's relative L2 error: (got - out0) against (ref - out0).
double UpdateError(const std::vector<float>& got, const std::vector<float>& ref,
                   const std::vector<float>& out0) {
  std::vector<float> d(got.size());
  std::vector<double> r(got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    d[i] = got[i] - out0[i];
    r[i] = static_cast<double>(ref[i]) - out0[i];
  }
  return RelL2(d, r);
}

struct Mode {
  const char* name;
  bool f32, invariant, bf16_x, bf16_out;
};

// How a one-row MatMulGroupLora / GateUpActivationLora runs: the update inside the GEMV launch
// (EMBER_LORA_GEMV_FUSED=1), as the GEMV's bias (the fold), or as the default's separate calls
// (EMBER_LORA_BIAS_FOLD=0).
enum class OneRow { kFused, kFold, kOff };
const char* OneRowName(OneRow mode) {
  return mode == OneRow::kFused ? "fused" : mode == OneRow::kFold ? "fold" : "fold off";
}
// A bf16-mode backend for `mode` (op profile on: the fused mode runs no LoraDelta op).
// graphs: decode steps as captured graphs, else launched op by op (profiled: with events around
// every op, else back to back).
std::unique_ptr<Backend> MakeOneRow(OneRow mode, bool graphs = false, bool profiled = true) {
  const ScopedEnv fold("EMBER_LORA_BIAS_FOLD", mode == OneRow::kOff ? "0" : "1");
  const ScopedEnv fused("EMBER_LORA_GEMV_FUSED", mode == OneRow::kFused ? "1" : "0");
  CudaBackendOptions options;
  options.profile_ops = !graphs && profiled;
  options.cuda_graphs = graphs;
  auto r = CreateCudaBackend(0, options);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return std::move(r).value();
}
// Calls of op kind `op` so far (a profiled backend).
int64_t OpCalls(Backend& be, const std::string& op) {
  for (const CudaOpTime& t : CudaGetOpProfile(be))
    if (t.op == op) return t.calls;
  return 0;
}

TEST_F(CudaOpsTest, LoraDeltaMatchesTheCpuOnRandomSegments) {
  const int64_t n = 45, k = 200, m = 300;  // none a multiple of the kernels' tiles
  const Mode modes[] = {{"f32", true, false, false, false},
                        {"bf16", false, false, false, false},
                        {"bf16 x and out", false, false, true, true},
                        {"bf16 invariant", false, true, false, false}};
  // Ranks 1, 16, 64, 5; rows 0-3, 10-11 and 44 are in no segment.
  const std::vector<Span> spans = {{4, 1, 0}, {5, 3, 1}, {12, 20, 2}, {32, 9, 1}, {41, 3, 3}};
  const int64_t ranks[] = {1, 16, 64, 5};
  for (const Mode& mode : modes) {
    SCOPED_TRACE(mode.name);
    std::unique_ptr<Backend> be = mode.invariant ? MakeInvariant() : Make(mode.f32);
    ASSERT_EQ(be->LoraUnsupported(), "");
    std::vector<HostAdapter> ads;
    for (size_t i = 0; i < 4; ++i)
      ads.push_back(RandomAdapter(ranks[i], k, m, 10 + 3 * static_cast<uint32_t>(i), !mode.f32));
    // Slots 0 and 2 first hold other adapters: the loads below reuse slot 0's storage (same
    // size) and grow slot 2's (rank 2 -> 64).
    for (const int32_t slot : {0, 2}) {
      const HostAdapter old = RandomAdapter(slot == 0 ? 1 : 2, k, m, 99, false);
      const LoraHostMatrix mats[] = {{old.a.data(), old.rank, k}, {old.b.data(), m, old.rank}};
      ASSERT_TRUE(be->UploadLoraSlot(slot, mats).ok());
    }
    const auto slots = UploadSlots(*be, ads, k, m);
    std::vector<float> x = Random(static_cast<size_t>(n * k), 1);
    std::vector<float> out0 = Random(static_cast<size_t>(n * m), 2);
    if (mode.bf16_x)
      for (float& v : x) v = RoundBf16(v);
    if (mode.bf16_out)
      for (float& v : out0) v = RoundBf16(v);
    const std::vector<float> ref = CpuReference(x, out0, n, k, m, ads, spans);

    ASSERT_TRUE(be->BeginStep(SimplePlan(static_cast<int32_t>(n))).ok());
    Tensor xt = mode.bf16_x ? be->AllocMatMulInput({n, k}) : be->Alloc({n, k});
    Tensor ot = mode.bf16_out ? be->AllocMatMulOutput({n, m}) : be->Alloc({n, m});
    ASSERT_EQ(xt.dtype == DType::kBF16, mode.bf16_x);
    ASSERT_EQ(ot.dtype == DType::kBF16, mode.bf16_out);
    ASSERT_TRUE(CudaCopyFromHost(*be, x, xt).ok());
    ASSERT_TRUE(CudaCopyFromHost(*be, out0, ot).ok());
    be->LoraDelta(xt, {}, ot);  // no segments: nothing changes
    be->LoraDelta(xt, Segments(spans, slots), ot);
    const std::vector<float> got = Download(*be, ot);
    EXPECT_LT(UpdateError(got, ref, out0), mode.bf16_out ? 1e-2 : 1e-5);
    for (int64_t r : {0, 1, 2, 3, 10, 11, 44})
      for (int64_t c = 0; c < m; ++c)
        ASSERT_EQ(got[static_cast<size_t>(r * m + c)], out0[static_cast<size_t>(r * m + c)])
            << "row " << r << " is in no segment";

    // Each segment alone gives its rows the same bits (the kernels are batch-invariant).
    for (const Span& s : spans) {
      ASSERT_TRUE(be->BeginStep(SimplePlan(static_cast<int32_t>(n))).ok());
      Tensor x1 = mode.bf16_x ? be->AllocMatMulInput({n, k}) : be->Alloc({n, k});
      Tensor o1 = mode.bf16_out ? be->AllocMatMulOutput({n, m}) : be->Alloc({n, m});
      ASSERT_TRUE(CudaCopyFromHost(*be, x, x1).ok());
      ASSERT_TRUE(CudaCopyFromHost(*be, out0, o1).ok());
      be->LoraDelta(x1, Segments({s}, slots), o1);
      const std::vector<float> solo = Download(*be, o1);
      EXPECT_EQ(0, std::memcmp(solo.data() + s.first * m, got.data() + s.first * m,
                               static_cast<size_t>(s.rows * m) * 4))
          << "segment at row " << s.first;
    }
  }
}

// Prefill-sized segments (>= 256 rows, EMBER_LORA_GEMM_ROWS's default) where the base MatMuls are
// cuBLAS's (bf16 mode, bf16 x) take two cuBLAS GEMMs each (t rounded to bf16 between them); shorter
// ones the BGMV kernels in the same call. Against the CPU over the bf16-rounded x and weights:
// relative L2 of the update within 1e-2 (t's bf16 rounding, and out's where out is bf16); rows
// outside every segment untouched.
TEST_F(CudaOpsTest, LoraDeltaPrefillSegmentsTakeGemms) {
  const int64_t n = 600, k = 256, m = 200;
  const std::vector<Span> spans = {{0, 300, 0}, {300, 10, 1}, {320, 280, 2}};
  const int64_t ranks[] = {16, 8, 5};
  for (const bool bf16_out : {false, true}) {
    SCOPED_TRACE(bf16_out ? "bf16 out" : "f32 out");
    std::unique_ptr<Backend> be = Make(false);
    std::vector<HostAdapter> ads;
    for (size_t i = 0; i < 3; ++i)
      ads.push_back(RandomAdapter(ranks[i], k, m, 40 + 3 * static_cast<uint32_t>(i), true));
    const auto slots = UploadSlots(*be, ads, k, m);
    std::vector<float> x = Random(static_cast<size_t>(n * k), 5);
    for (float& v : x) v = RoundBf16(v);
    std::vector<float> out0 = Random(static_cast<size_t>(n * m), 6);
    if (bf16_out)
      for (float& v : out0) v = RoundBf16(v);
    const std::vector<float> ref = CpuReference(x, out0, n, k, m, ads, spans);
    ASSERT_TRUE(be->BeginStep(SimplePlan(static_cast<int32_t>(n))).ok());
    Tensor xt = be->AllocMatMulInput({n, k});
    Tensor ot = bf16_out ? be->AllocMatMulOutput({n, m}) : be->Alloc({n, m});
    ASSERT_EQ(xt.dtype, DType::kBF16);
    ASSERT_EQ(ot.dtype == DType::kBF16, bf16_out);
    ASSERT_TRUE(CudaCopyFromHost(*be, x, xt).ok());
    ASSERT_TRUE(CudaCopyFromHost(*be, out0, ot).ok());
    be->LoraDelta(xt, Segments(spans, slots), ot);
    const std::vector<float> got = Download(*be, ot);
    EXPECT_LT(UpdateError(got, ref, out0), 1e-2);
    for (const int64_t r : {310, 315, 319})
      EXPECT_EQ(0, std::memcmp(got.data() + r * m, out0.data() + r * m, static_cast<size_t>(m) * 4))
          << "row " << r << " is in no segment";
    // The 10-row segment (the BGMV kernels) as in a call of its own.
    ASSERT_TRUE(be->BeginStep(SimplePlan(static_cast<int32_t>(n))).ok());
    Tensor x1 = be->AllocMatMulInput({n, k});
    Tensor o1 = bf16_out ? be->AllocMatMulOutput({n, m}) : be->Alloc({n, m});
    ASSERT_TRUE(CudaCopyFromHost(*be, x, x1).ok());
    ASSERT_TRUE(CudaCopyFromHost(*be, out0, o1).ok());
    be->LoraDelta(x1, Segments({spans[1]}, slots), o1);
    const std::vector<float> solo = Download(*be, o1);
    EXPECT_EQ(0, std::memcmp(solo.data() + 300 * m, got.data() + 300 * m,
                             static_cast<size_t>(10 * m) * 4));
  }
}

// LoraDeltaGroup (one shrink and one expand launch for q/k/v-like parts of one x, each of its own
// width) gives every part the bits of that part's LoraDelta alone; adapter 1 has no update for
// part 1 (its rows there are left alone), rows 0-3, 10-11 and 44 are in no segment.
TEST_F(CudaOpsTest, LoraDeltaGroupEqualsItsPartsAlone) {
  const int64_t n = 45, k = 200;
  const int64_t ms[3] = {300, 72, 130};
  const int64_t ranks[3] = {16, 8, 5};  // by slot
  const std::vector<Span> spans = {{4, 1, 0}, {5, 3, 1}, {12, 20, 2}, {32, 9, 1}, {41, 3, 0}};
  for (const bool f32 : {true, false}) {
    SCOPED_TRACE(f32 ? "f32" : "bf16");
    std::unique_ptr<Backend> be = Make(f32);
    std::vector<std::vector<Tensor>> slots;  // slot s: a and b of part 0, then 1, then 2
    for (int32_t s = 0; s < 3; ++s) {
      std::vector<HostAdapter> hosts;
      std::vector<LoraHostMatrix> mats;
      for (int p = 0; p < 3; ++p)
        hosts.push_back(RandomAdapter(ranks[s], k, ms[p],
                                      50 + 7 * static_cast<uint32_t>(s) + static_cast<uint32_t>(p),
                                      !f32));
      for (int p = 0; p < 3; ++p) {
        mats.push_back({hosts[static_cast<size_t>(p)].a.data(), ranks[s], k});
        mats.push_back({hosts[static_cast<size_t>(p)].b.data(), ms[p], ranks[s]});
      }
      auto r = be->UploadLoraSlot(s, mats);
      ASSERT_TRUE(r.ok()) << r.status().message();
      slots.push_back(std::move(r).value());
    }
    std::vector<LoraSegment> segs[3];
    for (int p = 0; p < 3; ++p)
      for (const Span& sp : spans) {
        if (p == 1 && sp.adapter == 1) continue;
        const auto& t = slots[static_cast<size_t>(sp.adapter)];
        segs[p].push_back(LoraSegment{sp.first, sp.rows, &t[static_cast<size_t>(2 * p)],
                                      &t[static_cast<size_t>(2 * p + 1)]});
      }
    const std::vector<float> x = Random(static_cast<size_t>(n * k), 1);
    std::vector<float> out0[3];
    for (int p = 0; p < 3; ++p)
      out0[p] = Random(static_cast<size_t>(n * ms[p]), 2 + static_cast<uint32_t>(p));
    // grouped: true, one LoraDeltaGroup; false, a LoraDelta per part.
    auto run = [&](bool grouped) {
      std::vector<std::vector<float>> got;
      EXPECT_TRUE(be->BeginStep(SimplePlan(static_cast<int32_t>(n))).ok());
      Tensor xt = be->Alloc({n, k});
      EXPECT_TRUE(CudaCopyFromHost(*be, x, xt).ok());
      LoraPart parts[3];
      for (int p = 0; p < 3; ++p) {
        parts[p] = LoraPart{segs[p], be->Alloc({n, ms[p]})};
        EXPECT_TRUE(CudaCopyFromHost(*be, out0[p], parts[p].out).ok());
      }
      if (grouped) {
        be->LoraDeltaGroup(xt, parts);
      } else {
        for (const LoraPart& part : parts) be->LoraDelta(xt, part.segments, part.out);
      }
      for (const LoraPart& part : parts) got.push_back(Download(*be, part.out));
      return got;
    };
    const auto grouped = run(true), alone = run(false);
    for (size_t p = 0; p < 3; ++p) {
      ASSERT_EQ(grouped[p].size(), alone[p].size());
      EXPECT_EQ(0, std::memcmp(grouped[p].data(), alone[p].data(), grouped[p].size() * 4))
          << "part " << p;
      EXPECT_NE(alone[p], out0[p]) << "part " << p << " was not updated";
      for (int64_t r : {0, 1, 2, 3, 10, 11, 44})
        EXPECT_EQ(grouped[p][static_cast<size_t>(r * ms[p])],
                  out0[p][static_cast<size_t>(r * ms[p])]);
    }
    // Adapter 1's rows of part 1 are untouched.
    for (int64_t r : {5, 6, 7, 32, 40})
      EXPECT_EQ(0, std::memcmp(grouped[1].data() + r * ms[1], out0[1].data() + r * ms[1],
                               static_cast<size_t>(ms[1]) * 4))
          << "row " << r;
  }
}

// The stacked form (bf16 mode, bf16 x, 9 to EMBER_LORA_STACKED_ROWS rows, sited matrices): every
// slot's matrices of a site side by side, one cuBLAS GEMM for the shrink of q/k/v-like parts whose
// sites are consecutive (a shrink per part otherwise), the mask, an expand GEMM per part. Against
// the CPU over the bf16-rounded x and weights, per part: relative L2 of the update within 1e-2
// (t rounded to bf16 once; out too where it is bf16). Slot 1 has part 1's matrices but no segment
// there (its rows stay untouched), slot 2 has no matrices for part 1 and was first loaded with a
// larger rank in place (its stale columns must not count); rows 0-3, 10-11 and 44 are in no
// segment; segments of one slot alone take the BGMV kernels. Then decode steps of 16 rows
// replayed from one graph with a new mix of adapters.
TEST_F(CudaOpsTest, LoraDeltaStackedMatchesTheCpu) {
  const ScopedEnv stacked_rows("EMBER_LORA_STACKED_ROWS", "1024");
  const int64_t n = 45, k = 200;
  const int64_t ms[3] = {300, 72, 136};
  const int64_t ranks[3] = {16, 8, 5};  // by slot
  const std::vector<Span> spans = {{4, 1, 0}, {5, 3, 1}, {12, 20, 2}, {32, 9, 1}, {41, 3, 0}};
  // hosts[slot][part]; slot 2 has none for part 1.
  std::vector<std::vector<HostAdapter>> hosts(3);
  for (int32_t s = 0; s < 3; ++s)
    for (int p = 0; p < 3; ++p)
      hosts[static_cast<size_t>(s)].push_back(
          RandomAdapter(s == 2 && p == 1 ? 1 : ranks[s], k, ms[p],
                        70 + 7 * static_cast<uint32_t>(s) + static_cast<uint32_t>(p), true));
  auto upload = [&](Backend& be, int32_t s, const std::vector<HostAdapter>& h) {
    std::vector<LoraHostMatrix> mats;
    for (int p = 0; p < 3; ++p) {
      if (s == 2 && p == 1) continue;
      const HostAdapter& a = h[static_cast<size_t>(p)];
      mats.push_back({a.a.data(), a.rank, k, p});
      mats.push_back({a.b.data(), ms[p], a.rank, p});
    }
    auto r = be.UploadLoraSlot(s, mats);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return std::move(r).value();
  };
  // segs[p] over slot tensors (a, b per present part, in part order).
  auto segments_of = [&](const std::vector<std::vector<Tensor>>& slots,
                         const std::vector<Span>& step_spans, int p) {
    std::vector<LoraSegment> segs;
    for (const Span& sp : step_spans) {
      if (p == 1 && sp.adapter != 0) continue;  // slot 1: no segment; slot 2: no matrices
      const size_t at = static_cast<size_t>(sp.adapter == 2 && p == 2 ? 1 : p);  // slot 2: [0, 2]
      const auto& t = slots[static_cast<size_t>(sp.adapter)];
      segs.push_back(LoraSegment{sp.first, sp.rows, &t[2 * at], &t[2 * at + 1]});
    }
    return segs;
  };
  auto reference = [&](const std::vector<float>& x, const std::vector<float>& out0, int64_t rows,
                       int p, const std::vector<Span>& step_spans) {
    std::vector<HostAdapter> ads;
    for (size_t s = 0; s < 3; ++s) ads.push_back(hosts[s][static_cast<size_t>(p)]);
    std::vector<Span> kept;
    for (const Span& sp : step_spans)
      if (p != 1 || sp.adapter == 0) kept.push_back(sp);
    return CpuReference(x, out0, rows, k, ms[p], ads, kept);
  };
  for (const bool bf16_out : {false, true}) {
    SCOPED_TRACE(bf16_out ? "bf16 out" : "f32 out");
    CudaBackendOptions options;
    options.profile_ops = true;
    auto created = CreateCudaBackend(0, options);
    ASSERT_TRUE(created.ok()) << created.status().message();
    Backend& be = **created;
    std::vector<std::vector<Tensor>> slots;
    for (int32_t s = 0; s < 3; ++s) {
      if (s == 2) {  // an adapter of rank 8 there first: the same stacks, reloaded in place
        std::vector<HostAdapter> old;
        for (int p = 0; p < 3; ++p)
          old.push_back(RandomAdapter(8, k, ms[p], 90 + static_cast<uint32_t>(p), true));
        upload(be, s, old);
      }
      slots.push_back(upload(be, s, hosts[static_cast<size_t>(s)]));
    }
    std::vector<float> x = Random(static_cast<size_t>(n * k), 1);
    for (float& v : x) v = RoundBf16(v);
    std::vector<float> out0[3];
    for (int p = 0; p < 3; ++p) {
      out0[p] = Random(static_cast<size_t>(n * ms[p]), 2 + static_cast<uint32_t>(p));
      if (bf16_out)
        for (float& v : out0[p]) v = RoundBf16(v);
    }
    // parts {0, 1, 2} (one shrink) and {0, 2} (a shrink each).
    for (const std::vector<int>& which : {std::vector<int>{0, 1, 2}, std::vector<int>{0, 2}}) {
      SCOPED_TRACE(testing::Message() << which.size() << " parts");
      ASSERT_TRUE(be.BeginStep(SimplePlan(static_cast<int32_t>(n))).ok());
      Tensor xt = be.AllocMatMulInput({n, k});
      ASSERT_EQ(xt.dtype, DType::kBF16);
      ASSERT_TRUE(CudaCopyFromHost(be, x, xt).ok());
      std::vector<std::vector<LoraSegment>> segs;
      std::vector<LoraPart> parts;
      for (const int p : which) segs.push_back(segments_of(slots, spans, p));
      for (size_t i = 0; i < which.size(); ++i) {
        const int64_t m = ms[which[i]];
        Tensor o = bf16_out ? be.AllocMatMulOutput({n, m}) : be.Alloc({n, m});
        ASSERT_TRUE(CudaCopyFromHost(be, out0[which[i]], o).ok());
        parts.push_back(LoraPart{segs[i], o});
      }
      const int64_t stacked = OpCalls(be, "LoraStacked"), bgmv = OpCalls(be, "LoraDelta");
      be.LoraDeltaGroup(xt, parts);
      for (size_t i = 0; i < which.size(); ++i) {
        const int p = which[i];
        SCOPED_TRACE(testing::Message() << "part " << p);
        const std::vector<float> got = Download(be, parts[i].out);
        const std::vector<float>& o0 = out0[p];
        EXPECT_LT(UpdateError(got, reference(x, o0, n, p, spans), o0), 1e-2);
        std::vector<int64_t> untouched = {0, 1, 2, 3, 10, 11, 44};
        if (p == 1) untouched.insert(untouched.end(), {5, 6, 7, 12, 20, 31, 32, 40});
        for (const int64_t r : untouched)
          EXPECT_EQ(0, std::memcmp(got.data() + r * ms[p], o0.data() + r * ms[p],
                                   static_cast<size_t>(ms[p]) * 4))
              << "row " << r;
      }
      EXPECT_EQ(OpCalls(be, "LoraStacked") - stacked, 1);
      EXPECT_EQ(OpCalls(be, "LoraDelta") - bgmv, 0);
    }
    // Segments of one slot alone keep to the BGMV kernels (they read only that slot's matrices).
    ASSERT_TRUE(be.BeginStep(SimplePlan(static_cast<int32_t>(n))).ok());
    Tensor xt = be.AllocMatMulInput({n, k});
    ASSERT_TRUE(CudaCopyFromHost(be, x, xt).ok());
    Tensor o = bf16_out ? be.AllocMatMulOutput({n, ms[0]}) : be.Alloc({n, ms[0]});
    ASSERT_TRUE(CudaCopyFromHost(be, out0[0], o).ok());
    const std::vector<Span> one = {{4, 1, 0}, {41, 3, 0}};
    const int64_t stacked = OpCalls(be, "LoraStacked"), bgmv = OpCalls(be, "LoraDelta");
    be.LoraDelta(xt, segments_of(slots, one, 0), o);
    EXPECT_LT(UpdateError(Download(be, o), reference(x, out0[0], n, 0, one), out0[0]), 1e-2);
    EXPECT_EQ(OpCalls(be, "LoraStacked") - stacked, 0);
    EXPECT_EQ(OpCalls(be, "LoraDelta") - bgmv, 1);
  }

  // Decode steps of 16 rows in graphs: each step's mix is data.
  CudaBackendOptions options;
  options.cuda_graphs = true;
  auto created = CreateCudaBackend(0, options);
  ASSERT_TRUE(created.ok()) << created.status().message();
  Backend& be = **created;
  std::vector<std::vector<Tensor>> slots;
  for (int32_t s = 0; s < 3; ++s) slots.push_back(upload(be, s, hosts[static_cast<size_t>(s)]));
  const int64_t rows = 16;
  const std::vector<std::vector<Span>> steps = {{{0, 2, 0}, {3, 5, 1}, {9, 4, 2}},
                                                {{0, 2, 0}, {3, 5, 1}, {9, 4, 2}},
                                                {{1, 6, 2}, {8, 8, 0}},
                                                {{0, 10, 1}, {10, 6, 2}}};
  for (size_t step = 0; step < steps.size(); ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    std::vector<float> x = Random(static_cast<size_t>(rows * k), 80 + static_cast<uint32_t>(step));
    for (float& v : x) v = RoundBf16(v);
    const std::vector<float> out0 = Random(static_cast<size_t>(rows * ms[0]), 81);
    BatchPlan plan;
    for (int32_t s = 0; s < rows; ++s) plan.AddSequence({1}, 5, {s}, true);
    ASSERT_TRUE(be.BeginStep(plan).ok());
    Tensor xt = be.AllocMatMulInput({rows, k}), ot = be.Alloc({rows, ms[0]});
    ASSERT_EQ(xt.dtype, DType::kBF16);
    ASSERT_TRUE(CudaCopyFromHost(be, x, xt).ok());
    ASSERT_TRUE(CudaCopyFromHost(be, out0, ot).ok());
    be.LoraDelta(xt, segments_of(slots, steps[step], 0), ot);
    const std::vector<float> got = Download(be, ot);
    EXPECT_LT(UpdateError(got, reference(x, out0, rows, 0, steps[step]), out0), 1e-2);
  }
  const CudaGraphStats stats = CudaGetGraphStats(be);
  EXPECT_EQ(stats.captures, 1) << "a new mix is data, not a new graph";
  EXPECT_EQ(stats.replays, 3);
}

// MatMulGroupLora of many rows with the update first (EMBER_LORA_UPDATE_FIRST_ROWS): the stacked
// update of two slots written into q's and v's outputs, then the GEMMs adding x W^T (and q's bias)
// to them (beta 1). Against the GEMMs then the update: relative L2 within 1e-5 (f32 out) / 1e-2
// (bf16 out: the update rounded once more); k (no adapter) bitwise; rows 550-599 in no segment.
TEST_F(CudaOpsTest, MatMulGroupLoraUpdateFirstEqualsUpdateAfter) {
  const int64_t n = 600, k = 256, rank = 16;
  const int64_t ms[3] = {128, 64, 64};  // q (biased where out is f32), k (no adapter), v
  const ScopedEnv stacked_rows("EMBER_LORA_STACKED_ROWS", "100000");
  std::vector<float> w_host[3];
  for (int p = 0; p < 3; ++p)
    w_host[p] = Random(static_cast<size_t>(ms[p] * k), 100 + static_cast<uint32_t>(p), 0.05f);
  const std::vector<float> bias = Random(static_cast<size_t>(ms[0]), 104);
  std::vector<float> x = Random(static_cast<size_t>(n * k), 105);
  for (float& v : x) v = RoundBf16(v);
  HostAdapter ads[2][2];  // [slot][q, v]
  for (int s = 0; s < 2; ++s)
    for (int i = 0; i < 2; ++i)
      ads[s][i] =
          RandomAdapter(rank, k, ms[2 * i], 110 + 4 * static_cast<uint32_t>(s + 2 * i), true);
  for (const bool bf16_out : {false, true}) {
    SCOPED_TRACE(bf16_out ? "bf16 out" : "f32 out");
    std::vector<float> outs[2][3];
    for (int first = 0; first < 2; ++first) {
      const ScopedEnv env("EMBER_LORA_UPDATE_FIRST_ROWS", first == 1 ? "300" : "0");
      CudaBackendOptions options;
      options.profile_ops = true;
      auto created = CreateCudaBackend(0, options);
      ASSERT_TRUE(created.ok()) << created.status().message();
      Backend& be = **created;
      Tensor w[3];
      for (int p = 0; p < 3; ++p) w[p] = Weight(be, w_host[p], {ms[p], k});
      std::vector<std::vector<Tensor>> slots;
      for (int32_t s = 0; s < 2; ++s) {
        const LoraHostMatrix mats[] = {{ads[s][0].a.data(), rank, k, 0},
                                       {ads[s][0].b.data(), ms[0], rank, 0},
                                       {ads[s][1].a.data(), rank, k, 2},
                                       {ads[s][1].b.data(), ms[2], rank, 2}};
        auto r = be.UploadLoraSlot(s, mats);
        ASSERT_TRUE(r.ok()) << r.status().message();
        slots.push_back(std::move(r).value());
      }
      const LoraSegment seg_q[] = {{0, 250, &slots[0][0], &slots[0][1]},
                                   {250, 300, &slots[1][0], &slots[1][1]}};
      const LoraSegment seg_v[] = {{0, 250, &slots[0][2], &slots[0][3]},
                                   {250, 300, &slots[1][2], &slots[1][3]}};
      ASSERT_TRUE(be.BeginStep(SimplePlan(static_cast<int32_t>(n))).ok());
      Tensor xt = be.AllocMatMulInput({n, k});
      ASSERT_EQ(xt.dtype, DType::kBF16);
      ASSERT_TRUE(CudaCopyFromHost(be, x, xt).ok());
      Tensor bt = Upload(be, bias, {ms[0]});
      MatMulPart parts[3];
      for (int p = 0; p < 3; ++p)
        parts[p] = MatMulPart{&w[p], p == 0 && !bf16_out ? &bt : nullptr,
                              bf16_out ? be.AllocMatMulOutput({n, ms[p]}) : be.Alloc({n, ms[p]})};
      const LoraPart lora[] = {{seg_q, parts[0].out}, {seg_v, parts[2].out}};
      be.MatMulGroupLora(xt, parts, lora);
      for (int p = 0; p < 3; ++p) outs[first][p] = Download(be, parts[p].out);
      EXPECT_EQ(OpCalls(be, "LoraStacked"), 1);
    }
    for (int p = 0; p < 3; ++p) {
      SCOPED_TRACE(testing::Message() << "part " << p);
      ExpectSameOrClose(outs[1][p], outs[0][p], p == 1, bf16_out ? 1e-2 : 1e-5);
    }
  }
}

// One row on the GEMV (bf16 mode): MatMulGroupLora folds each update into its projection's
// bias (the update written with the bias first, the GEMV adding it), or computes it inside the
// GEMV launch (fused: no LoraDelta op runs), which equals MatMulGroup then LoraDeltaGroup up to
// the order of float additions (relative L2 1e-6); a projection without an update is untouched
// by either (bitwise), and with the fold off (EMBER_LORA_BIAS_FOLD=0) the call is the default's
// two calls, bitwise.
TEST_F(CudaOpsTest, MatMulGroupLoraFoldsTheUpdateIntoTheGemvBias) {
  const int64_t k = 256, rank = 16;
  const int64_t ms[3] = {128, 64, 64};  // q (biased), k (no adapter), v
  for (const OneRow mode : {OneRow::kFused, OneRow::kFold, OneRow::kOff}) {
    SCOPED_TRACE(OneRowName(mode));
    const bool fold = mode != OneRow::kOff;
    std::unique_ptr<Backend> be = MakeOneRow(mode);
    Tensor w[3];
    for (int p = 0; p < 3; ++p)
      w[p] = Weight(*be, Random(static_cast<size_t>(ms[p] * k), 20 + static_cast<uint32_t>(p)),
                    {ms[p], k});
    const std::vector<float> bias = Random(static_cast<size_t>(ms[0]), 23);
    // Slot 0: q's a, b then v's a, b.
    const HostAdapter aq = RandomAdapter(rank, k, ms[0], 30, true);
    const HostAdapter av = RandomAdapter(rank, k, ms[2], 32, true);
    const LoraHostMatrix mats[] = {{aq.a.data(), rank, k},
                                   {aq.b.data(), ms[0], rank},
                                   {av.a.data(), rank, k},
                                   {av.b.data(), ms[2], rank}};
    auto slot = be->UploadLoraSlot(0, mats);
    ASSERT_TRUE(slot.ok()) << slot.status().message();
    const std::vector<Tensor>& t = *slot;
    const LoraSegment seg_q[] = {{0, 1, &t[0], &t[1]}};
    const LoraSegment seg_v[] = {{0, 1, &t[2], &t[3]}};
    const std::vector<float> x = Random(static_cast<size_t>(k), 24);
    auto run = [&](bool grouped_lora) {
      EXPECT_TRUE(be->BeginStep(SimplePlan(1)).ok());
      Tensor xt = Upload(*be, x, {1, k});
      Tensor bt = Upload(*be, bias, {ms[0]});
      MatMulPart parts[3];
      for (int p = 0; p < 3; ++p)
        parts[p] = MatMulPart{&w[p], p == 0 ? &bt : nullptr, be->Alloc({1, ms[p]})};
      const LoraPart lora[] = {{seg_q, parts[0].out}, {seg_v, parts[2].out}};
      if (grouped_lora) {
        be->MatMulGroupLora(xt, parts, lora);
      } else {
        be->MatMulGroup(xt, parts);
        be->LoraDeltaGroup(xt, lora);
      }
      std::vector<std::vector<float>> out;
      for (const MatMulPart& part : parts) out.push_back(Download(*be, part.out));
      return out;
    };
    const int64_t before = OpCalls(*be, "LoraDelta");
    const auto got = run(true);
    EXPECT_EQ(OpCalls(*be, "LoraDelta") - before, mode == OneRow::kFused ? 0 : 1);
    const auto want = run(false);
    for (size_t p = 0; p < 3; ++p) {
      SCOPED_TRACE(testing::Message() << "part " << p);
      ExpectSameOrClose(got[p], want[p], p == 1 || !fold, 1e-6);
    }
  }
}

// One row on the gated GEMV (bf16 mode): GateUpActivationLora folds the updates of gate and up
// into the gated GEMV's biases (one launch after the updates), which equals MatMulGroup,
// LoraDeltaGroup and SiluMul up to the order of float additions (gate, up and the activation
// within relative L2 1e-5); an adapter on up alone; with the fold off, bitwise the default's.
TEST_F(CudaOpsTest, GateUpActivationLoraFoldsTheUpdatesIntoTheGatedGemv) {
  const int64_t k = 2048, m = 1000, rank = 16;
  for (const OneRow mode : {OneRow::kFused, OneRow::kFold, OneRow::kOff}) {
    for (const bool gate_too : {true, false}) {
      SCOPED_TRACE(testing::Message()
                   << OneRowName(mode) << (gate_too ? ", gate and up" : ", up alone"));
      const bool fold = mode != OneRow::kOff;
      std::unique_ptr<Backend> be = MakeOneRow(mode);
      Tensor wg = Weight(*be, Random(static_cast<size_t>(m * k), 40, 0.05f), {m, k});
      Tensor wu = Weight(*be, Random(static_cast<size_t>(m * k), 41, 0.05f), {m, k});
      const HostAdapter ag = RandomAdapter(rank, k, m, 42, true);
      const HostAdapter au = RandomAdapter(rank, k, m, 44, true);
      const LoraHostMatrix mats[] = {{ag.a.data(), rank, k},
                                     {ag.b.data(), m, rank},
                                     {au.a.data(), rank, k},
                                     {au.b.data(), m, rank}};
      auto slot = be->UploadLoraSlot(0, mats);
      ASSERT_TRUE(slot.ok()) << slot.status().message();
      const std::vector<Tensor>& t = *slot;
      const LoraSegment seg_g[] = {{0, 1, &t[0], &t[1]}};
      const LoraSegment seg_u[] = {{0, 1, &t[2], &t[3]}};
      const std::vector<float> x = Random(static_cast<size_t>(k), 46);
      auto run = [&](bool fused_call) {
        EXPECT_TRUE(be->BeginStep(SimplePlan(1)).ok());
        Tensor xt = Upload(*be, x, {1, k});
        Tensor gate = be->Alloc({1, m}), up = be->Alloc({1, m}), act = be->Alloc({1, m});
        std::vector<LoraPart> lora;
        if (gate_too) lora.push_back({seg_g, gate});
        lora.push_back({seg_u, up});
        if (fused_call) {
          be->GateUpActivationLora(xt, wg, wu, GateActivation::kSilu, gate, up, act, lora);
        } else {
          const MatMulPart parts[] = {{&wg, nullptr, gate}, {&wu, nullptr, up}};
          be->MatMulGroup(xt, parts);
          be->LoraDeltaGroup(xt, lora);
          be->SiluMul(gate, up, act);
        }
        return std::vector<std::vector<float>>{Download(*be, gate), Download(*be, up),
                                               Download(*be, act)};
      };
      const int64_t before = OpCalls(*be, "LoraDelta");
      const auto got = run(true);
      EXPECT_EQ(OpCalls(*be, "LoraDelta") - before, mode == OneRow::kFused ? 0 : 1);
      const auto want = run(false);
      for (size_t i = 0; i < 3; ++i) {
        SCOPED_TRACE(testing::Message() << "output " << i);
        ExpectSameOrClose(got[i], want[i], !fold, 1e-5);
      }
    }
  }
}

// Decode steps (one row per sequence) replay captured graphs: the row and entry tables are read
// from device memory each step, so a replay with new x and a step with other segments both stay
// right, and a step with another mix of adapters replays the same graph (the key holds the
// tables' addresses, not their contents).
TEST_F(CudaOpsTest, LoraDeltaInDecodeGraphs) {
  const int64_t n = 8, k = 128, m = 96;
  CudaBackendOptions options;
  options.cuda_graphs = true;
  auto created = CreateCudaBackend(0, options);
  ASSERT_TRUE(created.ok()) << created.status().message();
  Backend& be = **created;
  std::vector<HostAdapter> ads = {RandomAdapter(8, k, m, 5, true), RandomAdapter(3, k, m, 7, true)};
  const auto slots = UploadSlots(be, ads, k, m);
  const std::vector<std::vector<Span>> steps = {{{0, 2, 0}, {3, 1, 1}},
                                                {{0, 2, 0}, {3, 1, 1}},
                                                {{1, 1, 1}, {4, 4, 0}},
                                                {{0, 2, 0}, {3, 1, 1}}};
  for (size_t step = 0; step < steps.size(); ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    const std::vector<float> x =
        Random(static_cast<size_t>(n * k), 30 + static_cast<uint32_t>(step));
    const std::vector<float> out0 = Random(static_cast<size_t>(n * m), 40);
    BatchPlan plan;
    for (int32_t s = 0; s < n; ++s) plan.AddSequence({1}, 5, {s}, true);
    ASSERT_TRUE(be.BeginStep(plan).ok());
    Tensor xt = be.Alloc({n, k}), ot = be.Alloc({n, m});
    ASSERT_TRUE(CudaCopyFromHost(be, x, xt).ok());
    ASSERT_TRUE(CudaCopyFromHost(be, out0, ot).ok());
    be.LoraDelta(xt, Segments(steps[step], slots), ot);
    const std::vector<float> got = Download(be, ot);
    EXPECT_LT(UpdateError(got, CpuReference(x, out0, n, k, m, ads, steps[step]), out0), 1e-5);
  }
  const CudaGraphStats stats = CudaGetGraphStats(be);
  EXPECT_EQ(stats.captures, 1) << "step 2's new mix is data, not a new graph";
  EXPECT_EQ(stats.replays, 3);
}

// Batch-1 decode steps with the update inside the GEMV launch (fused), replayed from one captured
// graph while the step's adapter alternates between two slots: each step equals the separate
// calls (fold off, no graphs) within relative L2 1e-6 (the key holds the tables' addresses, so
// the replays read each step's slot).
TEST_F(CudaOpsTest, FusedGemvLoraReplaysForEveryAdapter) {
  const int64_t k = 512, m = 384;
  auto fused = MakeOneRow(OneRow::kFused, /*graphs=*/true);
  auto plain = MakeOneRow(OneRow::kOff);
  const std::vector<HostAdapter> ads = {RandomAdapter(16, k, m, 50, true),
                                        RandomAdapter(8, k, m, 52, true)};
  const std::vector<float> w_host = Random(static_cast<size_t>(m * k), 54);
  Tensor w[2] = {Weight(*fused, w_host, {m, k}), Weight(*plain, w_host, {m, k})};
  const auto fused_slots = UploadSlots(*fused, ads, k, m);
  const auto plain_slots = UploadSlots(*plain, ads, k, m);
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step << ", adapter " << step % 2);
    const std::vector<float> x = Random(static_cast<size_t>(k), 60 + static_cast<uint32_t>(step));
    std::vector<float> outs[2];
    for (int b = 0; b < 2; ++b) {
      Backend& be = b == 0 ? *fused : *plain;
      const auto& slots = b == 0 ? fused_slots : plain_slots;
      BatchPlan plan;
      plan.AddSequence({1}, 5, {0}, true);
      ASSERT_TRUE(be.BeginStep(plan).ok());
      Tensor xt = Upload(be, x, {1, k});
      const MatMulPart part{&w[b], nullptr, be.Alloc({1, m})};
      const LoraSegment seg[] = {{0, 1, &slots[static_cast<size_t>(step % 2)][0],
                                  &slots[static_cast<size_t>(step % 2)][1]}};
      const LoraPart lora[] = {{seg, part.out}};
      be.MatMulGroupLora(xt, std::span<const MatMulPart>(&part, 1), lora);
      outs[b] = Download(be, part.out);
    }
    ExpectSameOrClose(outs[0], outs[1], false, 1e-6);
  }
  const CudaGraphStats stats = CudaGetGraphStats(*fused);
  EXPECT_EQ(stats.captures, 1) << "another slot's adapter is data, not a new graph";
  EXPECT_EQ(stats.replays, 3);
}

// Several fused launches in one decode step, as a model's layers make them (the qwen3 fixture's
// shapes: k 64, q/k/v 128/64/64 rows, adapters of rank 8 on q and v; between two layers an RmsNorm
// of the step's q into the next layer's x), captured once and replayed: every layer's outputs
// equal the separate calls (fold off, no graphs) within relative L2 1e-5, at every step; also
// launched back to back without a graph (the launches still overlap: programmatic dependent
// launch), with every layer on one x, and with the fold instead. Session 49: with graphs, layers
// 1 and 2 read a stale x until the fused launch read x through the L2 (gemv.cu's LoadX).
class FusedGemvLoraChain : public CudaOpsTest {
 protected:
  // mode: the one-row path under test (against the fold off, profiled); norm: each layer's x
  // the RmsNorm of the previous layer's q (else every layer reads the step's x).
  void Check(bool graphs, OneRow mode = OneRow::kFused, bool norm = true);
};
void FusedGemvLoraChain::Check(bool graphs, OneRow mode, bool norm) {
  SCOPED_TRACE(testing::Message() << OneRowName(mode) << ", "
                                  << (graphs ? "graphs" : "launched one by one")
                                  << (norm ? ", x normed from q" : ", one x"));
  const int64_t k = 64, rank = 8, layers = 3;
  const int64_t ms[3] = {128, 64, 64};
  auto fused = MakeOneRow(mode, graphs, /*profiled=*/false);
  auto plain = MakeOneRow(OneRow::kOff);
  Backend* bes[2] = {fused.get(), plain.get()};
  // Per layer: w_q, w_k, w_v, and the adapter's q and v matrices (slot 0: layer by layer, q's a,
  // b then v's a, b).
  std::vector<std::vector<float>> w_host;
  std::vector<HostAdapter> aq, av;
  std::vector<LoraHostMatrix> mats;
  for (int64_t l = 0; l < layers; ++l) {
    for (int p = 0; p < 3; ++p)
      w_host.push_back(
          Random(static_cast<size_t>(ms[p] * k), 70 + static_cast<uint32_t>(3 * l + p)));
    aq.push_back(RandomAdapter(rank, k, ms[0], 80 + static_cast<uint32_t>(4 * l), true));
    av.push_back(RandomAdapter(rank, k, ms[2], 82 + static_cast<uint32_t>(4 * l), true));
  }
  for (int64_t l = 0; l < layers; ++l) {
    const size_t i = static_cast<size_t>(l);
    mats.insert(mats.end(), {{aq[i].a.data(), rank, k},
                             {aq[i].b.data(), ms[0], rank},
                             {av[i].a.data(), rank, k},
                             {av[i].b.data(), ms[2], rank}});
  }
  std::vector<Tensor> w[2];
  std::vector<Tensor> slot[2];
  for (int b = 0; b < 2; ++b) {
    for (size_t i = 0; i < w_host.size(); ++i)
      w[b].push_back(Weight(*bes[b], w_host[i], {ms[i % 3], k}));
    auto up = bes[b]->UploadLoraSlot(0, mats);
    ASSERT_TRUE(up.ok()) << up.status().message();
    slot[b] = std::move(up).value();
  }
  const std::vector<float> norm_w = Random(static_cast<size_t>(k), 90);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    const std::vector<float> x0 = Random(static_cast<size_t>(k), 100 + static_cast<uint32_t>(step));
    std::vector<std::vector<float>> outs[2];
    for (int b = 0; b < 2; ++b) {
      Backend& be = *bes[b];
      BatchPlan plan;
      plan.AddSequence({1}, 5, {0}, true);
      ASSERT_TRUE(be.BeginStep(plan).ok());
      Tensor nw = Upload(be, norm_w, {k});
      Tensor x = Upload(be, x0, {1, k});
      std::vector<Tensor> results;  // downloaded after the step, so its launches run as one
      for (int64_t l = 0; l < layers; ++l) {
        const size_t i = static_cast<size_t>(l);
        MatMulPart parts[3];
        for (int p = 0; p < 3; ++p)
          parts[p] =
              MatMulPart{&w[b][3 * i + static_cast<size_t>(p)], nullptr, be.Alloc({1, ms[p]})};
        const LoraSegment seg_q[] = {{0, 1, &slot[b][4 * i], &slot[b][4 * i + 1]}};
        const LoraSegment seg_v[] = {{0, 1, &slot[b][4 * i + 2], &slot[b][4 * i + 3]}};
        const LoraPart lora[] = {{seg_q, parts[0].out}, {seg_v, parts[2].out}};
        be.MatMulGroupLora(x, parts, lora);
        for (const MatMulPart& part : parts) results.push_back(part.out);
        // The next layer's x: an RmsNorm of q's first k columns (a kernel between the launches).
        if (!norm) continue;
        Tensor q_head = parts[0].out;
        q_head.shape[1] = k;  // the first k of q's 128 columns (one row: contiguous)
        Tensor next = be.Alloc({1, k});
        be.RmsNorm(q_head, nw, 1e-6f, RmsNormKind::kPlain, next);
        x = next;
      }
      for (const Tensor& r : results) outs[b].push_back(Download(be, r));
    }
    ASSERT_EQ(outs[0].size(), outs[1].size());
    for (size_t o = 0; o < outs[0].size(); ++o) {
      SCOPED_TRACE(testing::Message() << "layer " << o / 3 << ", part " << o % 3);
      float worst = 0;
      for (size_t i = 0; i < outs[0][o].size(); ++i)
        worst = std::max(worst, std::abs(outs[0][o][i] - outs[1][o][i]));
      SCOPED_TRACE(testing::Message() << "largest difference " << worst);
      ExpectSameOrClose(outs[0][o], outs[1][o], false, 1e-5);
    }
  }
}
TEST_F(FusedGemvLoraChain, LayersLaunchedOneByOne) {
  Check(false);
}
TEST_F(FusedGemvLoraChain, LayersInOneGraphStep) {
  Check(true);
}
TEST_F(FusedGemvLoraChain, LayersOfOneXInOneGraphStep) {
  Check(true, OneRow::kFused, false);
}
TEST_F(FusedGemvLoraChain, FoldedLayersInOneGraphStep) {
  Check(true, OneRow::kFold);
}
TEST_F(FusedGemvLoraChain, FoldedLayersLaunchedOneByOne) {
  Check(false, OneRow::kFold);
}

}  // namespace
}  // namespace ember
