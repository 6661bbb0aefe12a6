// CudaBackend's step input and output: BeginStep (the plan's upload through page-locked staging
// halves on a stream of its own), the logits rows' gather, copies to the host, and the ids that
// ArgmaxRows / SampleRows make (copied back on another stream, delivered now or, after
// DeferStepIds, by WaitIds). See cuda_backend_impl.h for the staging halves' protocol.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/threshold_sampling.h"  // CheckLogitEdits, CheckTokenMasks
#include "util/half.h"

namespace ember::cuda {

static_assert(sizeof(RowSampling) == sizeof(SampleRowParams) &&
              offsetof(RowSampling, u) == offsetof(SampleRowParams, u));
static_assert(sizeof(LogitEdit) == 16);

Status CudaBackend::BeginStep(const BatchPlan& plan) {
  Flush();  // the previous step's ops, if nothing read its results
  SendKvUploads();  // the prompt cache's staged blocks, before the step reads the pool
  if (kv_pool_.data() != nullptr) {
    const std::string err = plan.Validate(kv_blocks_);
    if (!err.empty()) return Status::Error("BatchPlan: " + err);
    if (plan.block_size != kv_block_size_)
      return Status::Error("BatchPlan: block_size " + std::to_string(plan.block_size) +
                           " differs from the KV pool's " + std::to_string(kv_block_size_));
  }
  // This step takes the other staging half, last used two steps ago: its ids must have been read
  // and its copies done (they are, unless nothing waited for that step).
  for (const IdsDelivery& d : deliveries_)
    if (d.half != half_)
      return Status::Error("BeginStep: two earlier steps' ids are unread (WaitIds)");
  // Every op of the current half's step is on the stream (Flush above): mark its end, which the
  // upload into that half's plan buffer two steps on waits for.
  CUDA_CHECK(cudaEventRecord(staging_[static_cast<size_t>(half_)].step_end.get(), stream_.get()));
  half_ ^= 1;
  CUDA_CHECK(cudaEventSynchronize(staging_[static_cast<size_t>(half_)].copied.get()));
  CUDA_CHECK(cudaEventSynchronize(staging_[static_cast<size_t>(half_)].ids_copied.get()));
  staging_[static_cast<size_t>(half_)].used = 0;
  defer_ids_ = false;
  ++steps_begun_;
  // Workspace: if the last step spilled into several chunks, merge them into one.
  if (arena_chunks_.size() > 1) {
    size_t total = 0;
    for (const DeviceBuffer& c : arena_chunks_) total += c.bytes();
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    arena_chunks_.clear();
    arena_chunks_.emplace_back(total);
  }
  arena_offset_ = 0;
  gemm_scratch_ = nullptr;
  gemm_scratch_bytes_ = 0;

  UploadStepPlan(plan);
  batch_invariant_ = always_invariant_ || (plan.batch_invariant && !f32_compute_);
  in_step_ = true;
  return Status::Ok();
}

// Grows the plan's fixed-capacity regions (plan_device_, step_ids_) to hold `plan`.
void CudaBackend::GrowPlanBuffers(const BatchPlan& plan) {
  const int64_t num_tables = static_cast<int64_t>(plan.block_tables.size());
  const int64_t num_logits = static_cast<int64_t>(plan.logits_rows.size());
  auto grow = [](int64_t need, int64_t cap) {
    while (cap < need) cap = std::max<int64_t>(64, cap * 2);
    return cap;
  };
  const int64_t cap_tokens =
      grow(std::max<int64_t>(plan.num_tokens(), num_logits), plan_cap_tokens_);
  const int64_t cap_seqs = grow(plan.num_seqs(), plan_cap_seqs_);
  // The tables' room starts large (at least two entries per KV block): the decode graphs hold the
  // plan buffer's address, so it should not move as contexts grow. Only the used part is copied.
  const int64_t cap_tables = grow(
      std::max<int64_t>({num_tables, int64_t{1} << 16, 2 * int64_t{kv_blocks_}}), plan_cap_tables_);
  if (cap_tokens == plan_cap_tokens_ && cap_seqs == plan_cap_seqs_ &&
      cap_tables == plan_cap_tables_)
    return;
  SyncAllStreams();
  const int64_t total = 6 * cap_seqs + 5 * cap_tokens + cap_tables;
  for (DeviceBuffer& b : plan_device_) {
    b = DeviceBuffer(static_cast<size_t>(total) * sizeof(int32_t));
  }
  EnsureStepIds(cap_tokens);
  plan_cap_tokens_ = cap_tokens;
  plan_cap_seqs_ = cap_seqs;
  plan_cap_tables_ = cap_tables;
}

// The plan into plan_host_, its host facts into plan_, and its upload into the current half's
// plan_device_.
void CudaBackend::UploadStepPlan(const BatchPlan& plan) {
  const int32_t num_tokens = plan.num_tokens(), num_seqs = plan.num_seqs();
  profiled_rows_ += num_tokens;
  const int64_t num_tables = static_cast<int64_t>(plan.block_tables.size());
  const int64_t num_logits = static_cast<int64_t>(plan.logits_rows.size());
  GrowPlanBuffers(plan);
  const int64_t cap_tokens = plan_cap_tokens_, cap_seqs = plan_cap_seqs_;
  // Device layout (int32): seqs [cap_seqs][4] (int4-aligned), state_slots, snapshot_slots
  // [cap_seqs each], then token_ids, positions, slot_mapping, token_seq, logits_rows (cap_tokens
  // each), block_tables (plan_cap_tables_).
  const int64_t total = 6 * cap_seqs + 5 * cap_tokens + plan_cap_tables_;
  // Everything before the tables is rewritten (zeros past the counts), the tables up to num_tables.
  const int64_t used = 6 * cap_seqs + 5 * cap_tokens + num_tables;
  plan_host_.resize(static_cast<size_t>(total));
  std::fill(plan_host_.begin(), plan_host_.begin() + (used - num_tables), 0);
  int32_t* h = plan_host_.data();
  int32_t* h_state_slots = h + 4 * cap_seqs;
  int32_t* h_snapshot_slots = h_state_slots + cap_seqs;
  int32_t* h_tokens = h_snapshot_slots + cap_seqs;
  int32_t* h_positions = h_tokens + cap_tokens;
  int32_t* h_slots = h_positions + cap_tokens;
  int32_t* h_token_seq = h_slots + cap_tokens;
  int32_t* h_logits = h_token_seq + cap_tokens;
  int32_t* h_tables = h_logits + cap_tokens;
  max_query_len_ = 0;
  max_context_len_ = 0;
  query_lens_.resize(static_cast<size_t>(num_seqs));
  for (int32_t s = 0; s < num_seqs; ++s) {
    const SequenceSlice& q = plan.seqs[static_cast<size_t>(s)];
    query_lens_[static_cast<size_t>(s)] = q.query_len;
    h[4 * s] = q.query_start;
    h[4 * s + 1] = q.query_len;
    h[4 * s + 2] = q.context_len;
    h[4 * s + 3] = q.block_table_start;
    h_state_slots[s] = q.state_slot;
    h_snapshot_slots[s] = q.snapshot_slot;
    max_query_len_ = std::max(max_query_len_, q.query_len);
    max_context_len_ = std::max(max_context_len_, q.context_len);
    for (int32_t i = q.query_start; i < q.query_start + q.query_len && i < num_tokens; ++i)
      h_token_seq[i] = s;
  }
  // Recurrent ops walk sequences that share a state slot (padding rows) in plan order.
  std::vector<int32_t> slots(h_state_slots, h_state_slots + num_seqs);
  std::sort(slots.begin(), slots.end());
  state_slots_shared_ = std::adjacent_find(slots.begin(), slots.end()) != slots.end();
  std::copy(plan.token_ids.begin(), plan.token_ids.end(), h_tokens);
  std::copy(plan.positions.begin(), plan.positions.end(), h_positions);
  std::copy(plan.slot_mapping.begin(), plan.slot_mapping.end(), h_slots);
  std::copy(plan.logits_rows.begin(), plan.logits_rows.end(), h_logits);
  std::copy(plan.block_tables.begin(), plan.block_tables.end(), h_tables);
  UploadPlan(static_cast<size_t>(used) * sizeof(int32_t));
  const int32_t* base = plan_device_[static_cast<size_t>(half_)].as<int32_t>();
  plan_.seqs = reinterpret_cast<const int4*>(base);
  plan_.state_slots = base + (h_state_slots - h);
  plan_.snapshot_slots = base + (h_snapshot_slots - h);
  plan_.token_ids = base + (h_tokens - h);
  plan_.positions = base + (h_positions - h);
  plan_.slot_mapping = base + (h_slots - h);
  plan_.token_seq = base + (h_token_seq - h);
  plan_.logits_rows = base + (h_logits - h);
  plan_.block_tables = base + (h_tables - h);
  plan_.fed_ids = step_ids_[static_cast<size_t>(half_ ^ 1)].as<int32_t>();
  plan_.num_tokens = num_tokens;
  plan_.num_seqs = num_seqs;
  plan_.num_logits_rows = static_cast<int32_t>(num_logits);
  plan_.block_size = plan.block_size;
}

void CudaBackend::SyncAllStreams() {
  CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(upload_stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(ids_stream_.get()));
}

void CudaBackend::EnsureStepIds(int64_t rows) {
  const size_t bytes = static_cast<size_t>(rows) * sizeof(int32_t);
  if (step_ids_[0].bytes() >= bytes) return;
  SyncAllStreams();
  for (DeviceBuffer& ids : step_ids_) {
    DeviceBuffer grown(bytes);
    if (ids.bytes() > 0)
      CUDA_CHECK(cudaMemcpyAsync(grown.data(), ids.data(), ids.bytes(), cudaMemcpyDeviceToDevice,
                                 stream_.get()));
    ids = std::move(grown);  // (freeing the old buffer waits for the copy)
  }
}

size_t CudaBackend::StageOffset(StagingHalf& h, size_t bytes) {
  size_t offset = (h.used + 15) / 16 * 16;
  if (offset + bytes > h.upload.bytes()) {
    // The half's earlier copies read the memory that growing drops: let them finish first.
    SyncAllStreams();
    h.upload.Reserve(std::max({bytes, 2 * h.upload.bytes(), size_t{1} << 20}));
    offset = 0;
  }
  return offset;
}

void CudaBackend::Upload(void* dst, const void* src, size_t bytes) {
  unsigned char* staged = Stage(bytes);
  std::memcpy(staged, src, bytes);
  CUDA_CHECK(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, stream_.get()));
  CUDA_CHECK(cudaEventRecord(staging_[static_cast<size_t>(half_)].copied.get(), stream_.get()));
}

unsigned char* CudaBackend::Stage(size_t bytes) {
  StagingHalf& h = staging_[static_cast<size_t>(half_)];
  const size_t offset = StageOffset(h, bytes);
  h.used = offset + bytes;
  return h.upload.data() + offset;
}

void CudaBackend::UploadPlan(size_t bytes) {
  StagingHalf& h = staging_[static_cast<size_t>(half_)];
  const size_t offset = StageOffset(h, bytes);
  std::memcpy(h.upload.data() + offset, plan_host_.data(), bytes);
  // The half's plan buffer was last read by the step two back (its step_end).
  CUDA_CHECK(cudaStreamWaitEvent(upload_stream_.get(), h.step_end.get(), 0));
  CUDA_CHECK(cudaMemcpyAsync(plan_device_[static_cast<size_t>(half_)].data(),
                             h.upload.data() + offset, bytes, cudaMemcpyHostToDevice,
                             upload_stream_.get()));
  CUDA_CHECK(cudaEventRecord(h.uploaded.get(), upload_stream_.get()));
  CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), h.uploaded.get(), 0));
  // Recorded behind the wait: complete once the upload has read the staging bytes.
  CUDA_CHECK(cudaEventRecord(h.copied.get(), stream_.get()));
  h.used = offset + bytes;
}

const int32_t* CudaBackend::CopyIdsBack(int64_t rows) {
  StagingHalf& h = staging_[static_cast<size_t>(half_)];
  const size_t bytes = static_cast<size_t>(rows) * sizeof(int32_t);
  if (h.ids.bytes() < bytes) {
    SyncAllStreams();  // a queued copy may target the old memory
    h.ids.Reserve(std::max<size_t>(bytes, 4096));
  }
  CUDA_CHECK(cudaEventRecord(h.ids_ready.get(), stream_.get()));
  CUDA_CHECK(cudaStreamWaitEvent(ids_stream_.get(), h.ids_ready.get(), 0));
  CUDA_CHECK(cudaMemcpyAsync(h.ids.data(), step_ids_[static_cast<size_t>(half_)].data(), bytes,
                             cudaMemcpyDeviceToHost, ids_stream_.get()));
  CUDA_CHECK(cudaEventRecord(h.ids_copied.get(), ids_stream_.get()));
  return reinterpret_cast<const int32_t*>(h.ids.data());
}

CudaBackend::IdsDelivery& CudaBackend::StepDelivery() {
  if (deliveries_.empty() || delivery_step_ != steps_begun_) {
    deliveries_.push_back(IdsDelivery{half_, {}, {}, {}});
    delivery_step_ = steps_begun_;
  }
  return deliveries_.back();
}

Status CudaBackend::WaitIds() {
  if (deliveries_.empty()) return Status::Ok();
  IdsDelivery d = std::move(deliveries_.front());
  deliveries_.pop_front();
  const StagingHalf& h = staging_[static_cast<size_t>(d.half)];
  CUDA_CHECK(cudaEventSynchronize(h.ids_copied.get()));
  const int32_t* ids = reinterpret_cast<const int32_t*>(h.ids.data());
  std::copy(ids, ids + d.argmax.size(), d.argmax.begin());
  for (int32_t r : d.sample_rows) d.sampled[static_cast<size_t>(r)] = ids[r];
  return Status::Ok();
}

void CudaBackend::WaitIdsCopied() {
  CUDA_CHECK(cudaEventSynchronize(staging_[static_cast<size_t>(half_)].ids_copied.get()));
}

void CudaBackend::DeferStepIds() {
  defer_ids_ = true;
  StepDelivery();  // one delivery per deferred step, even one that makes no ids
}

void CudaBackend::DropStepIds() {
  if (defer_ids_ && delivery_step_ == steps_begun_ && !deliveries_.empty()) deliveries_.pop_back();
  delivery_step_ = ~uint64_t{0};
  defer_ids_ = false;
}

void CudaBackend::GatherLogitsRows(const Tensor& x, Tensor out) {
  CHECK_EQ(x.rows(), plan_.num_tokens);
  CHECK_EQ(out.rows(), plan_.num_logits_rows);
  CHECK_EQ(out.cols(), x.cols());
  const PlanView plan = plan_;
  const int64_t d = x.cols();
  recorder_.Record(
      OpKind::kGatherLogitsRows,
      {KeyOf(x.data), KeyOf(out.data), U(d), KeyOf(plan.logits_rows), U(plan.num_logits_rows)},
      [=](cudaStream_t st) {
        LaunchGatherRows(static_cast<const float*>(x.data), d, plan, static_cast<float*>(out.data),
                         st);
      });
}

Status CudaBackend::CopyToHost(const Tensor& t, std::span<float> out) {
  CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16) << DTypeName(t.dtype);
  CHECK_EQ(static_cast<int64_t>(out.size()), t.numel());
  Flush();
  if (t.dtype == DType::kBF16) {  // an AllocMatMulInput buffer (tests): widened on the host
    std::vector<uint16_t> bits(out.size());
    CUDA_CHECK(
        cudaMemcpyAsync(bits.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost, stream_.get()));
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    std::transform(bits.begin(), bits.end(), out.begin(), Bf16ToF32);
    return Status::Ok();
  }
  CUDA_CHECK(
      cudaMemcpyAsync(out.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost, stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return Status::Ok();
}

// An MTP module's step inputs (attention_core.cc): both run after the ops recorded so far and
// before later ones (a flush between, so a decode step's graph ends there). The host rows are
// copied on the stream; pageable memory is staged by the driver before the call returns.
Status CudaBackend::CopyFromHost(std::span<const float> in, Tensor out) {
  if (out.dtype != DType::kF32 || in.size() != static_cast<size_t>(out.numel()))
    return Status::Error("CopyFromHost: " + std::to_string(in.size()) + " floats for tensor " +
                         ShapeString(out) + " " + DTypeName(out.dtype));
  Flush();
  CUDA_CHECK(cudaMemcpyAsync(out.data, in.data(), in.size() * sizeof(float), cudaMemcpyHostToDevice,
                             stream_.get()));
  return Status::Ok();
}

Status CudaBackend::ZeroRows(Tensor x, std::span<const int32_t> rows) {
  if (x.dtype != DType::kF32) return Status::Error("ZeroRows: " + ShapeString(x) + " is not f32");
  for (int32_t r : rows)
    if (r < 0 || r >= x.rows())
      return Status::Error("ZeroRows: row " + std::to_string(r) + " of " + ShapeString(x));
  if (rows.empty()) return Status::Ok();
  Flush();
  const size_t row_bytes = static_cast<size_t>(x.cols()) * sizeof(float);
  for (int32_t r : rows)
    CUDA_CHECK(cudaMemsetAsync(static_cast<unsigned char*>(x.data) + row_bytes * r, 0, row_bytes,
                               stream_.get()));
  return Status::Ok();
}

Status CudaBackend::SampleRows(const Tensor& x, std::span<const int32_t> rows,
                               std::span<const RowSampling> params, std::span<int32_t> ids) {
  CHECK(x.dtype == DType::kF32);
  CHECK_EQ(rows.size(), params.size());
  CHECK_EQ(static_cast<int64_t>(ids.size()), x.rows());
  for (int32_t r : rows) CHECK(r >= 0 && r < x.rows()) << "SampleRows: row " << r;
  Flush();
  if (rows.empty()) return Status::Ok();
  EnsureStepIds(x.rows());
  // One buffer: params (8-byte aligned) first, then rows.
  const size_t params_bytes = params.size_bytes(), rows_bytes = rows.size_bytes();
  if (sample_args_.bytes() < params_bytes + rows_bytes)
    sample_args_ = DeviceBuffer(params_bytes + rows_bytes);
  char* base = sample_args_.as<char>();
  Upload(base, params.data(), params_bytes);
  Upload(base + params_bytes, rows.data(), rows_bytes);
  LaunchSampleRows(static_cast<const float*>(x.data), x.cols(),
                   reinterpret_cast<const int32_t*>(base + params_bytes),
                   reinterpret_cast<const SampleRowParams*>(base),
                   static_cast<int32_t>(rows.size()),
                   step_ids_[static_cast<size_t>(half_)].as<int32_t>(), stream_.get());
  const int32_t* host = CopyIdsBack(x.rows());
  if (defer_ids_) {
    IdsDelivery& d = StepDelivery();
    d.sampled = ids;
    d.sample_rows.assign(rows.begin(), rows.end());
    return Status::Ok();
  }
  WaitIdsCopied();
  for (int32_t r : rows) ids[static_cast<size_t>(r)] = host[r];
  return Status::Ok();
}

Status CudaBackend::ApplyLogitEdits(Tensor x, std::span<const LogitEdit> edits) {
  CHECK(x.dtype == DType::kF32);
  EMBER_RETURN_IF_ERROR(CheckLogitEdits(x.rows(), x.cols(), edits));
  Flush();
  if (edits.empty()) return Status::Ok();
  CHECK_LE(edits.size(), size_t{INT32_MAX});
  if (logit_edits_.bytes() < edits.size_bytes()) logit_edits_ = DeviceBuffer(edits.size_bytes());
  Upload(logit_edits_.data(), edits.data(), edits.size_bytes());  // `edits` may die after it
  LaunchLogitEdits(static_cast<float*>(x.data), x.cols(), logit_edits_.as<LogitEdit>(),
                   static_cast<int32_t>(edits.size()), stream_.get());
  return Status::Ok();
}

Status CudaBackend::ApplyTokenMasks(Tensor x, std::span<const RowMask> masks) {
  CHECK(x.dtype == DType::kF32);
  EMBER_RETURN_IF_ERROR(CheckTokenMasks(x.rows(), x.cols(), masks));
  Flush();
  if (masks.empty()) return Status::Ok();
  CHECK_LE(masks.size(), size_t{65535});
  // One upload from page-locked staging: the rows (padded to 16 bytes), then every mask's words,
  // gathered there straight from the callers' masks (`masks` may die after the call).
  const size_t words = static_cast<size_t>((x.cols() + 31) / 32);
  const size_t rows_bytes = (masks.size() * sizeof(int32_t) + 15) / 16 * 16;
  const size_t mask_bytes = words * sizeof(uint32_t);
  const size_t bytes = rows_bytes + masks.size() * mask_bytes;
  DeviceBuffer& device = token_masks_[static_cast<size_t>(half_)];
  if (device.bytes() < bytes) device = DeviceBuffer(bytes);
  unsigned char* staged = Stage(bytes);
  for (size_t j = 0; j < masks.size(); ++j) {
    std::memcpy(staged + j * sizeof(int32_t), &masks[j].row, sizeof(int32_t));
    std::memcpy(staged + rows_bytes + j * mask_bytes, masks[j].bits.data(), mask_bytes);
  }
  // On upload_stream_, so that the copy runs beside the forward just enqueued (a 128-row step
  // at a 128k vocabulary sends 2 MiB), once the half's last mask kernel has read the buffer
  // (masks_read); the stream waits for the copy before this mask kernel.
  StagingHalf& h = staging_[static_cast<size_t>(half_)];
  CUDA_CHECK(cudaStreamWaitEvent(upload_stream_.get(), h.masks_read.get(), 0));
  CUDA_CHECK(cudaMemcpyAsync(device.data(), staged, bytes, cudaMemcpyHostToDevice,
                             upload_stream_.get()));
  CUDA_CHECK(cudaEventRecord(h.masks_uploaded.get(), upload_stream_.get()));
  CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), h.masks_uploaded.get(), 0));
  // Recorded behind the wait: complete once the copy has read the staging bytes.
  CUDA_CHECK(cudaEventRecord(h.copied.get(), stream_.get()));
  const auto* base = device.as<unsigned char>();
  LaunchTokenMasks(static_cast<float*>(x.data), x.cols(), reinterpret_cast<const int32_t*>(base),
                   reinterpret_cast<const uint32_t*>(base + rows_bytes),
                   static_cast<int32_t>(masks.size()), stream_.get());
  CUDA_CHECK(cudaEventRecord(h.masks_read.get(), stream_.get()));
  return Status::Ok();
}

Status CudaBackend::ArgmaxRows(const Tensor& x, std::span<int32_t> ids) {
  CHECK(x.dtype == DType::kF32);
  CHECK_EQ(static_cast<int64_t>(ids.size()), x.rows());
  EnsureStepIds(x.rows());  // (before the op's key holds the ids' address)
  // Recorded as the step's last op: the decode graph ends with it, a programmatic dependent
  // launch behind the lm_head.
  const size_t cells = size_t{kArgmaxSplitRows} * kArgmaxSplitChunks;
  ArgmaxScratch scratch;
  scratch.max = argmax_scratch_.as<float>();
  scratch.index = reinterpret_cast<int32_t*>(scratch.max + cells);
  scratch.counters = reinterpret_cast<unsigned*>(scratch.index + cells);
  scratch.max_rows = kArgmaxSplitRows;
  scratch.max_chunks = kArgmaxSplitChunks;
  const float* xp = static_cast<const float*>(x.data);
  const int64_t rows = x.rows(), cols = x.cols();
  int32_t* idp = step_ids_[static_cast<size_t>(half_)].as<int32_t>();
  recorder_.Record(OpKind::kArgmaxRows,
                   {KeyOf(xp), U(rows), U(cols), KeyOf(idp), KeyOf(scratch.max)},
                   [=](cudaStream_t st) { LaunchArgmaxRows(xp, rows, cols, idp, &scratch, st); });
  Flush();
  const int32_t* host = CopyIdsBack(x.rows());
  if (defer_ids_) {
    StepDelivery().argmax = ids;
    return Status::Ok();
  }
  WaitIdsCopied();
  std::copy(host, host + ids.size(), ids.begin());
  return Status::Ok();
}

}  // namespace ember::cuda
