// CudaBackend::MoeMlp: a mixture-of-experts MLP as one recorded op (router, route, experts and
// combine; moe.cu), over a device table of the expert set's weight pointers and step-arena
// scratch. Whether the experts run on tensor cores follows MoeOnTensorCores.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"

namespace ember::cuda {

std::string CudaBackend::MoeUnsupported(int32_t num_experts, int32_t top_k, int64_t d,
                                        int64_t inter) const {
  if (MoeSupported(num_experts, top_k, d, inter)) return "";
  return "the cuda backend's kernels take up to " + std::to_string(kMoeMaxExperts) +
         " experts, top k <= " + std::to_string(kMoeMaxTopK) +
         ", and hidden and expert widths that are multiples of 8 and at most " +
         std::to_string(kMoeMaxSmem / 4 / kMoeTileRows);
}

bool CudaBackend::MoeOnTensorCores(int64_t rows, int32_t top_k, int32_t num_experts,
                                   bool mxfp4) const {
  if (f32_compute_ || switches_.moe_mma == RuntimeSwitches::MoeMma::kNever) return false;
  if (switches_.moe_mma == RuntimeSwitches::MoeMma::kAlways || batch_invariant_) return true;
  return MoeMmaPays(rows * top_k, num_experts, mxfp4);
}

// MoeMlp's checks of its operands (the expert weights themselves: MoeTable, at first use).
void CudaBackend::CheckMoeMlp(const Tensor& x, const MoeExperts& experts, const Tensor& out) const {
  const int64_t rows = x.rows(), d = x.cols();
  const int32_t num_experts = static_cast<int32_t>(experts.gate.size());
  CHECK(num_experts > 0 && experts.up.size() == experts.gate.size() &&
        experts.down.size() == experts.gate.size());
  CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32);
  CHECK(experts.router.rows() == num_experts && experts.router.cols() == d &&
        (experts.router.dtype == experts.gate[0].dtype || experts.mxfp4()))
      << "router " << ShapeString(experts.router) << " " << DTypeName(experts.router.dtype);
  CHECK_EQ(reinterpret_cast<uintptr_t>(experts.router.data) % 16, 0u);
  CHECK_EQ(out.rows(), rows);
  CHECK_EQ(out.cols(), d);
  const bool mxfp4 = experts.mxfp4();
  const int64_t inter = experts.gate[0].rows();
  const DType wtype = experts.gate[0].dtype;
  CHECK(mxfp4 ? wtype == DType::kU8 && experts.router.dtype == DType::kBF16
              : wtype == DType::kBF16 || wtype == DType::kF32)
      << DTypeName(wtype) << (mxfp4 ? " MXFP4 experts" : " experts");
  if (mxfp4) {
    CHECK(!f32_compute_ && d % 32 == 0 && inter % 32 == 0)
        << "MXFP4 experts: d " << d << ", inter " << inter;
    CHECK(experts.up_scales.size() == experts.gate.size() &&
          experts.down_scales.size() == experts.gate.size() &&
          experts.gate_scales.size() == experts.gate.size());
  }
  if (experts.router_bias) {
    CHECK(experts.router_bias->dtype == DType::kF32 && experts.router_bias->numel() == num_experts)
        << "router bias " << ShapeString(*experts.router_bias);
  }
}

void CudaBackend::MoeMlp(const Tensor& x, const MoeExperts& experts, Tensor out) {
  CheckMoeMlp(x, experts, out);
  const int64_t rows = x.rows(), d = x.cols();
  const int32_t num_experts = static_cast<int32_t>(experts.gate.size());
  const bool mxfp4 = experts.mxfp4(), biased = experts.biased();
  const int64_t inter = experts.gate[0].rows();
  const DType wtype = experts.gate[0].dtype;
  const DeviceBuffer& table = MoeTable(experts, d, inter);
  MoeArgs a;
  a.router = experts.router.data;
  a.x = static_cast<const float*>(x.data);
  const auto* ptrs = static_cast<const void* const*>(table.data());
  a.gate = ptrs;
  a.up = ptrs + num_experts;
  a.down = ptrs + 2 * num_experts;
  a.router_bias =
      experts.router_bias ? static_cast<const float*>(experts.router_bias->data) : nullptr;
  const int64_t scale_ptrs = mxfp4 ? 3 * num_experts : 0;
  if (mxfp4) {
    a.mxfp4 = true;
    a.gate_scales = ptrs + 3 * num_experts;
    a.up_scales = ptrs + 4 * num_experts;
    a.down_scales = ptrs + 5 * num_experts;
  }
  if (biased) {
    CHECK_EQ(table.bytes(), (6 * num_experts + scale_ptrs) * sizeof(void*));  // biased
    const auto* biases = reinterpret_cast<const float* const*>(ptrs + 3 * num_experts + scale_ptrs);
    a.gate_bias = biases;
    a.up_bias = biases + num_experts;
    a.down_bias = biases + 2 * num_experts;
  }
  a.clamped_swiglu = experts.activation == MoeActivation::kClampedSwiglu;
  a.swiglu_limit = experts.swiglu_limit;
  a.swiglu_alpha = experts.swiglu_alpha;
  a.w_bf16 = mxfp4 || wtype == DType::kBF16;
  a.mma = a.w_bf16 && MoeOnTensorCores(rows, experts.top_k, num_experts, mxfp4);
  a.rows = rows;
  a.d = d;
  a.inter = inter;
  a.num_experts = num_experts;
  a.top_k = experts.top_k;
  a.route.normalize = experts.normalize;
  if (experts.routing == MoeRouting::kSigmoidGrouped) {
    CHECK(experts.score_bias && experts.score_bias->dtype == DType::kF32 &&
          experts.score_bias->numel() == num_experts)
        << "grouped routing needs a float32 score bias of " << num_experts;
    CHECK(experts.groups >= 1 && experts.groups <= 64 && num_experts % experts.groups == 0 &&
          num_experts / experts.groups >= 2 && experts.top_groups >= 1 &&
          experts.top_groups <= experts.groups)
        << num_experts << " experts in " << experts.groups << " groups, " << experts.top_groups
        << " kept";
    CHECK(!experts.router_bias) << "grouped routing with a router bias";
    a.route.grouped = true;
    a.router_bias = static_cast<const float*>(experts.score_bias->data);  // MoeRouteSpec
    a.route.groups = static_cast<int16_t>(experts.groups);
    a.route.top_groups = static_cast<int16_t>(experts.top_groups);
    a.route.scale = experts.scale;
  }
  a.max_tiles = MoeMaxTiles(rows, experts.top_k, num_experts);
  MoeScratch(a, rows, d, inter);
  a.out = static_cast<float*>(out.data);
  // The scratch follows from the arena's state, also keyed.
  const uint64_t weights_kind = U(a.w_bf16) | U(a.mxfp4) << 1 | U(a.mma) << 2;
  recorder_.Record(
      OpKind::kMoeMlp,
      {KeyOf(a.router), KeyOf(a.x), KeyOf(a.logits), KeyOf(ptrs), weights_kind, U(rows), U(d),
       U(inter), U(num_experts), U(a.top_k), U(a.route.normalize), U(a.route.grouped),
       U(a.route.groups), U(a.route.top_groups), KeyOf(a.route.scale), KeyOf(a.ids), KeyOf(a.y), KeyOf(a.out),
       KeyOf(a.router_bias), KeyOf(a.gate_bias), U(a.clamped_swiglu), KeyOf(a.swiglu_limit),
       KeyOf(a.swiglu_alpha)},
      [=](cudaStream_t st) { LaunchMoeMlp(a, st); });
}

// [gate, up, down (, gate_scales, up_scales, down_scales) (, gate_bias, up_bias, down_bias)]
// x num_experts device pointers of one expert set, checked and uploaded at its first use.
const DeviceBuffer& CudaBackend::MoeTable(const MoeExperts& experts, int64_t d, int64_t inter) {
  const bool mxfp4 = experts.mxfp4(), biased = experts.biased();
  const DType wtype = experts.gate[0].dtype;
  auto table = std::find_if(moe_tables_.begin(), moe_tables_.end(),
                            [&](const auto& t) { return t.first == experts.gate[0].data; });
  if (table == moe_tables_.end()) {
    // [gate, up, down (, gate_bias, up_bias, down_bias)] x num_experts pointers.
    std::vector<const void*> ptrs;
    // A matrix [out, in]: MXFP4 [out, in / 2] bytes with scales [out, in / 32].
    const int64_t per_byte = mxfp4 ? 2 : 1;
    for (const std::vector<Tensor>* part : {&experts.gate, &experts.up, &experts.down}) {
      for (const Tensor& w : *part) {
        const bool down = part == &experts.down;
        CHECK(w.dtype == wtype && w.rows() == (down ? d : inter) &&
              w.cols() * per_byte == (down ? inter : d))
            << "expert weight " << ShapeString(w) << " " << DTypeName(w.dtype);
        CHECK_EQ(reinterpret_cast<uintptr_t>(w.data) % 16, 0u);
        ptrs.push_back(w.data);
      }
    }
    if (mxfp4) {
      for (const std::vector<Tensor>* part :
           {&experts.gate_scales, &experts.up_scales, &experts.down_scales}) {
        for (const Tensor& sc : *part) {
          const bool down = part == &experts.down_scales;
          CHECK(sc.dtype == DType::kU8 && sc.rows() == (down ? d : inter) &&
                sc.cols() * 32 == (down ? inter : d))
              << "expert scales " << ShapeString(sc) << " " << DTypeName(sc.dtype);
          ptrs.push_back(sc.data);
        }
      }
    }
    if (biased) {
      for (const std::vector<Tensor>* part :
           {&experts.gate_bias, &experts.up_bias, &experts.down_bias}) {
        CHECK_EQ(part->size(), experts.gate.size());
        for (const Tensor& bias : *part) {
          CHECK(bias.dtype == DType::kF32 &&
                bias.numel() == (part == &experts.down_bias ? d : inter))
              << "expert bias " << ShapeString(bias) << " " << DTypeName(bias.dtype);
          ptrs.push_back(bias.data);
        }
      }
    }
    if (moe_tables_.empty()) PrepareMoeKernels();
    DeviceBuffer buffer(ptrs.size() * sizeof(void*));
    CUDA_CHECK(cudaMemcpy(buffer.data(), ptrs.data(), buffer.bytes(), cudaMemcpyHostToDevice));
    moe_tables_.emplace_back(experts.gate[0].data, std::move(buffer));
    table = moe_tables_.end() - 1;
  }
  return table->second;
}

// Route, schedule and activation buffers for a's rows: one arena region per step, shared by the
// step's MoE layers (their launches run in stream order), grown when a layer needs more.
void CudaBackend::MoeScratch(MoeArgs& a, int64_t rows, int64_t d, int64_t inter) {
  const int32_t num_experts = a.num_experts;
  const size_t pairs = static_cast<size_t>(rows * a.top_k);
  auto align = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const size_t pair_bytes = align(pairs * 4),
               tile_bytes = align(static_cast<size_t>(a.max_tiles) * 12);
  const size_t act_bytes = align(pairs * static_cast<size_t>(inter) * 4);
  const size_t logit_bytes = align(static_cast<size_t>(rows * num_experts) * 4);
  const size_t need = logit_bytes + 4 * pair_bytes + tile_bytes + 256 + act_bytes +
                      pairs * static_cast<size_t>(d) * 4;
  unsigned char* at = StepRegionOf(moe_scratch_, need);
  auto take = [&](size_t bytes) {
    unsigned char* p = at;
    at += bytes;
    return p;
  };
  a.logits = reinterpret_cast<float*>(take(logit_bytes));
  a.ids = reinterpret_cast<int32_t*>(take(pair_bytes));
  a.weights = reinterpret_cast<float*>(take(pair_bytes));
  a.sorted = reinterpret_cast<int32_t*>(take(pair_bytes));
  a.pair_pos = reinterpret_cast<int32_t*>(take(pair_bytes));
  a.tiles = reinterpret_cast<int32_t*>(take(tile_bytes));
  a.num_tiles = reinterpret_cast<int32_t*>(take(256));
  a.act = reinterpret_cast<float*>(take(act_bytes));
  a.y = reinterpret_cast<float*>(take(pairs * static_cast<size_t>(d) * 4));
}

}  // namespace ember::cuda
