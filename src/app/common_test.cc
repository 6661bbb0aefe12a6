// `ember run`'s sampling flags and an HTTP body (or an `ember batch` line) with the same values go
// through the same resolver: equal SamplingParams and max_tokens on valid input, the same error
// message on invalid input, and the same seed rule (negative seeds keep their bits).
#include "app/common.h"

#include <gtest/gtest.h>

#include "backend/backend_factory.h"
#include "serve/openai_schema.h"

namespace ember::app {
namespace {

SamplingContext Context() {
  SamplingContext c;
  c.defaults.temperature = 0.7f;  // generation_config.json
  c.defaults.top_k = 20;
  c.limits = {/*vocab_size=*/1000, /*context_length=*/512, /*kv_capacity_tokens=*/4096};
  c.num_prompt_tokens = 6;
  c.fallback_max_tokens = 16;
  return c;
}

// The flags (as `ember run` reads them) as a SamplingRequest.
Result<SamplingRequest> FromFlags(std::vector<std::string> args) {
  GenerationFlags gen;
  FlagParser flags("test");
  gen.Register(flags);
  args.insert(args.begin(), "ember");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  bool help = false;
  Status st = flags.Parse(static_cast<int>(argv.size()), argv.data(), 1, &help);
  if (!st.ok()) return st;
  return gen.Request(flags);
}

// The same values as a /v1/completions body or a batch line (the schema's own checks included).
std::variant<SamplingRequest, std::string> FromBody(serve::RequestJson body,
                                                    serve::CompletionSource source) {
  body[source == serve::CompletionSource::kBatchLine ? "prompt_ids" : "prompt"] = {1, 2, 3};
  serve::SchemaLimits limits;
  limits.vocab_size = 1000;
  serve::CompletionRequest req;
  if (auto error = serve::ParseCompletionRequest(body, limits, &req, source)) return error->message;
  return static_cast<SamplingRequest>(req.params);
}

std::string Resolve(const SamplingRequest& r, ResolvedSampling* out) {
  auto resolved = ResolveSampling(r, Context());
  if (auto* error = std::get_if<SamplingError>(&resolved)) return error->message;
  *out = std::get<ResolvedSampling>(resolved);
  return "";
}

TEST(GenerationFlagsTest, FlagsAndBodiesResolveAlike) {
  Result<SamplingRequest> flags =
      FromFlags({"--temperature", "0.25", "--top-p", "0.9", "--min-p", "0.05",
                 "--repetition-penalty", "1.2", "--presence-penalty", "0.5", "--seed", "-3"});
  ASSERT_TRUE(flags.ok()) << flags.message();
  const serve::RequestJson body = {{"temperature", 0.25},     {"top_p", 0.9},
                                   {"min_p", 0.05},           {"repetition_penalty", 1.2},
                                   {"presence_penalty", 0.5}, {"seed", -3}};
  ResolvedSampling from_flags;
  ASSERT_EQ(Resolve(*flags, &from_flags), "");
  for (auto source : {serve::CompletionSource::kHttpBody, serve::CompletionSource::kBatchLine}) {
    auto parsed = FromBody(body, source);
    ASSERT_TRUE(std::holds_alternative<SamplingRequest>(parsed)) << std::get<std::string>(parsed);
    ResolvedSampling from_body;
    ASSERT_EQ(Resolve(std::get<SamplingRequest>(parsed), &from_body), "");
    const SamplingParams& a = from_flags.params;
    const SamplingParams& b = from_body.params;
    EXPECT_EQ(a.temperature, b.temperature);
    EXPECT_EQ(a.top_p, b.top_p);
    EXPECT_EQ(a.min_p, b.min_p);
    EXPECT_EQ(a.top_k, b.top_k);
    EXPECT_EQ(a.top_k, 20);  // neither gave it: generation_config.json's
    EXPECT_EQ(a.repetition_penalty, b.repetition_penalty);
    EXPECT_EQ(a.presence_penalty, b.presence_penalty);
    EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
    EXPECT_EQ(a.seed, b.seed);
    EXPECT_EQ(from_flags.max_tokens, from_body.max_tokens);
  }
  EXPECT_EQ(from_flags.params.seed, static_cast<uint64_t>(int64_t{-3}));
}

TEST(GenerationFlagsTest, InvalidValuesGiveTheServersMessage) {
  struct Case {
    std::vector<std::string> flags;
    serve::RequestJson body;
  };
  const Case cases[] = {
      {{"--temperature", "9"}, {{"temperature", 9}}},
      {{"--top-p", "0"}, {{"top_p", 0}}},
      {{"--min-p", "1.5"}, {{"min_p", 1.5}}},
      {{"--top-k", "-2"}, {{"top_k", -2}}},
      {{"--repetition-penalty", "0"}, {{"repetition_penalty", 0}}},
      {{"--frequency-penalty", "-3"}, {{"frequency_penalty", -3}}},
  };
  for (const Case& c : cases) {
    Result<SamplingRequest> flags = FromFlags(c.flags);
    ASSERT_TRUE(flags.ok()) << flags.message();
    ResolvedSampling unused;
    const std::string cli_error = Resolve(*flags, &unused);
    ASSERT_NE(cli_error, "") << c.flags[0];
    for (auto source : {serve::CompletionSource::kHttpBody, serve::CompletionSource::kBatchLine}) {
      auto parsed = FromBody(c.body, source);
      ASSERT_TRUE(std::holds_alternative<std::string>(parsed)) << c.body.dump();
      EXPECT_EQ(std::get<std::string>(parsed), cli_error);
    }
  }
}

// --batch-invariant auto (the default) turns CUDA's batch-invariant products on exactly when
// speculation is on: drafts are verified in multi-row steps, whose rows must carry a one-row
// step's logits for the tokens to equal unspeculated decoding's.
// `on`: the backend is batch-invariant in every step; `auto`: only the steps where drafting may
// run are (SpeculationConfig::invariant_steps, which matters only with speculation); `off`:
// none.
TEST(EngineFlagsTest, BatchInvariantAutoFollowsSpeculation) {
  struct Case {
    std::string batch_invariant, spec_method;
    bool backend, steps;
  };
  for (const Case& c : {Case{"auto", "none", false, true}, Case{"auto", "ngram", false, true},
                        Case{"off", "ngram", false, false}, Case{"on", "none", true, false}}) {
    EngineFlags flags;
    flags.device = "cpu";
    flags.batch_invariant = c.batch_invariant;
    flags.spec_method = c.spec_method;
    const Result<ModelLoadOptions> opts = flags.LoadOptions();
    ASSERT_TRUE(opts.ok()) << opts.message();
    EXPECT_EQ(opts->cuda_batch_invariant, c.backend) << c.batch_invariant << " " << c.spec_method;
    EXPECT_EQ(flags.Config().speculation.invariant_steps, c.steps)
        << c.batch_invariant << " " << c.spec_method;
  }
  EngineFlags bad;
  bad.batch_invariant = "sometimes";
  EXPECT_FALSE(bad.LoadOptions().ok());
}

// --cpu-matmul: each value's kernel where this CPU runs it, a refusal naming the flag where it
// does not, auto the fastest this CPU runs (CpuFastestMatmul), an unknown value refused.
TEST(EngineFlagsTest, CpuMatmulChoosesAKernelThisCpuRuns) {
  ModelLoadOptions opts;
  ASSERT_TRUE(ApplyCpuMatmulFlag("exact", opts).ok());
  EXPECT_EQ(opts.cpu_matmul, CpuMatmul::kExact);
  struct Kernel {
    const char* value;
    bool runs;
    CpuMatmul matmul;
  };
  for (const Kernel& kernel : {Kernel{"f32", CpuHasF32Fast(), CpuMatmul::kF32},
                               Kernel{"bf16", CpuHasBf16Dot(), CpuMatmul::kBf16}}) {
    const Status st = ApplyCpuMatmulFlag(kernel.value, opts);
    if (kernel.runs) {
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(opts.cpu_matmul, kernel.matmul);
    } else {
      EXPECT_NE(st.message().find(std::string("--cpu-matmul ") + kernel.value), std::string::npos)
          << st.message();
    }
  }
  ASSERT_TRUE(ApplyCpuMatmulFlag("auto", opts).ok());
  EXPECT_EQ(opts.cpu_matmul, CpuFastestMatmul());
  EXPECT_EQ(CpuFastestMatmul(), CpuFastestMatmul()) << "timed once, then fixed";
  EXPECT_EQ(opts.cpu_matmul == CpuMatmul::kExact, !CpuHasF32Fast());
  const Status bad = ApplyCpuMatmulFlag("fast", opts);
  EXPECT_NE(bad.message().find("--cpu-matmul must be exact, f32, bf16 or auto, got 'fast'"),
            std::string::npos)
      << bad.message();
}

}  // namespace
}  // namespace ember::app
