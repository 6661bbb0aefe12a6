// CudaBackend's pointwise and row-wise ops, one launch each: the embedding gather, RMSNorm (with
// the residual add), the gated activations, Add and Softcap. Their kernels are embedding.cu,
// rms_norm.cu, activation.cu and elementwise.cu.
#include "backend/cuda/cuda_backend_impl.h"

namespace ember::cuda {

void CudaBackend::Embedding(const Tensor& table, float scale, Tensor out) {
  CHECK_EQ(out.rows(), plan_.num_tokens);
  CHECK_EQ(out.cols(), table.cols());
  const PlanView plan = plan_;
  const ElemType type = ToElemType(table.dtype);
  const int64_t vocab = table.rows(), d = table.cols();
  recorder_.Record(
      OpKind::kEmbedding,
      {KeyOf(table.data), U(static_cast<int>(type)), U(vocab), U(d), KeyOf(scale),
       KeyOf(plan.token_ids), KeyOf(plan.fed_ids), U(plan.num_tokens), KeyOf(out.data)},
      [=](cudaStream_t st) {
        LaunchEmbedding(table.data, type, vocab, d, scale, plan, static_cast<float*>(out.data), st);
      });
}

void CudaBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, RmsNormKind kind,
                          Tensor out) {
  CHECK(x.dtype == DType::kF32 && weight.dtype == DType::kF32);
  CHECK(out.dtype == DType::kF32 || out.dtype == DType::kBF16) << DTypeName(out.dtype);
  CHECK_EQ(x.numel(), out.numel());
  CHECK_EQ(weight.numel(), x.cols());
  const bool one_plus = kind == RmsNormKind::kOnePlusWeight;
  const bool out_bf16 = out.dtype == DType::kBF16;
  const int64_t rows = x.rows(), d = x.cols();
  recorder_.Record(OpKind::kRmsNorm,
                   {KeyOf(x.data), KeyOf(weight.data), KeyOf(eps), U(one_plus), U(rows), U(d),
                    KeyOf(out.data), U(out_bf16)},
                   [=](cudaStream_t st) {
                     LaunchRmsNorm(static_cast<const float*>(x.data), nullptr, nullptr, false,
                                   static_cast<const float*>(weight.data), eps, one_plus, rows, d,
                                   out.data, out_bf16, st);
                   });
}

void CudaBackend::AddRmsNorm(Tensor residual, const Tensor& delta, const Tensor& weight, float eps,
                             RmsNormKind kind, Tensor out) {
  CHECK_EQ(residual.numel(), delta.numel());
  CHECK_EQ(residual.numel(), out.numel());
  CHECK_EQ(weight.numel(), residual.cols());
  CHECK(weight.dtype == DType::kF32 && residual.dtype == DType::kF32);
  CHECK(delta.dtype == DType::kF32 || delta.dtype == DType::kBF16) << DTypeName(delta.dtype);
  CHECK(out.dtype == DType::kF32 || out.dtype == DType::kBF16) << DTypeName(out.dtype);
  const bool one_plus = kind == RmsNormKind::kOnePlusWeight;
  const bool delta_bf16 = delta.dtype == DType::kBF16;
  const bool out_bf16 = out.dtype == DType::kBF16;
  const int64_t rows = residual.rows(), d = residual.cols();
  recorder_.Record(OpKind::kAddRmsNorm,
                   {KeyOf(residual.data), KeyOf(delta.data), KeyOf(weight.data), KeyOf(eps),
                    U(one_plus), U(rows), U(d), KeyOf(out.data), U(out_bf16), U(delta_bf16)},
                   [=](cudaStream_t st) {
                     LaunchRmsNorm(nullptr, static_cast<float*>(residual.data), delta.data,
                                   delta_bf16, static_cast<const float*>(weight.data), eps,
                                   one_plus, rows, d, out.data, out_bf16, st);
                   });
}

void CudaBackend::SiluMul(const Tensor& gate, const Tensor& up, Tensor out) {
  GatedActivation(gate, up, out, false);
}

void CudaBackend::GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor out) {
  GatedActivation(gate, up, out, true);
}

void CudaBackend::GatedActivation(const Tensor& gate, const Tensor& up, Tensor out, bool gelu) {
  CHECK_EQ(gate.numel(), up.numel());
  CHECK_EQ(gate.numel(), out.numel());
  CHECK(gate.dtype == up.dtype && (gate.dtype == DType::kF32 || gate.dtype == DType::kBF16))
      << DTypeName(gate.dtype) << ", " << DTypeName(up.dtype);
  CHECK(out.dtype == DType::kF32 || out.dtype == DType::kBF16) << DTypeName(out.dtype);
  const bool in_bf16 = gate.dtype == DType::kBF16;
  const bool out_bf16 = out.dtype == DType::kBF16;
  const int64_t n = gate.numel();
  recorder_.Record(
      gelu ? OpKind::kGeluTanhMul : OpKind::kSiluMul,
      {KeyOf(gate.data), KeyOf(up.data), KeyOf(out.data), U(n), U(out_bf16), U(in_bf16)},
      [=](cudaStream_t st) {
        LaunchGatedActivation(gate.data, up.data, in_bf16, out.data, out_bf16, n, gelu, st);
      });
}

void CudaBackend::Add(const Tensor& a, const Tensor& b, Tensor out) {
  CHECK_EQ(a.numel(), b.numel());
  CHECK_EQ(a.numel(), out.numel());
  const int64_t n = a.numel();
  recorder_.Record(OpKind::kAdd, {KeyOf(a.data), KeyOf(b.data), KeyOf(out.data), U(n)},
                   [=](cudaStream_t st) {
                     LaunchAdd(static_cast<const float*>(a.data), static_cast<const float*>(b.data),
                               static_cast<float*>(out.data), n, st);
                   });
}

void CudaBackend::Softcap(Tensor x, float cap) {
  CHECK_GT(cap, 0.f);
  const int64_t n = x.numel();
  recorder_.Record(OpKind::kSoftcap, {KeyOf(x.data), KeyOf(cap), U(n)}, [=](cudaStream_t st) {
    LaunchSoftcap(static_cast<float*>(x.data), cap, n, st);
  });
}

}  // namespace ember::cuda
