// OpKind: the kinds of launch the CUDA backend records (StepRecorder), one per backend op or fused
// op. The kind is the first word of a recorded op's graph key and the name the op profile
// (CudaGetOpProfile, EMBER_CUDA_PROFILE_OUT) reports. Plain data, any thread.
#pragma once

#include <cstdint>

namespace ember::cuda {

enum class OpKind : uint8_t {
  kEmbedding = 1,
  kRmsNorm = 2,
  kAddRmsNorm = 3,
  kMatMulCublas = 4,  // cuBLAS or the skinny wgmma GEMM, a CublasGroup of one x
  kRope = 5,
  kWriteKv = 6,
  kAttention = 7,
  kSiluMul = 8,
  kGeluTanhMul = 9,
  kAdd = 10,
  kSoftcap = 11,
  kGatherLogitsRows = 12,
  kMatMulGemv = 13,            // the batch-1 GEMV over the parts of one x
  kMatMulGemm = 14,            // the batch-invariant GEMM over the parts of one x
  kRopeWriteKv = 15,           // Backend::RopeWriteKv in one launch
  kMatMulGemvActivation = 16,  // Backend::GateUpActivation as one GEMV launch
  kRopeAttention = 17,         // Backend::RopeWriteKvAttention as one decode attention launch
  kMoeMlp = 18,
  kArgmaxRows = 19,
  kLoraDelta = 20,  // Backend::LoraDelta: the shrink and expand launches over its segments
  kCausalConv1dSilu = 21,
  kGatedDeltaRule = 22,
  kSigmoidGateMul = 23,
  kMlaAttention = 24,
  kHadamardRows = 25,  // an int4-rotated layer's q before its attention, its output after
  kLoraGemm = 26,      // LoraDelta's prefill-sized segments on cuBLAS GEMMs (RecordLoraGemms)
  kLoraStacked = 27,   // LoraDelta over every slot's stacked matrices (RecordLoraStacked)
};

// The profile's name of a kind: "Embedding", "MatMul(cublas)", "RopeAttention", ...
const char* OpKindName(OpKind kind);

}  // namespace ember::cuda
