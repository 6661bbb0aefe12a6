// ScatterKvBlocks / GatherKvBlocks: the prompt cache's block records (back to back on the device,
// or wherever a table of addresses says: page-locked host records the kernel reads and writes
// over the bus) copied into their pool blocks or out of them (one CUDA block per (record, layer
// K or V segment)).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kv_block_upload.h"

namespace ember::cuda {
namespace {

// kGather: pool -> records; else records -> pool. Record i is at record_ptrs[i] when given (a
// table of device-accessible addresses: page-locked host records), else at records + i * bytes.
template <bool kGather>
__global__ void CopyKvBlocksKernel(unsigned char* records, int64_t record_bytes,
                                   unsigned char* const* record_ptrs, const int32_t* block_ids,
                                   const KvBlockSegment* segments, unsigned char* pool) {
  const KvBlockSegment s = segments[blockIdx.y];
  unsigned char* record =
      (record_ptrs != nullptr ? record_ptrs[blockIdx.x] : records + blockIdx.x * record_bytes) +
      s.src;
  unsigned char* block = pool + s.dst + s.bytes * static_cast<uint64_t>(block_ids[blockIdx.x]);
  const unsigned char* src = kGather ? block : record;
  unsigned char* dst = kGather ? record : block;
  const uint64_t aligned = reinterpret_cast<uint64_t>(src) | reinterpret_cast<uint64_t>(dst) |
                           s.bytes;
  if ((aligned & 15) == 0) {
    const uint4* src16 = reinterpret_cast<const uint4*>(src);
    uint4* dst16 = reinterpret_cast<uint4*>(dst);
    for (uint64_t i = threadIdx.x; i < s.bytes / 16; i += blockDim.x) dst16[i] = src16[i];
  } else {
    for (uint64_t i = threadIdx.x; i < s.bytes; i += blockDim.x) dst[i] = src[i];
  }
}

template <bool kGather>
void Launch(unsigned char* records, int64_t record_bytes, unsigned char* const* record_ptrs,
            const int32_t* block_ids, int32_t num_records, const KvBlockSegment* segments,
            int32_t num_segments, unsigned char* pool, cudaStream_t stream) {
  if (num_records == 0) return;
  const dim3 grid(static_cast<unsigned>(num_records), static_cast<unsigned>(num_segments));
  CopyKvBlocksKernel<kGather><<<grid, 256, 0, stream>>>(records, record_bytes, record_ptrs,
                                                        block_ids, segments, pool);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void LaunchScatterKvBlocks(const unsigned char* records, int64_t record_bytes,
                           const int32_t* block_ids, int32_t num_records,
                           const KvBlockSegment* segments, int32_t num_segments,
                           unsigned char* pool, cudaStream_t stream) {
  Launch<false>(const_cast<unsigned char*>(records), record_bytes, nullptr, block_ids, num_records,
                segments, num_segments, pool, stream);
}

void LaunchScatterKvBlocksFrom(const unsigned char* const* records, const int32_t* block_ids,
                               int32_t num_records, const KvBlockSegment* segments,
                               int32_t num_segments, unsigned char* pool, cudaStream_t stream) {
  Launch<false>(nullptr, 0, const_cast<unsigned char* const*>(records), block_ids, num_records,
                segments, num_segments, pool, stream);
}

void LaunchGatherKvBlocks(const unsigned char* pool, const int32_t* block_ids, int32_t num_records,
                          const KvBlockSegment* segments, int32_t num_segments,
                          unsigned char* records, int64_t record_bytes, cudaStream_t stream) {
  Launch<true>(records, record_bytes, nullptr, block_ids, num_records, segments, num_segments,
               const_cast<unsigned char*>(pool), stream);
}

void LaunchGatherKvBlocksTo(const unsigned char* pool, const int32_t* block_ids,
                            int32_t num_records, const KvBlockSegment* segments,
                            int32_t num_segments, unsigned char* const* records,
                            cudaStream_t stream) {
  Launch<true>(nullptr, 0, records, block_ids, num_records, segments, num_segments,
               const_cast<unsigned char*>(pool), stream);
}

}  // namespace ember::cuda
