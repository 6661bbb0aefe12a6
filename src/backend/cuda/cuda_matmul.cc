// CudaBackend's matrix products: MatMul, MatMulGroup (the projections of one x) and
// GateUpActivation. Each weight takes one of three paths (MatMulPathOf): the batch-1 GEMV
// (gemv.cu), the fixed-order tensor-core GEMM (gemm_invariant.cu; every row count in the
// batch-invariant mode, 2..8 rows otherwise) or cuBLAS / the skinny wgmma GEMM. The parts of a
// group that take the same path are one recorded op: one GEMV or GEMM launch over all of them, or
// one cuBLAS op that converts x once and runs the later parts on a side stream.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/gemm_skinny.h"

namespace ember::cuda {
namespace {

// A GEMV launch's LoRA update in its graph key: the tables' and buffers' addresses and the
// shapes, never what the tables hold (a replay serves whatever adapter the step's row names).
constexpr size_t kGemvLoraKeyWords = 8 + kGemvMaxParts;
size_t GemvLoraKey(const GemvLora& l, uint64_t* key) {
  size_t n = 0;
  for (uint64_t v : {uint64_t{1}, KeyOf(l.row_entry), KeyOf(l.entries), U(l.num_slots), U(l.parts),
                     U(l.rank_cap), KeyOf(l.t), KeyOf(l.sync)})
    key[n++] = v;
  for (int i = 0; i < kGemvMaxParts; ++i) key[n++] = U(l.lora_of[i]);
  return n;
}

cudaDataType_t ToCudaType(DType t) {
  switch (t) {
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kI32:
    case DType::kU8:
    case DType::kQ8_0:  // block-quantized weights never reach CUDA (UploadWeight refuses them)
    case DType::kQ4_0:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      break;
  }
  CHECK(false) << "no cuBLAS type for " << DTypeName(t);
  return CUDA_R_32F;
}

void RunCublasPart(const CublasGroup& g, const CublasPart& p, cublasHandle_t handle,
                   cudaStream_t st) {
  const int64_t n = g.n, k = g.k, m = p.m;
  if (p.skinny) {
    LaunchSkinnyGemm(static_cast<const __nv_bfloat16*>(g.converted),
                     static_cast<const __nv_bfloat16*>(p.w), static_cast<float*>(p.out), m, n, m, k,
                     st);
  } else {
    // Row-major out[n, m] = x[n, k] W[m, k]^T  ==  column-major out^T[m, n] = W^T x^T.
    const bool f32_weight = g.wdtype == DType::kF32;
    const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
    const cudaDataType_t wt = ToCudaType(g.wdtype);
    CUBLAS_CHECK(cublasGemmEx(
        handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n),
        static_cast<int>(k), &alpha, p.w, wt, static_cast<int>(k), f32_weight ? g.x : g.converted,
        wt, static_cast<int>(k), &beta, p.out, p.out_bf16 ? CUDA_R_16BF : CUDA_R_32F,
        static_cast<int>(m), f32_weight ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
  }
  if (p.bias != nullptr)
    LaunchAddBias(static_cast<float*>(p.out), static_cast<const float*>(p.bias), n, m, st);
}

}  // namespace

void CudaBackend::MatMul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor out) {
  const MatMulPart part{&weight, bias, out};
  MatMulGroup(x, std::span<const MatMulPart>(&part, 1));
}

int64_t CudaBackend::CheckMatMul(const Tensor& x, const Tensor& weight, const Tensor* bias,
                                 const Tensor& out) const {
  const int64_t n = x.rows(), k = x.cols(), m = weight.rows();
  CHECK_EQ(weight.cols(), k) << "MatMul " << ShapeString(x) << " x " << ShapeString(weight);
  CHECK_EQ(out.rows(), n);
  CHECK_EQ(out.cols(), m);
  // A bf16 out (AllocMatMulOutput) only where the cuBLAS path runs and writes it.
  CHECK(out.dtype == DType::kF32 || (out.dtype == DType::kBF16 && weight.dtype == DType::kBF16 &&
                                     bias == nullptr && Bf16MatMulInput(n)))
      << "MatMul: out " << DTypeName(out.dtype) << " [" << n << " rows]";
  // A bf16 x (AllocMatMulInput) is already the cuBLAS operand.
  CHECK(x.dtype == DType::kF32 ||
        (x.dtype == DType::kBF16 && weight.dtype == DType::kBF16 && Bf16MatMulInput(n)))
      << "MatMul: x " << DTypeName(x.dtype) << " [" << n << " rows] with "
      << DTypeName(weight.dtype) << " weights";
  if (bias != nullptr) {
    CHECK_EQ(bias->numel(), m);
    CHECK(bias->dtype == DType::kF32);
  }
  return n;
}

// Batch-invariant mode: the fixed-order tensor-core GEMM for every n (gemm_invariant.cu), so a
// row's bits never depend on the other rows of the step. Default mode: the same kernel for 2..8
// rows too, where it beats the f32-x GEMV by up to 3x (the GEMV re-reads every x row per weight
// load; docs/perf.md). One row: the bandwidth-bound GEMV (f32 activations,
// bias fused). Otherwise cuBLAS.
MatMulPath CudaBackend::MatMulPathOf(const Tensor& x, const Tensor& weight) const {
  const int64_t n = x.rows(), k = x.cols();
  if (weight.dtype != DType::kBF16) return MatMulPath::kCublas;
  if (batch_invariant_ || (n >= 2 && n <= kDecodeGemmMaxRows)) return MatMulPath::kInvariant;
  if (n == 1 && GemvBf16Supported(x.data, weight.data, k)) return MatMulPath::kGemv;
  return MatMulPath::kCublas;
}

void CudaBackend::MatMulGroup(const Tensor& x, std::span<const MatMulPart> parts) {
  RecordMatMulGroup(x, parts, nullptr);
}

void CudaBackend::RecordMatMulGroup(const Tensor& x, std::span<const MatMulPart> parts,
                                    const bool* accumulate) {
  CHECK_LE(parts.size(), kMaxMatMulGroupParts);
  size_t index = 0;
  // The launch being assembled (at most one is open: a part of another path closes it).
  std::optional<PartsLaunch> launch;
  std::optional<CublasGroup> cublas;
  for (const MatMulPart& part : parts) {
    const Tensor& weight = *part.weight;
    const bool adds = accumulate != nullptr && accumulate[index++];
    if (CheckMatMul(x, weight, part.bias, part.out) == 0) continue;
    const MatMulPath path = MatMulPathOf(x, weight);
    CHECK(!adds || path == MatMulPath::kCublas) << "MatMul: accumulating off the cuBLAS path";
    if (path == MatMulPath::kCublas) {
      if (launch) RecordPartsLaunch(*launch);
      launch.reset();
      AddToCublasGroup(x, weight, part.bias != nullptr ? part.bias->data : nullptr, part.out,
                       cublas, adds);
      continue;
    }
    if (cublas) RecordCublasGroup(*cublas);
    cublas.reset();
    const GemvPart gemv{weight.data,
                        part.bias != nullptr ? static_cast<const float*>(part.bias->data) : nullptr,
                        static_cast<float*>(part.out.data), weight.rows()};
    AddToPartsLaunch(path, x, gemv, launch);
  }
  if (launch) RecordPartsLaunch(*launch);
  if (cublas) RecordCublasGroup(*cublas);
}

// MatMulGroup's one GEMV launch over every part, with the batch-1 LoRA update `lora` inside it
// (MatMulGroupLora; the caller checked that the ring GEMV takes the parts: GemvLoraFused).
void CudaBackend::RecordGemvWithLora(const Tensor& x, std::span<const MatMulPart> parts,
                                     const GemvLora& lora) {
  CHECK(!parts.empty() && parts.size() <= static_cast<size_t>(kGemvMaxParts));
  std::optional<PartsLaunch> launch;
  for (const MatMulPart& part : parts) {
    const Tensor& weight = *part.weight;
    CHECK_GT(CheckMatMul(x, weight, part.bias, part.out), 0);
    CHECK(MatMulPathOf(x, weight) == MatMulPath::kGemv);
    const GemvPart gemv{weight.data,
                        part.bias != nullptr ? static_cast<const float*>(part.bias->data) : nullptr,
                        static_cast<float*>(part.out.data), weight.rows()};
    AddToPartsLaunch(MatMulPath::kGemv, x, gemv, launch);
  }
  CHECK_EQ(launch->num_parts, static_cast<int>(parts.size()));
  launch->lora = lora;
  RecordPartsLaunch(*launch);
}

void CudaBackend::AddToPartsLaunch(MatMulPath path, const Tensor& x, const GemvPart& part,
                                   std::optional<PartsLaunch>& launch) {
  const int64_t n = x.rows(), k = x.cols();
  if (launch && launch->path == path && launch->num_parts < kGemvMaxParts) {
    launch->parts[static_cast<size_t>(launch->num_parts++)] = part;
    return;
  }
  if (launch) RecordPartsLaunch(*launch);
  launch.emplace();
  launch->path = path;
  launch->x = static_cast<const float*>(x.data);
  launch->n = n;
  launch->k = k;
  if (path == MatMulPath::kGemv) {
    // This launch's weights are the previous GEMV launch's prefetch target.
    if (!gemv_next_.empty()) gemv_next_.back() = GemvPrefetch{part.w, part.m * k * 2};
    gemv_next_.emplace_back();
    launch->hint = gemv_next_.size() - 1;
  } else {
    const auto scratch_bytes = static_cast<size_t>(GemmInvariantScratchBytes(n, k));
    if (scratch_bytes > gemm_scratch_bytes_) {
      gemm_scratch_ = ArenaAlloc(scratch_bytes);
      gemm_scratch_bytes_ = scratch_bytes;
    }
    launch->scratch = scratch_bytes > 0 ? gemm_scratch_ : nullptr;
  }
  launch->parts[0] = part;
  launch->num_parts = 1;
}

void CudaBackend::RecordPartsLaunch(const PartsLaunch& l) {
  std::array<uint64_t, 5 + 4 * kGemvMaxParts + kGemvLoraKeyWords> key = {
      KeyOf(l.x), U(l.n), U(l.k), U(l.num_parts), KeyOf(l.scratch)};
  size_t key_len = 5;
  for (int i = 0; i < l.num_parts; ++i) {
    const GemvPart& p = l.parts[static_cast<size_t>(i)];
    for (uint64_t v : {KeyOf(p.w), KeyOf(p.bias), KeyOf(p.out), U(p.m)}) key[key_len++] = v;
  }
  if (l.lora) key_len += GemvLoraKey(*l.lora, key.data() + key_len);
  const std::span<const uint64_t> words(key.data(), key_len);
  if (l.path == MatMulPath::kGemv) {
    // The prefetch target is read when the op launches (Flush), after the whole step is recorded.
    const std::vector<GemvPrefetch>* hints = &gemv_next_;
    recorder_.Record(OpKind::kMatMulGemv, words, [l, hints](cudaStream_t st) {
      LaunchGemvBf16Multi(l.x, l.parts.data(), l.num_parts, l.k, (*hints)[l.hint], st, {},
                          l.lora ? &*l.lora : nullptr);
    });
  } else {
    const int variant = switches_.gemm_tiled_variant;
    recorder_.Record(OpKind::kMatMulGemm, words, [l, variant](cudaStream_t st) {
      LaunchGemmInvariant(l.x, l.scratch, l.parts.data(), l.num_parts, l.n, l.k, variant, st);
    });
  }
}

// Parity mode (f32 weights): true fp32 FMA, never TF32, one op per part. Otherwise the
// activations are converted to the weight's 16-bit type once per group (or are that type
// already: a bf16 AllocMatMulInput x) and accumulated in f32.
void CudaBackend::AddToCublasGroup(const Tensor& x, const Tensor& weight, const void* bias,
                                   Tensor out, std::optional<CublasGroup>& group, bool accumulate) {
  const int64_t n = x.rows(), k = x.cols(), m = weight.rows();
  const bool f32_weight = weight.dtype == DType::kF32;
  const bool x_bf16 = x.dtype == DType::kBF16;
  const bool out_bf16 = out.dtype == DType::kBF16;
  const bool join = !f32_weight && group && group->converted != nullptr &&
                    group->wdtype == weight.dtype && group->num_parts < CublasGroup::kMaxParts;
  void* converted = f32_weight ? nullptr
                    : x_bf16   ? x.data
                    : join     ? group->converted
                               : ArenaAlloc(static_cast<size_t>(n * k) * DTypeSize(weight.dtype));
  // bf16 GEMMs of a few rows against small weights: the wgmma skinny GEMM where it beats cuBLAS.
  const bool skinny = weight.dtype == DType::kBF16 && !out_bf16 && !accumulate &&
                      SkinnyGemmPreferred(n, m, k) &&
                      SkinnyGemmSupported(n, m, k, converted, weight.data);
  // (Its plan queries the occupancy once per shape: here, not while a graph is being captured.)
  if (skinny) (void)PlanSkinnyGemm(n, m, k);
  const CublasPart gemm{weight.data, bias, out.data, m, skinny, out_bf16, accumulate};
  if (join) {
    // The later parts run on the side stream while the first runs.
    group->parts[group->num_parts++] = gemm;
    return;
  }
  if (group) RecordCublasGroup(*group);
  group.emplace();
  group->x = x.data;
  group->converted = converted;
  group->convert = !f32_weight && !x_bf16;
  group->wdtype = weight.dtype;
  group->n = n;
  group->k = k;
  group->parts[0] = gemm;
  group->num_parts = 1;
}

void CudaBackend::RecordCublasGroup(const CublasGroup& g) {
  std::array<uint64_t, 6 + 7 * CublasGroup::kMaxParts> key{};
  size_t len = 0;
  for (uint64_t v : {KeyOf(g.x), KeyOf(g.converted), U(g.convert), U(static_cast<int>(g.wdtype)),
                     U(g.n), U(g.k)})
    key[len++] = v;
  for (int i = 0; i < g.num_parts; ++i) {
    const CublasPart& p = g.parts[i];
    for (uint64_t v : {KeyOf(p.w), KeyOf(p.bias), KeyOf(p.out), U(p.m), U(p.skinny), U(p.out_bf16),
                       U(p.accumulate)})
      key[len++] = v;
  }
  const cublasHandle_t main = cublas_.get(), side = cublas_side_.get();
  const cudaStream_t side_stream = side_stream_.get();
  const cudaEvent_t fork = fork_.get(), join = join_.get();
  recorder_.Record(OpKind::kMatMulCublas, std::span<const uint64_t>(key.data(), len),
                   [g, main, side, side_stream, fork, join](cudaStream_t st) {
                     if (g.convert)
                       LaunchConvert(g.x, ElemType::kF32, g.converted, ToElemType(g.wdtype),
                                     g.n * g.k, st);
                     if (g.num_parts > 1) {
                       CUDA_CHECK(cudaEventRecord(fork, st));
                       CUDA_CHECK(cudaStreamWaitEvent(side_stream, fork));
                       for (int i = 1; i < g.num_parts; ++i)
                         RunCublasPart(g, g.parts[i], side, side_stream);
                     }
                     RunCublasPart(g, g.parts[0], main, st);
                     if (g.num_parts > 1) {
                       CUDA_CHECK(cudaEventRecord(join, side_stream));
                       CUDA_CHECK(cudaStreamWaitEvent(st, join));
                     }
                   });
}

// One row whose gate and up both take the GEMV: one launch computes gate, up and the activation
// (the step loses a kernel and its wait; gate and up are still written), where the ring GEMV can
// take the pair (GemvGatedFused). Otherwise MatMulGroup, then the activation.
bool CudaBackend::GatedGemvFits(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                                const Tensor& gate, const Tensor& up, const Tensor& out) const {
  const int64_t n = gate.numel(), k = x.cols();
  return x.rows() > 0 && MatMulPathOf(x, w_gate) == MatMulPath::kGemv &&
         MatMulPathOf(x, w_up) == MatMulPath::kGemv && gate.dtype == DType::kF32 &&
         up.dtype == DType::kF32 && out.dtype == DType::kF32 && w_gate.rows() == n &&
         w_up.rows() == n && GemvGatedFused(n, k);
}

void CudaBackend::GateUpActivation(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                                   GateActivation activation, Tensor gate, Tensor up, Tensor out) {
  if (!GatedGemvFits(x, w_gate, w_up, gate, up, out)) {
    Backend::GateUpActivation(x, w_gate, w_up, activation, gate, up, out);
    return;
  }
  RecordGatedGemv(x, w_gate, w_up, activation, gate, up, out, nullptr, nullptr);
}

void CudaBackend::RecordGatedGemv(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                                  GateActivation activation, Tensor gate, Tensor up, Tensor out,
                                  const float* bias_gate, const float* bias_up,
                                  const GemvLora* lora) {
  const int64_t n = gate.numel(), k = x.cols();
  CheckMatMul(x, w_gate, nullptr, gate);
  CheckMatMul(x, w_up, nullptr, up);
  CHECK_EQ(up.numel(), n);
  CHECK_EQ(out.numel(), n);
  const bool gelu = activation == GateActivation::kGeluTanh;
  const std::array<GemvPart, 2> parts = {
      GemvPart{w_gate.data, bias_gate, static_cast<float*>(gate.data), n},
      GemvPart{w_up.data, bias_up, static_cast<float*>(up.data), n}};
  // A GEMV launch: the previous one prefetches its weights.
  if (!gemv_next_.empty()) gemv_next_.back() = GemvPrefetch{w_gate.data, n * k * 2};
  gemv_next_.emplace_back();
  const std::vector<GemvPrefetch>* hints = &gemv_next_;
  const size_t hint = gemv_next_.size() - 1;
  const float* xp = static_cast<const float*>(x.data);
  const GemvGatedOut gated{static_cast<float*>(out.data), gelu};
  std::array<uint64_t, 11 + kGemvLoraKeyWords> key = {KeyOf(xp),
                                                      U(k),
                                                      U(gelu),
                                                      KeyOf(out.data),
                                                      U(n),
                                                      KeyOf(parts[0].w),
                                                      KeyOf(parts[0].bias),
                                                      KeyOf(parts[0].out),
                                                      KeyOf(parts[1].w),
                                                      KeyOf(parts[1].bias),
                                                      KeyOf(parts[1].out)};
  size_t key_len = 11;
  std::optional<GemvLora> fused;
  if (lora != nullptr) {
    fused = *lora;
    key_len += GemvLoraKey(*lora, key.data() + key_len);
  }
  recorder_.Record(OpKind::kMatMulGemvActivation, std::span<const uint64_t>(key.data(), key_len),
                   [=](cudaStream_t st) {
                     LaunchGemvBf16Multi(xp, parts.data(), 2, k, (*hints)[hint], st, gated,
                                         fused ? &*fused : nullptr);
                   });
}

}  // namespace ember::cuda
