#include "serve/embeddings.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <memory>

#include "engine/engine.h"
#include "engine/pooling.h"
#include "serve/body_fields.h"
#include "tokenizer/tokenizer.h"
#include "util/json_bounds.h"

namespace ember::serve {

namespace {

using nlohmann::json;

HttpResponse JsonBody(int status, const json& body) {
  HttpResponse res;
  res.status = status;
  res.body = body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  return res;
}

std::string At(size_t i) {
  return "input[" + std::to_string(i) + "]";
}

// One element of an `input` array of ids: a list of token ids.
FieldError ReadIds(const RequestJson& v, const std::string& path, int32_t vocab,
                   std::vector<int32_t>* out) {
  if (v.empty()) return InvalidRequest(path + ": an input must hold at least one token", "input");
  out->reserve(v.size());
  for (size_t j = 0; j < v.size(); ++j) {
    int32_t id = 0;
    if (auto e = CheckTokenId(v[j], path + "[" + std::to_string(j) + "]", "input", vocab, &id))
      return e;
    out->push_back(id);
  }
  return std::nullopt;
}

// `input`: a string, an array of strings, an array of token ids, or an array of arrays of ids.
FieldError ReadInputs(const ServedModel& model, const RequestJson& body,
                      std::vector<std::vector<int32_t>>* inputs) {
  const auto it = body.find("input");
  if (it == body.end())
    return InvalidRequest("input: required", "input", "missing_required_parameter");
  const RequestJson& input = *it;
  const auto encode = [&](const RequestJson& text, const std::string& path) -> FieldError {
    if (text.get_ref<const std::string&>().empty())
      return InvalidRequest(path + ": an input must not be empty", "input");
    inputs->push_back(model.tokenizer->Encode(text.get_ref<const std::string&>(),
                                              /*add_special_tokens=*/true));
    return std::nullopt;
  };
  if (input.is_string()) return encode(input, "input");
  if (!input.is_array())
    return InvalidRequest(
        "input: expected a string, an array of strings, an array of token ids "
        "or an array of arrays of token ids, got " +
            std::string(input.type_name()),
        "input", "invalid_type");
  if (input.empty()) return InvalidRequest("input: must hold at least one input", "input");
  if (input.size() > kMaxEmbeddingInputs)
    return InvalidRequest("input: at most " + std::to_string(kMaxEmbeddingInputs) +
                              " inputs per request, got " + std::to_string(input.size()),
                          "input");
  const int32_t vocab = model.vocab_size;
  if (input[0].is_number()) {  // one input given as token ids
    inputs->emplace_back();
    return ReadIds(input, "input", vocab, &inputs->back());
  }
  for (size_t i = 0; i < input.size(); ++i) {
    const RequestJson& item = input[i];
    if (item.is_string() && input[0].is_string()) {
      if (auto e = encode(item, At(i))) return e;
    } else if (item.is_array() && input[0].is_array()) {
      inputs->emplace_back();
      if (auto e = ReadIds(item, At(i), vocab, &inputs->back())) return e;
    } else {
      return InvalidRequest(At(i) +
                                ": every element must be of one kind (strings, or arrays of "
                                "token ids), got " +
                                std::string(item.type_name()),
                            "input", "invalid_type");
    }
  }
  return std::nullopt;
}

// Each input fits the served context (nothing is generated: the whole context is usable).
FieldError CheckLengths(const ServedModel& model, const std::vector<std::vector<int32_t>>& inputs) {
  const int64_t limit = std::min<int64_t>(model.context_length, model.engine->kv_capacity_tokens());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (static_cast<int64_t>(inputs[i].size()) > limit)
      return InvalidRequest(At(i) + " has " + std::to_string(inputs[i].size()) +
                                " tokens; this model's maximum context length is " +
                                std::to_string(limit) + " tokens",
                            "input", "context_length_exceeded");
  }
  return std::nullopt;
}

ApiError FromSubmitError(const SubmitError& e, size_t index) {
  switch (e.code) {
    case SubmitError::Code::kInvalidRequest:
      return InvalidRequest(At(index) + ": " + e.message, "input");
    case SubmitError::Code::kQueueFull:
      return ApiError{429, e.message, "rate_limit_error", "", "queue_full"};
    case SubmitError::Code::kShuttingDown:
      return ApiError{503, e.message, "server_error", "", "shutting_down"};
  }
  return ApiError{500, e.message, "server_error", "", ""};
}

// The inputs in flight: each stream ends with one event carrying its pooled vector. At most
// kEmbeddingWave of a request's inputs are in the engine at once; the rest are submitted as
// those finish, so a request of many inputs neither fills the engine's queue for everyone else
// nor is refused by it (a request larger than --max-queue could never have been queued whole).
// Polled on the connection's strand; destroying it before the end cancels what still runs.
class EmbeddingResponse final : public AsyncResponse {
 public:
  EmbeddingResponse(const ServedModel& model, EmbeddingRequest request)
      : model_(model),
        request_(std::move(request)),
        streams_(request_.inputs.size()),
        vectors_(request_.inputs.size()),
        closed_(request_.inputs.size(), false) {
    for (const auto& ids : request_.inputs) prompt_tokens_ += static_cast<int64_t>(ids.size());
  }
  ~EmbeddingResponse() override {
    for (size_t i = 0; i < next_; ++i) {
      streams_[i]->SetNotify(nullptr);
      if (!closed_[i]) streams_[i]->Cancel();
    }
  }

  // Submits inputs until kEmbeddingWave are in flight, all are, or the engine's queue is full
  // (the rest wait for this request's own inputs to finish). An error other than a full queue
  // ends the request.
  std::optional<ApiError> SubmitMore() {
    while (next_ < streams_.size() && in_flight_ < kEmbeddingWave) {
      GenerationRequest g;
      g.prompt_ids = request_.inputs[next_];
      g.max_tokens = 0;
      g.pooling = model_.embeddings.pooling;
      Engine::SubmitResult submitted = model_.engine->Submit(std::move(g));
      if (auto* error = std::get_if<SubmitError>(&submitted)) {
        if (error->code == SubmitError::Code::kQueueFull) break;
        return FromSubmitError(*error, next_);
      }
      streams_[next_] = std::get<std::shared_ptr<ResponseStream>>(std::move(submitted));
      if (wake_) streams_[next_]->SetNotify(wake_);
      ++next_;
      ++in_flight_;
    }
    if (in_flight_ == 0 && next_ < streams_.size()) {  // the queue is full of other requests
      return FromSubmitError({SubmitError::Code::kQueueFull,
                              "too many requests are waiting; retry later", ""},
                             next_);
    }
    return std::nullopt;
  }

  bool streaming() const override { return false; }
  HttpResponse Head() override { return {}; }
  void Start(std::function<void()> wake) override {
    wake_ = std::move(wake);
    for (size_t i = 0; i < next_; ++i) streams_[i]->SetNotify(wake_);
  }
  bool Poll(std::string* /*out*/) override {
    for (size_t i = 0; i < next_ && !error_; ++i) {
      if (closed_[i]) continue;
      events_.clear();
      closed_[i] = !streams_[i]->Next(&events_, std::chrono::milliseconds(0));
      for (TokenEvent& e : events_) OnEvent(i, e);
      if (closed_[i]) --in_flight_;
    }
    if (!error_) error_ = SubmitMore();
    return !error_ && in_flight_ > 0;
  }
  HttpResponse Final() override {
    if (error_) return JsonBody(error_->http_status, error_->ToJson());
    for (size_t i = 0; i < vectors_.size(); ++i) {
      if (vectors_[i].empty())
        return JsonBody(500, ApiError{500, At(i) + ": the engine ended it without an embedding",
                                      "server_error", "", "engine_error"}
                                 .ToJson());
      if (request_.dimensions) vectors_[i] = TruncateEmbedding(vectors_[i], *request_.dimensions);
    }
    return JsonBody(200,
                    EmbeddingsResponse(model_.name, vectors_, request_.base64, prompt_tokens_));
  }
  void Abort() override {
    for (size_t i = 0; i < next_; ++i)
      if (!closed_[i]) streams_[i]->Cancel();
  }
  std::string LogNote() const override {
    return "tokens=" + std::to_string(prompt_tokens_) +
           "+0 inputs=" + std::to_string(streams_.size());
  }

 private:
  void OnEvent(size_t i, TokenEvent& e) {
    if (!e.embedding.empty()) vectors_[i] = std::move(e.embedding);
    if ((e.finish == FinishReason::kError || e.finish == FinishReason::kCancelled) && !error_) {
      error_ = e.finish == FinishReason::kError
                   ? ApiError{500, At(i) + ": the engine failed to compute it", "server_error", "",
                              "engine_error"}
                   : ApiError{503, At(i) + ": cancelled (the server is shutting down)",
                              "server_error", "", "cancelled"};
    }
  }

  const ServedModel& model_;
  EmbeddingRequest request_;
  std::vector<std::shared_ptr<ResponseStream>> streams_;  // [inputs] the first next_ submitted
  std::vector<std::vector<float>> vectors_;  // [inputs] the pooled vectors, as they arrive
  std::vector<bool> closed_;
  size_t next_ = 0;       // inputs submitted
  size_t in_flight_ = 0;  // submitted and not closed
  std::function<void()> wake_;
  std::vector<TokenEvent> events_;  // scratch
  std::optional<ApiError> error_;
  int64_t prompt_tokens_ = 0;
};

}  // namespace

std::variant<EmbeddingRequest, ApiError> PrepareEmbeddings(const ServedModel& model,
                                                           const RequestJson& body) {
  if (auto e = CheckFields(body, {"input", "model", "encoding_format", "dimensions", "user"}))
    return *e;
  std::optional<std::string> name, format, user;
  if (auto e = ReadString(body, "model", &name)) return *e;
  if (auto e = CheckServedModelName(name, model.name)) return *e;
  if (auto e = ReadString(body, "user", &user)) return *e;  // accepted, not used
  if (auto e = ReadString(body, "encoding_format", &format)) return *e;
  if (format && *format != "float" && *format != "base64")
    return InvalidRequest(
        "encoding_format: must be \"float\" or \"base64\", got \"" + *format + "\"",
        "encoding_format");
  if (!model.embeddings.available)
    return InvalidRequest("the model '" + model.name +
                              "' cannot serve embeddings: " + model.embeddings.unavailable_reason,
                          "model", "embeddings_unavailable");
  const int32_t hidden = model.engine->model().config().hidden_size;
  std::optional<int64_t> dimensions;
  if (auto e = ReadInt(body, "dimensions", 1, hidden, &dimensions)) return *e;
  if (dimensions && !model.embeddings.pooling.normalize)
    return InvalidRequest(
        "dimensions: this model's embeddings are not normalized (its pooling "
        "config has no Normalize module), so a truncated vector would not be "
        "what the model was trained to give; omit dimensions",
        "dimensions", "unsupported_value");
  EmbeddingRequest out;
  out.base64 = format.value_or("float") == "base64";
  if (dimensions) out.dimensions = static_cast<int32_t>(*dimensions);
  if (auto e = ReadInputs(model, body, &out.inputs)) return *e;
  if (auto e = CheckLengths(model, out.inputs)) return *e;
  return out;
}

std::string Base64Floats(std::span<const float> values) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(values.size() * 4, '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(values[i]);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<char>((bits >> (8 * b)) & 0xff);
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t chunk = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) chunk |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) chunk |= static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[(chunk >> 18) & 63];
    out += kAlphabet[(chunk >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(chunk >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[chunk & 63] : '=';
  }
  return out;
}

json EmbeddingsResponse(const std::string& model_name,
                        const std::vector<std::vector<float>>& vectors, bool base64,
                        int64_t prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    json item = {{"object", "embedding"}, {"index", i}};
    if (base64) {
      item["embedding"] = Base64Floats(vectors[i]);
    } else {
      item["embedding"] = vectors[i];
    }
    data.push_back(std::move(item));
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model_name},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

Handled HandleEmbeddings(const ServedModel& model, const HttpRequest& req, bool shutting_down) {
  const auto refuse = [](const ApiError& e) {
    return Handled{JsonBody(e.http_status, e.ToJson()), nullptr};
  };
  if (shutting_down)
    return refuse(
        ApiError{503, "the server is shutting down", "server_error", "", "shutting_down"});
  Result<RequestJson> body = ParseOrderedJsonBounded(req.body, kMaxBodyDepth);
  if (!body.ok())
    return refuse(InvalidRequest("the request body is not valid JSON (UTF-8): " + body.message(),
                                 "", "invalid_json"));
  auto prepared = PrepareEmbeddings(model, *body);
  if (auto* error = std::get_if<ApiError>(&prepared)) return refuse(*error);
  EmbeddingRequest request = std::move(std::get<EmbeddingRequest>(prepared));
  auto response = std::make_unique<EmbeddingResponse>(model, std::move(request));
  if (auto error = response->SubmitMore()) return refuse(*error);
  return {HttpResponse{}, std::move(response)};
}

}  // namespace ember::serve
