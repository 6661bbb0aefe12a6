#include "backend/backend.h"

#include <sstream>

namespace ember {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kU8:
      return 1;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      break;
  }
  CHECK(false) << "DTypeSize of block-quantized " << DTypeName(dtype) << " (use DTypeRowBytes)";
  return 0;
}

bool IsKQuant(DType dtype) {
  return dtype == DType::kQ4_K || dtype == DType::kQ5_K || dtype == DType::kQ6_K;
}

bool IsBlockQuantized(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kQ4_0 || IsKQuant(dtype);
}

int64_t DTypeBlockValues(DType dtype) {
  return IsKQuant(dtype) ? 256 : IsBlockQuantized(dtype) ? 32 : 1;
}

namespace {
size_t BlockBytes(DType dtype) {
  switch (dtype) {
    case DType::kQ8_0: return 34;
    case DType::kQ4_0: return 18;
    case DType::kQ4_K: return 144;
    case DType::kQ5_K: return 176;
    case DType::kQ6_K: return 210;
    default: return DTypeSize(dtype);
  }
}
}  // namespace

size_t DTypeRowBytes(DType dtype, int64_t cols) {
  const int64_t block = DTypeBlockValues(dtype);
  CHECK_EQ(cols % block, 0) << DTypeName(dtype) << " row of " << cols << " values";
  return static_cast<size_t>(cols / block) * BlockBytes(dtype);
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kU8:
      return "U8";
    case DType::kQ8_0: return "Q8_0";
    case DType::kQ4_0: return "Q4_0";
    case DType::kQ4_K: return "Q4_K";
    case DType::kQ5_K: return "Q5_K";
    case DType::kQ6_K: return "Q6_K";
  }
  return "?";
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int32_t i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

Tensor Tensor::Reshape(std::initializer_list<int64_t> new_shape) const {
  CHECK_LE(new_shape.size(), 4u);
  Tensor t = *this;
  t.ndim = static_cast<int32_t>(new_shape.size());
  t.shape = {};
  size_t i = 0;
  for (int64_t d : new_shape) t.shape[i++] = d;
  CHECK_EQ(t.numel(), numel()) << "Reshape " << ShapeString(*this) << " -> " << ShapeString(t);
  return t;
}

Tensor Tensor::RowSlice(int64_t first, int64_t count) const {
  CHECK(first >= 0 && count >= 0 && first + count <= rows());
  Tensor t = *this;
  t.data = static_cast<uint8_t*>(data) + static_cast<size_t>(first) * DTypeRowBytes(dtype, cols());
  t.ndim = 2;
  t.shape = {count, cols(), 0, 0};
  return t;
}

std::string Backend::MoeUnsupported(int32_t, int32_t, int64_t, int64_t) const {
  return "the " + name() + " backend has no mixture-of-experts kernels";
}

void Backend::MoeMlp(const Tensor&, const MoeExperts&, Tensor) {
  CHECK(false) << "backend " << name() << " has no MoeMlp";
}

Status Backend::AllocateLatentKvPool(int32_t, int32_t, int32_t, int32_t) {
  return Status::Error("multi-head latent attention is not supported on the " + name() +
                       " backend yet");
}

void Backend::MlaAttention(int32_t, const MlaParams&, Tensor, const Tensor&, const Tensor&,
                           Tensor) {
  CHECK(false) << "backend " << name() << " has no MlaAttention";
}

Status Backend::SetKvFormat(const KvFormat& format, int32_t head_dim) {
  const std::string own = KvFormatText(head_dim);
  for (size_t l = 0; l < format.layers.size(); ++l) {
    const KvDType t = format.layers[l];
    if (t != KvDType::kAuto && own != KvDTypeName(t))
      return Status::Error("--kv-cache-dtype " + std::string(KvDTypeName(t)) + " (layer " +
                           std::to_string(l) + "): not supported on the " + name() +
                           " backend yet (its KV cache is " + own + " here: use auto or " + own +
                           ")");
  }
  return Status::Ok();
}

Status Backend::CopyKvBlockToHost(int32_t /*block_id*/, std::span<uint8_t> /*out*/) {
  return Status::Error("the " + name() + " backend cannot copy KV blocks to host memory");
}

Status Backend::CopyKvBlocksToHost(std::span<const int32_t> blocks,
                                   std::span<const std::span<uint8_t>> outs) {
  if (blocks.size() != outs.size())
    return Status::Error("CopyKvBlocksToHost: " + std::to_string(blocks.size()) + " blocks, " +
                         std::to_string(outs.size()) + " outputs");
  for (size_t i = 0; i < blocks.size(); ++i)
    EMBER_RETURN_IF_ERROR(CopyKvBlockToHost(blocks[i], outs[i]));
  return Status::Ok();
}

Status Backend::CopyKvBlockFromHost(int32_t /*block_id*/, std::span<const uint8_t> /*in*/) {
  return Status::Error("the " + name() + " backend cannot copy KV blocks from host memory");
}

void Backend::MatMulGroup(const Tensor& x, std::span<const MatMulPart> parts) {
  CHECK_LE(parts.size(), kMaxMatMulGroupParts);
  for (const MatMulPart& part : parts) MatMul(x, *part.weight, part.bias, part.out);
}

void Backend::RopeWriteKv(int32_t rope_id, int32_t layer, Tensor q, Tensor k, const Tensor& v) {
  Rope(rope_id, q, k);
  WriteKv(layer, k, v);
}

void Backend::RopeWriteKvAttention(int32_t rope_id, const AttentionParams& params, Tensor q,
                                   Tensor k, const Tensor& v, Tensor out) {
  RopeWriteKv(rope_id, params.layer, q, k, v);
  Attention(params, q, out);
}

void Backend::GateUpActivation(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                               GateActivation activation, Tensor gate, Tensor up, Tensor out) {
  const MatMulPart parts[] = {{&w_gate, nullptr, gate}, {&w_up, nullptr, up}};
  MatMulGroup(x, parts);
  if (activation == GateActivation::kSilu) {
    SiluMul(gate, up, out);
  } else {
    GeluTanhMul(gate, up, out);
  }
}

void Backend::GateUpActivationLora(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                                   GateActivation activation, Tensor gate, Tensor up, Tensor out,
                                   std::span<const LoraPart> lora) {
  const MatMulPart parts[] = {{&w_gate, nullptr, gate}, {&w_up, nullptr, up}};
  MatMulGroupLora(x, parts, lora);
  if (activation == GateActivation::kSilu) {
    SiluMul(gate, up, out);
  } else {
    GeluTanhMul(gate, up, out);
  }
}

void Backend::LoraDelta(const Tensor& x, std::span<const LoraSegment> segments, Tensor out) {
  for (const LoraSegment& seg : segments) {
    CHECK(seg.rows > 0 && seg.first_row + seg.rows <= x.rows() && seg.a && seg.b);
    Tensor low = Alloc({seg.rows, seg.a->dim(0)});
    MatMul(x.RowSlice(seg.first_row, seg.rows), *seg.a, nullptr, low);
    Tensor update = Alloc({seg.rows, seg.b->dim(0)});
    MatMul(low, *seg.b, nullptr, update);
    Tensor rows = out.RowSlice(seg.first_row, seg.rows);
    Add(rows, update, rows);
  }
}

void Backend::LoraDeltaGroup(const Tensor& x, std::span<const LoraPart> parts) {
  CHECK_LE(parts.size(), kMaxLoraParts);
  for (const LoraPart& part : parts) LoraDelta(x, part.segments, part.out);
}

void Backend::MatMulGroupLora(const Tensor& x, std::span<const MatMulPart> parts,
                              std::span<const LoraPart> lora) {
  MatMulGroup(x, parts);
  if (!lora.empty()) LoraDeltaGroup(x, lora);
}

Result<std::vector<Tensor>> Backend::UploadLoraSlot(int32_t slot,
                                                    std::span<const LoraHostMatrix> matrices) {
  std::vector<Tensor> tensors;
  tensors.reserve(matrices.size());
  for (size_t i = 0; i < matrices.size(); ++i) {
    const LoraHostMatrix& m = matrices[i];
    const int64_t shape[] = {m.rows, m.cols};
    EMBER_ASSIGN_OR_RETURN(Tensor t, UploadWeight("lora." + std::to_string(slot) + "." +
                                                      std::to_string(i),
                                                  DType::kF32, shape, m.data));
    tensors.push_back(t);
  }
  return tensors;
}

std::string Backend::LoraUnsupported() const {
  const std::string who = name().rfind("cuda", 0) == 0 ? std::string("CUDA") : name();
  return "LoRA adapters are not supported on the " + who + " backend yet";
}

std::string ShapeString(const Tensor& t) {
  std::ostringstream os;
  os << "[";
  for (int32_t i = 0; i < t.ndim; ++i) os << (i ? ", " : "") << t.dim(i);
  os << "]";
  return os.str();
}

// ---- MTP modules: a backend without the host-row ops refuses (Model::Load asks MtpUnsupported)
std::string Backend::MtpUnsupported() const {
  return "multi-token-prediction drafts (--spec-method mtp) are not supported on the " + name() +
         " backend yet";
}
Status Backend::CopyFromHost(std::span<const float>, Tensor) {
  return Status::Error(MtpUnsupported() + " (CopyFromHost)");
}
Status Backend::ZeroRows(Tensor, std::span<const int32_t>) {
  return Status::Error(MtpUnsupported() + " (ZeroRows)");
}

// ---- recurrent layers: a backend without them refuses (Model::Load asks RecurrentUnsupported)
std::string Backend::RecurrentUnsupported() const {
  return "gated DeltaNet linear attention is not supported on the " + name() + " backend yet";
}
std::string Backend::StateSnapshotsUnsupported() const {
  return "the " + name() + " backend does not keep per-row recurrent-state snapshots " +
         "(SequenceSlice::snapshot_slot) yet";
}
Status Backend::AllocateStateSlots(int32_t, int64_t) {
  return Status::Error(RecurrentUnsupported() + " (AllocateStateSlots)");
}
Status Backend::CopyStateSlot(int32_t, int32_t) {
  return Status::Error(RecurrentUnsupported() + " (CopyStateSlot)");
}
Status Backend::CheckStateSlotCopy(int32_t slot, size_t bytes, int32_t slots,
                                   int64_t floats_per_slot) {
  if (slot < 0 || slot >= slots)
    return Status::Error("state slot copy: slot " + std::to_string(slot) + " outside the " +
                         std::to_string(slots) + " allocated");
  if (bytes != static_cast<size_t>(floats_per_slot) * sizeof(float))
    return Status::Error("state slot copy: " + std::to_string(bytes) + " bytes, a slot holds " +
                         std::to_string(floats_per_slot * 4));
  return Status::Ok();
}
Status Backend::CopyStateSlotToHost(int32_t, std::span<uint8_t>) {
  return Status::Error(RecurrentUnsupported() + " (CopyStateSlotToHost)");
}
Status Backend::CopyStateSlotFromHost(int32_t, std::span<const uint8_t>) {
  return Status::Error(RecurrentUnsupported() + " (CopyStateSlotFromHost)");
}
Status Backend::CausalConv1dSilu(Tensor, const Tensor&, int64_t) {
  return Status::Error(RecurrentUnsupported() + " (CausalConv1dSilu)");
}
Status Backend::GatedDeltaRule(const GatedDeltaParams&, const Tensor&, const Tensor&, Tensor) {
  return Status::Error(RecurrentUnsupported() + " (GatedDeltaRule)");
}
Status Backend::SigmoidGateMul(Tensor, const Tensor&) {
  return Status::Error("SigmoidGateMul is not implemented on the " + name() + " backend yet");
}

}  // namespace ember
