// The prompt cache's block copies on the GPU (kv_block_upload.cu): staged block records
// scattered into their KV pool blocks, and pool blocks gathered into records. Used by
// cuda_kv_upload.cc.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ember::cuda {

// One layer's K or V part of a pool block: `bytes` at `src` within a block record, at
// dst + bytes * block_id in the pool.
struct KvBlockSegment {
  uint64_t src = 0, dst = 0, bytes = 0;
};
// Copies num_records records (record_bytes each, back to back at `records`) into the pool blocks
// block_ids[i], segment by segment. Device pointers.
void LaunchScatterKvBlocks(const unsigned char* records, int64_t record_bytes,
                           const int32_t* block_ids, int32_t num_records,
                           const KvBlockSegment* segments, int32_t num_segments,
                           unsigned char* pool, cudaStream_t stream);
// The same from records[i] (a device array of device-accessible addresses: page-locked host
// records, read over the bus).
void LaunchScatterKvBlocksFrom(const unsigned char* const* records, const int32_t* block_ids,
                               int32_t num_records, const KvBlockSegment* segments,
                               int32_t num_segments, unsigned char* pool, cudaStream_t stream);
// The reverse: the pool blocks block_ids[i] copied into num_records records, back to back.
void LaunchGatherKvBlocks(const unsigned char* pool, const int32_t* block_ids, int32_t num_records,
                          const KvBlockSegment* segments, int32_t num_segments,
                          unsigned char* records, int64_t record_bytes, cudaStream_t stream);
// ... into records[i] (as LaunchScatterKvBlocksFrom's table).
void LaunchGatherKvBlocksTo(const unsigned char* pool, const int32_t* block_ids,
                            int32_t num_records, const KvBlockSegment* segments,
                            int32_t num_segments, unsigned char* const* records,
                            cudaStream_t stream);

}  // namespace ember::cuda
