// GenerationJob: one HTTP request's generation in flight. It submits each prompt to the engine,
// reads TokenEvents from the ResponseStreams, turns each sample's tokens into text through a
// TextStream (stop strings never leak, UTF-8 never split), splits chat replies into reasoning,
// content and tool calls (reasoning.h, tool_calls.h, or harmony.h), collects logprobs and usage, and
// renders either streaming SSE chunks or the final response body (openai_response.h).
// A sample that hits a stop string stops consuming; when every sample of a prompt is done the
// engine request is cancelled so its KV blocks are freed. Destroying an unfinished job cancels
// it (client disconnect). Not thread-safe: one HTTP thread drives a job.
#pragma once

#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/response_stream.h"
#include "serve/api_error.h"
#include "serve/harmony.h"
#include "serve/metrics.h"
#include "serve/openai_response.h"
#include "serve/request_builder.h"
#include "serve/reasoning.h"
#include "serve/text_stream.h"
#include "serve/tool_calls.h"

namespace ember::serve {

class GenerationJob {
 public:
  // Submits every prompt; on a refusal (400 / 429 / 503) nothing stays submitted.
  static std::variant<std::unique_ptr<GenerationJob>, ApiError> Start(
      const ServedModel& model, PreparedRequest prepared, Metrics* metrics, int64_t arrival_ns);
  ~GenerationJob();
  GenerationJob(const GenerationJob&) = delete;
  GenerationJob& operator=(const GenerationJob&) = delete;

  bool stream() const { return prepared_.stream; }
  bool done() const;

  // Streaming: waits up to `wait` for tokens and appends the SSE events now ready to *out.
  // Returns false once the response is complete ("data: [DONE]" is then the last event).
  bool PollStream(std::chrono::milliseconds wait, std::string* out);
  // Streaming, for a consumer that shapes the events itself (another API's dialect): appends the
  // chat.completion.chunk bodies now ready (PollStream's events, unframed; the usage chunk with
  // include_usage; never the error or [DONE]) to *chunks. Returns false once complete; error()
  // then says whether the request failed.
  bool PollChunks(std::chrono::milliseconds wait, std::vector<nlohmann::json>* chunks);
  // Once done(): the error the request ended with (nullopt when it succeeded).
  const std::optional<ApiError>& error() const { return error_; }
  // The stop string that ended choice `index` ("" when none did: EOS, length, a tool call).
  const std::string& stop_string(int32_t index) const;
  // Non-streaming: waits up to `wait` for tokens; returns true once every sample is finished.
  bool PollUntilDone(std::chrono::milliseconds wait);
  // After PollUntilDone returned true: the response body, or the error to answer with.
  std::variant<nlohmann::json, ApiError> Result() const;

  // Stops generation now (client went away). Idempotent.
  void Cancel();
  // Event-driven consumers: `notify` runs (on the engine thread; it must only post work) whenever
  // one of the job's engine streams has events or closes; poll with a zero wait then.
  void SetNotify(const std::function<void()>& notify);
  // Tokens so far (final once done()).
  Usage usage() const { return TotalUsage(); }

 private:
  struct Sample {
    int32_t choice_index = 0;
    std::unique_ptr<TextStream> text;
    std::unique_ptr<ReasoningParser> reasoning_parser;  // chat, thinking model: <think> blocks
    std::unique_ptr<ToolCallParser> tool_parser;  // chat with tools: calls out of the text
    std::unique_ptr<HarmonyParser> harmony_parser;  // chat, harmony model: instead of the two
    std::string reasoning, unsent_reasoning;
    std::string full_text;                   // everything released so far (with echo)
    std::string unsent_text;                 // streaming: released but not yet sent
    std::vector<TokenLogprobEntry> logprobs, unsent_logprobs;
    int64_t logprob_offset = 0;  // text_offset of the next generated token's entry
    // Echo with logprobs: nothing is streamed until the prompt's entries arrived (they lead the
    // first chunk, with the echoed text).
    bool awaits_prompt_logprobs = false;
    std::vector<ToolCall> tool_calls, unsent_tool_calls;
    int32_t num_tokens = 0;
    int64_t last_token_ns = 0;
    bool done = false;
    bool finish_sent = false;
    std::string finish_reason;
  };
  struct PromptRun {
    std::shared_ptr<ResponseStream> stream;
    int32_t prompt_tokens = 0;
    bool closed = false;
    bool cancel_sent = false;
    bool got_prompt_logprobs = false;
    std::optional<nlohmann::json> vllm_prompt_logprobs;  // prompt_logprobs asked (vLLM's field)
  };

  GenerationJob(const ServedModel& model, PreparedRequest prepared, Metrics* metrics,
                int64_t arrival_ns);
  void Pump(std::chrono::milliseconds wait);
  void OnEvent(size_t prompt_idx, const TokenEvent& event);
  // The prompt's logprobs (sample 0's first event): vLLM's list, and the echo's entries at the
  // front of each of the prompt's samples' logprobs.
  void OnPromptLogprobs(size_t prompt_idx, const std::vector<PromptLogprob>& logprobs);
  void FinishSample(Sample& sample, const std::string& reason);
  TokenLogprobEntry MakeLogprob(const TokenEvent& event) const;
  void AppendText(Sample& sample, const std::string& text);
  void AppendReasoning(Sample& sample, const ReasoningDelta& delta);
  void AppendHarmony(Sample& sample, HarmonyDelta delta);
  void AppendContent(Sample& sample, const std::string& text);
  void AppendDelta(Sample& sample, ToolCallDelta delta);
  // AppendDelta of a tool-call-parsing parser's output; ends the sample at its first call when
  // parallel_tool_calls is false.
  void AppendParsed(Sample& sample, ToolCallDelta delta);
  void OnAllClosed();
  Usage TotalUsage() const;

  const ServedModel& model_;
  PreparedRequest prepared_;
  Metrics* metrics_;
  const int64_t arrival_ns_;
  ResponseMeta meta_;
  std::vector<PromptRun> prompts_;
  std::vector<Sample> samples_;  // [num_prompts * n], choice index order
  std::optional<ApiError> error_;
  bool saw_first_token_ = false;
  bool started_stream_ = false;
  bool finished_ = false;        // all streams closed and accounted
  bool cancelled_by_client_ = false;
};

}  // namespace ember::serve
