// ThresholdSample (the CUDA SampleRows kernel's CPU twin) against the host sampler, Sample():
// the same token for the same uniform draw over random rows (peaked, flat, with ties, -inf and
// NaN entries) and every combination of temperature, top-k, top-p and min-p; the CPU backend's
// SampleRows over a tensor of such rows; and, where a GPU exists, the CUDA kernel = the twin.
// Also the logits processors as edit lists (ApplyLogitEditsToRows, the twin of the CUDA
// logit_edits kernel) against processors.h's passes, bit for bit, on the CPU and CUDA backends.
#include "backend/threshold_sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_loader.h"
#include "sampling/logit_edits.h"
#include "sampling/processors.h"
#include "sampling/sampler.h"

namespace ember {
namespace {

std::vector<float> RandomRow(std::mt19937& rng, int vocab, int kind) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(vocab));
  const float scale = kind == 0 ? 1.0f : kind == 1 ? 6.0f : 0.2f;  // typical, peaked, flat
  for (float& x : row) x = normal(rng) * scale;
  if (kind == 3) {  // coarse values: many exact ties, including at the top
    for (float& x : row) x = std::round(x * 2.0f) / 2.0f;
  }
  if (kind == 4) {  // masked and broken entries
    for (size_t i = 0; i < row.size(); i += 7) row[i] = -std::numeric_limits<float>::infinity();
    row[3] = std::numeric_limits<float>::quiet_NaN();
  }
  if (kind == 5) {  // a language model's shape: N(0, 2) and a head of 20 tokens, two of them tied
    for (float& x : row) x *= 2.0f;
    for (int i = 0; i < 20; ++i) row[rng() % row.size()] = 12.0f + normal(rng) * 2.0f;
    row[rng() % row.size()] = 14.0f;
    row[rng() % row.size()] = 14.0f;
  }
  return row;
}

TEST(ThresholdSampleTest, MatchesTheHostSampler) {
  std::mt19937 rng(123);
  int cases = 0, mismatches = 0;
  for (int vocab : {50, 1000, 4099}) {
    for (int kind = 0; kind < 5; ++kind) {
      for (float temperature : {0.5f, 1.0f, 1.7f}) {
        for (int32_t top_k : {0, 1, 7, 60}) {
          for (float top_p : {1.0f, 0.95f, 0.5f}) {
            for (float min_p : {0.0f, 0.05f}) {
              const std::vector<float> row = RandomRow(rng, vocab, kind);
              SamplingParams sp;
              sp.temperature = temperature;
              sp.top_k = top_k;
              sp.top_p = top_p;
              sp.min_p = min_p;
              sp.seed = static_cast<uint64_t>(cases);
              SamplerState state(sp, 0, {});
              SamplerState peek = state;
              RowSampling rp;
              rp.temperature = temperature;
              rp.top_k = top_k;
              rp.top_p = top_p;
              rp.min_p = min_p;
              rp.u = peek.NextUniform();
              std::vector<float> scratch = row;
              const int32_t host = Sample(scratch, sp, state).token_id;
              const int32_t twin = ThresholdSample(row, rp);
              ++cases;
              if (host != twin) {
                ++mismatches;
                ADD_FAILURE() << "vocab " << vocab << " kind " << kind << " T " << temperature
                              << " k " << top_k << " p " << top_p << " min_p " << min_p << " u "
                              << rp.u << ": host " << host << " twin " << twin;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases;
}

TEST(ThresholdSampleTest, CpuBackendSampleRows) {
  CpuBackendOptions options;
  options.num_threads = 1;
  auto be = MakeCpuBackend(options);
  std::mt19937 rng(7);
  const int vocab = 777, rows = 5;
  std::vector<float> data;
  for (int r = 0; r < rows; ++r) {
    std::vector<float> row = RandomRow(rng, vocab, r % 5);
    data.insert(data.end(), row.begin(), row.end());
  }
  const std::vector<int64_t> shape = {rows, vocab};
  auto x = be->UploadWeight("logits", DType::kF32, shape, data.data());
  ASSERT_TRUE(x.ok()) << x.message();
  const std::vector<int32_t> which = {4, 0, 2};
  std::vector<RowSampling> params(3);
  params[0] = {0.8f, 10, 0.9f, 0.0f, 0.31};
  params[1] = {1.0f, 0, 1.0f, 0.0f, 0.77};
  params[2] = {1.3f, 0, 0.6f, 0.02f, 0.05};
  std::vector<int32_t> ids(rows, -1);  // by logits row: the rows not sampled stay -1
  ASSERT_TRUE(be->SampleRows(*x, which, params, ids).ok());
  for (size_t j = 0; j < which.size(); ++j) {
    std::span<const float> row(data.data() + which[j] * vocab, static_cast<size_t>(vocab));
    EXPECT_EQ(ids[static_cast<size_t>(which[j])], ThresholdSample(row, params[j]))
        << "row " << which[j];
  }
  EXPECT_EQ(ids[1], -1);
  EXPECT_EQ(ids[3], -1);
  const std::vector<int32_t> bad = {5};
  EXPECT_FALSE(be->SampleRows(*x, bad, std::span(params).first(1), ids).ok());
  EXPECT_FALSE(be->SampleRows(*x, which, params, std::span(ids).first(3)).ok());
}

// The CUDA kernel against its twin, where a GPU exists: real-vocabulary rows, every filter.
TEST(ThresholdSampleTest, CudaMatchesTheTwin) {
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  CudaBackendOptions options;
  options.f32_compute = true;  // keep the uploaded rows float32
  auto be = LoadCudaBackend(0, options);
  ASSERT_TRUE(be.ok()) << be.message();
  std::mt19937 rng(99);
  for (int vocab : {1000, 151936}) {
    const int rows = 48;
    std::vector<float> data;
    for (int r = 0; r < rows; ++r) {
      // Every kind; at the real vocabulary the head-heavy ones (1, 5) take the block kernel's
      // compacted passes.
      std::vector<float> row = RandomRow(rng, vocab, r % 6);
      data.insert(data.end(), row.begin(), row.end());
    }
    const std::vector<int64_t> shape = {rows, vocab};
    auto x = (*be)->UploadWeight("logits", DType::kF32, shape, data.data());
    ASSERT_TRUE(x.ok()) << x.message();
    std::vector<int32_t> which;
    std::vector<RowSampling> params;
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    const float temps[] = {0.6f, 1.0f, 1.5f};
    const int32_t ks[] = {0, 1, 20, 500};
    const float ps[] = {1.0f, 0.9f, 0.4f};
    const float min_ps[] = {0.0f, 0.1f};
    for (int r = 0; r < rows; ++r) {
      which.push_back(rows - 1 - r);  // rows in another order than stored
      params.push_back(
          {temps[r % 3], ks[r % 4], ps[(r / 4) % 3], min_ps[(r / 12) % 2], uniform(rng)});
    }
    // All rows at once (one block per row), then in groups of 12 (a cluster of 8 blocks per
    // row) and alone (a cluster of 16 blocks where the device runs it, batch-1 decode's shape).
    std::vector<int32_t> ids(static_cast<size_t>(rows), -1);  // by logits row
    ASSERT_TRUE((*be)->SampleRows(*x, which, params, ids).ok());
    for (size_t group : {size_t{12}, size_t{1}}) {
      std::vector<int32_t> grouped(static_cast<size_t>(rows), -1);
      for (size_t j = 0; j < which.size(); j += group) {
        const size_t len = std::min(group, which.size() - j);
        ASSERT_TRUE((*be)
                        ->SampleRows(*x, std::span(which).subspan(j, len),
                                     std::span(params).subspan(j, len), grouped)
                        .ok());
      }
      EXPECT_EQ(grouped, ids) << "vocab " << vocab << ", groups of " << group;
    }
    int mismatches = 0;
    for (size_t j = 0; j < which.size(); ++j) {
      std::span<const float> row(data.data() + static_cast<size_t>(which[j]) * vocab,
                                 static_cast<size_t>(vocab));
      const int32_t want = ThresholdSample(row, params[j]);
      const int32_t got = ids[static_cast<size_t>(which[j])];
      if (got != want) {
        ++mismatches;
        ADD_FAILURE() << "vocab " << vocab << " row " << which[j] << " T " << params[j].temperature
                      << " k " << params[j].top_k << " p " << params[j].top_p << " min_p "
                      << params[j].min_p << " u " << params[j].u << ": cuda " << got << " twin "
                      << want;
      }
    }
    EXPECT_EQ(mismatches, 0) << "vocab " << vocab;
  }
}

// ---- logits processors as edit lists ----

// Equal bits, or both NaN (a GPU's NaN results carry the canonical payload).
bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) ||
         std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// One row's request: processors drawn at random over `vocab`, with the sequence state after a
// random prompt and some accepted output tokens (ids drawn from a small range so they repeat and
// overlap the biased and stop ids).
struct ProcessedRow {
  SamplingParams params;
  std::vector<int32_t> prompt, stop_ids, outputs;
};

ProcessedRow RandomProcessedRow(std::mt19937& rng, int32_t vocab, int kind, int num_prompt) {
  ProcessedRow r;
  const int32_t hot = std::min(vocab, 300);  // ids below this repeat
  auto id = [&](bool hot_id) {
    return static_cast<int32_t>(rng() % static_cast<uint32_t>(hot_id ? hot : vocab));
  };
  std::uniform_real_distribution<float> uni(-3.0f, 3.0f);
  SamplingParams& p = r.params;
  if (kind & 1) {
    for (int i = 0; i < 12; ++i) p.logit_bias.push_back({id(i % 2 == 0), uni(rng)});
    p.logit_bias.push_back(p.logit_bias[0]);  // a repeated id, same and other values
    p.logit_bias.push_back({p.logit_bias[1].first, 0.3f});
  }
  if (kind & 2) p.repetition_penalty = kind & 8 ? 0.85f : 1.3f;
  if (kind & 4) {
    p.presence_penalty = kind & 8 ? -0.4f : 0.6f;
    p.frequency_penalty = 0.35f;
  }
  if (kind & 16) {
    p.min_tokens = 100;
    r.stop_ids = {id(true), id(true), id(false)};
    if (!p.logit_bias.empty()) r.stop_ids.push_back(p.logit_bias[0].first);
  }
  for (int i = 0; i < num_prompt; ++i) r.prompt.push_back(id(i % 3 != 0));
  for (int i = 0; i < 40; ++i) r.outputs.push_back(id(true));
  return r;
}

// rows.size() rows of random logits and their edits (AppendLogitEdits, row by row); `want` is
// every row after processors.h's passes in Sample()'s order.
struct EditCase {
  std::vector<float> logits, want;
  std::vector<LogitEdit> edits;
};

EditCase MakeEditCase(std::mt19937& rng, int32_t vocab, int num_rows, int num_prompt) {
  EditCase c;
  for (int r = 0; r < num_rows; ++r) {
    std::vector<float> row = RandomRow(rng, vocab, r % 5);
    row[1] = 0.0f;  // signed zeros through the repetition penalty's branch
    row[2] = -0.0f;
    const ProcessedRow pr = RandomProcessedRow(rng, vocab, r % 32, num_prompt);
    SamplerState state(pr.params, 0, pr.prompt, pr.stop_ids);
    for (int32_t t : pr.outputs) state.Accept(t);
    AppendLogitEdits(pr.params, state, r, c.edits);
    c.logits.insert(c.logits.end(), row.begin(), row.end());
    const SamplingParams& p = pr.params;
    ApplyLogitBias(row, p.logit_bias);
    if (p.has_penalties()) {
      ApplyPenalties(row, state.seen_ids(), state.output_counts(), p.repetition_penalty,
                     p.presence_penalty, p.frequency_penalty);
    }
    if (state.num_output_tokens() < p.min_tokens) MaskTokens(row, state.min_tokens_mask_ids());
    c.want.insert(c.want.end(), row.begin(), row.end());
  }
  return c;
}

int CountDifferences(const std::vector<float>& got, const std::vector<float>& want) {
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!SameFloat(got[i], want[i]) && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << ": got " << got[i] << " want " << want[i];
    }
  }
  return bad;
}

// The edit lists reproduce processors.h's passes bit for bit: every combination of bias (with a
// repeated id), repetition (above and below 1), presence / frequency, and min_tokens masks that
// hit biased and penalised ids; and the CPU backend's ApplyLogitEdits is the same function.
TEST(LogitEditsTest, CpuTwinEqualsTheProcessors) {
  std::mt19937 rng(7);
  const int32_t vocab = 1000;
  const int rows = 64;
  EditCase c = MakeEditCase(rng, vocab, rows, 200);
  ASSERT_GT(c.edits.size(), 2000u);
  EXPECT_NE(c.logits, c.want);  // the processors did something
  std::vector<float> got = c.logits;
  ASSERT_TRUE(ApplyLogitEditsToRows(got, vocab, c.edits).ok());
  EXPECT_EQ(CountDifferences(got, c.want), 0);

  CpuBackendOptions options;
  options.num_threads = 1;
  auto be = MakeCpuBackend(options);
  const std::vector<int64_t> shape = {rows, vocab};
  std::vector<float> data = c.logits;  // the CPU backend keeps (and edits) the host pointer
  auto x = be->UploadWeight("logits", DType::kF32, shape, data.data());
  ASSERT_TRUE(x.ok()) << x.message();
  ASSERT_TRUE(be->ApplyLogitEdits(*x, c.edits).ok());
  std::vector<float> back(data.size());
  ASSERT_TRUE(be->CopyToHost(*x, back).ok());
  EXPECT_EQ(CountDifferences(back, c.want), 0);
  const LogitEdit outside[] = {{rows, 0, LogitEditOp::kAdd, 1.0f}};
  EXPECT_FALSE(be->ApplyLogitEdits(*x, outside).ok());
  const LogitEdit bad_token[] = {{0, vocab, LogitEditOp::kMask, 0.0f}};
  const Status st = ApplyLogitEditsToRows(got, vocab, bad_token);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("token 1000"), std::string::npos) << st.message();
}

// A request without processors (or with min_tokens reached) has no edits; a masked id keeps only
// its mask; a repeated bias id keeps its entries in request order, grouped.
TEST(LogitEditsTest, ListShape) {
  SamplingParams p;
  SamplerState plain(p, 0, {});
  std::vector<LogitEdit> edits;
  AppendLogitEdits(p, plain, 0, edits);
  EXPECT_TRUE(edits.empty());

  p.logit_bias = {{5, 1.0f}, {9, 2.0f}, {5, -0.5f}, {3, 4.0f}};
  p.repetition_penalty = 1.5f;
  p.min_tokens = 1;
  const std::vector<int32_t> prompt = {5, 3, 8}, stops = {3};
  SamplerState state(p, 0, prompt, stops);
  AppendLogitEdits(p, state, 2, edits);
  using Op = LogitEditOp;
  const std::vector<std::tuple<int32_t, Op, float>> want = {
      {5, Op::kAdd, 1.0f}, {5, Op::kAdd, -0.5f}, {5, Op::kRepetition, 1.5f},  // prompt id 5
      {8, Op::kRepetition, 1.5f},                                              // prompt id 8
      {9, Op::kAdd, 2.0f},                                                     // bias only
      {3, Op::kMask, 0.0f}};                                                   // masked: only
  ASSERT_EQ(edits.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(edits[i].row, 2);
    EXPECT_EQ(edits[i].token, std::get<0>(want[i])) << i;
    EXPECT_EQ(edits[i].op, std::get<1>(want[i])) << i;
    EXPECT_EQ(edits[i].value, std::get<2>(want[i])) << i;
  }
  state.Accept(8);  // min_tokens reached: no mask; 8's output count subtracts +0: no edit
  edits.clear();
  AppendLogitEdits(p, state, 0, edits);
  EXPECT_EQ(edits.size(), 7u);  // 5: 3 edits, 3: bias + repetition, 8: repetition, 9: bias
  p.frequency_penalty = 0.5f;  // now 8 (output count 1) also drops by 0.5
  edits.clear();
  AppendLogitEdits(p, state, 0, edits);
  ASSERT_EQ(edits.size(), 8u);
  EXPECT_EQ(edits[6].token, 8);
  EXPECT_EQ(edits[6].op, LogitEditOp::kSubtract);
  EXPECT_EQ(edits[6].value, 0.5f);
}

// The CUDA kernel against its twin, where a GPU exists: a real vocabulary, long prompts (many
// edits per row), runs of several edits on one element, bit for bit.
TEST(LogitEditsTest, CudaMatchesTheTwin) {
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  CudaBackendOptions options;
  options.f32_compute = true;  // keep the uploaded rows float32
  auto be = LoadCudaBackend(0, options);
  ASSERT_TRUE(be.ok()) << be.message();
  std::mt19937 rng(11);
  const int32_t vocab = 151936;
  const int rows = 48;
  EditCase c = MakeEditCase(rng, vocab, rows, 3000);
  const std::vector<int64_t> shape = {rows, vocab};
  auto x = (*be)->UploadWeight("logits", DType::kF32, shape, c.logits.data());
  ASSERT_TRUE(x.ok()) << x.message();
  ASSERT_TRUE((*be)->ApplyLogitEdits(*x, c.edits).ok());
  std::vector<float> back(c.logits.size());
  ASSERT_TRUE((*be)->CopyToHost(*x, back).ok());
  EXPECT_EQ(CountDifferences(back, c.want), 0) << c.edits.size() << " edits";
  const LogitEdit outside[] = {{0, vocab, LogitEditOp::kAdd, 1.0f}};
  EXPECT_FALSE((*be)->ApplyLogitEdits(*x, outside).ok());
}

}  // namespace
}  // namespace ember
