// CudaBackend's block copies for the prompt cache. Uploads (CopyKvBlockFromHost): records staged
// in page-locked halves and sent as one copy and one scatter kernel per half, so restoring a long
// prefix costs a host memcpy per block rather than a copy per layer and a wait per block.
// Downloads (CopyKvBlocksToHost): one gather kernel into a device staging area, one copy into
// page-locked memory and one wait per 32 MiB of records, so evicting a long prefix into the RAM
// tier no longer waits for the GPU once per block. The RAM tier's own records are page-locked and
// mapped (AllocPinnedHost): a download into them is one gather kernel writing over the bus and
// one wait; an upload from them (CopyKvBlockFromPinned) is queued and read by one scatter kernel
// over the bus at the next send, with no host copy on either side.
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"
#include "util/check.h"

namespace ember::cuda {
namespace {

// A half's records take up to this many bytes (at least one record).
constexpr size_t kKvUploadHalfBytes = size_t{32} << 20;

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Where a half's block ids and segment table start, after `n` records of `record` bytes.
size_t IdsOffset(size_t n, size_t record) { return AlignUp(n * record, 16); }
size_t SegmentsOffset(size_t n, size_t record) {
  return AlignUp(IdsOffset(n, record) + n * sizeof(int32_t), 16);
}

// A table for records elsewhere (page-locked host records): n addresses, then as above.
size_t TableIdsOffset(size_t n) { return AlignUp(n * sizeof(void*), 16); }
size_t TableSegmentsOffset(size_t n) { return AlignUp(TableIdsOffset(n) + n * sizeof(int32_t), 16); }

// The device's address of host bytes at p when they are page-locked memory it can reach (mapped:
// cudaHostAlloc under unified addressing), else null.
unsigned char* DeviceAddressOfHost(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // plain memory may report an error on old drivers: not sticky
    return nullptr;
  }
  if (a.type != cudaMemoryTypeHost || a.devicePointer == nullptr) return nullptr;
  return static_cast<unsigned char*>(a.devicePointer);
}

}  // namespace

void* CudaBackend::AllocPinnedHost(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}

void CudaBackend::FreePinnedHost(void* p) {
  if (p == nullptr) return;
  // The step stream is the only one that reads or writes the records.
  CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  CUDA_CHECK(cudaFreeHost(p));
}

void CudaBackend::FillKvSegments(KvBlockSegment* segments) const {
  uint64_t src = 0;
  for (int32_t t = 0; t < kv_tensors_ * kv_layers_; ++t) {  // the record's order: layer-major, K then V
    const uint64_t bytes = static_cast<uint64_t>(KvLayerBlockBytes(t / kv_tensors_));
    const uint64_t dst = kv_layer_offset_[static_cast<size_t>(t / kv_tensors_)] +
                         bytes * static_cast<uint64_t>(t % kv_tensors_) *
                             static_cast<uint64_t>(kv_blocks_);
    segments[t] = {src, dst, bytes};
    src += bytes;
  }
  CHECK_EQ(src, static_cast<uint64_t>(KvBlockBytes()));
}

Status CudaBackend::CopyKvBlockToHost(int32_t block_id, std::span<uint8_t> out) {
  const std::span<uint8_t> outs[] = {out};
  return CopyKvBlocksToHost(std::span<const int32_t>(&block_id, 1), outs);
}

Status CudaBackend::CopyKvBlocksToHost(std::span<const int32_t> blocks,
                                       std::span<const std::span<uint8_t>> outs) {
  if (kv_pool_.data() == nullptr) return Status::Error("KV block copy before AllocateKvPool");
  CHECK_EQ(blocks.size(), outs.size());
  const size_t record = static_cast<size_t>(KvBlockBytes());
  for (size_t i = 0; i < blocks.size(); ++i) {
    CHECK(blocks[i] >= 0 && blocks[i] < kv_blocks_) << "KV block " << blocks[i] << " out of range";
    CHECK_EQ(outs[i].size(), record);
  }
  if (blocks.empty()) return Status::Ok();
  Flush();
  SendKvUploads();  // a staged upload may be a block's content
  const int32_t num_segments = kv_tensors_ * kv_layers_;
  // Every output page-locked and mapped: the gather writes into them directly.
  std::vector<const unsigned char*> direct;
  for (const std::span<uint8_t> out : outs) {
    const unsigned char* d = DeviceAddressOfHost(out.data());
    if (d == nullptr) break;
    direct.push_back(d);
  }
  if (direct.size() == outs.size()) {
    // The previous use of the table is complete: every path below ends in a wait.
    const KvAddressTable t =
        UploadKvAddressTable(direct, blocks, kv_download_host_, kv_download_device_);
    LaunchGatherKvBlocksTo(kv_pool_.as<unsigned char>(), t.blocks,
                           static_cast<int32_t>(direct.size()), t.segments, num_segments,
                           t.records, stream_.get());
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    return Status::Ok();
  }
  const size_t capacity = std::max<size_t>(1, kKvUploadHalfBytes / record);
  const size_t bytes = SegmentsOffset(capacity, record) +
                       static_cast<size_t>(num_segments) * sizeof(KvBlockSegment);
  if (kv_download_device_.bytes() < bytes) {
    kv_download_host_.Reserve(bytes);
    kv_download_device_ = DeviceBuffer(bytes);
  }
  unsigned char* host = kv_download_host_.data();
  unsigned char* device = kv_download_device_.as<unsigned char>();
  for (size_t first = 0; first < blocks.size(); first += capacity) {
    const size_t n = std::min(capacity, blocks.size() - first);
    const size_t ids = IdsOffset(n, record), segments = SegmentsOffset(n, record);
    std::memcpy(host + ids, blocks.data() + first, n * sizeof(int32_t));
    FillKvSegments(reinterpret_cast<KvBlockSegment*>(host + segments));
    const size_t end = segments + static_cast<size_t>(num_segments) * sizeof(KvBlockSegment);
    CUDA_CHECK(cudaMemcpyAsync(device + ids, host + ids, end - ids, cudaMemcpyHostToDevice,
                               stream_.get()));
    LaunchGatherKvBlocks(kv_pool_.as<unsigned char>(),
                         reinterpret_cast<const int32_t*>(device + ids), static_cast<int32_t>(n),
                         reinterpret_cast<const KvBlockSegment*>(device + segments), num_segments,
                         device, static_cast<int64_t>(record), stream_.get());
    CUDA_CHECK(cudaMemcpyAsync(host, device, n * record, cudaMemcpyDeviceToHost, stream_.get()));
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    for (size_t i = 0; i < n; ++i)
      std::memcpy(outs[first + i].data(), host + i * record, record);
  }
  return Status::Ok();
}

Status CudaBackend::CopyKvBlockFromHost(int32_t block_id, std::span<const uint8_t> in) {
  if (kv_pool_.data() == nullptr) return Status::Error("KV block copy before AllocateKvPool");
  CHECK(block_id >= 0 && block_id < kv_blocks_) << "KV block " << block_id << " out of range";
  const size_t record = static_cast<size_t>(KvBlockBytes());
  CHECK_EQ(in.size(), record);
  if (kv_upload_record_bytes_ == 0) {  // first use: size the halves for this pool
    kv_upload_record_bytes_ = record;
    kv_upload_capacity_ = std::max<size_t>(1, kKvUploadHalfBytes / record);
    const size_t bytes = SegmentsOffset(kv_upload_capacity_, record) +
                         static_cast<size_t>(kv_tensors_ * kv_layers_) * sizeof(KvBlockSegment);
    for (KvUploadHalf& h : kv_upload_) h.bytes.Reserve(bytes);
    kv_upload_device_ = DeviceBuffer(bytes);
    kv_upload_index_.assign(static_cast<size_t>(kv_blocks_), 0);
  }
  // Queued from page-locked memory: sent first, so this later content lands last.
  if (!kv_pinned_index_.empty() && kv_pinned_index_[static_cast<size_t>(block_id)] != 0)
    SendKvUploads();
  KvUploadHalf* half = &kv_upload_[static_cast<size_t>(kv_upload_half_)];
  int32_t& index = kv_upload_index_[static_cast<size_t>(block_id)];
  if (index == 0 && half->blocks.size() == kv_upload_capacity_) {
    SendKvUploads();
    half = &kv_upload_[static_cast<size_t>(kv_upload_half_)];
  }
  // The half's previous send must have been read before its bytes change.
  if (half->blocks.empty()) CUDA_CHECK(cudaEventSynchronize(half->sent.get()));
  if (index == 0) {  // a block staged twice keeps one record: the later content
    half->blocks.push_back(block_id);
    index = static_cast<int32_t>(half->blocks.size());
  }
  std::memcpy(half->bytes.data() + static_cast<size_t>(index - 1) * record, in.data(), record);
  return Status::Ok();
}

Status CudaBackend::CopyKvBlockFromPinned(int32_t block_id, std::span<const uint8_t> in) {
  if (kv_pool_.data() == nullptr) return Status::Error("KV block copy before AllocateKvPool");
  CHECK(block_id >= 0 && block_id < kv_blocks_) << "KV block " << block_id << " out of range";
  CHECK_EQ(in.size(), static_cast<size_t>(KvBlockBytes()));
  const unsigned char* device = DeviceAddressOfHost(in.data());
  if (device == nullptr) return CopyKvBlockFromHost(block_id, in);  // not mapped: staged
  if (kv_pinned_index_.empty()) kv_pinned_index_.assign(static_cast<size_t>(kv_blocks_), 0);
  // Staged in the current half: sent first, so this later content lands last (SendKvUploads
  // sends the half before the queue).
  if (!kv_upload_index_.empty() && kv_upload_index_[static_cast<size_t>(block_id)] != 0)
    SendKvUploads();
  int32_t& index = kv_pinned_index_[static_cast<size_t>(block_id)];
  if (index != 0) {  // queued twice: the later record
    kv_pinned_.records[static_cast<size_t>(index - 1)] = device;
    return Status::Ok();
  }
  kv_pinned_.blocks.push_back(block_id);
  kv_pinned_.records.push_back(device);
  index = static_cast<int32_t>(kv_pinned_.blocks.size());
  return Status::Ok();
}

bool CudaBackend::PinnedReadsDone(bool wait) {
  if (wait) {
    SendKvUploads();
    CUDA_CHECK(cudaEventSynchronize(kv_pinned_.read.get()));
    return true;
  }
  if (!kv_pinned_.blocks.empty()) return false;  // not sent yet (the next step sends it)
  const cudaError_t e = cudaEventQuery(kv_pinned_.read.get());
  if (e == cudaErrorNotReady) return false;
  CUDA_CHECK(e);
  return true;
}

CudaBackend::KvAddressTable CudaBackend::UploadKvAddressTable(
    std::span<const unsigned char* const> records, std::span<const int32_t> blocks,
    PinnedBytes& host, DeviceBuffer& device) {
  CHECK_EQ(records.size(), blocks.size());
  const size_t n = records.size();
  const size_t end = TableSegmentsOffset(n) +
                     static_cast<size_t>(kv_tensors_ * kv_layers_) * sizeof(KvBlockSegment);
  host.Reserve(end);
  if (device.bytes() < end) device = DeviceBuffer(end);
  unsigned char* h = host.data();
  std::memcpy(h, records.data(), n * sizeof(void*));
  std::memcpy(h + TableIdsOffset(n), blocks.data(), n * sizeof(int32_t));
  FillKvSegments(reinterpret_cast<KvBlockSegment*>(h + TableSegmentsOffset(n)));
  unsigned char* d = device.as<unsigned char>();
  CUDA_CHECK(cudaMemcpyAsync(d, h, end, cudaMemcpyHostToDevice, stream_.get()));
  return {reinterpret_cast<unsigned char* const*>(d),
          reinterpret_cast<const int32_t*>(d + TableIdsOffset(n)),
          reinterpret_cast<const KvBlockSegment*>(d + TableSegmentsOffset(n))};
}

void CudaBackend::SendPinnedUploads() {
  if (kv_pinned_.blocks.empty()) return;
  // The previous send's table has been copied before it is rewritten (or regrown).
  CUDA_CHECK(cudaEventSynchronize(kv_pinned_.read.get()));
  const KvAddressTable t = UploadKvAddressTable(kv_pinned_.records, kv_pinned_.blocks,
                                                kv_pinned_.table, kv_pinned_.device);
  LaunchScatterKvBlocksFrom(t.records, t.blocks, static_cast<int32_t>(kv_pinned_.blocks.size()),
                            t.segments, kv_tensors_ * kv_layers_, kv_pool_.as<unsigned char>(),
                            stream_.get());
  CUDA_CHECK(cudaEventRecord(kv_pinned_.read.get(), stream_.get()));
  for (int32_t b : kv_pinned_.blocks) kv_pinned_index_[static_cast<size_t>(b)] = 0;
  kv_pinned_.blocks.clear();
  kv_pinned_.records.clear();
}

void CudaBackend::SendKvUploads() {
  SendStagedUploads();
  SendPinnedUploads();
}

void CudaBackend::SendStagedUploads() {
  KvUploadHalf& half = kv_upload_[static_cast<size_t>(kv_upload_half_)];
  if (half.blocks.empty()) return;
  const size_t n = half.blocks.size(), record = kv_upload_record_bytes_;
  unsigned char* host = half.bytes.data();
  std::memcpy(host + IdsOffset(n, record), half.blocks.data(), n * sizeof(int32_t));
  FillKvSegments(reinterpret_cast<KvBlockSegment*>(host + SegmentsOffset(n, record)));
  const size_t total = SegmentsOffset(n, record) +
                       static_cast<size_t>(kv_tensors_ * kv_layers_) * sizeof(KvBlockSegment);
  Flush();  // ops recorded before the upload run before it
  unsigned char* device = kv_upload_device_.as<unsigned char>();
  CUDA_CHECK(cudaMemcpyAsync(device, host, total, cudaMemcpyHostToDevice, stream_.get()));
  LaunchScatterKvBlocks(device, static_cast<int64_t>(record),
                        reinterpret_cast<const int32_t*>(device + IdsOffset(n, record)),
                        static_cast<int32_t>(n),
                        reinterpret_cast<const KvBlockSegment*>(device + SegmentsOffset(n, record)),
                        kv_tensors_ * kv_layers_, kv_pool_.as<unsigned char>(), stream_.get());
  CUDA_CHECK(cudaEventRecord(half.sent.get(), stream_.get()));
  for (int32_t b : half.blocks) kv_upload_index_[static_cast<size_t>(b)] = 0;
  half.blocks.clear();
  kv_upload_half_ ^= 1;
}

}  // namespace ember::cuda
