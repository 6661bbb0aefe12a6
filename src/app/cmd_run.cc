// `ember run`: one prompt through the engine, printed as text, ids or JSON.
#include <cstdio>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/common.h"
#include "app/model_files.h"
#include "engine/engine.h"
#include "serve/request_builder.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "util/flags.h"
#include "util/mapped_file.h"

namespace ember::app {

namespace {

Result<std::vector<int32_t>> ParseIdArray(const std::string& text, const std::string& flag) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return Status::Error(flag + ": expected a JSON array of token ids");
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      return Status::Error(flag + ": every element must be a non-negative integer token id");
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

// max_tokens when neither --max-tokens nor generation_config.json gives it.
constexpr int32_t kDefaultMaxTokens = 128;

}  // namespace

int RunCommand(int argc, char** argv, int first) {
  std::string model_dir, prompt, prompt_ids_json, output = "text";
  int64_t max_tokens = kDefaultMaxTokens;
  GenerationFlags gen;
  EngineFlags engine_flags;
  FlagParser flags(
      "usage: ember run --model DIR (--prompt TEXT | --prompt-ids JSON_ARRAY) [--max-tokens N]\n"
      "       [--temperature T] [--top-p P] [--top-k K] [--seed S] [--output text|ids|json]");
  flags.AddString("--model", &model_dir, "Hugging Face model folder or .gguf file");
  flags.AddString("--prompt", &prompt, "prompt text (needs the model's tokenizer)");
  flags.AddString("--prompt-ids", &prompt_ids_json, "prompt as a JSON array of token ids");
  flags.AddInt("-n,--max-tokens", &max_tokens,
               "tokens to generate (default: generation_config.json's max_new_tokens, else 128; "
               "cut to the room left in the context)");
  flags.AddString("--output", &output, "text (default), ids (JSON array on the last line), json");
  gen.Register(flags);
  engine_flags.max_batch = 1;  // one request: no decode graphs for batches it cannot have
  engine_flags.Register(flags, /*serving=*/false);
  if (int rc = ParseOrExit(flags, argc, argv, first); rc >= 0) return rc;

  if (model_dir.empty()) return Fail("--model is required");
  if (prompt.empty() == prompt_ids_json.empty())
    return Fail("give exactly one of --prompt and --prompt-ids");
  if (output != "text" && output != "ids" && output != "json")
    return Fail("--output must be text, ids or json, got '" + output + "'");

  auto loaded = LoadModelAndEngine(model_dir, engine_flags);
  if (!loaded.ok()) return Fail(loaded.message());
  LoadedModel& lm = *loaded;

  const bool need_tokenizer = !prompt.empty() || output != "ids";
  if (need_tokenizer && lm.tokenizer == nullptr) {
    return Fail(TokenizerSource(model_dir) + ": not found; " +
                (prompt.empty() ? std::string("use --output ids") : std::string("use --prompt-ids")) +
                " with a model that has no tokenizer");
  }

  GenerationRequest request;
  if (!prompt.empty()) {
    request.prompt_ids = lm.tokenizer->Encode(prompt, /*add_special_tokens=*/true);
  } else {
    auto ids = ParseIdArray(prompt_ids_json, "--prompt-ids");
    if (!ids.ok()) return Fail(ids.message());
    request.prompt_ids = std::move(*ids);
  }
  Result<SamplingRequest> asked = gen.Request(flags);
  if (!asked.ok()) return Fail(asked.message());
  if (flags.WasSet("--max-tokens")) {
    if (max_tokens < 0 || max_tokens > INT32_MAX)
      return Fail("--max-tokens: must be in [0, 2147483647], got " + std::to_string(max_tokens));
    asked->max_tokens = static_cast<int32_t>(max_tokens);
  }
  SamplingContext context;
  context.defaults = serve::SamplingDefaultsOf(lm.model->generation_defaults());
  context.limits = serve::TokenLimitsOf(*lm.engine);
  context.fallback_max_tokens = kDefaultMaxTokens;
  context.num_prompt_tokens = static_cast<int64_t>(request.prompt_ids.size());
  auto resolved = ResolveSampling(*asked, context);
  if (auto* error = std::get_if<SamplingError>(&resolved)) return Fail(error->message);
  request.adapter = lm.default_adapter;  // --adapter (--lora NAME=DIR)
  request.sampling = std::get<ResolvedSampling>(resolved).params;
  request.max_tokens = std::get<ResolvedSampling>(resolved).max_tokens;
  if (request.sampling.has_dry() && !request.sampling.dry_sequence_breakers.empty()) {
    if (lm.tokenizer == nullptr)
      return Fail("--dry-sequence-breakers: the model has no tokenizer, so breaker strings cannot "
                  "be matched to tokens; pass --dry-sequence-breakers '[]'");
    request.sampling.dry_breaker_ids = std::make_shared<const std::vector<int32_t>>(
        serve::DryBreakerIdsOf(*lm.tokenizer, context.limits.vocab_size,
                               request.sampling.dry_sequence_breakers));
  }

  GenerationTimer timer;  // before Submit: a fast model's first token can precede the next line
  auto submitted = lm.engine->Submit(request);
  if (auto* error = std::get_if<SubmitError>(&submitted)) return Fail(error->message);
  std::shared_ptr<ResponseStream> stream = std::get<std::shared_ptr<ResponseStream>>(submitted);

  std::unique_ptr<IncrementalDetokenizer> detok;
  if (lm.tokenizer != nullptr) detok = std::make_unique<IncrementalDetokenizer>(*lm.tokenizer, true);
  std::vector<int32_t> ids;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  std::vector<TokenEvent> events;
  while (stream->Next(&events)) {
    for (const TokenEvent& e : events) {
      if (e.token_id >= 0) {
        timer.OnToken(e.time_ns);
        ids.push_back(e.token_id);
        if (detok != nullptr) {
          std::string piece = detok->Push(e.token_id);
          text += piece;
          if (output == "text") {
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
          }
        }
      }
      if (e.finish != FinishReason::kNone) finish = e.finish;
    }
    events.clear();
  }
  if (detok != nullptr) {
    std::string rest = detok->Flush();
    text += rest;
    if (output == "text") std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  RequestUsage usage = stream->usage();
  if (output == "text") {
    std::printf("\n");
  } else if (output == "ids") {
    std::printf("%s\n", nlohmann::json(ids).dump().c_str());
  } else {
    nlohmann::json j = {{"prompt_ids", request.prompt_ids},
                        {"ids", ids},
                        {"finish_reason", FinishReasonName(finish)},
                        {"usage",
                         {{"prompt_tokens", usage.prompt_tokens},
                          {"cached_tokens", usage.cached_tokens},
                          {"completion_tokens", usage.completion_tokens}}},
                        {"timings", timer.ToJson()}};
    AddCompletionTokensDetails(usage, &j["usage"]);
    if (detok != nullptr) j["text"] = text;
    std::printf("%s\n", j.dump().c_str());
  }
  lm.engine->Shutdown(/*drain=*/true);
  if (output != "json")
    std::fprintf(stderr, "%s%s\n", timer.Summary(usage).c_str(),
                 SpeculationSummary(lm.engine->Stats()).c_str());
  return finish == FinishReason::kError ? 1 : 0;
}

}  // namespace ember::app
