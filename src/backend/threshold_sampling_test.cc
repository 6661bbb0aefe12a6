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

// ---- token masks (structured output) as packed bits ----

// `rows` rows of random logits with processors (an EditCase: logits, edits, want = after the
// processors), and a token mask for each row in `masked_rows`, of assorted densities: nothing
// allowed, one token, a few, about half, all but a few, everything.
struct MaskCase {
  EditCase edits;
  std::vector<std::vector<uint8_t>> allowed;  // by masked row: [vocab] 0/1
  std::vector<std::vector<uint32_t>> bits;    // the same, packed
  std::vector<RowMask> masks;
  std::vector<float> want;  // want after the processors, then -inf where a mask says 0
};

MaskCase MakeMaskCase(std::mt19937& rng, int32_t vocab, int rows, std::vector<int32_t> masked_rows) {
  MaskCase c;
  c.edits = MakeEditCase(rng, vocab, rows, 200);
  c.want = c.edits.want;
  for (size_t j = 0; j < masked_rows.size(); ++j) {
    std::vector<uint8_t> allowed(static_cast<size_t>(vocab), 0);
    const uint32_t odds[] = {0, 0, 5, 500, 1000};  // kinds 0, 2, 3, 4: per mille allowed
    const int kind = static_cast<int>(j % 7);
    if (kind == 1) {
      allowed[rng() % allowed.size()] = 1;
    } else if (kind == 5) {
      std::fill(allowed.begin(), allowed.end(), 1);
      for (int k = 0; k < 9; ++k) allowed[rng() % allowed.size()] = 0;
    } else if (kind == 6) {
      std::fill(allowed.begin(), allowed.end(), 1);
    } else {
      for (uint8_t& a : allowed) a = rng() % 1000 < odds[kind];
    }
    std::vector<uint32_t> packed((allowed.size() + 31) / 32, 0);
    for (size_t t = 0; t < allowed.size(); ++t)
      packed[t / 32] |= uint32_t{allowed[t]} << (t % 32);
    const int32_t row = masked_rows[j];
    for (size_t t = 0; t < allowed.size(); ++t)
      if (!allowed[t])
        c.want[static_cast<size_t>(row) * static_cast<size_t>(vocab) + t] =
            -std::numeric_limits<float>::infinity();
    c.allowed.push_back(std::move(allowed));
    c.bits.push_back(std::move(packed));
  }
  for (size_t j = 0; j < masked_rows.size(); ++j) c.masks.push_back({masked_rows[j], c.bits[j]});
  return c;
}

// The twin (processors' edits, then the masks) gives the host sampler's masked rows bit for bit
// (vocabularies that end mid-word too), leaves the unmasked rows as the processors left them,
// and the CPU backend's ApplyTokenMasks is the same function; masks outside the tensor or of the
// wrong length are refused.
TEST(TokenMasksTest, CpuTwinEqualsTheHostMask) {
  std::mt19937 rng(5);
  for (int32_t vocab : {1000, 4099, 4096}) {
    const int rows = 16;
    MaskCase c = MakeMaskCase(rng, vocab, rows, {3, 0, 15, 7, 8, 9, 10, 11, 12, 1});
    std::vector<float> got = c.edits.logits;
    ASSERT_TRUE(ApplyLogitEditsToRows(got, vocab, c.edits.edits).ok());
    ASSERT_TRUE(ApplyTokenMasksToRows(got, vocab, c.masks).ok());
    EXPECT_EQ(CountDifferences(got, c.want), 0) << "vocab " << vocab;

    CpuBackendOptions options;
    options.num_threads = 1;
    auto be = MakeCpuBackend(options);
    const std::vector<int64_t> shape = {rows, vocab};
    std::vector<float> data = c.edits.logits;
    auto x = be->UploadWeight("logits", DType::kF32, shape, data.data());
    ASSERT_TRUE(x.ok()) << x.message();
    ASSERT_TRUE(be->ApplyLogitEdits(*x, c.edits.edits).ok());
    ASSERT_TRUE(be->ApplyTokenMasks(*x, c.masks).ok());
    std::vector<float> back(data.size());
    ASSERT_TRUE(be->CopyToHost(*x, back).ok());
    EXPECT_EQ(CountDifferences(back, c.want), 0) << "vocab " << vocab;
    const RowMask outside[] = {{rows, c.bits[0]}};
    EXPECT_FALSE(be->ApplyTokenMasks(*x, outside).ok());
    const RowMask short_mask[] = {{0, std::span(c.bits[0]).first(c.bits[0].size() - 1)}};
    const Status st = ApplyTokenMasksToRows(got, vocab, short_mask);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("token mask 0"), std::string::npos) << st.message();
  }
}

// What the masked row gives is Sample()'s token with the same mask, processors and draw: greedy
// (ArgmaxRows' rule on the twin's row) and sampled (ThresholdSample, SampleRows' algorithm, on
// the twin's row, with the uniform Sample() draws), a mask that allows one token included.
TEST(TokenMasksTest, MaskedTokensAreTheHostSamplers) {
  std::mt19937 rng(17);
  const int32_t vocab = 3001;
  int cases = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const ProcessedRow pr = RandomProcessedRow(rng, vocab, trial % 32, 100);
    SamplingParams p = pr.params;
    p.temperature = trial % 3 == 0 ? 0.0f : 0.7f + 0.2f * static_cast<float>(trial % 4);
    p.top_k = trial % 5 == 0 ? 40 : 0;
    p.top_p = trial % 2 == 0 ? 1.0f : 0.9f;
    p.seed = static_cast<uint64_t>(trial);
    SamplerState state(p, 0, pr.prompt, pr.stop_ids);
    for (int32_t t : pr.outputs) state.Accept(t);
    std::vector<LogitEdit> edits;
    AppendLogitEdits(p, state, 0, edits);
    const std::vector<float> row = RandomRow(rng, vocab, 5);
    std::vector<uint8_t> allowed(static_cast<size_t>(vocab));
    const uint32_t per_mille = trial % 4 == 0 ? 2 : trial % 4 == 1 ? 30 : 400;
    for (uint8_t& a : allowed) a = rng() % 1000 < per_mille;
    allowed[rng() % allowed.size()] = 1;  // at least one
    std::vector<uint32_t> bits((allowed.size() + 31) / 32, 0);
    for (size_t t = 0; t < allowed.size(); ++t) bits[t / 32] |= uint32_t{allowed[t]} << (t % 32);

    SamplerState peek = state;
    const double u = p.is_greedy() ? 0.0 : peek.NextUniform();
    std::vector<float> host_row = row;
    const int32_t host = Sample(host_row, p, state, allowed).token_id;
    std::vector<float> twin = row;
    ASSERT_TRUE(ApplyLogitEditsToRows(twin, vocab, edits).ok());
    const RowMask mask[] = {{0, bits}};
    ASSERT_TRUE(ApplyTokenMasksToRows(twin, vocab, mask).ok());
    const int32_t got =
        p.is_greedy() ? RowArgmax(twin)
                      : ThresholdSample(twin, {p.temperature, p.top_k, p.top_p, p.min_p, u});
    EXPECT_EQ(got, host) << "trial " << trial;
    // (A stop id masked by min_tokens may have been the one allowed token: no finite logit.)
    if (std::any_of(twin.begin(), twin.end(), [](float v) { return std::isfinite(v); })) {
      EXPECT_TRUE(allowed[static_cast<size_t>(got)]) << "trial " << trial;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 120);
}

// The CUDA kernel against its twin, where a GPU exists: real vocabularies (and one that ends
// mid-word), masks of every density on rows in another order than stored, after the
// processors' edits, bit for bit; then the masked rows' argmax and draws on the device equal the
// twin's and the host sampler's tokens. Bad masks are refused.
TEST(TokenMasksTest, CudaMatchesTheTwin) {
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  CudaBackendOptions options;
  options.f32_compute = true;  // keep the uploaded rows float32
  auto be = LoadCudaBackend(0, options);
  ASSERT_TRUE(be.ok()) << be.message();
  std::mt19937 rng(23);
  for (int32_t vocab : {128256, 151936, 4099}) {
    const int rows = 40;
    std::vector<int32_t> masked_rows;
    for (int r = rows - 1; r >= 0; r -= 1)
      if (r % 5 != 2) masked_rows.push_back(r);  // 32 masked rows, descending; 8 unmasked
    MaskCase c = MakeMaskCase(rng, vocab, rows, masked_rows);
    const std::vector<int64_t> shape = {rows, vocab};
    auto x = (*be)->UploadWeight("logits", DType::kF32, shape, c.edits.logits.data());
    ASSERT_TRUE(x.ok()) << x.message();
    ASSERT_TRUE((*be)->ApplyLogitEdits(*x, c.edits.edits).ok());
    ASSERT_TRUE((*be)->ApplyTokenMasks(*x, c.masks).ok());
    std::vector<float> back(c.edits.logits.size());
    ASSERT_TRUE((*be)->CopyToHost(*x, back).ok());
    EXPECT_EQ(CountDifferences(back, c.want), 0) << "vocab " << vocab;

    // Tokens: every row's argmax, and a draw from each row that any mask leaves a token.
    std::vector<int32_t> argmax(static_cast<size_t>(rows), -1);
    ASSERT_TRUE((*be)->ArgmaxRows(*x, argmax).ok());
    std::vector<int32_t> which;
    std::vector<RowSampling> params;
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (int r = 0; r < rows; ++r) {
      which.push_back(r);
      params.push_back({0.6f + 0.3f * static_cast<float>(r % 3), r % 4 == 0 ? 50 : 0,
                        r % 2 == 0 ? 1.0f : 0.9f, 0.0f, uniform(rng)});
    }
    std::vector<int32_t> drawn(static_cast<size_t>(rows), -1);
    ASSERT_TRUE((*be)->SampleRows(*x, which, params, drawn).ok());
    int mismatches = 0;
    for (int r = 0; r < rows; ++r) {
      const std::span<const float> twin(c.want.data() + static_cast<size_t>(r) * vocab,
                                        static_cast<size_t>(vocab));
      mismatches += argmax[static_cast<size_t>(r)] != RowArgmax(twin);
      mismatches += drawn[static_cast<size_t>(r)] != ThresholdSample(twin, params[static_cast<size_t>(r)]);
    }
    EXPECT_EQ(mismatches, 0) << "vocab " << vocab;
    // The host sampler on a masked row (greedy; its processors are the edits above): the same.
    for (size_t j = 0; j < masked_rows.size(); ++j) {
      const auto r = static_cast<size_t>(masked_rows[j]);
      std::vector<float> row(c.edits.want.begin() + static_cast<ptrdiff_t>(r * vocab),
                             c.edits.want.begin() + static_cast<ptrdiff_t>((r + 1) * vocab));
      SamplingParams greedy;
      greedy.temperature = 0.0f;
      SamplerState state(greedy, 0, {});
      if (std::count(c.allowed[j].begin(), c.allowed[j].end(), 1) == 0) continue;
      EXPECT_EQ(Sample(row, greedy, state, c.allowed[j]).token_id, argmax[r]) << "row " << r;
    }
    const RowMask outside[] = {{rows, c.bits[0]}};
    EXPECT_FALSE((*be)->ApplyTokenMasks(*x, outside).ok());
    const RowMask short_mask[] = {{0, std::span(c.bits[0]).first(1)}};
    EXPECT_FALSE((*be)->ApplyTokenMasks(*x, short_mask).ok());
  }
}

}  // namespace
}  // namespace ember
