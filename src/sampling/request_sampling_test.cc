// The resolver: a request field beats generation_config.json, which beats OpenAI's default;
// every invalid field is refused with an error naming it; max_tokens defaults fit the context and
// the KV cache; the context rule reports the numbers.
#include "sampling/request_sampling.h"

#include <cmath>

#include <gtest/gtest.h>

namespace ember {
namespace {

SamplingContext Context() {
  SamplingContext c;
  c.limits = {/*vocab_size=*/1000, /*context_length=*/512, /*kv_capacity_tokens=*/4096};
  c.num_prompt_tokens = 6;
  c.fallback_max_tokens = 16;
  return c;
}

ResolvedSampling Resolve(const SamplingRequest& r, const SamplingContext& c = Context()) {
  auto resolved = ResolveSampling(r, c);
  EXPECT_TRUE(std::holds_alternative<ResolvedSampling>(resolved))
      << std::get<SamplingError>(resolved).message;
  return std::holds_alternative<ResolvedSampling>(resolved) ? std::get<ResolvedSampling>(resolved)
                                                            : ResolvedSampling{};
}

SamplingError Refuse(const SamplingRequest& r, const SamplingContext& c = Context()) {
  auto resolved = ResolveSampling(r, c);
  EXPECT_TRUE(std::holds_alternative<SamplingError>(resolved));
  return std::holds_alternative<SamplingError>(resolved) ? std::get<SamplingError>(resolved)
                                                         : SamplingError{};
}

TEST(RequestSamplingTest, RequestBeatsGenerationConfigBeatsOpenAiDefaults) {
  SamplingContext c = Context();
  c.defaults.temperature = 0.6f;
  c.defaults.top_p = 0.95f;
  c.defaults.top_k = 20;
  c.defaults.repetition_penalty = 1.1f;
  c.defaults.max_new_tokens = 100;
  SamplingRequest r;
  r.temperature = 0.2f;  // given: wins over generation_config
  r.top_k = 0;           // given as "off": still wins
  const ResolvedSampling out = Resolve(r, c);
  EXPECT_FLOAT_EQ(out.params.temperature, 0.2f);
  EXPECT_EQ(out.params.top_k, 0);
  EXPECT_FLOAT_EQ(out.params.top_p, 0.95f);              // generation_config
  EXPECT_FLOAT_EQ(out.params.repetition_penalty, 1.1f);  // generation_config
  EXPECT_FLOAT_EQ(out.params.min_p, 0.0f);               // OpenAI's default
  EXPECT_FLOAT_EQ(out.params.presence_penalty, 0.0f);    // OpenAI's default
  EXPECT_EQ(out.max_tokens, 100);                        // generation_config's max_new_tokens
  r.max_tokens = 7;
  EXPECT_EQ(Resolve(r, c).max_tokens, 7);

  // Nothing anywhere: OpenAI's defaults and the fallback max_tokens.
  const ResolvedSampling plain = Resolve(SamplingRequest{});
  EXPECT_FLOAT_EQ(plain.params.temperature, 1.0f);
  EXPECT_FLOAT_EQ(plain.params.top_p, 1.0f);
  EXPECT_EQ(plain.params.top_k, 0);
  EXPECT_FLOAT_EQ(plain.params.repetition_penalty, 1.0f);
  EXPECT_FALSE(plain.params.seed.has_value());
  EXPECT_EQ(plain.max_tokens, 16);
}

TEST(RequestSamplingTest, DefaultMaxTokensFitTheContextAndTheKvCache) {
  SamplingContext c = Context();
  c.fallback_max_tokens = std::nullopt;  // chat: the rest of the context
  EXPECT_EQ(Resolve({}, c).max_tokens, 512 - 6);
  c.limits.kv_capacity_tokens = 100;
  EXPECT_EQ(Resolve({}, c).max_tokens, 100 - 6);
  c = Context();
  c.num_prompt_tokens = 500;
  EXPECT_EQ(Resolve({}, c).max_tokens, 12);  // 16 cut to the room left
  c.defaults.max_new_tokens = 1000;
  EXPECT_EQ(Resolve({}, c).max_tokens, 12);
}

TEST(RequestSamplingTest, ContextOverflowNamesTheNumbersAndTheField) {
  SamplingRequest r;
  r.max_tokens = 600;
  SamplingError e = Refuse(r);
  EXPECT_EQ(e.field, "max_tokens");
  EXPECT_TRUE(e.context_length_exceeded);
  EXPECT_NE(e.message.find("512"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("606"), std::string::npos) << e.message;

  SamplingContext c = Context();
  c.num_prompt_tokens = 512;
  c.prompt_field = "messages";
  e = Refuse({}, c);  // a default max_tokens has no room either
  EXPECT_EQ(e.field, "messages");
  EXPECT_TRUE(e.context_length_exceeded);
  EXPECT_NE(e.message.find("no room to generate"), std::string::npos) << e.message;
  r.max_tokens = 0;  // only the prompt: fits exactly
  EXPECT_EQ(Resolve(r, c).max_tokens, 0);

  c = Context();
  c.limits.kv_capacity_tokens = 64;
  r.max_tokens = 100;
  e = Refuse(r, c);
  EXPECT_EQ(e.field, "max_tokens");
  EXPECT_FALSE(e.context_length_exceeded);
  EXPECT_NE(e.message.find("--kv-cache-bytes"), std::string::npos) << e.message;
  EXPECT_FALSE(CheckContextFits(6, 58, c.limits, "prompt").has_value());
  EXPECT_TRUE(CheckContextFits(6, 59, c.limits, "prompt").has_value());
}

// Each invalid field is refused by both entry points (alone, and resolved), blaming that field
// with a message that names it.
TEST(RequestSamplingTest, EachInvalidFieldIsNamed) {
  struct Case {
    const char* field;
    void (*set)(SamplingRequest&);
  };
  const Case cases[] = {
      {"temperature", [](SamplingRequest& r) { r.temperature = 2.5f; }},
      {"temperature", [](SamplingRequest& r) { r.temperature = NAN; }},
      {"top_p", [](SamplingRequest& r) { r.top_p = 0.0f; }},
      {"min_p", [](SamplingRequest& r) { r.min_p = 1.5f; }},
      {"top_k", [](SamplingRequest& r) { r.top_k = -2; }},
      {"repetition_penalty", [](SamplingRequest& r) { r.repetition_penalty = 0.0f; }},
      {"repetition_penalty", [](SamplingRequest& r) { r.repetition_penalty = 11.0f; }},
      {"presence_penalty", [](SamplingRequest& r) { r.presence_penalty = 3.0f; }},
      {"frequency_penalty", [](SamplingRequest& r) { r.frequency_penalty = -2.5f; }},
      {"logit_bias",
       [](SamplingRequest& r) {
         r.logit_bias = {{1000, 1.0f}};
       }},
      {"logit_bias",
       [](SamplingRequest& r) {
         r.logit_bias = {{5, 101.0f}};
       }},
      {"top_logprobs", [](SamplingRequest& r) { r.top_logprobs = 21; }},
      {"min_tokens", [](SamplingRequest& r) { r.min_tokens = -1; }},
      {"min_tokens",
       [](SamplingRequest& r) {
         r.max_tokens = 4;
         r.min_tokens = 5;
       }},
      {"max_tokens", [](SamplingRequest& r) { r.max_tokens = -1; }},
      {"top_n_sigma", [](SamplingRequest& r) { r.top_n_sigma = -3.0f; }},
      {"typical_p", [](SamplingRequest& r) { r.typical_p = 1.5f; }},
      {"xtc_probability", [](SamplingRequest& r) { r.xtc_probability = -0.1f; }},
      {"xtc_threshold", [](SamplingRequest& r) { r.xtc_threshold = 0.51f; }},
      {"xtc_probability",
       [](SamplingRequest& r) {
         r.temperature = 0.0f;
         r.xtc_probability = 0.5f;
       }},
      {"dry_multiplier", [](SamplingRequest& r) { r.dry_multiplier = NAN; }},
      {"dry_base", [](SamplingRequest& r) { r.dry_base = 0.9f; }},
      {"dry_allowed_length", [](SamplingRequest& r) { r.dry_allowed_length = 0; }},
      {"dry_penalty_last_n", [](SamplingRequest& r) { r.dry_penalty_last_n = -5; }},
      {"dry_sequence_breakers",
       [](SamplingRequest& r) { r.dry_sequence_breakers = std::vector<std::string>{""}; }},
  };
  for (const Case& c : cases) {
    SamplingRequest r;
    c.set(r);
    const std::optional<SamplingError> alone = ValidateSamplingRequest(r, 1000);
    ASSERT_TRUE(alone.has_value()) << c.field;
    EXPECT_EQ(alone->field, c.field) << alone->message;
    EXPECT_EQ(alone->message.rfind(c.field, 0), 0u) << alone->message;
    const SamplingError resolved = Refuse(r);
    EXPECT_EQ(resolved.field, alone->field);
    EXPECT_EQ(resolved.message, alone->message);
  }
}

// A default max_tokens that leaves min_tokens no room is refused, naming min_tokens.
TEST(RequestSamplingTest, LlamaCppSamplersPassThroughTheResolver) {
  SamplingRequest r;
  r.top_n_sigma = 1.5f;
  r.typical_p = 0.9f;
  r.xtc_probability = 0.25f;
  r.xtc_threshold = 0.2f;
  r.dry_multiplier = 0.8f;
  r.dry_base = 2.0f;
  r.dry_allowed_length = 3;
  r.dry_penalty_last_n = 64;
  r.dry_sequence_breakers = std::vector<std::string>{"\n"};
  const SamplingParams p = Resolve(r).params;
  EXPECT_EQ(p.top_n_sigma, 1.5f);
  EXPECT_EQ(p.typical_p, 0.9f);
  EXPECT_EQ(p.xtc_probability, 0.25f);
  EXPECT_EQ(p.xtc_threshold, 0.2f);
  EXPECT_EQ(p.dry_multiplier, 0.8f);
  EXPECT_EQ(p.dry_base, 2.0f);
  EXPECT_EQ(p.dry_allowed_length, 3);
  EXPECT_EQ(p.dry_penalty_last_n, 64);
  EXPECT_EQ(p.dry_sequence_breakers, std::vector<std::string>{"\n"});
  // Unset: llama.cpp's defaults, every sampler off.
  const SamplingParams d = Resolve(SamplingRequest{}).params;
  EXPECT_FALSE(d.has_dry() || d.has_xtc() || d.has_typical_p() || d.has_top_n_sigma());
  EXPECT_EQ(d.dry_sequence_breakers, SamplingParams::DefaultDrySequenceBreakers());
  // Greedy from generation_config.json with XTC from the request: refused after the merge.
  SamplingContext c = Context();
  c.defaults.temperature = 0.0f;
  SamplingRequest xtc;
  xtc.xtc_probability = 0.5f;
  EXPECT_FALSE(ValidateSamplingRequest(xtc, 1000).has_value());
  EXPECT_EQ(Refuse(xtc, c).field, "xtc_probability");
}

TEST(RequestSamplingTest, MinTokensMustFitTheResolvedMaxTokens) {
  SamplingRequest r;
  r.min_tokens = 20;
  EXPECT_FALSE(ValidateSamplingRequest(r, 1000).has_value());  // max_tokens not known yet
  const SamplingError e = Refuse(r);                           // the default is 16
  EXPECT_EQ(e.field, "min_tokens");
  EXPECT_NE(e.message.find("16"), std::string::npos) << e.message;
}

// A bad generation_config value is caught too (it is validated after the merge), and a request
// field that overrides it clears the error.
TEST(RequestSamplingTest, GenerationConfigValuesAreValidatedAfterTheMerge) {
  SamplingContext c = Context();
  c.defaults.top_p = 1.5f;
  EXPECT_EQ(Refuse({}, c).field, "top_p");
  SamplingRequest r;
  r.top_p = 0.5f;
  EXPECT_FLOAT_EQ(Resolve(r, c).params.top_p, 0.5f);
}

TEST(RequestSamplingTest, SeedsKeepAllSixtyFourBits) {
  SamplingRequest r;
  r.seed = static_cast<uint64_t>(int64_t{-1});
  EXPECT_EQ(Resolve(r).params.seed, ~uint64_t{0});
}

}  // namespace
}  // namespace ember
