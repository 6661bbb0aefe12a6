// `ember batch`: offline generation for a JSONL file. Every line is validated and submitted at
// once; the engine interleaves them (continuous batching, shared prefixes cached). Output lines
// are written in input order: {"index", "ids", "text", "finish_reason", "usage"} (+ "logprobs"
// per generated token and "prompt_logprobs" per prompt token when the line asks) or, for a line
// that was refused, {"index", "error"}.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/common.h"
#include "serve/openai_schema.h"
#include "serve/request_builder.h"
#include "serve/text_stream.h"
#include "util/json_bounds.h"

namespace ember::app {

namespace {

using nlohmann::json;

struct BatchLine {
  GenerationRequest request;
  std::vector<std::string> stop_strings;
  std::string error;  // set when the line was refused
  std::shared_ptr<ResponseStream> stream;
};

// Parses one input line with /v1/completions' schema and request builder (the batch-line source:
// openai_schema.h), so a line is checked and resolved exactly as that body would be. JSON mode's
// token texts are built for the first line that asks for structured output.
Status ParseLine(const std::string& text, serve::ServedModel* model, bool* json_mode_built,
                 BatchLine* line) {
  // Bounded like an HTTP body: nesting past serve::kMaxBodyDepth is refused before any recursion,
  // and objects parse in time linear in their keys.
  Result<serve::RequestJson> parsed = ParseOrderedJsonBounded(text, serve::kMaxBodyDepth);
  if (!parsed.ok()) return Status::Error("not valid JSON: " + parsed.message());
  const serve::RequestJson body = std::move(*parsed);
  // The vocabulary's token texts (built once, on the first line that asks for structured output).
  const auto asks_structured = [&body] {
    for (const char* field : {"response_format", "guided_json", "guided_regex", "guided_choice",
                              "guided_grammar", "grammar", "structured_outputs", "json_schema"})
      if (body.contains(field)) return true;
    return false;
  };
  if (!*json_mode_built && body.is_object() && asks_structured() && model->tokenizer != nullptr) {
    model->token_texts = serve::VocabularyTexts(*model->tokenizer, model->vocab_size);
    model->grammars = std::make_shared<GbnfCache>(model->token_texts, model->defaults.eos_token_ids);
    *json_mode_built = true;
  }
  serve::Prepared prepared =
      serve::PrepareCompletion(*model, body, serve::CompletionSource::kBatchLine);
  if (auto* error = std::get_if<serve::ApiError>(&prepared)) return Status::Error(error->message);
  serve::PreparedRequest& request = std::get<serve::PreparedRequest>(prepared);
  line->request = std::move(request.prompts[0].request);
  line->stop_strings = std::move(request.stop);
  return Status::Ok();
}

json TopLogprobsJson(const std::vector<TokenLogprob>& top) {
  json list = json::array();
  for (const TokenLogprob& t : top) list.push_back({{"id", t.token_id}, {"logprob", t.logprob}});
  return list;
}

// Reads one finished line's tokens, applying stop strings; returns the output JSON.
json CollectLine(int64_t index, BatchLine& line, const Tokenizer* tokenizer) {
  std::unique_ptr<serve::TextStream> text_stream;
  if (tokenizer != nullptr)
    text_stream = std::make_unique<serve::TextStream>(*tokenizer, line.stop_strings, true);
  std::vector<int32_t> ids;
  json logprobs = json::array(), prompt_logprobs;
  const bool want_logprobs = line.request.sampling.wants_logprobs();
  std::string text;
  FinishReason finish = FinishReason::kNone;
  bool stopped_by_string = false;
  std::vector<TokenEvent> events;
  while (line.stream->Next(&events)) {
    for (const TokenEvent& e : events) {
      if (e.prompt_logprobs) {  // entry i is prompt position i + 1's; the first token has none
        prompt_logprobs = json::array({nullptr});
        for (size_t i = 0; i < e.prompt_logprobs->size(); ++i) {
          const PromptLogprob& p = (*e.prompt_logprobs)[i];
          prompt_logprobs.push_back({{"id", line.request.prompt_ids[i + 1]},
                                     {"logprob", p.logprob},
                                     {"rank", p.rank},
                                     {"top_logprobs", TopLogprobsJson(p.top_logprobs)}});
        }
      }
      if (e.token_id >= 0 && !stopped_by_string) {
        ids.push_back(e.token_id);
        if (want_logprobs)
          logprobs.push_back({{"id", e.token_id},
                              {"logprob", e.logprob},
                              {"top_logprobs", TopLogprobsJson(e.top_logprobs)}});
        if (text_stream != nullptr) {
          serve::TextDelta delta = text_stream->Push(e.token_id);
          text += delta.text;
          if (delta.stopped) {
            stopped_by_string = true;
            line.stream->Cancel();
          }
        }
      }
      if (e.finish != FinishReason::kNone) finish = e.finish;
    }
    events.clear();
  }
  if (text_stream != nullptr && !stopped_by_string) {
    text += text_stream->Finish();
    stopped_by_string = text_stream->stopped();
  }
  if (stopped_by_string) finish = FinishReason::kStop;
  RequestUsage usage = line.stream->usage();
  json out = {{"index", index}, {"ids", ids}};
  if (tokenizer != nullptr) out["text"] = text;
  out["finish_reason"] = FinishReasonName(finish);
  if (want_logprobs) out["logprobs"] = logprobs;
  if (line.request.prompt_logprobs >= 0) out["prompt_logprobs"] = prompt_logprobs;
  out["usage"] = {{"prompt_tokens", usage.prompt_tokens},
                  {"cached_tokens", usage.cached_tokens},
                  {"completion_tokens", static_cast<int32_t>(ids.size())}};
  AddCompletionTokensDetails(usage, &out["usage"]);
  return out;
}

}  // namespace

int BatchCommand(int argc, char** argv, int first) {
  std::string model_dir, input_path, output_path;
  EngineFlags engine_flags;
  FlagParser flags(
      "usage: ember batch --model DIR --input IN.jsonl --output OUT.jsonl [--max-batch N]\n"
      "       [--kv-cache-bytes B] [--kv-cache-dtype T]\n"
      "Each input line is a /v1/completions body (same fields, checks and messages) with one\n"
      "prompt: {\"prompt_ids\": [...]} or {\"prompt\": \"...\" or [ids]} with optional "
      "max_tokens,\n"
      "temperature, top_p, top_k, min_p, seed, stop, repetition/presence/frequency_penalty,\n"
      "min_tokens, ignore_eos, logit_bias ({\"id\": bias}), response_format ({\"type\":\n"
      "\"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": {\"schema\": {...}}}: the\n"
      "text is one JSON object; or guided_json, guided_regex, guided_choice, guided_grammar,\n"
      "grammar (GBNF), structured_outputs, json_schema), speculative_decoding (false: no drafts for this line), logprobs (N: each generated token's logprob and its top N),\n"
      "prompt_logprobs (N: the same for every prompt token but the first; with max_tokens 0\n"
      "the prompt is only scored). Unset fields fall back to generation_config.json, then to\n"
      "OpenAI's defaults (max_tokens 16). Not in a line: n, echo, stream, model.");
  flags.AddString("--model", &model_dir, "Hugging Face model folder");
  flags.AddString("--input", &input_path, "input JSONL file");
  flags.AddString("--output", &output_path, "output JSONL file");
  engine_flags.Register(flags, /*serving=*/false);
  if (int rc = ParseOrExit(flags, argc, argv, first); rc >= 0) return rc;
  if (model_dir.empty() || input_path.empty() || output_path.empty())
    return Fail("--model, --input and --output are required");

  std::ifstream in(input_path);
  if (!in) return Fail(input_path + ": cannot open");
  std::vector<std::string> lines;
  for (std::string text; std::getline(in, text);) lines.push_back(text);
  std::ofstream out(output_path, std::ios::trunc);
  if (!out) return Fail(output_path + ": cannot open for writing");

  engine_flags.max_queue = std::max<int64_t>(1, static_cast<int64_t>(lines.size()));
  auto loaded = LoadModelAndEngine(model_dir, engine_flags);
  if (!loaded.ok()) return Fail(loaded.message());
  LoadedModel& lm = *loaded;

  // Generation time: from the first submission to the last line's end (the model is loaded).
  const auto start = std::chrono::steady_clock::now();
  std::vector<BatchLine> batch(lines.size());
  serve::ServedModel served = ServedModelOf(lm);
  served.max_n = 1;
  bool json_mode_built = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    Status st = ParseLine(lines[i], &served, &json_mode_built, &batch[i]);
    if (!st.ok()) {
      batch[i].error = input_path + " line " + std::to_string(i + 1) + ": " + st.message();
      continue;
    }
    auto submitted = lm.engine->Submit(batch[i].request);
    if (auto* error = std::get_if<SubmitError>(&submitted)) {
      batch[i].error = input_path + " line " + std::to_string(i + 1) + ": " +
                       (error->param.empty() ? "" : error->param + ": ") + error->message;
    } else {
      batch[i].stream = std::get<std::shared_ptr<ResponseStream>>(submitted);
    }
  }
  int64_t num_errors = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    json result;
    if (!batch[i].error.empty()) {
      ++num_errors;
      std::fprintf(stderr, "ember: %s\n", batch[i].error.c_str());
      result = {{"index", i}, {"error", batch[i].error}};
    } else {
      result = CollectLine(static_cast<int64_t>(i), batch[i], lm.tokenizer.get());
    }
    out << result.dump() << "\n";
  }
  out.flush();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  lm.engine->Shutdown(/*drain=*/true);
  EngineStats stats = lm.engine->Stats();
  std::fprintf(
      stderr,
      "ember batch: %zu lines, %lld refused; %lld prompt tokens (%lld from the prefix "
      "cache), %lld generated, %lld steps, %lld preemptions; %.3f s (%.1f generated "
      "tok/s; engine thread: schedule %.3f s, forward %.3f s, finish %.3f s)%s\n",
      lines.size(), static_cast<long long>(num_errors), static_cast<long long>(stats.prompt_tokens),
      static_cast<long long>(stats.prefix_hit_tokens),
      static_cast<long long>(stats.generated_tokens), static_cast<long long>(stats.steps),
      static_cast<long long>(stats.preemptions), seconds,
      double(stats.generated_tokens) / std::max(seconds, 1e-9), 1e-9 * double(stats.schedule_ns),
      1e-9 * double(stats.forward_ns), 1e-9 * double(stats.finish_ns),
      SpeculationSummary(stats).c_str());
  if (!out) return Fail(output_path + ": write error");
  return num_errors > 0 ? 1 : 0;
}

}  // namespace ember::app
