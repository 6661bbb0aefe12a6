// CudaBackend's LoRA adapters: the slots' device storage (UploadLoraSlot: one buffer per slot,
// reused in place, grown when a larger adapter comes) and LoraDelta (lora.cu's BGMV-style shrink
// and expand over every row of the call).
//
// Tables, not segments: each call turns its segments into a row table (row -> LoRA slot, -1 for
// rows in no segment) and an entry table (per part and slot, that slot's a, b and rank for the
// part's projection; rank 0 for slots with no segment there). Both are staged on the host into
// one arena region per step and uploaded by Flush in a single copy ahead of the step's launches
// (a call whose row table equals the previous call's reuses it: one row table per step in the
// usual case). The op's graph key holds the tables' addresses, the shapes and the rank cap, never
// their contents: a decode step of the same shape replays its graph whatever mix of adapters
// its rows use, and a new mix costs no capture.
#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "util/half.h"

namespace ember::cuda {

namespace {

static_assert(kMaxLoraParts == static_cast<size_t>(kMaxLoraKernelParts));

size_t Align256(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}
bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

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
  // Pairs (a, then b) of one site join the stacks.
  if (lora_slot_matrices_.size() < lora_slots_.size())
    lora_slot_matrices_.resize(lora_slots_.size());
  std::vector<LoraSlotMatrix>& sited = lora_slot_matrices_[static_cast<size_t>(slot)];
  sited.clear();
  for (size_t i = 0; i + 1 < matrices.size(); ++i) {
    const LoraHostMatrix &a = matrices[i], &b = matrices[i + 1];
    if (a.site < 0 || b.site != a.site || a.rows != b.cols) continue;
    sited.push_back(LoraSlotMatrix{a.site, tensors[i].data, tensors[i + 1].data,
                                   static_cast<int32_t>(a.rows), a.cols, b.rows});
    ++i;
  }
  UpdateLoraStacks(slot);
  return tensors;
}

void CudaBackend::UpdateLoraStacks(int32_t slot) {
  if (f32_compute_ || switches_.lora_stacked_rows <= 0) return;
  const auto before_site = [](const LoraStack& st, int64_t site) { return st.site < site; };
  // Every site's shape (k, m) and the largest rank.
  std::vector<LoraStack> sites;
  int32_t rank = 0;
  bool consistent = true;
  for (const std::vector<LoraSlotMatrix>& matrices : lora_slot_matrices_) {
    for (const LoraSlotMatrix& mat : matrices) {
      rank = std::max(rank, mat.rank);
      auto at = std::lower_bound(sites.begin(), sites.end(), mat.site, before_site);
      if (at != sites.end() && at->site == mat.site) {
        consistent = consistent && at->k == mat.k && at->m == mat.m;
      } else {
        sites.insert(at, LoraStack{mat.site, mat.k, mat.m, nullptr, nullptr});
      }
    }
  }
  rank = (rank + 7) / 8 * 8;
  const auto slots = static_cast<int32_t>(lora_slot_matrices_.size());
  bool same_layout = consistent && slots == lora_stack_slots_ && rank == lora_stack_rank_ &&
                     sites.size() == lora_stacks_.size();
  for (size_t i = 0; same_layout && i < sites.size(); ++i)
    same_layout = sites[i].site == lora_stacks_[i].site && sites[i].k == lora_stacks_[i].k &&
                  sites[i].m == lora_stacks_[i].m;
  const size_t width = static_cast<size_t>(slots) * static_cast<size_t>(rank);  // columns
  std::vector<int32_t> rewrite;  // the slots whose columns are written
  if (same_layout) {
    rewrite.push_back(slot);
  } else {
    lora_stacks_.clear();
    lora_stack_of_.clear();
    lora_stack_buffer_ = DeviceBuffer();
    lora_stack_slots_ = lora_stack_rank_ = 0;
    if (!consistent || sites.empty()) return;
    size_t total = 0;
    for (const LoraStack& st : sites)
      total += Align256(width * static_cast<size_t>(st.k) * 2) +
               Align256(static_cast<size_t>(st.m) * width * 2);
    // A second copy of every adapter: only where it leaves the device room (else the BGMV
    // kernels serve every call).
    constexpr size_t kReserve = size_t{1} << 30;
    size_t free_bytes = 0, device_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &device_bytes));
    if (total + kReserve > free_bytes) return;
    lora_stack_buffer_ = DeviceBuffer(total);
    CUDA_CHECK(cudaMemsetAsync(lora_stack_buffer_.data(), 0, total, stream()));
    auto* next = static_cast<unsigned char*>(lora_stack_buffer_.data());
    for (LoraStack& st : sites) {  // the a stacks in site order, then the b stacks
      st.a = next;
      next += Align256(width * static_cast<size_t>(st.k) * 2);
    }
    for (LoraStack& st : sites) {
      st.b = next;
      next += Align256(static_cast<size_t>(st.m) * width * 2);
    }
    lora_stacks_ = std::move(sites);
    lora_stack_slots_ = slots;
    lora_stack_rank_ = rank;
    for (int32_t s = 0; s < slots; ++s) rewrite.push_back(s);
  }
  const size_t R = static_cast<size_t>(lora_stack_rank_);
  auto stack_of = [&](int64_t site) {
    return static_cast<size_t>(
        std::lower_bound(lora_stacks_.begin(), lora_stacks_.end(), site, before_site) -
        lora_stacks_.begin());
  };
  for (const int32_t s : rewrite) {
    const size_t col = static_cast<size_t>(s) * R;
    if (same_layout) {  // the slot's previous adapter may have had sites or a rank this one lacks
      for (const LoraStack& st : lora_stacks_) {
        CUDA_CHECK(cudaMemsetAsync(st.a + col * static_cast<size_t>(st.k) * 2, 0,
                                   R * static_cast<size_t>(st.k) * 2, stream()));
        CUDA_CHECK(cudaMemset2DAsync(st.b + col * 2, width * 2, 0, R * 2, static_cast<size_t>(st.m),
                                     stream()));
      }
    }
    for (const LoraSlotMatrix& mat : lora_slot_matrices_[static_cast<size_t>(s)]) {
      const LoraStack& st = lora_stacks_[stack_of(mat.site)];
      const auto r = static_cast<size_t>(mat.rank);
      CUDA_CHECK(cudaMemcpyAsync(st.a + col * static_cast<size_t>(st.k) * 2, mat.a,
                                 r * static_cast<size_t>(st.k) * 2, cudaMemcpyDeviceToDevice,
                                 stream()));
      CUDA_CHECK(cudaMemcpy2DAsync(st.b + col * 2, width * 2, mat.b, r * 2, r * 2,
                                   static_cast<size_t>(st.m), cudaMemcpyDeviceToDevice, stream()));
    }
  }
  CUDA_CHECK(cudaStreamSynchronize(stream()));
  lora_stack_of_.clear();
  for (int32_t s = 0; s < slots; ++s)
    for (const LoraSlotMatrix& mat : lora_slot_matrices_[static_cast<size_t>(s)])
      lora_stack_of_[mat.a] = LoraStackRef{static_cast<int32_t>(stack_of(mat.site)), s};
}

int32_t CudaBackend::LoraSlotOf(const void* p, int32_t hint) const {
  auto holds = [&](int32_t slot) {
    const DeviceBuffer& b = lora_slots_[static_cast<size_t>(slot)];
    const auto* base = static_cast<const unsigned char*>(b.data());
    const auto* q = static_cast<const unsigned char*>(p);
    return base != nullptr && q >= base && q < base + b.bytes();
  };
  const int32_t slots = static_cast<int32_t>(lora_slots_.size());
  if (hint >= 0 && hint < slots && holds(hint)) return hint;
  for (int32_t s = 0; s < slots; ++s)
    if (holds(s)) return s;
  CHECK(false) << "LoraDelta: a matrix that no UploadLoraSlot made";
  return -1;
}

void* CudaBackend::LoraStage(const void* src, size_t bytes) {
  const size_t padded = (bytes + 15) / 16 * 16;
  if (lora_stage_step_ != steps_begun_) {  // the step's first table
    lora_stage_step_ = steps_begun_;
    lora_stage_dev_ = nullptr;
    lora_stage_cap_ = lora_stage_used_ = lora_stage_sent_ = lora_stage_total_ = 0;
    lora_last_rows_dev_ = nullptr;
  }
  if (lora_stage_used_ + padded > lora_stage_cap_) {
    LoraSendStaged();
    // A power of two: a new largest step moves the later arena addresses (and so the decode
    // graphs' keys) only when it doubles the region.
    lora_stage_cap_ =
        std::bit_ceil(std::max({padded, 2 * lora_stage_cap_, lora_stage_hint_, size_t{4096}}));
    lora_stage_dev_ = static_cast<unsigned char*>(ArenaAlloc(lora_stage_cap_));
    lora_stage_host_.resize(lora_stage_cap_);
    lora_stage_used_ = lora_stage_sent_ = 0;
  }
  std::memcpy(lora_stage_host_.data() + lora_stage_used_, src, bytes);
  void* dev = lora_stage_dev_ + lora_stage_used_;
  lora_stage_used_ += padded;
  lora_stage_total_ += padded;
  lora_stage_hint_ = std::max(lora_stage_hint_, lora_stage_total_);
  return dev;
}

void CudaBackend::LoraSendStaged() {
  if (lora_stage_dev_ == nullptr || lora_stage_used_ == lora_stage_sent_) return;
  Upload(lora_stage_dev_ + lora_stage_sent_, lora_stage_host_.data() + lora_stage_sent_,
         lora_stage_used_ - lora_stage_sent_);
  lora_stage_sent_ = lora_stage_used_;
}

void CudaBackend::LoraDelta(const Tensor& x, std::span<const LoraSegment> segments, Tensor out) {
  const LoraPart part{segments, out};
  LoraDeltaGroup(x, std::span<const LoraPart>(&part, 1));
}

void CudaBackend::LoraDeltaGroup(const Tensor& x, std::span<const LoraPart> parts) {
  LoraUpdate(x, parts, nullptr);
}

// One row on the GEMV (the batch-1 decode step): the updates first, each written with its
// projection's bias into a row of its own, which the GEMV then adds as its bias. The update's
// launches run while the GEMV's ring fills, and out is written once. Elsewhere the default.
void CudaBackend::MatMulGroupLora(const Tensor& x, std::span<const MatMulPart> parts,
                                  std::span<const LoraPart> lora) {
  CHECK_LE(parts.size(), kMaxMatMulGroupParts);
  CHECK_LE(lora.size(), static_cast<size_t>(kMaxLoraKernelParts));
  bool fold = switches_.lora_bias_fold && x.rows() == 1;
  for (const MatMulPart& part : parts)
    fold = fold && MatMulPathOf(x, *part.weight) == MatMulPath::kGemv;
  size_t product_of[kMaxLoraKernelParts] = {};
  for (size_t i = 0; fold && i < lora.size(); ++i) {
    size_t p = 0;
    while (p < parts.size() && parts[p].out.data != lora[i].out.data) ++p;
    fold = p < parts.size();
    product_of[i] = p;
  }
  if (!fold) {
    if (!MatMulGroupAfterLora(x, parts, lora)) Backend::MatMulGroupLora(x, parts, lora);
    return;
  }
  // One launch for the GEMV and the update where the ring GEMV takes it.
  float* outs[kMaxMatMulGroupParts] = {};
  int64_t total = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    outs[p] = static_cast<float*>(parts[p].out.data);
    total += parts[p].weight->rows();
  }
  if (parts.size() <= static_cast<size_t>(kGemvMaxParts) && GemvLoraFused(total, x.cols(), false)) {
    if (const std::optional<GemvLora> fused =
            StageGemvLora(x, lora, std::span<float* const>(outs, parts.size()))) {
      RecordGemvWithLora(x, parts, *fused);
      return;
    }
  }
  MatMulPart folded[kMaxMatMulGroupParts];
  std::copy(parts.begin(), parts.end(), folded);
  LoraPart updates[kMaxLoraKernelParts];
  Tensor biases[kMaxLoraKernelParts];
  const float* bases[kMaxLoraKernelParts] = {};
  for (size_t i = 0; i < lora.size(); ++i) {
    MatMulPart& product = folded[product_of[i]];
    const int64_t m = product.weight->rows();
    Tensor row = Alloc({1, m});  // f32: the GEMV's bias
    updates[i] = LoraPart{lora[i].segments, row};
    bases[i] = product.bias != nullptr ? static_cast<const float*>(product.bias->data) : nullptr;
    biases[i] = row;
    biases[i].ndim = 1;
    biases[i].shape[0] = m;
    product.bias = &biases[i];
  }
  LoraUpdate(x, std::span<const LoraPart>(updates, lora.size()), bases);
  MatMulGroup(x, std::span<const MatMulPart>(folded, parts.size()));
}

// One row on the gated GEMV: the updates into rows of their own first, which the gated GEMV adds
// as gate's and up's biases before the activation (one launch instead of the GEMV, the updates
// and the activation). Elsewhere the default.
void CudaBackend::GateUpActivationLora(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                                       GateActivation activation, Tensor gate, Tensor up,
                                       Tensor out, std::span<const LoraPart> lora) {
  bool fold = switches_.lora_bias_fold && x.rows() == 1 && !lora.empty() && lora.size() <= 2 &&
              GatedGemvFits(x, w_gate, w_up, gate, up, out);
  for (const LoraPart& part : lora)
    fold = fold && (part.out.data == gate.data || part.out.data == up.data);
  if (!fold) {
    Backend::GateUpActivationLora(x, w_gate, w_up, activation, gate, up, out, lora);
    return;
  }
  float* const outs[2] = {static_cast<float*>(gate.data), static_cast<float*>(up.data)};
  if (const std::optional<GemvLora> fused = StageGemvLora(x, lora, outs)) {
    RecordGatedGemv(x, w_gate, w_up, activation, gate, up, out, nullptr, nullptr, &*fused);
    return;
  }
  LoraPart updates[2];
  const float* biases[2] = {};  // gate's, up's
  const float* const zeros[kMaxLoraKernelParts] = {};
  for (size_t i = 0; i < lora.size(); ++i) {
    const Tensor row = Alloc({1, gate.numel()});  // f32
    updates[i] = LoraPart{lora[i].segments, row};
    biases[lora[i].out.data == gate.data ? 0 : 1] = static_cast<const float*>(row.data);
  }
  LoraUpdate(x, std::span<const LoraPart>(updates, lora.size()), zeros);
  RecordGatedGemv(x, w_gate, w_up, activation, gate, up, out, biases[0], biases[1]);
}

bool CudaBackend::MatMulGroupAfterLora(const Tensor& x, std::span<const MatMulPart> parts,
                                       std::span<const LoraPart> lora) {
  if (switches_.lora_update_first_rows <= 0 || x.rows() < switches_.lora_update_first_rows ||
      lora.empty() || parts.size() > kMaxMatMulGroupParts)
    return false;
  bool accumulate[kMaxMatMulGroupParts] = {};
  for (const LoraPart& part : lora) {
    size_t p = 0;
    while (p < parts.size() && parts[p].out.data != part.out.data) ++p;
    if (p == parts.size() || accumulate[p] ||
        MatMulPathOf(x, *parts[p].weight) != MatMulPath::kCublas)
      return false;
    accumulate[p] = true;
  }
  if (!RecordLoraStacked(x, lora, /*overwrite=*/true)) return false;
  RecordMatMulGroup(x, parts, accumulate);
  return true;
}

void CudaBackend::LoraUpdate(const Tensor& x, std::span<const LoraPart> parts,
                             const float* const* bases) {
  CHECK_LE(parts.size(), static_cast<size_t>(kMaxLoraKernelParts));
  // Calls of up to EMBER_LORA_STACKED_ROWS rows where the base MatMuls are cuBLAS's: GEMMs over
  // the stacks. Else prefill-sized segments there: two cuBLAS GEMMs per segment and part; the
  // rest: the BGMV kernels.
  if (bases == nullptr && RecordLoraStacked(x, parts)) return;
  LoraPart rest[kMaxLoraKernelParts];
  if (bases == nullptr && RecordLoraGemms(x, parts, rest))
    parts = std::span<const LoraPart>(rest, parts.size());
  size_t segments_total = 0;
  for (const LoraPart& part : parts) segments_total += part.segments.size();
  // (Overwrite writes a bias row its GEMV reads: it never comes without segments.)
  CHECK(bases == nullptr || segments_total > 0);
  if (segments_total == 0) return;
  const LoraTables tables = BuildLoraTables(x, parts);
  RecordLoraDelta(x, parts, tables.wdtype, tables.x_vec, tables.w_vec, bases);
}

// Checks the parts' segments and fills lora_rows_ (each row's slot, -1 none) and lora_entries_
// ([part][slot]: the slot's matrices for the part's projection, rank 0 where it has none).
CudaBackend::LoraTables CudaBackend::BuildLoraTables(const Tensor& x,
                                                     std::span<const LoraPart> parts) {
  CHECK(x.dtype == DType::kF32 || x.dtype == DType::kBF16) << DTypeName(x.dtype);
  const int64_t n = x.rows(), k = x.cols();
  size_t segments_total = 0;
  for (const LoraPart& part : parts) segments_total += part.segments.size();
  LoraTables tables;
  tables.wdtype = [&] {
    for (const LoraPart& part : parts)
      if (!part.segments.empty()) return part.segments[0].a->dtype;
    return DType::kF32;
  }();
  const DType wdtype = tables.wdtype;
  CHECK(wdtype == DType::kF32 || wdtype == DType::kBF16) << DTypeName(wdtype);
  const size_t slots = lora_slots_.size();
  lora_rows_.assign(static_cast<size_t>(n), -1);
  lora_entries_.assign(parts.size() * slots, LoraEntry{});
  if (lora_seg_slot_.size() < segments_total) lora_seg_slot_.resize(segments_total, -1);
  bool x_vec = k % 8 == 0 && Aligned16(x.data), w_vec = true;
  size_t seg_index = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const Tensor& out = parts[p].out;
    CHECK(out.dtype == DType::kF32 || out.dtype == DType::kBF16) << DTypeName(out.dtype);
    CHECK(out.dtype == parts[0].out.dtype) << "LoraDeltaGroup: parts of different dtypes";
    CHECK_EQ(x.rows(), out.rows());
    const int64_t m = out.cols();
    for (const LoraSegment& seg : parts[p].segments) {
      CHECK(seg.rows > 0 && seg.first_row >= 0 && seg.first_row + seg.rows <= n && seg.a && seg.b);
      const int64_t rank = seg.a->dim(0);
      CHECK(seg.a->ndim == 2 && seg.b->ndim == 2 && seg.a->dim(1) == k && seg.b->dim(0) == m &&
            seg.b->dim(1) == rank)
          << ShapeString(*seg.a) << " " << ShapeString(*seg.b) << " for x " << ShapeString(x)
          << " out " << ShapeString(out);
      CHECK(seg.a->dtype == wdtype && seg.b->dtype == wdtype);
      CHECK(rank >= 1 && rank <= kMaxLoraKernelRank) << rank;
      const int32_t slot = LoraSlotOf(seg.a->data, lora_seg_slot_[seg_index]);
      lora_seg_slot_[seg_index++] = slot;
      LoraEntry& entry = lora_entries_[p * slots + static_cast<size_t>(slot)];
      CHECK(entry.rank == 0 || entry.a == seg.a->data)
          << "LoraDelta: two adapters in slot " << slot;
      entry = LoraEntry{seg.a->data, seg.b->data, static_cast<int32_t>(rank), 0};
      for (int64_t r = seg.first_row; r < seg.first_row + seg.rows; ++r) {
        int32_t& row_slot = lora_rows_[static_cast<size_t>(r)];
        // A row's slot is the same in every part (one adapter per sequence); twice in one part
        // is an overlap.
        CHECK(row_slot == -1 || (p > 0 && row_slot == slot))
            << "LoraDelta: segments overlap at row " << r;
        row_slot = slot;
      }
      x_vec = x_vec && Aligned16(seg.a->data);
      w_vec = w_vec && Aligned16(seg.b->data);
      lora_rank_cap_ = std::max(lora_rank_cap_, static_cast<int32_t>(rank));
    }
  }
  tables.x_vec = x_vec;
  tables.w_vec = w_vec;
  return tables;
}

// lora_rows_ on the device, followed by the rows' order for the kernels (LoraDeltaArgs::row_order:
// a stable sort by slot, the rows of no slot last); the step's previous copy where it holds the
// same rows.
const int32_t* CudaBackend::StageLoraRows() {
  if (lora_stage_step_ == steps_begun_ && lora_last_rows_dev_ != nullptr &&
      lora_last_rows_ == lora_rows_)
    return lora_last_rows_dev_;
  const size_t n = lora_rows_.size();
  lora_staged_rows_.assign(lora_rows_.begin(), lora_rows_.end());
  lora_staged_rows_.resize(2 * n);
  // Counting sort: slot s's rows start at first[s + 1] (first[0]: the rows of no slot, placed
  // last).
  std::vector<int32_t>& first = lora_order_first_;
  first.assign(lora_slots_.size() + 2, 0);
  for (const int32_t slot : lora_rows_) ++first[static_cast<size_t>(slot) + 2];
  first[1] = 0;
  for (size_t s = 2; s < first.size(); ++s) first[s] += first[s - 1];
  first[0] = first.back();  // the rows of no slot after every slot's
  for (size_t r = 0; r < n; ++r) {
    const size_t at = switches_.lora_row_order
                          ? static_cast<size_t>(first[static_cast<size_t>(lora_rows_[r]) + 1]++)
                          : r;
    lora_staged_rows_[n + at] = static_cast<int32_t>(r);
  }
  const auto* dev = static_cast<const int32_t*>(
      LoraStage(lora_staged_rows_.data(), lora_staged_rows_.size() * sizeof(int32_t)));
  lora_last_rows_ = lora_rows_;
  lora_last_rows_dev_ = dev;
  return dev;
}

// The batch-1 update inside the GEMV launch over `outs` (GemvLora): the tables of `lora` staged,
// each lora part matched to the GEMV part it adds to; nullopt where the launch cannot take it
// (the switch off, f32 weights or x, a lora part whose output is no GEMV part).
std::optional<GemvLora> CudaBackend::StageGemvLora(const Tensor& x, std::span<const LoraPart> lora,
                                                   std::span<float* const> outs) {
  if (!switches_.lora_gemv_fused || x.rows() != 1 || x.dtype != DType::kF32 || lora.empty() ||
      lora.size() > static_cast<size_t>(kMaxLoraKernelParts))
    return std::nullopt;
  GemvLora l;
  for (size_t i = 0; i < lora.size(); ++i) {
    size_t p = 0;
    while (p < outs.size() && outs[p] != lora[i].out.data) ++p;
    if (p == outs.size() || l.lora_of[p] >= 0) return std::nullopt;
    l.lora_of[p] = static_cast<int32_t>(i);
    for (const LoraSegment& seg : lora[i].segments)
      if (seg.a->dtype != DType::kBF16 || lora[i].out.dtype != DType::kF32) return std::nullopt;
  }
  (void)BuildLoraTables(x, lora);
  l.row_entry = StageLoraRows();
  l.entries = static_cast<const LoraEntry*>(
      LoraStage(lora_entries_.data(), lora_entries_.size() * sizeof(LoraEntry)));
  l.num_slots = static_cast<int32_t>(lora_slots_.size());
  l.parts = static_cast<int32_t>(lora.size());
  l.rank_cap = lora_rank_cap_;
  // t of its own per launch (no later launch of the step writes it).
  l.t = static_cast<float*>(ArenaAlloc(lora.size() * static_cast<size_t>(lora_rank_cap_) * 4));
  // Each fused launch of a step has a counter pair of its own (the step's n-th such launch the
  // n-th pair, so a same-shaped step replays with the same addresses), so no launch can see
  // another's counts even where two of them overlap.
  if (gemv_lora_sync_.data() == nullptr) {
    gemv_lora_sync_ = DeviceBuffer(2 * sizeof(unsigned) * kGemvLoraSyncPairs);
    CUDA_CHECK(cudaMemsetAsync(gemv_lora_sync_.data(), 0, gemv_lora_sync_.bytes(), stream()));
  }
  if (gemv_lora_step_ != steps_begun_) {
    gemv_lora_step_ = steps_begun_;
    gemv_lora_launches_ = 0;
  }
  l.sync = static_cast<unsigned*>(gemv_lora_sync_.data()) +
           2 * (gemv_lora_launches_++ % kGemvLoraSyncPairs);
  return l;
}

bool CudaBackend::LoraGemmSegment(const Tensor& x, const LoraSegment& seg) const {
  return switches_.lora_gemm_rows > 0 && seg.rows >= switches_.lora_gemm_rows &&
         Bf16MatMulInput(x.rows()) && x.dtype == DType::kBF16 && seg.a->dtype == DType::kBF16 &&
         seg.b->dtype == DType::kBF16;
}

// Records the cuBLAS GEMMs of the parts' prefill-sized segments (LoraGemmSegment) as one op and
// fills `rest` with each part's other segments (views into lora_rest_); false, `rest` untouched,
// when no segment takes the GEMMs. Each: t [rows, rank] bf16 = x[rows] a^T, then out[rows] += t
// b^T (beta 1), f32 accumulation; not batch-invariant, like the cuBLAS MatMuls beside them.
bool CudaBackend::RecordLoraGemms(const Tensor& x, std::span<const LoraPart> parts,
                                  LoraPart* rest) {
  bool any = false;
  for (const LoraPart& part : parts)
    for (const LoraSegment& seg : part.segments) any = any || LoraGemmSegment(x, seg);
  if (!any) return false;
  struct Gemm {
    const void* x;  // the segment's first row of x
    const void* a;
    const void* b;
    void* t;
    void* out;  // the segment's first row of out
    int32_t rows, rank;
    int64_t m;
    bool out_bf16;
  };
  std::vector<Gemm> gemms;
  std::vector<uint64_t> key;
  const int64_t k = x.cols();
  for (size_t p = 0; p < parts.size(); ++p) {
    std::vector<LoraSegment>& others = lora_rest_[p];
    others.clear();
    const Tensor& out = parts[p].out;
    const int64_t m = out.cols();
    for (const LoraSegment& seg : parts[p].segments) {
      if (!LoraGemmSegment(x, seg)) {
        others.push_back(seg);
        continue;
      }
      const int64_t rank = seg.a->dim(0);
      CHECK(seg.a->ndim == 2 && seg.b->ndim == 2 && seg.a->dim(1) == k && seg.b->dim(0) == m &&
            seg.b->dim(1) == rank && seg.first_row >= 0 && seg.first_row + seg.rows <= x.rows() &&
            out.rows() == x.rows())
          << ShapeString(*seg.a) << " " << ShapeString(*seg.b) << " for x " << ShapeString(x)
          << " out " << ShapeString(out);
      CHECK(out.dtype == DType::kF32 || out.dtype == DType::kBF16) << DTypeName(out.dtype);
      Gemm g;
      g.x = static_cast<const unsigned char*>(x.data) + seg.first_row * k * 2;
      g.a = seg.a->data;
      g.b = seg.b->data;
      g.t = ArenaAlloc(static_cast<size_t>(seg.rows * rank) * 2);
      g.out = static_cast<unsigned char*>(out.data) +
              seg.first_row * m * static_cast<int64_t>(DTypeSize(out.dtype));
      g.rows = static_cast<int32_t>(seg.rows);
      g.rank = static_cast<int32_t>(rank);
      g.m = m;
      g.out_bf16 = out.dtype == DType::kBF16;
      gemms.push_back(g);
      key.insert(key.end(), {KeyOf(g.x), KeyOf(g.a), KeyOf(g.b), KeyOf(g.t), KeyOf(g.out),
                             U(g.rows), U(g.rank), U(g.m), U(g.out_bf16)});
    }
    rest[p] = LoraPart{others, out};
  }
  const cublasHandle_t handle = cublas_.get();
  recorder_.Record(OpKind::kLoraGemm, key, [gemms, handle, k](cudaStream_t) {
    // (The handle is bound to the step's stream.) Row-major y[rows, m] = x[rows, k] w[m, k]^T is
    // column-major y^T = w^T x^T.
    const float one = 1.0f, zero = 0.0f;
    for (const Gemm& g : gemms) {
      CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, g.rank, g.rows,
                                static_cast<int>(k), &one, g.a, CUDA_R_16BF, static_cast<int>(k),
                                g.x, CUDA_R_16BF, static_cast<int>(k), &zero, g.t, CUDA_R_16BF,
                                g.rank, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(g.m), g.rows,
                                g.rank, &one, g.b, CUDA_R_16BF, g.rank, g.t, CUDA_R_16BF, g.rank,
                                &one, g.out, g.out_bf16 ? CUDA_R_16BF : CUDA_R_32F,
                                static_cast<int>(g.m), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  });
  return true;
}

// Every slot at once: t [n][part][slots * rank] f32 = x times each part's a stack (one GEMM for
// the parts whose a stacks lie side by side), tb [part][n][slots * rank] bf16 = t where the
// column's slot is the row's in that part and 0 elsewhere (LaunchLoraStackMask), then out[part]
// += tb[part] times the part's b stack (beta 1; overwrite: out = that, beta 0). f32 accumulation; t
// rounded to bf16 once, as in RecordLoraGemms; not batch-invariant, like the cuBLAS MatMuls beside
// it. The graph key holds the tables' addresses, not the rows' slots: any mix of adapters replays
// one graph.
bool CudaBackend::RecordLoraStacked(const Tensor& x, std::span<const LoraPart> parts,
                                    bool overwrite) {
  const int64_t n = x.rows(), k = x.cols();
  if (lora_stacks_.empty() || switches_.lora_stacked_rows <= 0 || n > switches_.lora_stacked_rows ||
      !Bf16MatMulInput(n) || x.dtype != DType::kBF16)
    return false;
  const size_t num_parts = parts.size();
  if (num_parts == 0 || num_parts > static_cast<size_t>(kMaxLoraKernelParts)) return false;
  const LoraStack* stack[kMaxLoraKernelParts] = {};
  lora_part_rows_.assign(num_parts * static_cast<size_t>(n), -1);
  int32_t first_slot = -1;
  bool mixed = false;  // segments of two slots or more
  size_t seg_index = 0;  // each segment's slot into lora_seg_slot_ (BuildLoraTables's order)
  for (size_t p = 0; p < num_parts; ++p) {
    for (const LoraSegment& seg : parts[p].segments) {
      const auto it = lora_stack_of_.find(seg.a->data);
      if (it == lora_stack_of_.end()) return false;
      const LoraStack& st = lora_stacks_[static_cast<size_t>(it->second.stack)];
      if (stack[p] != nullptr && stack[p] != &st) return false;  // two sites in one part
      stack[p] = &st;
      if (first_slot < 0) first_slot = it->second.slot;
      mixed = mixed || it->second.slot != first_slot;
      if (lora_seg_slot_.size() <= seg_index) lora_seg_slot_.resize(seg_index + 1, -1);
      lora_seg_slot_[seg_index++] = it->second.slot;
    }
  }
  // One adapter (or none) reads only its own matrices on the other paths: 0.755x of the base
  // against the stacks' 0.718x with 8 slots loaded (H100, docs/perf.md session 52).
  if (!mixed) return false;
  // Overwriting: every output is written (a part without segments would be left as it was).
  if (overwrite &&
      std::any_of(stack, stack + num_parts, [](const LoraStack* st) { return st == nullptr; }))
    return false;
  seg_index = 0;
  for (size_t p = 0; p < num_parts; ++p) {
    const Tensor& out = parts[p].out;
    if (stack[p] == nullptr) continue;
    CHECK(out.dtype == DType::kF32 || out.dtype == DType::kBF16) << DTypeName(out.dtype);
    CHECK(stack[p]->k == k && stack[p]->m == out.cols() && out.rows() == n)
        << "LoraDelta: x " << ShapeString(x) << " out " << ShapeString(out) << " for an adapter of "
        << stack[p]->k << " -> " << stack[p]->m;
    for (const LoraSegment& seg : parts[p].segments) {
      CHECK(seg.rows > 0 && seg.first_row >= 0 && seg.first_row + seg.rows <= n);
      const int32_t slot = lora_seg_slot_[seg_index++];
      for (int64_t r = seg.first_row; r < seg.first_row + seg.rows; ++r) {
        int32_t& row_slot = lora_part_rows_[p * static_cast<size_t>(n) + static_cast<size_t>(r)];
        CHECK_EQ(row_slot, -1) << "LoraDelta: segments overlap at row " << r;
        row_slot = slot;
      }
    }
  }
  const int32_t rank = lora_stack_rank_, width = lora_stack_slots_ * rank;
  LoraStagedPartRows& staged = lora_part_rows_staged_[num_parts - 1];
  if (staged.step != steps_begun_ || staged.rows != lora_part_rows_ || staged.dev == nullptr) {
    staged.dev = static_cast<const int32_t*>(
        LoraStage(lora_part_rows_.data(), lora_part_rows_.size() * sizeof(int32_t)));
    staged.rows = lora_part_rows_;
    staged.step = steps_begun_;
  }
  const int32_t* rows_dev = staged.dev;
  auto* t = reinterpret_cast<float*>(
      StepRegionOf(lora_t_, static_cast<size_t>(n) * num_parts * static_cast<size_t>(width) * 4));
  void* tb =
      StepRegionOf(lora_tb_, num_parts * static_cast<size_t>(n) * static_cast<size_t>(width) * 2);
  bool one_shrink = true;  // every part's a stack right after the one before
  for (size_t p = 0; p < num_parts; ++p)
    one_shrink = one_shrink && stack[p] != nullptr &&
                 stack[p]->a == stack[0]->a + p * static_cast<size_t>(width) * k * 2;
  struct Part {
    const void* a;
    const void* b;
    void* out;
    int64_t m;
    bool out_bf16;
  };
  std::array<Part, kMaxLoraKernelParts> recorded{};
  std::vector<uint64_t> key = {KeyOf(x.data),   U(n),          U(k),        U(num_parts),
                               U(width),        U(rank),       KeyOf(t),    KeyOf(tb),
                               KeyOf(rows_dev), U(one_shrink), U(overwrite)};
  for (size_t p = 0; p < num_parts; ++p) {
    if (stack[p] == nullptr) continue;
    recorded[p] = Part{stack[p]->a, stack[p]->b, parts[p].out.data, stack[p]->m,
                       parts[p].out.dtype == DType::kBF16};
    key.insert(key.end(), {U(p), KeyOf(recorded[p].a), KeyOf(recorded[p].b), KeyOf(recorded[p].out),
                           U(recorded[p].m), U(recorded[p].out_bf16)});
  }
  const cublasHandle_t handle = cublas_.get();
  const void* xd = x.data;
  const auto parts_n = static_cast<int32_t>(num_parts);
  recorder_.Record(OpKind::kLoraStacked, key, [=](cudaStream_t st) {
    // Row-major y[rows, m] = x[rows, k] w[m, k]^T is column-major y^T = w^T x^T.
    const float one = 1.0f, zero = 0.0f;
    const int ldt = parts_n * width;
    for (int32_t p = 0; p < parts_n; ++p) {
      if (recorded[p].a == nullptr) continue;
      const int rows_of_a = one_shrink ? ldt : width;
      CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, rows_of_a, static_cast<int>(n),
                                static_cast<int>(k), &one, recorded[p].a, CUDA_R_16BF,
                                static_cast<int>(k), xd, CUDA_R_16BF, static_cast<int>(k), &zero,
                                t + static_cast<int64_t>(p) * width, CUDA_R_32F, ldt,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      if (one_shrink) break;
    }
    LaunchLoraStackMask(t, rows_dev, static_cast<int32_t>(n), parts_n, width, rank, tb, st);
    for (int32_t p = 0; p < parts_n; ++p) {
      const Part& part = recorded[p];
      if (part.a == nullptr) continue;
      const auto* tbp =
          static_cast<const unsigned char*>(tb) + static_cast<int64_t>(p) * n * width * 2;
      CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(part.m),
                                static_cast<int>(n), width, &one, part.b, CUDA_R_16BF, width, tbp,
                                CUDA_R_16BF, width, overwrite ? &zero : &one, part.out,
                                part.out_bf16 ? CUDA_R_16BF : CUDA_R_32F, static_cast<int>(part.m),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  });
  return true;
}

// Stages the call's tables (lora_rows_, lora_entries_) and records its launches.
void CudaBackend::RecordLoraDelta(const Tensor& x, std::span<const LoraPart> parts, DType wdtype,
                                  bool x_vec, bool w_vec, const float* const* bases) {
  const int64_t n = x.rows();
  LoraDeltaArgs args;
  args.row_entry = StageLoraRows();
  args.row_order = args.row_entry + n;
  args.entries = static_cast<const LoraEntry*>(
      LoraStage(lora_entries_.data(), lora_entries_.size() * sizeof(LoraEntry)));
  args.num_slots = static_cast<int32_t>(lora_slots_.size());
  args.parts = static_cast<int32_t>(parts.size());
  args.n = static_cast<int32_t>(n);
  args.rank_cap = lora_rank_cap_;
  args.x = x.data;
  args.x_bf16 = x.dtype == DType::kBF16;
  args.k = x.cols();
  for (size_t p = 0; p < parts.size(); ++p) {
    args.out[p] = parts[p].out.data;
    args.m[p] = parts[p].out.cols();
    if (bases != nullptr) args.base[p] = bases[p];
  }
  args.overwrite = bases != nullptr;
  args.out_bf16 = parts[0].out.dtype == DType::kBF16;
  args.w_bf16 = wdtype == DType::kBF16;
  args.x_vec = x_vec;
  args.w_vec = w_vec;
  // t: one arena region per step, shared by the step's LoraDelta calls (each call's expand has
  // read its t before the next call's shrink writes it, in stream order), grown when a call
  // needs more.
  const size_t t_bytes =
      static_cast<size_t>(n) * parts.size() * static_cast<size_t>(lora_rank_cap_) * 4;
  args.t = reinterpret_cast<float*>(StepRegionOf(lora_t_, t_bytes));
  // The tables' addresses, not their contents: a replay reads what this step staged there.
  lora_key_.assign({KeyOf(args.row_entry), KeyOf(args.entries), U(lora_entries_.size()), U(args.n),
                    U(args.rank_cap), KeyOf(x.data), U(args.x_bf16), U(args.k), U(args.parts),
                    U(args.out_bf16), U(args.w_bf16), U(args.x_vec) << 1 | U(args.w_vec),
                    KeyOf(args.t)});
  for (size_t p = 0; p < parts.size(); ++p) {
    lora_key_.push_back(KeyOf(args.out[p]));
    lora_key_.push_back(U(args.m[p]));
    lora_key_.push_back(KeyOf(args.base[p]));
  }
  lora_key_.push_back(U(args.overwrite));
  recorder_.Record(OpKind::kLoraDelta, lora_key_,
                   [args](cudaStream_t st) { LaunchLoraDelta(args, st); });
}

}  // namespace ember::cuda
