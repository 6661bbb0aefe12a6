// Test-only helpers shared by the engine's tests: fixture models (ModelDir, LoadModel on the CPU
// backend), greedy requests and their submission (Greedy, SubmitOrDie) and a token constraint
// (StrideConstraint). Header-only; links gtest.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "model/model.h"
#include "sampling/token_constraint.h"
#include "util/testing.h"

namespace ember::testing {

// A fixture model's folder (../shared/fixtures/models/NAME, or under EMBER_FIXTURES).
inline std::string ModelDir(const std::string& name) { return FixturesDir() + "/models/" + name; }

// The model at `dir` on the CPU backend; null (and a test failure) when it does not load.
inline std::unique_ptr<Model> LoadModel(const std::string& dir) {
  auto model = Model::Load(dir, ModelLoadOptions{});
  EXPECT_TRUE(model.ok()) << model.message();
  return model.ok() ? std::move(model).value() : nullptr;
}

// A greedy request for `max_tokens` tokens that ignores EOS (goldens and batch comparisons run to
// max_tokens).
inline GenerationRequest Greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  return r;
}

// The request's stream; null (and a test failure naming the engine's message) when refused.
inline std::shared_ptr<ResponseStream> SubmitOrDie(Engine& engine, const GenerationRequest& request) {
  auto result = engine.Submit(request);
  if (auto* error = std::get_if<SubmitError>(&result)) {
    ADD_FAILURE() << "submit refused: " << error->message;
    return nullptr;
  }
  return std::get<std::shared_ptr<ResponseStream>>(result);
}

// A test constraint: only ids that are multiples of `stride` (and below the vocabulary), done after
// `length` tokens; from token `block_at` on it allows nothing. At the output positions listed in
// `forced` it allows one id only, ForcedId(position) (runs of them: jump-forward chains).
class StrideConstraint : public TokenConstraint {
 public:
  StrideConstraint(int32_t vocab, int32_t stride, int32_t length, int32_t block_at = -1,
                   std::vector<int32_t> forced = {})
      : vocab_(vocab),
        stride_(stride),
        length_(length),
        block_at_(block_at),
        forced_(std::move(forced)) {}
  int32_t ForcedId(int32_t position) const {
    return stride_ * ((position * 5 + 3) % ((vocab_ - 1) / stride_ + 1));
  }
  std::unique_ptr<TokenConstraint> Clone() const override {
    return std::make_unique<StrideConstraint>(*this);
  }
  int32_t vocab_size() const override { return vocab_; }
  int64_t Allowed(std::vector<uint8_t>& allowed) const override {
    allowed.assign(static_cast<size_t>(vocab_), 0);
    if (accepted_ == block_at_) return 0;
    if (std::find(forced_.begin(), forced_.end(), accepted_) != forced_.end()) {
      allowed[static_cast<size_t>(ForcedId(accepted_))] = 1;
      return 1;
    }
    int64_t count = 0;
    for (int32_t id = 0; id < vocab_; id += stride_) allowed[static_cast<size_t>(id)] = 1, ++count;
    return count;
  }
  bool Accept(int32_t id) override {
    const bool forced = std::find(forced_.begin(), forced_.end(), accepted_) != forced_.end();
    const bool ok = forced ? id == ForcedId(accepted_) : id % stride_ == 0;
    ++accepted_;
    return ok;
  }
  bool Done() const override { return accepted_ >= length_; }

 private:
  int32_t vocab_, stride_, length_, block_at_;
  std::vector<int32_t> forced_;
  int32_t accepted_ = 0;
};

}  // namespace ember::testing
