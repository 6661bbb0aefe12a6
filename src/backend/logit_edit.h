// LogitEdit: one elementary logits-processor operation on one element of a step's logits, and
// the ONE definition of its float arithmetic (ApplyLogitEdit), shared by the host sampler
// (sampling/logit_edits.h builds the edits of a row and applies them), the CPU backend's
// ApplyLogitEdits and the CUDA kernel (backend/cuda/logit_edits.cu), so all three produce the
// same bits. Plain C++17 with no includes beyond <cstdint>, so nvcc compiles it too. Pure;
// thread-safe.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define EMBER_HOST_DEVICE __host__ __device__
#else
#define EMBER_HOST_DEVICE
#endif

namespace ember {

// What an edit does to x = logits[row, token]; `value` is its operand.
enum class LogitEditOp : int32_t {
  kAdd = 0,         // x += value                         (logit_bias; one edit per bias entry)
  kRepetition = 1,  // x = x > 0 ? x / value : x * value  (repetition penalty, value != 1)
  kSubtract = 2,    // x -= value                         (frequency * count + presence)
  kMask = 3,        // x = -inf                           (min_tokens: stop ids)
};

// 16 bytes. The edits of one element sit next to each other in a list, in the order they apply
// (the host sampler's: bias entries, repetition, subtraction; a masked element has only its
// mask); distinct elements commute, so a backend may apply them in parallel.
struct LogitEdit {
  int32_t row = 0;    // logits row (the step's sampling row)
  int32_t token = 0;  // column, in [0, vocab)
  LogitEditOp op = LogitEditOp::kAdd;
  float value = 0.0f;
};

// The float operation of one edit, exactly as sampling/processors.cc specifies it.
EMBER_HOST_DEVICE inline float ApplyLogitEdit(float x, LogitEditOp op, float value) {
  switch (op) {
    case LogitEditOp::kAdd:
      return x + value;
    case LogitEditOp::kRepetition:
      return x > 0.0f ? x / value : x * value;
    case LogitEditOp::kSubtract:
      return x - value;
    case LogitEditOp::kMask:
      break;
  }
#if defined(__CUDA_ARCH__)
  return -__int_as_float(0x7f800000);
#else
  return -__builtin_huge_valf();
#endif
}

// Whether a packed token mask (RowMask's layout: bit t % 32 of word t / 32) allows column t; a
// column it does not allow becomes ApplyLogitEdit(x, kMask, 0), the same -inf as a kMask edit.
EMBER_HOST_DEVICE inline bool TokenMaskAllows(const uint32_t* bits, int64_t t) {
  return ((bits[t >> 5] >> (t & 31)) & 1u) != 0;
}

}  // namespace ember
