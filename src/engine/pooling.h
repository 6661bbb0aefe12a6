// Pooling: how an embedding request turns a prompt's final hidden states (after the model's final
// norm, before the LM head) into one vector. kLastToken keeps the last prompt row (decoder
// embedding models such as Qwen3-Embedding), kMean averages every row, kCls keeps the first; an
// optional L2 normalization follows. PoolingAccumulator gathers a prompt's rows chunk by chunk
// (prefill is chunked) and sums in double, so the result does not depend on the chunking beyond
// float32 rounding of the rows themselves. Plain values; an accumulator belongs to one sequence
// (the engine thread's).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ember {

enum class PoolingKind : uint8_t { kNone, kLastToken, kMean, kCls };

// "none", "last", "mean", "cls".
const char* PoolingKindName(PoolingKind kind);

struct PoolingSpec {
  PoolingKind kind = PoolingKind::kNone;  // kNone: not an embedding request
  bool normalize = false;                 // L2-normalize the pooled vector
};

// Whether pooling reads rows before the prompt's last: such a prompt cannot take a prefix-cache
// hit (a cached row's hidden state is not kept, only its K/V).
bool PoolingReadsEarlyRows(PoolingKind kind);

// The prompt positions [begin, end) whose hidden states pooling needs among the rows
// [first_pos, first_pos + num_rows) of a prompt of prompt_len tokens (empty: begin == end).
struct PositionRange {
  int32_t begin = 0, end = 0;
  int32_t size() const { return end - begin; }
};
PositionRange PooledPositions(PoolingKind kind, int32_t prompt_len, int32_t first_pos,
                              int32_t num_rows);

// Scales v to unit L2 norm (computed in double); a zero vector stays zero.
void L2Normalize(std::span<float> v);

// The first `dimensions` values of a unit-norm embedding, normalized again (Matryoshka-style
// truncation, OpenAI's `dimensions`). dimensions must be in [1, v.size()].
std::vector<float> TruncateEmbedding(std::span<const float> v, int32_t dimensions);

class PoolingAccumulator {
 public:
  // Adds `rows` ([num_rows, dim], row-major) in position order.
  void Add(std::span<const float> rows, int32_t dim);
  // Forgets every row (the sequence was preempted and recomputes its prompt).
  void Reset();
  int32_t num_rows() const { return num_rows_; }
  // The pooled vector per `spec` (mean: the sum over the row count; last/cls: the one row), then
  // normalized when spec.normalize. Empty when no row was added.
  std::vector<float> Finish(const PoolingSpec& spec) const;

 private:
  std::vector<double> sum_;  // [dim] (kLastToken / kCls: the one row)
  int32_t num_rows_ = 0;
};

}  // namespace ember
