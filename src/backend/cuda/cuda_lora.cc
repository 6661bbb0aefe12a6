// CudaBackend's LoRA adapters: the slots' device storage (UploadLoraSlot: one buffer per slot,
// reused in place, grown when a larger adapter comes) and LoraDelta (lora.cu's shrink and expand
// over every segment of the call, their descriptors uploaded into the step arena).
//
// Decode graphs: the descriptors are copied into the arena at record time (behind the previous
// step on the stream, ahead of this step's launches) and the launch reads them from there; the
// op's graph key holds the descriptors' address and every descriptor word, so a graph replays
// only a step with the same segments (the same adapters' matrices over the same rows), and a
// step whose segments changed captures its own graph (the recorder's LRU of 128 graphs).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "util/half.h"

namespace ember::cuda {

namespace {

size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

// bf16 weights in the bf16 mode (rounded RN on the host, as UploadWeight's conversion), f32 in
// the f32 mode; each matrix 256-byte aligned in the slot's buffer.
Result<std::vector<Tensor>> CudaBackend::UploadLoraSlot(int32_t slot,
                                                        std::span<const LoraHostMatrix> matrices) {
  CHECK_GE(slot, 0);
  const DType dtype = f32_compute_ ? DType::kF32 : DType::kBF16;
  const size_t elem = DTypeSize(dtype);
  size_t total = 0;
  for (const LoraHostMatrix& m : matrices) {
    if (m.rows <= 0 || m.cols <= 0)
      return Status::Error("LoRA slot " + std::to_string(slot) + ": a matrix has no elements");
    total += Align256(static_cast<size_t>(m.rows * m.cols) * elem);
  }
  if (lora_slots_.size() <= static_cast<size_t>(slot))
    lora_slots_.resize(static_cast<size_t>(slot) + 1);
  DeviceBuffer& buffer = lora_slots_[static_cast<size_t>(slot)];
  // Steps still on the GPU may read the slot's previous adapter: let them end first.
  Flush();
  SyncAllStreams();
  if (buffer.bytes() < total) {
    buffer = DeviceBuffer();
    buffer = DeviceBuffer(total);
  }
  std::vector<unsigned char> host(total);
  std::vector<Tensor> tensors;
  tensors.reserve(matrices.size());
  size_t offset = 0;
  for (const LoraHostMatrix& m : matrices) {
    const size_t n = static_cast<size_t>(m.rows * m.cols);
    if (dtype == DType::kF32) {
      std::memcpy(host.data() + offset, m.data, n * sizeof(float));
    } else {
      uint16_t* dst = reinterpret_cast<uint16_t*>(host.data() + offset);
      for (size_t i = 0; i < n; ++i) dst[i] = F32ToBf16(m.data[i]);
    }
    Tensor t;
    t.data = static_cast<unsigned char*>(buffer.data()) + offset;
    t.dtype = dtype;
    t.ndim = 2;
    t.shape[0] = m.rows;
    t.shape[1] = m.cols;
    tensors.push_back(t);
    offset += Align256(n * elem);
  }
  CUDA_CHECK(cudaMemcpy(buffer.data(), host.data(), total, cudaMemcpyHostToDevice));
  return tensors;
}

void CudaBackend::LoraDelta(const Tensor& x, std::span<const LoraSegment> segments, Tensor out) {
  if (segments.empty()) return;
  CHECK(x.dtype == DType::kF32 || x.dtype == DType::kBF16) << DTypeName(x.dtype);
  CHECK(out.dtype == DType::kF32 || out.dtype == DType::kBF16) << DTypeName(out.dtype);
  CHECK_EQ(x.rows(), out.rows());
  const int64_t k = x.cols(), m = out.cols();
  const DType wdtype = segments[0].a->dtype;
  CHECK(wdtype == DType::kF32 || wdtype == DType::kBF16) << DTypeName(wdtype);
  lora_descs_.clear();
  int32_t max_rows = 0, max_rank = 0;
  for (const LoraSegment& seg : segments) {
    CHECK(seg.rows > 0 && seg.first_row >= 0 && seg.first_row + seg.rows <= x.rows() && seg.a &&
          seg.b);
    const int64_t rank = seg.a->dim(0);
    CHECK(seg.a->ndim == 2 && seg.b->ndim == 2 && seg.a->dim(1) == k && seg.b->dim(0) == m &&
          seg.b->dim(1) == rank)
        << ShapeString(*seg.a) << " " << ShapeString(*seg.b) << " for x " << ShapeString(x)
        << " out " << ShapeString(out);
    CHECK(seg.a->dtype == wdtype && seg.b->dtype == wdtype);
    CHECK(rank >= 1 && rank <= kMaxLoraKernelRank) << rank;
    lora_descs_.push_back(LoraSegmentDesc{seg.a->data, seg.b->data,
                                          static_cast<int32_t>(seg.first_row),
                                          static_cast<int32_t>(seg.rows),
                                          static_cast<int32_t>(rank), 0});
    max_rows = std::max(max_rows, static_cast<int32_t>(seg.rows));
    max_rank = std::max(max_rank, static_cast<int32_t>(rank));
  }
  const size_t desc_bytes = lora_descs_.size() * sizeof(LoraSegmentDesc);
  void* descs = ArenaAlloc(desc_bytes);
  Upload(descs, lora_descs_.data(), desc_bytes);
  LoraDeltaArgs args;
  args.segments = static_cast<const LoraSegmentDesc*>(descs);
  args.num_segments = static_cast<int32_t>(lora_descs_.size());
  args.max_rows = max_rows;
  args.max_rank = max_rank;
  args.x = x.data;
  args.x_bf16 = x.dtype == DType::kBF16;
  args.k = k;
  args.out = out.data;
  args.out_bf16 = out.dtype == DType::kBF16;
  args.m = m;
  args.w_bf16 = wdtype == DType::kBF16;
  // t: one arena region per step, shared by the step's LoraDelta calls (each call's expand has
  // read its t before the next call's shrink writes it, in stream order), grown when a call
  // needs more.
  const size_t t_bytes = static_cast<size_t>(x.rows()) * static_cast<size_t>(max_rank) * 4;
  if (lora_t_step_ != steps_begun_ || lora_t_bytes_ < t_bytes) {
    lora_t_ = static_cast<float*>(ArenaAlloc(t_bytes));
    lora_t_bytes_ = t_bytes;
    lora_t_step_ = steps_begun_;
  }
  args.t = lora_t_;
  lora_key_.assign({KeyOf(descs), U(args.num_segments), U(max_rows),
                    U(max_rank), KeyOf(x.data), U(args.x_bf16), U(k), KeyOf(out.data),
                    U(args.out_bf16), U(m), U(args.w_bf16), KeyOf(args.t)});
  for (const LoraSegmentDesc& d : lora_descs_) {
    lora_key_.push_back(KeyOf(d.a));
    lora_key_.push_back(KeyOf(d.b));
    lora_key_.push_back(U(d.first_row) << 32 | U(d.rows));
    lora_key_.push_back(U(d.rank));
  }
  recorder_.Record(OpKind::kLoraDelta, lora_key_,
                   [args](cudaStream_t st) { LaunchLoraDelta(args, st); });
}

}  // namespace ember::cuda
