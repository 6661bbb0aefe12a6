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
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/common.h"
#include "sampling/json_schema.h"
#include "serve/openai_schema.h"
#include "serve/request_builder.h"
#include "serve/text_stream.h"

namespace ember::app {

namespace {

using nlohmann::json;

struct BatchLine {
  GenerationRequest request;
  std::vector<std::string> stop_strings;
  std::string error;  // set when the line was refused
  std::shared_ptr<ResponseStream> stream;
};

Result<float> NumberField(const json& j, const char* key) {
  const json& v = j.at(key);
  if (!v.is_number()) return Status::Error(std::string(key) + ": expected a number");
  return v.get<float>();
}

Result<int64_t> IntegerField(const json& j, const char* key) {
  const json& v = j.at(key);
  if (!v.is_number_integer()) return Status::Error(std::string(key) + ": expected an integer");
  return v.get<int64_t>();
}

// JSON mode's token texts, built by the first line that asks (null after that: unavailable).
struct JsonModeCache {
  bool built = false;
  std::shared_ptr<const TokenTexts> texts;
};

// Parses one input line into a request (sampling defaults from generation_config.json).
Status ParseLine(const std::string& text, const LoadedModel& lm, JsonModeCache* json_mode,
                 BatchLine* line) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Error("not a JSON object");
  GenerationRequest& r = line->request;
  const GenerationDefaults& d = lm.model->generation_defaults();
  r.sampling.temperature = d.temperature.value_or(1.0f);
  r.sampling.top_p = d.top_p.value_or(1.0f);
  r.sampling.top_k = d.top_k.value_or(0);
  r.sampling.min_p = d.min_p.value_or(0.0f);
  r.sampling.repetition_penalty = d.repetition_penalty.value_or(1.0f);
  r.max_tokens = 16;
  bool has_prompt = false;
  for (const auto& [key, value] : j.items()) {
    if (key == "prompt_ids") {
      if (!value.is_array()) return Status::Error("prompt_ids: expected an array of token ids");
      for (const json& id : value) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
          return Status::Error("prompt_ids: every element must be a non-negative integer");
        r.prompt_ids.push_back(id.get<int32_t>());
      }
      if (has_prompt) return Status::Error("give only one of prompt and prompt_ids");
      has_prompt = true;
    } else if (key == "prompt") {
      if (!value.is_string()) return Status::Error("prompt: expected a string");
      if (lm.tokenizer == nullptr)
        return Status::Error("prompt: the model folder has no tokenizer.json; use prompt_ids");
      if (has_prompt) return Status::Error("give only one of prompt and prompt_ids");
      r.prompt_ids = lm.tokenizer->Encode(value.get<std::string>(), /*add_special_tokens=*/true);
      has_prompt = true;
    } else if (key == "max_tokens") {
      EMBER_ASSIGN_OR_RETURN(int64_t v, IntegerField(j, "max_tokens"));
      if (v < 0 || v > INT32_MAX) return Status::Error("max_tokens: must be >= 0");
      r.max_tokens = static_cast<int32_t>(v);
    } else if (key == "logprobs" || key == "prompt_logprobs") {
      EMBER_ASSIGN_OR_RETURN(int64_t v, IntegerField(j, key.c_str()));
      if (v < 0 || v > kMaxTopLogprobs)
        return Status::Error(key + ": must be in [0, " + std::to_string(kMaxTopLogprobs) + "]");
      (key == "logprobs" ? r.sampling.top_logprobs : r.prompt_logprobs) = static_cast<int32_t>(v);
    } else if (key == "temperature") {
      EMBER_ASSIGN_OR_RETURN(r.sampling.temperature, NumberField(j, "temperature"));
    } else if (key == "top_p") {
      EMBER_ASSIGN_OR_RETURN(r.sampling.top_p, NumberField(j, "top_p"));
    } else if (key == "min_p") {
      EMBER_ASSIGN_OR_RETURN(r.sampling.min_p, NumberField(j, "min_p"));
    } else if (key == "top_k") {
      EMBER_ASSIGN_OR_RETURN(int64_t v, IntegerField(j, "top_k"));
      if (v < -1 || v > INT32_MAX) return Status::Error("top_k: must be -1, 0 or positive");
      r.sampling.top_k = static_cast<int32_t>(v);
    } else if (key == "seed") {
      EMBER_ASSIGN_OR_RETURN(int64_t v, IntegerField(j, "seed"));
      if (v < 0) return Status::Error("seed: must be non-negative");
      r.sampling.seed = static_cast<uint64_t>(v);
    } else if (key == "repetition_penalty") {
      EMBER_ASSIGN_OR_RETURN(r.sampling.repetition_penalty, NumberField(j, "repetition_penalty"));
    } else if (key == "presence_penalty") {
      EMBER_ASSIGN_OR_RETURN(r.sampling.presence_penalty, NumberField(j, "presence_penalty"));
    } else if (key == "frequency_penalty") {
      EMBER_ASSIGN_OR_RETURN(r.sampling.frequency_penalty, NumberField(j, "frequency_penalty"));
    } else if (key == "stop") {
      if (value.is_string()) {
        line->stop_strings.push_back(value.get<std::string>());
      } else if (value.is_array()) {
        for (const json& s : value) {
          if (!s.is_string()) return Status::Error("stop: expected a string or a list of strings");
          line->stop_strings.push_back(s.get<std::string>());
        }
      } else {
        return Status::Error("stop: expected a string or a list of strings");
      }
      for (const std::string& s : line->stop_strings)
        if (s.empty()) return Status::Error("stop: stop strings must not be empty");
      if (!line->stop_strings.empty() && lm.tokenizer == nullptr)
        return Status::Error("stop: needs the model's tokenizer.json");
    } else if (key == "logit_bias") {
      if (!value.is_object()) return Status::Error("logit_bias: expected {\"token id\": bias}");
      for (const auto& [id_text, bias] : value.items()) {
        const std::optional<int32_t> id = serve::ParseTokenIdKey(id_text);
        if (!id || !bias.is_number())
          return Status::Error("logit_bias: expected {\"token id\": bias}, got key '" + id_text +
                               "'");
        r.sampling.logit_bias.emplace_back(*id, bias.get<float>());
      }
    } else if (key == "response_format") {
      const json* type = value.is_object() && value.contains("type") ? &value["type"] : nullptr;
      const bool schema = type != nullptr && *type == "json_schema";
      if (type == nullptr || !type->is_string() || value.size() != (schema ? 2u : 1u) ||
          (schema && !(value.contains("json_schema") && value["json_schema"].is_object() &&
                       value["json_schema"].contains("schema"))))
        return Status::Error("response_format: expected {\"type\": \"text\" | \"json_object\"} or "
                             "{\"type\": \"json_schema\", \"json_schema\": {\"schema\": {...}}}");
      if (*type == "json_object" || schema) {
        if (lm.tokenizer == nullptr)
          return Status::Error("response_format: structured output needs the model's tokenizer.json");
        if (!json_mode->built) {
          json_mode->texts = serve::JsonModeTexts(*lm.tokenizer, lm.engine->vocab_size());
          json_mode->built = true;
        }
        if (json_mode->texts == nullptr) {
          return Status::Error("response_format: structured output is not available for this "
                               "model: no token of its vocabulary can start a JSON object");
        }
      }
      if (*type == "json_object") {
        r.constraint = std::make_shared<JsonObjectConstraint>(json_mode->texts);
      } else if (schema) {
        // The line again, in its key order: properties are written in the schema's order.
        const auto ordered = nlohmann::ordered_json::parse(text);
        EMBER_ASSIGN_OR_RETURN(
            auto compiled,
            CompileJsonSchema(ordered["response_format"]["json_schema"]["schema"],
                              "response_format.json_schema.schema"));
        r.constraint = MakeJsonSchemaConstraint(json_mode->texts, std::move(compiled));
      } else if (*type != "text") {
        return Status::Error("response_format: type must be \"text\", \"json_object\" or "
                             "\"json_schema\"");
      }
    } else {
      return Status::Error("unknown field '" + key + "'");
    }
  }
  if (!has_prompt) return Status::Error("one of prompt or prompt_ids is required");
  if (r.max_tokens == 0 && r.prompt_logprobs < 0)
    return Status::Error("max_tokens: 0 only scores the prompt; it needs prompt_logprobs");
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
  return out;
}

}  // namespace

int BatchCommand(int argc, char** argv, int first) {
  std::string model_dir, input_path, output_path;
  EngineFlags engine_flags;
  FlagParser flags(
      "usage: ember batch --model DIR --input IN.jsonl --output OUT.jsonl [--max-batch N]\n"
      "       [--kv-cache-bytes B]\n"
      "Each input line: {\"prompt_ids\": [...]} or {\"prompt\": \"...\"} with optional "
      "max_tokens,\n"
      "temperature, top_p, top_k, min_p, seed, stop, repetition/presence/frequency_penalty,\n"
      "logit_bias ({\"id\": bias}), response_format ({\"type\": \"json_object\"} or {\"type\":\n"
      "\"json_schema\", \"json_schema\": {\"schema\": {...}}}: the text is\n"
      "one JSON object), logprobs (N: each generated token's logprob and its top N),\n"
      "prompt_logprobs (N: the same for every prompt token but the first; with max_tokens 0\n"
      "the prompt is only scored).");
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
  JsonModeCache json_mode;
  for (size_t i = 0; i < lines.size(); ++i) {
    Status st = ParseLine(lines[i], lm, &json_mode, &batch[i]);
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
      "tok/s; engine thread: schedule %.3f s, forward %.3f s, finish %.3f s)\n",
      lines.size(), static_cast<long long>(num_errors), static_cast<long long>(stats.prompt_tokens),
      static_cast<long long>(stats.prefix_hit_tokens),
      static_cast<long long>(stats.generated_tokens), static_cast<long long>(stats.steps),
      static_cast<long long>(stats.preemptions), seconds,
      double(stats.generated_tokens) / std::max(seconds, 1e-9), 1e-9 * double(stats.schedule_ns),
      1e-9 * double(stats.forward_ns), 1e-9 * double(stats.finish_ns));
  if (!out) return Fail(output_path + ": write error");
  return num_errors > 0 ? 1 : 0;
}

}  // namespace ember::app
