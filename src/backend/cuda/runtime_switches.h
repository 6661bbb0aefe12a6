// RuntimeSwitches: the CUDA backend's settings read from the environment, once, when a backend is
// created (CreateCudaBackend); kernel launchers get these values as arguments and read no
// environment. Only diagnostics and live A/B knobs live here; a switch whose A/B is decided is
// removed with its losing code path (docs/perf.md records each decision). Plain data.
#pragma once

#include <cstdint>
#include <string>

namespace ember::cuda {

struct RuntimeSwitches {
  // EMBER_MOE_MMA=0 / 1: MoeMlp's experts never / always on the tensor cores (unset: the
  // measured rule, MoeMmaPays). scripts/device-test.sh runs the MoE tests under both to cover
  // the kernels the rule does not pick at test sizes.
  enum class MoeMma : uint8_t { kAuto, kNever, kAlways };
  MoeMma moe_mma = MoeMma::kAuto;
  // EMBER_GEMM_VARIANT=1: the batch-invariant tiled GEMM's 128 x 128 tile with 4 stages of k32
  // instead of 3 of k64 (the same bits; an A/B knob with no recorded result yet).
  int32_t gemm_tiled_variant = 0;
  // EMBER_LORA_GEMM_ROWS=N: a LoRA segment of at least N rows, where the base MatMuls are
  // cuBLAS's, takes two cuBLAS GEMMs instead of the BGMV kernels (0: never). 256 by default.
  int64_t lora_gemm_rows = 256;
  // EMBER_LORA_STACKED_ROWS=N: a LoraDelta call of 9..N rows with bf16 x (the cuBLAS MatMuls'
  // rows, outside the batch-invariant mode) and segments of two slots or more runs as cuBLAS
  // GEMMs over every slot's matrices stacked side by side (RecordLoraStacked) instead of the
  // BGMV kernels and per-segment GEMMs (0: never). Every row count by default: 128 x (512 + 128)
  // with 8 adapters mixed 0.791x of the base against 0.668x (H100, docs/perf.md session 52).
  int64_t lora_stacked_rows = int64_t{1} << 40;
  // EMBER_LORA_UPDATE_FIRST_ROWS=N: a MatMulGroupLora of N rows or more on cuBLAS whose update
  // takes the stacked form writes the update into the outputs first and the GEMMs add x W^T to
  // it (beta 1) instead of the update reading and writing the GEMMs' outputs after them (0:
  // never, the default until measured).
  int64_t lora_update_first_rows = 0;
  // EMBER_MLA_FLASH=0: MlaAttention in the bf16 mode on the f32 one-block-per-(row, head) kernel
  // instead of the tensor-core path (an A/B knob).
  bool mla_flash = true;
  // EMBER_MLA_M_TILES=1 / 2 / 4: the tensor-core MLA's 16-row m-tiles per block, whatever the
  // step (unset: by the step's rows). The same results either way: a test and A/B knob.
  int32_t mla_flash_m_tiles = 0;
  // EMBER_MLA_SPLIT_KEYS=N: the tensor-core MLA's key splits (rounded down to a multiple of 32;
  // 0: none): the softmax state restarts every N keys and the splits run as blocks of their own.
  int32_t mla_split_keys = 1024;
  // EMBER_DELTA_CHUNKED=0: GatedDeltaRule walks every row in order instead of taking the chunked
  // form for long sequences where a step need not be batch-invariant (an A/B knob; the chunked
  // form gives 1.21x the prefill of a Qwen3-Next shape on the H100, docs/perf.md session 47).
  bool delta_chunked = true;
  // EMBER_KV_DIRECT=0: int8 / FP8 KV rows of head dim 128 through the attention's bf16 tiles
  // (each value times its scale, rounded) instead of as its direct f16 operands (an A/B knob; the
  // direct operands read the rows 1.3-1.4x faster on the H100, docs/perf.md session 47).
  bool kv_direct = true;
  // EMBER_LORA_BIAS_FOLD=0: a one-row MatMulGroupLora as the GEMV then the LoRA update (the
  // default folds the update into the GEMV's bias; an A/B knob).
  bool lora_bias_fold = true;
  // EMBER_LORA_GEMV_FUSED=0: with the fold, the batch-1 update as two launches before the GEMV
  // (shrink, expand into the bias row) instead of inside the ring GEMV's own launch (gemv.cu's
  // LoRA warp: shrink, then each row's t b^T at its store). An A/B knob: the whole 8B at batch 1
  // on an H100 decodes at 0.907x of the base fused against 0.827x (docs/perf.md session 49).
  bool lora_gemv_fused = true;
  // EMBER_LORA_ROW_ORDER=0: LoraDelta's kernels tile the rows in row order instead of grouped by
  // adapter (an A/B knob; the same arithmetic per row either way).
  bool lora_row_order = true;
  // EMBER_CUDA_GRAPHS=0: decode steps launch their ops one by one instead of as a captured graph
  // (a diagnostic: where a result differs with graphs, whether the graph is the cause).
  bool graphs = true;
  // EMBER_CUDA_PROFILE_OUT=FILE: time every op kind with events and append the totals to FILE
  // when the backend goes away (for programs that cannot call CudaGetOpProfile).
  std::string profile_out;
  // EMBER_CUDA_TRACE_OUT=FILE: where a -DEMBER_CUDA_TRACE=ON build writes its step timeline.
  std::string trace_out;

  static RuntimeSwitches FromEnvironment();
};

}  // namespace ember::cuda
