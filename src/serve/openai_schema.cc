#include "serve/openai_schema.h"

#include <cfloat>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "sampling/regex_syntax.h"   // EscapeRegexLiteral
#include "template/chat_template.h"  // CheckTemplateKwargs
#include "util/json_bounds.h"

namespace ember::serve {

using json = RequestJson;

namespace {

#define EMBER_RETURN_IF_API_ERROR(expr) \
  do {                                  \
    if (auto _api_err = (expr)) return _api_err; \
  } while (0)

using MaybeError = std::optional<ApiError>;

// A JSON number a float can hold (finite), at `path`; errors blame `param`.
MaybeError ReadFloat(const json& v, const std::string& path, const std::string& param, float* out) {
  if (!v.is_number()) return FieldTypeError(path, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x) || std::fabs(x) > FLT_MAX)
    return InvalidRequest(path + ": must be a finite number", param);
  *out = static_cast<float>(x);
  return std::nullopt;
}

// Reads the fields of one JSON object, remembering which were consumed so the rest can be
// reported as unknown. A field whose value is null counts as absent (OpenAI clients send nulls).
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string path) : object_(object), path_(std::move(path)) {}

  // The field's value without consuming it (null when absent).
  const json* Peek(const std::string& name) const {
    auto it = object_.find(name);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  const json* Get(const std::string& name) {
    known_.insert(name);
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::string Path(const std::string& name) const {
    return path_.empty() ? name : path_ + "." + name;
  }
  MaybeError CheckUnknown() const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (known_.count(it.key()) == 0) {
        return InvalidRequest("Unrecognized request argument supplied: " + Path(it.key()) +
                                  " (this server does not implement it)",
                              Path(it.key()), "unknown_parameter");
      }
    }
    return std::nullopt;
  }

  MaybeError Bool(const std::string& name, bool* out) {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return FieldTypeError(Path(name), "a boolean", *v);
    *out = v->get<bool>();
    return std::nullopt;
  }

  MaybeError Int(const std::string& name, int64_t lo, int64_t hi, std::optional<int64_t>* out) {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer()) return FieldTypeError(Path(name), "an integer", *v);
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX})
      return OutOfRange(name, v->dump(), lo, hi);
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) return OutOfRange(name, std::to_string(x), lo, hi);
    *out = x;
    return std::nullopt;
  }

  MaybeError Int32(const std::string& name, int64_t lo, int64_t hi, std::optional<int32_t>* out) {
    std::optional<int64_t> x;
    EMBER_RETURN_IF_API_ERROR(Int(name, lo, hi, &x));
    if (x) *out = static_cast<int32_t>(*x);
    return std::nullopt;
  }

  // A number a float can hold (finite). Its range is the resolver's (ValidateSamplingRequest).
  MaybeError Number(const std::string& name, std::optional<float>* out) {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    float x = 0.0f;
    EMBER_RETURN_IF_API_ERROR(ReadFloat(*v, Path(name), Path(name), &x));
    *out = x;
    return std::nullopt;
  }

  MaybeError String(const std::string& name, std::string* out) {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return FieldTypeError(Path(name), "a string", *v);
    *out = v->get<std::string>();
    return std::nullopt;
  }

 private:
  ApiError OutOfRange(const std::string& name, const std::string& got, int64_t lo, int64_t hi) {
    std::ostringstream msg;
    msg << Path(name) << ": must be in [" << lo << ", " << hi << "], got " << got;
    return InvalidRequest(msg.str(), Path(name));
  }

  const json& object_;
  std::string path_;
  std::set<std::string> known_;
};

MaybeError ParseStop(ObjectReader& r, const SchemaLimits& limits, std::vector<std::string>* out) {
  const json* v = r.Get("stop");
  if (v == nullptr) return std::nullopt;
  const std::string path = r.Path("stop");
  if (v->is_string()) {
    out->push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > static_cast<size_t>(limits.max_stop_strings)) {
      return InvalidRequest(path + ": at most " + std::to_string(limits.max_stop_strings) +
                                " stop strings, got " + std::to_string(v->size()),
                            path);
    }
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string())
        return FieldTypeError(path + "[" + std::to_string(i) + "]", "a string", (*v)[i]);
      out->push_back((*v)[i].get<std::string>());
    }
  } else {
    return FieldTypeError(path, "a string or an array of strings", *v);
  }
  for (const std::string& s : *out) {
    if (s.empty()) return InvalidRequest(path + ": stop strings must not be empty", path);
  }
  return std::nullopt;
}

// logit_bias: {"token id": bias}. The ids' and biases' ranges are the resolver's.
MaybeError ParseLogitBias(ObjectReader& r, std::vector<std::pair<int32_t, float>>* out) {
  const json* v = r.Get("logit_bias");
  if (v == nullptr) return std::nullopt;
  const std::string path = r.Path("logit_bias");
  if (!v->is_object()) return FieldTypeError(path, "an object mapping token ids to biases", *v);
  for (auto it = v->begin(); it != v->end(); ++it) {
    const std::string item = path + "." + it.key();
    const std::optional<int32_t> id = ParseTokenIdKey(it.key());
    if (!id) return InvalidRequest(item + ": keys must be token ids (decimal integers)", path);
    float bias = 0.0f;
    EMBER_RETURN_IF_API_ERROR(ReadFloat(*it, item, path, &bias));
    out->emplace_back(*id, bias);
  }
  return std::nullopt;
}

// dry_sequence_breakers: an array of strings (their count and sizes are the resolver's rules;
// the count is bounded here first, before anything is copied).
MaybeError ParseDrySequenceBreakers(ObjectReader& r, std::optional<std::vector<std::string>>* out) {
  const json* v = r.Get("dry_sequence_breakers");
  if (v == nullptr) return std::nullopt;
  const std::string path = r.Path("dry_sequence_breakers");
  if (!v->is_array()) return FieldTypeError(path, "an array of strings", *v);
  if (v->size() > kMaxDrySequenceBreakers) {
    return InvalidRequest(path + ": at most " + std::to_string(kMaxDrySequenceBreakers) +
                              " strings, got " + std::to_string(v->size()),
                          path);
  }
  out->emplace();
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string())
      return FieldTypeError(path + "[" + std::to_string(i) + "]", "a string", (*v)[i]);
    (*out)->push_back((*v)[i].get<std::string>());
  }
  return std::nullopt;
}

// llama.cpp's samplers: top_n_sigma, typical_p, XTC, DRY (SamplingParams defines them).
MaybeError ParseLlamaCppSamplers(ObjectReader& r, CommonParams* p) {
  EMBER_RETURN_IF_API_ERROR(r.Number("top_n_sigma", &p->top_n_sigma));
  EMBER_RETURN_IF_API_ERROR(r.Number("typical_p", &p->typical_p));
  EMBER_RETURN_IF_API_ERROR(r.Number("xtc_probability", &p->xtc_probability));
  EMBER_RETURN_IF_API_ERROR(r.Number("xtc_threshold", &p->xtc_threshold));
  EMBER_RETURN_IF_API_ERROR(r.Number("dry_multiplier", &p->dry_multiplier));
  EMBER_RETURN_IF_API_ERROR(r.Number("dry_base", &p->dry_base));
  EMBER_RETURN_IF_API_ERROR(
      r.Int32("dry_allowed_length", INT32_MIN, INT32_MAX, &p->dry_allowed_length));
  EMBER_RETURN_IF_API_ERROR(
      r.Int32("dry_penalty_last_n", INT32_MIN, INT32_MAX, &p->dry_penalty_last_n));
  return ParseDrySequenceBreakers(r, &p->dry_sequence_breakers);
}

// The sampling fields (SamplingRequest) but logprobs, which each endpoint spells its own way:
// read with their JSON types here, then checked by the resolver's rules
// (ValidateSamplingRequest). `zero_max_tokens_refusal`: why max_tokens 0 is refused here (null:
// 0 is allowed, the prompt alone is wanted).
MaybeError ParseSampling(ObjectReader& r, const SchemaLimits& limits,
                         const char* zero_max_tokens_refusal, CommonParams* p) {
  std::optional<int32_t> max_tokens, max_completion_tokens;
  EMBER_RETURN_IF_API_ERROR(r.Int32("max_tokens", 0, INT32_MAX, &max_tokens));
  EMBER_RETURN_IF_API_ERROR(r.Int32("max_completion_tokens", 0, INT32_MAX, &max_completion_tokens));
  p->max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  if (p->max_tokens == 0 && zero_max_tokens_refusal != nullptr) {
    const std::string field = max_completion_tokens ? "max_completion_tokens" : "max_tokens";
    return InvalidRequest(r.Path(field) + ": " + zero_max_tokens_refusal, r.Path(field));
  }
  EMBER_RETURN_IF_API_ERROR(r.Number("temperature", &p->temperature));
  EMBER_RETURN_IF_API_ERROR(r.Number("top_p", &p->top_p));
  EMBER_RETURN_IF_API_ERROR(r.Number("min_p", &p->min_p));
  EMBER_RETURN_IF_API_ERROR(r.Number("repetition_penalty", &p->repetition_penalty));
  EMBER_RETURN_IF_API_ERROR(r.Int32("top_k", INT32_MIN, INT32_MAX, &p->top_k));
  EMBER_RETURN_IF_API_ERROR(r.Number("presence_penalty", &p->presence_penalty));
  EMBER_RETURN_IF_API_ERROR(r.Number("frequency_penalty", &p->frequency_penalty));
  EMBER_RETURN_IF_API_ERROR(ParseLogitBias(r, &p->logit_bias));
  std::optional<int64_t> seed;  // any int64; a negative one keeps its bits (SamplingRequest)
  EMBER_RETURN_IF_API_ERROR(
      r.Int("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
            &seed));
  if (seed) p->seed = static_cast<uint64_t>(*seed);
  std::optional<int32_t> min_tokens;
  EMBER_RETURN_IF_API_ERROR(r.Int32("min_tokens", INT32_MIN, INT32_MAX, &min_tokens));
  p->min_tokens = min_tokens.value_or(0);
  EMBER_RETURN_IF_API_ERROR(ParseLlamaCppSamplers(r, p));
  if (auto error = ValidateSamplingRequest(*p, limits.vocab_size)) {
    // "max_tokens" blames whichever of the two spellings the request used.
    const std::string field = error->field == "max_tokens" && max_completion_tokens
                                  ? "max_completion_tokens"
                                  : error->field;
    return InvalidRequest(error->message, r.Path(field));
  }
  return std::nullopt;
}

// 0 generates nothing: only an echo of the prompt (completions) makes sense of it.
constexpr const char* kZeroMaxTokensNeedsEcho =
    "must be at least 1 (0 only on /v1/completions with echo, which returns the prompt alone), "
    "got 0";

// Fields common to both endpoints (everything but the prompt/messages and logprobs).
MaybeError ParseCommon(ObjectReader& r, const SchemaLimits& limits,
                       const char* zero_max_tokens_refusal, CommonParams* p) {
  EMBER_RETURN_IF_API_ERROR(r.String("model", &p->model));
  EMBER_RETURN_IF_API_ERROR(ParseSampling(r, limits, zero_max_tokens_refusal, p));
  EMBER_RETURN_IF_API_ERROR(ParseStop(r, limits, &p->stop));
  EMBER_RETURN_IF_API_ERROR(r.Bool("ignore_eos", &p->ignore_eos));
  EMBER_RETURN_IF_API_ERROR(r.Bool("speculative_decoding", &p->speculative_decoding));
  if (r.Peek("cache_salt") != nullptr) {
    EMBER_RETURN_IF_API_ERROR(r.String("cache_salt", &p->cache_salt));
    if (p->cache_salt.empty() || p->cache_salt.size() > kMaxCacheSaltBytes)
      return InvalidRequest(r.Path("cache_salt") + ": must be a non-empty string of at most " +
                                std::to_string(kMaxCacheSaltBytes) + " bytes",
                            r.Path("cache_salt"));
  }
  EMBER_RETURN_IF_API_ERROR(r.String("adapter", &p->adapter));
  std::optional<int32_t> n;
  EMBER_RETURN_IF_API_ERROR(r.Int32("n", 1, limits.max_n, &n));
  p->n = n.value_or(1);
  EMBER_RETURN_IF_API_ERROR(r.Bool("stream", &p->stream));
  std::optional<int32_t> prompt_logprobs;
  EMBER_RETURN_IF_API_ERROR(
      r.Int32("prompt_logprobs", 0, limits.max_top_logprobs, &prompt_logprobs));
  if (prompt_logprobs && p->stream) {
    return InvalidRequest(r.Path("prompt_logprobs") +
                              ": not available with stream (as vLLM); "
                              "use echo with logprobs on completions",
                          r.Path("prompt_logprobs"), "unsupported_value");
  }
  p->prompt_logprobs = prompt_logprobs.value_or(-1);
  if (const json* so = r.Get("stream_options")) {
    const std::string path = r.Path("stream_options");
    if (!so->is_object()) return FieldTypeError(path, "an object", *so);
    if (!p->stream)
      return InvalidRequest(path + ": only allowed when stream is true", path);
    ObjectReader sr(*so, path);
    EMBER_RETURN_IF_API_ERROR(sr.Bool("include_usage", &p->include_usage));
    EMBER_RETURN_IF_API_ERROR(sr.CheckUnknown());
  }
  // Accepted and ignored (documented): end-user id and request metadata.
  std::string user;
  EMBER_RETURN_IF_API_ERROR(r.String("user", &user));
  if (const json* m = r.Get("metadata"); m != nullptr && !m->is_object())
    return FieldTypeError(r.Path("metadata"), "an object", *m);
  return std::nullopt;
}

}  // namespace

namespace {

// messages[i]: role + content (string, or text parts joined with "\n"; null only beside
// tool_calls, then ""), name, tool_calls, tool_call_id. Returns the normalised message the chat
// template sees.
MaybeError ParseMessage(const json& m, const std::string& path, json* out) {
  if (!m.is_object()) return FieldTypeError(path, "an object", m);
  ObjectReader r(m, path);
  std::string role;
  EMBER_RETURN_IF_API_ERROR(r.String("role", &role));
  static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant",
                                               "tool"};
  if (role.empty())
    return InvalidRequest(path + ".role: required", path + ".role", "missing_required_parameter");
  if (kRoles.count(role) == 0) {
    return InvalidRequest(path + ".role: must be one of system, developer, user, assistant, tool; "
                          "got '" + role + "'",
                          path + ".role");
  }
  // Sorted keys (what templates have always seen); tool_calls, which sorts last, is appended at
  // the end in the client's key order.
  nlohmann::json msg = {{"role", role}, {"content", nullptr}};
  if (const json* c = r.Get("content")) {
    if (c->is_string()) {
      msg["content"] = *c;
    } else if (c->is_array()) {
      std::string text;
      for (size_t i = 0; i < c->size(); ++i) {
        const std::string ppath = path + ".content[" + std::to_string(i) + "]";
        const json& part = (*c)[i];
        if (!part.is_object()) return FieldTypeError(ppath, "an object", part);
        ObjectReader pr(part, ppath);
        std::string type, part_text;
        EMBER_RETURN_IF_API_ERROR(pr.String("type", &type));
        if (type != "text") {
          return InvalidRequest(ppath + ".type: only \"text\" content parts are supported by this "
                                "build (no vision or audio), got '" + type + "'",
                                ppath + ".type");
        }
        const json* t = pr.Get("text");
        if (t == nullptr || !t->is_string())
          return InvalidRequest(ppath + ".text: required string", ppath + ".text");
        EMBER_RETURN_IF_API_ERROR(pr.CheckUnknown());
        if (i > 0) text += "\n";
        text += t->get<std::string>();
      }
      msg["content"] = text;
    } else {
      return FieldTypeError(path + ".content", "a string or an array of text parts", *c);
    }
  }
  std::string name;
  EMBER_RETURN_IF_API_ERROR(r.String("name", &name));
  if (!name.empty()) msg["name"] = name;
  // A response's message sent back as it came: its null fields, refusal and annotations are
  // accepted and not rendered; its reasoning reaches the template (Qwen3's renders it).
  if (role == "assistant") {
    for (const char* key : {"function_call", "audio"}) {
      if (r.Get(key) != nullptr)
        return InvalidRequest(path + "." + key + ": not supported (only null is accepted)",
                              path + "." + key);
    }
    if (const json* v = r.Get("refusal"); v != nullptr && !v->is_string())
      return FieldTypeError(path + ".refusal", "a string or null", *v);
    if (const json* v = r.Get("annotations"); v != nullptr && !v->is_array())
      return FieldTypeError(path + ".annotations", "an array or null", *v);
    if (const json* v = r.Get("reasoning_content")) {
      if (!v->is_string()) return FieldTypeError(path + ".reasoning_content", "a string or null", *v);
      msg["reasoning_content"] = *v;
    }
  }
  const json* tool_calls = nullptr;
  if (const json* tc = r.Get("tool_calls")) {
    if (role != "assistant")
      return InvalidRequest(path + ".tool_calls: only assistant messages carry tool calls",
                            path + ".tool_calls");
    if (!tc->is_array()) return FieldTypeError(path + ".tool_calls", "an array", *tc);
    for (size_t i = 0; i < tc->size(); ++i) {
      const json& call = (*tc)[i];
      const std::string cpath = path + ".tool_calls[" + std::to_string(i) + "]";
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
        return InvalidRequest(cpath + ": expected {id, type, function: {name, arguments}}", cpath);
    }
    tool_calls = tc;
  }
  std::string tool_call_id;
  EMBER_RETURN_IF_API_ERROR(r.String("tool_call_id", &tool_call_id));
  if (!tool_call_id.empty()) msg["tool_call_id"] = tool_call_id;
  if (msg["content"].is_null() && tool_calls == nullptr)
    return InvalidRequest(path + ".content: required", path + ".content",
                          "missing_required_parameter");
  // An assistant turn that only calls tools comes back from clients with content null (as the
  // response gave it); templates test the content as a string ('</think>' in content), so they
  // get "" (what transformers' own examples pass).
  if (msg["content"].is_null()) msg["content"] = "";
  EMBER_RETURN_IF_API_ERROR(r.CheckUnknown());
  *out = json(msg);
  if (tool_calls != nullptr) (*out)["tool_calls"] = *tool_calls;
  return std::nullopt;
}

MaybeError ParseTools(ObjectReader& r, json* tools) {
  const json* v = r.Get("tools");
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) return FieldTypeError("tools", "an array", *v);
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string path = "tools[" + std::to_string(i) + "]";
    const json& t = (*v)[i];
    if (!t.is_object()) return FieldTypeError(path, "an object", t);
    ObjectReader tr(t, path);
    std::string type;
    EMBER_RETURN_IF_API_ERROR(tr.String("type", &type));
    if (type != "function")
      return InvalidRequest(path + ".type: must be \"function\"", path + ".type");
    const json* f = tr.Get("function");
    if (f == nullptr || !f->is_object())
      return InvalidRequest(path + ".function: required object", path + ".function");
    ObjectReader fr(*f, path + ".function");
    std::string name, description;
    EMBER_RETURN_IF_API_ERROR(fr.String("name", &name));
    if (name.empty())
      return InvalidRequest(path + ".function.name: required", path + ".function.name");
    EMBER_RETURN_IF_API_ERROR(fr.String("description", &description));
    if (const json* p = fr.Get("parameters"); p != nullptr && !p->is_object())
      return FieldTypeError(path + ".function.parameters", "an object (JSON Schema)", *p);
    bool strict = false;
    EMBER_RETURN_IF_API_ERROR(fr.Bool("strict", &strict));
    EMBER_RETURN_IF_API_ERROR(fr.CheckUnknown());
    EMBER_RETURN_IF_API_ERROR(tr.CheckUnknown());
  }
  *tools = *v;
  return std::nullopt;
}

// tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name": N}} with
// N one of the tools. Runs after ParseTools.
MaybeError ParseToolChoice(ObjectReader& r, ChatRequest* out) {
  const json* tc = r.Get("tool_choice");
  if (tc == nullptr) return std::nullopt;
  if (tc->is_string()) {
    const std::string choice = tc->get<std::string>();
    if (choice == "none") {
      out->tools = nullptr;  // the model is told about no tools
    } else if (choice == "required") {
      if (out->tools.is_null() || out->tools.empty())
        return InvalidRequest("tool_choice: \"required\" needs at least one tool in tools",
                              "tool_choice");
      out->tool_choice = ToolChoice::kRequired;
    } else if (choice != "auto") {
      return InvalidRequest("tool_choice: must be \"none\", \"auto\", \"required\" or "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}}, got '" +
                                choice + "'",
                            "tool_choice");
    }
    return std::nullopt;
  }
  if (!tc->is_object()) return FieldTypeError("tool_choice", "a string or an object", *tc);
  ObjectReader cr(*tc, "tool_choice");
  std::string type;
  EMBER_RETURN_IF_API_ERROR(cr.String("type", &type));
  if (type != "function")
    return InvalidRequest("tool_choice.type: must be \"function\"", "tool_choice.type");
  const json* f = cr.Get("function");
  if (f == nullptr || !f->is_object())
    return InvalidRequest("tool_choice.function: required object", "tool_choice.function");
  ObjectReader fr(*f, "tool_choice.function");
  std::string name;
  EMBER_RETURN_IF_API_ERROR(fr.String("name", &name));
  EMBER_RETURN_IF_API_ERROR(fr.CheckUnknown());
  EMBER_RETURN_IF_API_ERROR(cr.CheckUnknown());
  bool known = false;
  if (out->tools.is_array())
    for (const json& t : out->tools) known |= t["function"]["name"] == name;
  if (!known)
    return InvalidRequest("tool_choice.function.name: '" + name + "' is not one of the tools",
                          "tool_choice.function.name");
  out->tool_choice = ToolChoice::kFunction;
  out->tool_choice_name = name;
  return std::nullopt;
}

// Records that `field` asks for structured output: a second such field is a 400 naming both.
MaybeError ClaimOutput(CommonParams* p, const std::string& field) {
  if (!p->output_field.empty()) {
    const std::string first = p->output_field.substr(0, p->output_field.find('.'));
    return InvalidRequest(field + ": cannot be combined with " + first +
                              " (give one structured-output field)",
                          field, "invalid_value");
  }
  p->output_field = field;
  return std::nullopt;
}

// A JSON schema given as an object or as JSON text (vLLM takes both), at `field`.
MaybeError ReadSchema(const json& v, const std::string& field, CommonParams* p) {
  EMBER_RETURN_IF_API_ERROR(ClaimOutput(p, field));
  if (v.is_string()) {
    auto parsed = ParseOrderedJsonBounded(v.get<std::string>(), kMaxBodyDepth);
    if (!parsed.ok()) return InvalidRequest(field + ": not a JSON schema: " + parsed.message(), field);
    p->json_schema = std::move(*parsed);
  } else {
    p->json_schema = v;
  }
  if (!p->json_schema.is_object()) return FieldTypeError(field, "an object (JSON Schema)", p->json_schema);
  return std::nullopt;
}

MaybeError ReadRegex(const json& v, const std::string& field, CommonParams* p) {
  EMBER_RETURN_IF_API_ERROR(ClaimOutput(p, field));
  if (!v.is_string()) return FieldTypeError(field, "a string (a regular expression)", v);
  p->regex = v.get<std::string>();
  return std::nullopt;
}

// A list of strings: the output is exactly one of them (a regex of their escaped alternation).
MaybeError ReadChoice(const json& v, const std::string& field, CommonParams* p) {
  EMBER_RETURN_IF_API_ERROR(ClaimOutput(p, field));
  if (!v.is_array() || v.empty()) return FieldTypeError(field, "a non-empty array of strings", v);
  std::string regex = "(?:";
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) return FieldTypeError(field + "[" + std::to_string(i) + "]", "a string", v[i]);
    if (i > 0) regex.push_back('|');
    regex.append(EscapeRegexLiteral(v[i].get<std::string>()));
  }
  regex.push_back(')');
  p->regex = std::move(regex);
  return std::nullopt;
}

// A GBNF grammar (llama.cpp's syntax; the request builder compiles it).
MaybeError ReadGrammar(const json& v, const std::string& field, CommonParams* p) {
  EMBER_RETURN_IF_API_ERROR(ClaimOutput(p, field));
  if (!v.is_string()) return FieldTypeError(field, "a string (a GBNF grammar)", v);
  p->grammar = v.get<std::string>();
  return std::nullopt;
}

// vLLM's structured_outputs: exactly one of json, regex, choice, grammar, json_object (true).
MaybeError ParseStructuredOutputs(const json& v, CommonParams* p) {
  if (!v.is_object()) return FieldTypeError("structured_outputs", "an object", v);
  ObjectReader sr(v, "structured_outputs");
  if (sr.Get("structural_tag") != nullptr)
    return InvalidRequest("structured_outputs.structural_tag: structural tags are not supported; "
                          "use grammar, regex, choice, json or json_object",
                          "structured_outputs.structural_tag", "unsupported_parameter");
  if (const json* j = sr.Get("json")) EMBER_RETURN_IF_API_ERROR(ReadSchema(*j, "structured_outputs.json", p));
  if (const json* re = sr.Get("regex")) EMBER_RETURN_IF_API_ERROR(ReadRegex(*re, "structured_outputs.regex", p));
  if (const json* c = sr.Get("choice")) EMBER_RETURN_IF_API_ERROR(ReadChoice(*c, "structured_outputs.choice", p));
  if (const json* g = sr.Get("grammar")) EMBER_RETURN_IF_API_ERROR(ReadGrammar(*g, "structured_outputs.grammar", p));
  bool json_object = false;
  EMBER_RETURN_IF_API_ERROR(sr.Bool("json_object", &json_object));
  if (json_object) {
    EMBER_RETURN_IF_API_ERROR(ClaimOutput(p, "structured_outputs.json_object"));
    p->json_object = true;
  }
  EMBER_RETURN_IF_API_ERROR(sr.CheckUnknown());
  if (p->output_field.rfind("structured_outputs", 0) != 0)
    return InvalidRequest("structured_outputs: give one of json, regex, choice, grammar or json_object",
                          "structured_outputs");
  return std::nullopt;
}

// The structured-output fields besides response_format (read after it): vLLM's guided_json,
// guided_regex, guided_choice, guided_grammar and structured_outputs, llama.cpp's json_schema and
// grammar (GBNF).
MaybeError ParseGuidedFields(ObjectReader& r, CommonParams* p) {
  if (const json* v = r.Get("guided_json")) EMBER_RETURN_IF_API_ERROR(ReadSchema(*v, "guided_json", p));
  if (const json* v = r.Get("guided_regex")) EMBER_RETURN_IF_API_ERROR(ReadRegex(*v, "guided_regex", p));
  if (const json* v = r.Get("guided_choice")) EMBER_RETURN_IF_API_ERROR(ReadChoice(*v, "guided_choice", p));
  if (const json* v = r.Get("guided_grammar")) EMBER_RETURN_IF_API_ERROR(ReadGrammar(*v, "guided_grammar", p));
  if (const json* v = r.Get("grammar")) EMBER_RETURN_IF_API_ERROR(ReadGrammar(*v, "grammar", p));
  if (const json* v = r.Get("json_schema")) EMBER_RETURN_IF_API_ERROR(ReadSchema(*v, "json_schema", p));
  if (const json* v = r.Get("structured_outputs")) EMBER_RETURN_IF_API_ERROR(ParseStructuredOutputs(*v, p));
  return std::nullopt;
}

// response_format: {"type": "text"}, {"type": "json_object"} (JSON mode) or {"type":
// "json_schema", "json_schema": {"name", "schema", "strict", "description"}}. The schema itself is
// kept as the client wrote it and compiled by the request builder.
MaybeError ParseResponseFormat(ObjectReader& r, CommonParams* p) {
  const json* v = r.Get("response_format");
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) return FieldTypeError("response_format", "an object", *v);
  ObjectReader fr(*v, "response_format");
  std::string type;
  EMBER_RETURN_IF_API_ERROR(fr.String("type", &type));
  if (type == "json_object") {
    EMBER_RETURN_IF_API_ERROR(ClaimOutput(p, "response_format"));
    p->json_object = true;
  } else if (type == "json_schema") {
    const json* js = fr.Get("json_schema");
    if (js == nullptr || !js->is_object())
      return InvalidRequest("response_format.json_schema: required object {name, schema}",
                            "response_format.json_schema", "missing_required_parameter");
    ObjectReader sr(*js, "response_format.json_schema");
    std::string name, description;
    bool strict = false;
    EMBER_RETURN_IF_API_ERROR(sr.String("name", &name));
    EMBER_RETURN_IF_API_ERROR(sr.String("description", &description));
    EMBER_RETURN_IF_API_ERROR(sr.Bool("strict", &strict));  // always enforced
    const json* schema = sr.Get("schema");
    if (schema == nullptr)
      return InvalidRequest("response_format.json_schema.schema: required",
                            "response_format.json_schema.schema", "missing_required_parameter");
    if (!schema->is_object())
      return FieldTypeError("response_format.json_schema.schema", "an object (JSON Schema)", *schema);
    EMBER_RETURN_IF_API_ERROR(sr.CheckUnknown());
    EMBER_RETURN_IF_API_ERROR(ClaimOutput(p, "response_format.json_schema.schema"));
    p->json_schema = *schema;
  } else if (type != "text") {
    return InvalidRequest("response_format.type: must be \"text\", \"json_object\" or "
                          "\"json_schema\", got '" + type + "'",
                          "response_format.type", "unsupported_value");
  }
  return fr.CheckUnknown();
}

}  // namespace

const char* JsonTypeName(const RequestJson& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

ApiError FieldTypeError(const std::string& path, const char* expected, const RequestJson& got) {
  return InvalidRequest(path + ": expected " + expected + ", got " + JsonTypeName(got), path,
                        "invalid_type");
}

std::optional<int32_t> ParseTokenIdKey(const std::string& key) {
  if (key.empty() || key.size() > 10) return std::nullopt;
  int64_t id = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return std::nullopt;
    id = id * 10 + (c - '0');
  }
  if (id > INT32_MAX) return std::nullopt;
  return static_cast<int32_t>(id);
}

std::optional<ApiError> ParseChatRequest(const json& body, const SchemaLimits& limits,
                                         ChatRequest* out) {
  if (!body.is_object()) return FieldTypeError("body", "a JSON object", body);
  ObjectReader r(body, "");
  EMBER_RETURN_IF_API_ERROR(ParseCommon(r, limits, kZeroMaxTokensNeedsEcho, &out->params));

  const json* messages = r.Get("messages");
  if (messages == nullptr)
    return InvalidRequest("messages: required", "messages", "missing_required_parameter");
  if (!messages->is_array()) return FieldTypeError("messages", "an array", *messages);
  if (messages->empty()) return InvalidRequest("messages: must not be empty", "messages");
  out->messages = json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    json msg;
    EMBER_RETURN_IF_API_ERROR(
        ParseMessage((*messages)[i], "messages[" + std::to_string(i) + "]", &msg));
    out->messages.push_back(std::move(msg));
  }

  bool logprobs = false;
  std::optional<int32_t> top_logprobs;
  EMBER_RETURN_IF_API_ERROR(r.Bool("logprobs", &logprobs));
  EMBER_RETURN_IF_API_ERROR(r.Int32("top_logprobs", 0, limits.max_top_logprobs, &top_logprobs));
  if (top_logprobs && !logprobs)
    return InvalidRequest("top_logprobs: requires logprobs to be true", "top_logprobs");
  out->params.top_logprobs = logprobs ? top_logprobs.value_or(0) : -1;

  EMBER_RETURN_IF_API_ERROR(ParseTools(r, &out->tools));
  EMBER_RETURN_IF_API_ERROR(ParseToolChoice(r, out));
  EMBER_RETURN_IF_API_ERROR(r.Bool("parallel_tool_calls", &out->parallel_tool_calls));
  if (const json* kw = r.Get("chat_template_kwargs")) {
    if (!kw->is_object()) return FieldTypeError("chat_template_kwargs", "an object", *kw);
    // The render's own variables (messages, tools, add_generation_prompt, ...) and the
    // template language's builtins cannot be overridden from a request.
    if (Status st = CheckTemplateKwargs(*kw); !st.ok())
      return InvalidRequest(st.message(), "chat_template_kwargs", "invalid_value");
    out->chat_template_kwargs = *kw;
  }
  EMBER_RETURN_IF_API_ERROR(ParseResponseFormat(r, &out->params));
  EMBER_RETURN_IF_API_ERROR(ParseGuidedFields(r, &out->params));
  return r.CheckUnknown();
}

namespace {

// Token ids at `path` (errors blame `field`, the request field that holds them).
MaybeError ParseTokenIds(const json& v, const std::string& path, const std::string& field,
                         const SchemaLimits& limits, PromptInput* out) {
  out->is_token_ids = true;
  if (v.empty()) return InvalidRequest(path + ": the prompt is empty", path);
  for (size_t i = 0; i < v.size(); ++i) {
    const json& id = v[i];
    const std::string ipath = path + "[" + std::to_string(i) + "]";
    if (!id.is_number_integer()) return FieldTypeError(ipath, "an integer token id", id);
    if (id.is_number_unsigned() ? id.get<uint64_t>() >= uint64_t(limits.vocab_size)
                                : (id.get<int64_t>() < 0 || id.get<int64_t>() >= limits.vocab_size))
      return InvalidRequest(ipath + ": token id " + id.dump() + " is outside the vocabulary [0, " +
                                std::to_string(limits.vocab_size) + ")",
                            field);
    out->token_ids.push_back(id.get<int32_t>());
  }
  return std::nullopt;
}

MaybeError ParsePrompt(const json* v, const SchemaLimits& limits, std::vector<PromptInput>* out) {
  if (v == nullptr)
    return InvalidRequest("prompt: required", "prompt", "missing_required_parameter");
  if (v->is_string()) {
    out->push_back(PromptInput{false, v->get<std::string>(), {}});
    return std::nullopt;
  }
  if (!v->is_array())
    return FieldTypeError("prompt", "a string, an array of strings, or an array of token ids", *v);
  if (v->empty()) return InvalidRequest("prompt: must not be empty", "prompt");
  const json& first = (*v)[0];
  if (first.is_number()) {
    PromptInput p;
    EMBER_RETURN_IF_API_ERROR(ParseTokenIds(*v, "prompt", "prompt", limits, &p));
    out->push_back(std::move(p));
    return std::nullopt;
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const json& item = (*v)[i];
    const std::string path = "prompt[" + std::to_string(i) + "]";
    if (item.is_string() && first.is_string()) {
      out->push_back(PromptInput{false, item.get<std::string>(), {}});
    } else if (item.is_array() && first.is_array()) {
      PromptInput p;
      EMBER_RETURN_IF_API_ERROR(ParseTokenIds(item, path, "prompt", limits, &p));
      out->push_back(std::move(p));
    } else {
      return FieldTypeError(path, first.is_array() ? "an array of token ids" : "a string", item);
    }
  }
  return std::nullopt;
}

// A batch line's one prompt: `prompt` (as on /v1/completions) or `prompt_ids` (token ids).
MaybeError ParseBatchLinePrompt(ObjectReader& r, const SchemaLimits& limits,
                                std::vector<PromptInput>* out) {
  const json* prompt = r.Get("prompt");
  const json* ids = r.Get("prompt_ids");
  if (prompt != nullptr && ids != nullptr)
    return InvalidRequest("prompt_ids: give only one of prompt and prompt_ids", "prompt_ids");
  if (ids == nullptr) {
    EMBER_RETURN_IF_API_ERROR(ParsePrompt(prompt, limits, out));
    if (out->size() > 1)
      return InvalidRequest("prompt: a batch line holds one prompt (write one line per prompt)",
                            "prompt");
    return std::nullopt;
  }
  if (!ids->is_array()) return FieldTypeError("prompt_ids", "an array of token ids", *ids);
  PromptInput p;
  EMBER_RETURN_IF_API_ERROR(ParseTokenIds(*ids, "prompt_ids", "prompt_ids", limits, &p));
  out->push_back(std::move(p));
  return std::nullopt;
}

// What a batch line cannot carry: one output line holds one sample of one prompt, and the batch
// runs its --model.
MaybeError RefuseOutsideBatchLine(ObjectReader& r) {
  for (const char* field : {"n", "echo", "stream", "stream_options", "model"}) {
    if (r.Get(field) != nullptr) {
      return InvalidRequest(std::string(field) +
                                ": not available in an `ember batch` line (one line gives one "
                                "sample of one prompt, from the batch's --model)",
                            field, "unsupported_parameter");
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseCompletionRequest(const json& body, const SchemaLimits& limits,
                                               CompletionRequest* out, CompletionSource source) {
  if (!body.is_object()) return FieldTypeError("body", "a JSON object", body);
  ObjectReader r(body, "");
  const bool batch_line = source == CompletionSource::kBatchLine;
  if (batch_line) EMBER_RETURN_IF_API_ERROR(RefuseOutsideBatchLine(r));
  // max_tokens 0 returns the prompt alone: its echo, or in a batch line its prompt_logprobs.
  const json* echo = r.Peek("echo");  // read (and type-checked) below
  const bool prompt_only_asked = batch_line
                                     ? r.Peek("prompt_logprobs") != nullptr
                                     : echo != nullptr && echo->is_boolean() && echo->get<bool>();
  const char* zero_refusal = prompt_only_asked ? nullptr
                             : batch_line ? "0 only scores the prompt; it needs prompt_logprobs"
                                          : kZeroMaxTokensNeedsEcho;
  EMBER_RETURN_IF_API_ERROR(ParseCommon(r, limits, zero_refusal, &out->params));
  if (batch_line) {
    EMBER_RETURN_IF_API_ERROR(ParseBatchLinePrompt(r, limits, &out->prompts));
  } else {
    EMBER_RETURN_IF_API_ERROR(ParsePrompt(r.Get("prompt"), limits, &out->prompts));
  }
  std::optional<int32_t> logprobs;
  EMBER_RETURN_IF_API_ERROR(r.Int32("logprobs", 0, limits.max_top_logprobs, &logprobs));
  out->params.top_logprobs = logprobs.value_or(-1);
  EMBER_RETURN_IF_API_ERROR(r.Bool("echo", &out->echo));
  EMBER_RETURN_IF_API_ERROR(ParseResponseFormat(r, &out->params));  // as vLLM: also here
  EMBER_RETURN_IF_API_ERROR(ParseGuidedFields(r, &out->params));
  return r.CheckUnknown();
}

}  // namespace ember::serve
