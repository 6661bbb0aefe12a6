#include "serve/generation_job.h"

#include <algorithm>
#include <chrono>
#include <span>

#include "engine/engine.h"
#include "serve/prompt_logprobs.h"
#include "tokenizer/tokenizer.h"

namespace ember::serve {

namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

ApiError FromSubmitError(const SubmitError& e) {
  switch (e.code) {
    case SubmitError::Code::kInvalidRequest:
      return InvalidRequest(e.message, e.param);
    case SubmitError::Code::kQueueFull:
      return ApiError{429, e.message, "rate_limit_error", "", "queue_full"};
    case SubmitError::Code::kShuttingDown:
      return ApiError{503, e.message, "server_error", "", "shutting_down"};
  }
  return ApiError{500, e.message, "server_error", "", ""};
}

}  // namespace

std::variant<std::unique_ptr<GenerationJob>, ApiError> GenerationJob::Start(
    const ServedModel& model, PreparedRequest prepared, Metrics* metrics, int64_t arrival_ns) {
  std::unique_ptr<GenerationJob> job(
      new GenerationJob(model, std::move(prepared), metrics, arrival_ns));
  for (PreparedPrompt& p : job->prepared_.prompts) {
    PromptRun run;
    run.prompt_tokens = static_cast<int32_t>(p.request.prompt_ids.size());
    Engine::SubmitResult submitted = model.engine->Submit(p.request);
    if (auto* error = std::get_if<SubmitError>(&submitted)) {
      job->Cancel();  // the prompts already submitted
      return FromSubmitError(*error);
    }
    run.stream = std::get<std::shared_ptr<ResponseStream>>(submitted);
    job->prompts_.push_back(std::move(run));
  }
  return job;
}

GenerationJob::GenerationJob(const ServedModel& model, PreparedRequest prepared, Metrics* metrics,
                             int64_t arrival_ns)
    : model_(model), prepared_(std::move(prepared)), metrics_(metrics), arrival_ns_(arrival_ns) {
  meta_.endpoint = prepared_.endpoint;
  meta_.id = NewResponseId(prepared_.endpoint);
  meta_.created = std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  meta_.model = model.name;
  const int32_t n = prepared_.n;
  for (size_t p = 0; p < prepared_.prompts.size(); ++p) {
    for (int32_t i = 0; i < n; ++i) {
      Sample s;
      s.choice_index = static_cast<int32_t>(p) * n + i;
      if (prepared_.harmony) {
        // Harmony's parser reads its control tokens, so the text keeps them (no other special
        // token); the parser never releases them.
        s.text = std::make_unique<TextStream>(*model.tokenizer, prepared_.stop,
                                              HarmonyControlTokens());
        const HarmonyOptions options{
            .reasoning = prepared_.reasoning,
            .tool_calls = prepared_.tool_format == ToolCallFormat::kHarmony};
        s.harmony_parser =
            std::make_unique<HarmonyParser>(options, prepared_.harmony_last_message);
      } else if (prepared_.tool_format == ToolCallFormat::kMistral) {
        // Mistral's calls start with control tokens ([TOOL_CALLS], [ARGS]): the text keeps
        // them (no other special token) for the tool-call parser.
        s.text =
            std::make_unique<TextStream>(*model.tokenizer, prepared_.stop, MistralControlTokens());
      } else {
        s.text = std::make_unique<TextStream>(*model.tokenizer, prepared_.stop,
                                              /*skip_special_tokens=*/true);
      }
      if (!prepared_.harmony) {
        if (prepared_.reasoning)
          s.reasoning_parser = std::make_unique<ReasoningParser>(prepared_.starts_in_reasoning);
        if (prepared_.tool_format != ToolCallFormat::kNone)
          s.tool_parser = std::make_unique<ToolCallParser>(prepared_.tool_format);
      }
      s.full_text = prepared_.prompts[p].echo_text;
      s.unsent_text = s.full_text;
      s.logprob_offset = static_cast<int64_t>(s.full_text.size());
      s.awaits_prompt_logprobs = prepared_.echo_logprobs;
      samples_.push_back(std::move(s));
    }
  }
}

GenerationJob::~GenerationJob() {
  if (!finished_) Cancel();
}

void GenerationJob::Cancel() {
  cancelled_by_client_ = true;
  for (PromptRun& p : prompts_) {
    if (p.stream != nullptr && !p.closed) p.stream->Cancel();
  }
}

void GenerationJob::SetNotify(const std::function<void()>& notify) {
  for (PromptRun& p : prompts_) p.stream->SetNotify(notify);
}

bool GenerationJob::done() const { return finished_; }

TokenLogprobEntry GenerationJob::MakeLogprob(const TokenEvent& e) const {
  auto decode = [this](int32_t id) {
    return model_.tokenizer->Decode(std::span<const int32_t>(&id, 1), false);
  };
  TokenLogprobEntry entry;
  entry.token = decode(e.token_id);
  entry.logprob = e.logprob;
  for (const TokenLogprob& t : e.top_logprobs) entry.top.emplace_back(decode(t.token_id), t.logprob);
  return entry;
}

void GenerationJob::AppendDelta(Sample& s, ToolCallDelta delta) {
  // parallel_tool_calls false: nothing after the first call counts.
  if (!prepared_.parallel_tool_calls && !s.tool_calls.empty()) return;
  if (!prepared_.parallel_tool_calls && delta.calls.size() > 1) delta.calls.resize(1);
  s.full_text += delta.content;
  s.unsent_text += delta.content;
  for (ToolCall& call : delta.calls) {
    call.id = NewToolCallId();
    s.tool_calls.push_back(call);
    s.unsent_tool_calls.push_back(std::move(call));
  }
}

// Released text flows: reasoning parser (chat, a thinking model) -> tool-call parser (chat with
// tools) -> the sample's content; or, for a harmony model, through its one parser.
void GenerationJob::AppendText(Sample& s, const std::string& text) {
  if (s.harmony_parser != nullptr) {
    AppendHarmony(s, s.harmony_parser->Push(text));
    return;
  }
  if (s.reasoning_parser == nullptr) {
    AppendContent(s, text);
    return;
  }
  AppendReasoning(s, s.reasoning_parser->Push(text));
}

void GenerationJob::AppendReasoning(Sample& s, const ReasoningDelta& delta) {
  s.reasoning += delta.reasoning;
  s.unsent_reasoning += delta.reasoning;
  AppendContent(s, delta.content);
}

void GenerationJob::AppendHarmony(Sample& s, HarmonyDelta delta) {
  s.reasoning += delta.reasoning;
  s.unsent_reasoning += delta.reasoning;
  AppendParsed(s, ToolCallDelta{std::move(delta.content), std::move(delta.calls)});
}

void GenerationJob::AppendContent(Sample& s, const std::string& text) {
  if (s.tool_parser == nullptr) {
    AppendDelta(s, ToolCallDelta{text, {}});
    return;
  }
  AppendParsed(s, s.tool_parser->Push(text));
}

void GenerationJob::AppendParsed(Sample& s, ToolCallDelta delta) {
  AppendDelta(s, std::move(delta));
  // parallel_tool_calls false: the first call ends the sample (the engine's work is cancelled
  // once every sample of the prompt is done).
  if (!prepared_.parallel_tool_calls && !s.tool_calls.empty()) FinishSample(s, "stop");
}

void GenerationJob::FinishSample(Sample& s, const std::string& reason) {
  if (s.done) return;
  s.done = true;
  AppendText(s, s.text->Finish());
  if (s.harmony_parser != nullptr) AppendHarmony(s, s.harmony_parser->Finish());
  if (s.reasoning_parser != nullptr) AppendReasoning(s, s.reasoning_parser->Finish());
  if (s.tool_parser != nullptr) AppendDelta(s, s.tool_parser->Finish());
  s.finish_reason = s.text->stopped() ? "stop" : reason;
  if (s.finish_reason == "stop" && !s.tool_calls.empty()) s.finish_reason = "tool_calls";
}

void GenerationJob::OnPromptLogprobs(size_t prompt_idx,
                                     const std::vector<PromptLogprob>& logprobs) {
  PromptRun& run = prompts_[prompt_idx];
  run.got_prompt_logprobs = true;
  const std::vector<int32_t>& ids = prepared_.prompts[prompt_idx].request.prompt_ids;
  if (prepared_.prompt_logprobs >= 0)
    run.vllm_prompt_logprobs =
        VllmPromptLogprobs(*model_.tokenizer, ids, logprobs, prepared_.prompt_logprobs);
  if (!prepared_.echo_logprobs) return;
  const std::vector<TokenLogprobEntry> entries =
      EchoLogprobEntries(*model_.tokenizer, ids, logprobs, prepared_.top_logprobs,
                         prepared_.prompts[prompt_idx].echo_text);
  for (int32_t i = 0; i < prepared_.n; ++i) {
    Sample& s = samples_[prompt_idx * prepared_.n + i];
    s.logprobs.insert(s.logprobs.begin(), entries.begin(), entries.end());
    s.unsent_logprobs.insert(s.unsent_logprobs.begin(), entries.begin(), entries.end());
    s.awaits_prompt_logprobs = false;
  }
}

void GenerationJob::OnEvent(size_t prompt_idx, const TokenEvent& e) {
  if (e.prompt_logprobs) OnPromptLogprobs(prompt_idx, *e.prompt_logprobs);
  Sample& s = samples_[prompt_idx * prepared_.n + e.sample_index];
  if (s.done) return;  // stopped by a stop string; the engine may still be producing
  if (e.token_id >= 0) {
    if (!saw_first_token_) {
      saw_first_token_ = true;
      metrics_->ObserveTimeToFirstToken(double(e.time_ns - arrival_ns_) * 1e-9);
    }
    if (s.last_token_ns > 0) metrics_->ObserveInterTokenLatency(double(e.time_ns - s.last_token_ns) * 1e-9);
    s.last_token_ns = e.time_ns;
    ++s.num_tokens;
    // A stop id (EOS, a request stop id): counted, never shown.
    const bool is_stop_token = e.stop_token;
    if (!is_stop_token) {
      if (prepared_.top_logprobs >= 0) {
        TokenLogprobEntry entry = MakeLogprob(e);
        entry.text_offset = s.logprob_offset;
        s.logprob_offset += static_cast<int64_t>(entry.token.size());
        s.logprobs.push_back(entry);
        s.unsent_logprobs.push_back(std::move(entry));
      }
      TextDelta delta = s.text->Push(e.token_id);
      AppendText(s, delta.text);
      if (s.done) return;  // its first tool call ended it (parallel_tool_calls false)
      if (delta.stopped) {
        FinishSample(s, "stop");
        return;
      }
    }
  }
  switch (e.finish) {
    case FinishReason::kNone: break;
    case FinishReason::kStop: FinishSample(s, "stop"); break;
    case FinishReason::kLength: FinishSample(s, "length"); break;
    case FinishReason::kCancelled:
      FinishSample(s, "abort");
      if (!cancelled_by_client_ && !error_)
        error_ = ApiError{503, "the request was cancelled: the server is shutting down",
                          "server_error", "", "shutting_down"};
      break;
    case FinishReason::kError:
      FinishSample(s, "error");
      if (!error_)
        error_ = ApiError{500, "the engine failed while generating (see the server log)",
                          "server_error", "", "engine_error"};
      break;
  }
}

void GenerationJob::Pump(std::chrono::milliseconds wait) {
  size_t num_open = 0;
  for (const PromptRun& p : prompts_) num_open += p.closed ? 0 : 1;
  if (num_open == 0) return;
  // A zero wait never blocks (event-driven callers poll when woken).
  const auto per_stream = wait.count() == 0
                              ? wait
                              : std::max(std::chrono::milliseconds(1),
                                         wait / static_cast<int64_t>(num_open));
  std::vector<TokenEvent> events;
  for (size_t p = 0; p < prompts_.size(); ++p) {
    PromptRun& run = prompts_[p];
    if (run.closed) continue;
    events.clear();
    if (!run.stream->Next(&events, per_stream)) run.closed = true;
    for (const TokenEvent& e : events) OnEvent(p, e);
    // Every sample of this prompt stopped on a stop string: free the engine's work now.
    bool all_done = true;
    for (int32_t i = 0; i < prepared_.n; ++i) all_done &= samples_[p * prepared_.n + i].done;
    if (all_done && !run.closed && !run.cancel_sent) {
      run.cancel_sent = true;
      run.stream->Cancel();
    }
  }
  bool all_closed = true;
  for (const PromptRun& p : prompts_) all_closed &= p.closed;
  if (all_closed && !finished_) OnAllClosed();
}

void GenerationJob::OnAllClosed() {
  finished_ = true;
  // Sample 0's first event carries its prompt's logprobs; only a failed or cancelled request
  // (which answers with its error) ends without them.
  const bool wants_prompt_logprobs = prepared_.echo_logprobs || prepared_.prompt_logprobs >= 0;
  for (const PromptRun& p : prompts_) {
    if (wants_prompt_logprobs && !p.got_prompt_logprobs && !error_ && !cancelled_by_client_)
      error_ = ApiError{500, "the engine ended the request without its prompt logprobs",
                        "server_error", "", "engine_error"};
  }
  for (Sample& s : samples_) FinishSample(s, "abort");  // only samples the engine never ended
  const Usage usage = TotalUsage();
  metrics_->CountTokens(usage.prompt_tokens, usage.completion_tokens);
  metrics_->ObserveRequestLatency(double(NowNs() - arrival_ns_) * 1e-9);
}

Usage GenerationJob::TotalUsage() const {
  Usage u;
  for (const PromptRun& p : prompts_) {
    u.prompt_tokens += p.prompt_tokens;
    const RequestUsage engine_usage = p.stream->usage();
    u.cached_tokens += engine_usage.cached_tokens;
    u.speculative = u.speculative || engine_usage.speculative;
    u.accepted_prediction_tokens += engine_usage.accepted_prediction_tokens;
    u.rejected_prediction_tokens += engine_usage.rejected_prediction_tokens;
    u.jump_forward = u.jump_forward || engine_usage.jump_forward;
    u.forced_tokens += engine_usage.forced_tokens;
  }
  for (const Sample& s : samples_) u.completion_tokens += s.num_tokens;
  return u;
}

bool GenerationJob::PollUntilDone(std::chrono::milliseconds wait) {
  Pump(wait);
  return finished_;
}

std::variant<nlohmann::json, ApiError> GenerationJob::Result() const {
  if (error_) return *error_;
  std::vector<ChoiceOutput> choices;
  for (const Sample& s : samples_) {
    ChoiceOutput c;
    c.index = s.choice_index;
    c.text = s.full_text;
    c.with_logprobs = prepared_.top_logprobs >= 0;
    c.logprobs = s.logprobs;
    c.finish_reason = s.finish_reason;
    c.tool_calls = s.tool_calls;
    c.reasoning = s.reasoning;
    c.prompt_logprobs =
        prompts_[static_cast<size_t>(s.choice_index / prepared_.n)].vllm_prompt_logprobs;
    choices.push_back(std::move(c));
  }
  return FinalBody(meta_, choices, TotalUsage());
}

const std::string& GenerationJob::stop_string(int32_t index) const {
  return samples_.at(static_cast<size_t>(index)).text->stop_string();
}

bool GenerationJob::PollStream(std::chrono::milliseconds wait, std::string* out) {
  std::vector<nlohmann::json> chunks;
  const bool more = PollChunks(wait, &chunks);
  for (const nlohmann::json& chunk : chunks) *out += SseEvent(chunk);
  if (more) return true;
  if (error_) *out += SseEvent(error_->ToJson());
  *out += kSseDone;
  return false;
}

bool GenerationJob::PollChunks(std::chrono::milliseconds wait, std::vector<nlohmann::json>* out) {
  const bool usage_null = prepared_.include_usage;
  if (!started_stream_) {
    started_stream_ = true;
    if (prepared_.endpoint == Endpoint::kChat) {
      for (const Sample& s : samples_) out->push_back(RoleChunkBody(meta_, s.choice_index, usage_null));
    }
  }
  if (!finished_) Pump(wait);
  const bool with_logprobs = prepared_.top_logprobs >= 0;
  for (Sample& s : samples_) {
    if (s.awaits_prompt_logprobs) continue;  // (an error ends the stream without them)
    if (!s.unsent_text.empty() || !s.unsent_logprobs.empty() || !s.unsent_tool_calls.empty() ||
        !s.unsent_reasoning.empty()) {
      ChoiceOutput c;
      c.index = s.choice_index;
      c.text = std::move(s.unsent_text);
      c.reasoning = std::move(s.unsent_reasoning);
      s.unsent_reasoning.clear();
      c.tool_calls = std::move(s.unsent_tool_calls);
      s.unsent_tool_calls.clear();
      c.with_logprobs = with_logprobs;
      c.logprobs = std::move(s.unsent_logprobs);
      s.unsent_text.clear();
      s.unsent_logprobs.clear();
      out->push_back(ChunkBody(meta_, c, usage_null));
    }
    if (s.done && !s.finish_sent && !error_) {
      s.finish_sent = true;
      ChoiceOutput c;
      c.index = s.choice_index;
      c.with_logprobs = false;
      c.finish_reason = s.finish_reason;
      out->push_back(ChunkBody(meta_, c, usage_null));
    }
  }
  if (!finished_) return true;
  if (!error_ && prepared_.include_usage) out->push_back(UsageChunkBody(meta_, TotalUsage()));
  return false;
}

}  // namespace ember::serve
