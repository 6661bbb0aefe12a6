// Engine: owns the scheduler, the KV bookkeeping and the step loop on ONE engine thread; callers
// on any thread Submit() requests and read tokens from the returned ResponseStream. Each step is
// schedule -> forward -> sample/postprocess; with overlapped steps (EngineConfig::overlap_steps)
// step N + 1 is scheduled and launched before step N's tokens are read and streamed. Requests are validated up front (lengths against the
// context and the KV capacity, sampling parameters): a request that can never run is refused with
// the numbers instead of failing later. Submit/Stats/Shutdown are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "engine/request.h"
#include "engine/response_stream.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "kv/kv_cache_manager.h"
#include "model/model.h"

namespace ember {

struct EngineConfig {
  // 0 in either of the two limits below: the device's default (ResolveEngineLimits).
  int32_t max_running = 64;          // sequences decoded together (--max-batch)
  int32_t max_step_tokens = 512;     // rows per forward step; longer prompts prefill in chunks
  int64_t kv_cache_bytes = 0;        // KV pool cap (--kv-cache-bytes); 0: DefaultKvCacheBytes()
  double gpu_memory_fraction = 0.9;  // of a GPU's memory this process may use (weights + KV + work)
  int32_t block_size = 16;
  int32_t max_queue = 1024;  // requests waiting for admission before Submit says kQueueFull
  bool enable_prefix_caching = true;
  int32_t max_n = 16;  // largest `n` accepted
  // Sampled rows without logits processors: drawn by the backend (Backend::SampleRows) when it
  // prefers that (a GPU), or always (tests of the CPU twin), else by the host sampler.
  enum class BackendSampling { kAuto, kAlways } backend_sampling = BackendSampling::kAuto;
  // Overlapped steps: when every row's token is made by the backend from state the host already
  // has (greedy or backend-sampled, no penalties, min_tokens reached, no logprobs), a step is
  // launched before the previous step's ids are read: its decode rows take those ids as fed
  // tokens, and the host's bookkeeping of step N runs while step N + 1 computes. A sequence that
  // stops at step N has one wasted row in step N + 1. Outputs are identical either way.
  bool overlap_steps = true;
  // Prompt logprobs keep the float32 logits of every prompt row of such a request: one step holds
  // at most this many bytes of them (PromptLogitsRows), so a long prompt prefills in more, shorter
  // steps instead of holding gigabytes of logits (a 150k vocabulary is 600 KB a row).
  int64_t prompt_logits_bytes = int64_t{64} << 20;
};

struct EngineStats {
  int64_t requests_submitted = 0, requests_finished = 0, requests_cancelled = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t computed_tokens = 0;  // rows run through the model
  int64_t steps = 0, preemptions = 0;
  int32_t num_queued = 0;   // requests not yet admitted
  int32_t num_running = 0;  // sequences in the running batch
  int32_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0, block_size = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  // Engine-thread wall time, summed over steps: scheduling, the model forward (recording and
  // launching the step, waiting for its outputs) and the rest of the step (host sampling, token
  // bookkeeping, prefix-cache commits, streaming the events).
  int64_t schedule_ns = 0, forward_ns = 0, finish_ns = 0;
  // The steps whose rows are all decode rows (one new token per sequence): count, rows, forward,
  // and the padding rows added to reach a graph bucket (Backend::DecodeGraphBuckets).
  int64_t decode_steps = 0, decode_rows = 0, decode_forward_ns = 0, decode_padding_rows = 0;
  // Steps launched before the previous step's ids were read (EngineConfig::overlap_steps).
  int64_t overlapped_steps = 0;
};

class Engine {
 public:
  // `model` must outlive the engine. Allocates the KV pool and starts the engine thread.
  static Result<std::unique_ptr<Engine>> Create(Model* model, const EngineConfig& config);
  ~Engine();  // Shutdown(/*drain=*/false)
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  using SubmitResult = std::variant<std::shared_ptr<ResponseStream>, SubmitError>;
  SubmitResult Submit(GenerationRequest request);

  // Stops accepting; drain=true finishes in-flight requests, false cancels them. Joins the thread.
  void Shutdown(bool drain);

  EngineStats Stats() const;
  int32_t context_length() const { return context_length_; }
  int64_t kv_capacity_tokens() const { return int64_t{num_blocks_} * config_.block_size; }
  int64_t kv_cache_bytes() const { return kv_cache_bytes_; }
  // The limits in force (a config's 0s resolved by ResolveEngineLimits).
  int32_t max_running() const { return config_.max_running; }
  int32_t max_step_tokens() const { return config_.max_step_tokens; }
  int32_t vocab_size() const { return vocab_size_; }
  const Model& model() const { return *model_; }

 private:
  Engine(Model* model, const EngineConfig& config, int32_t num_blocks, int64_t kv_bytes,
         std::vector<int32_t> graph_buckets);
  std::optional<SubmitError> Validate(const GenerationRequest& request) const;
  void Loop();
  void TakeInbox();
  void ReapCancelled();
  // A launched step: what completing it needs.
  struct LaunchedStep {
    std::vector<ScheduledSequence> scheduled;
    std::vector<int32_t> computed_end;  // [scheduled] num_computed_tokens after the step
    std::vector<int32_t> token_index;   // [scheduled] its placeholder in tokens, or -1
    std::vector<RowOutput> kinds;       // [rows]
    std::vector<int32_t> ids;           // [rows] tokens of kArgmax/kSample rows
    std::span<float> logits;            // kCopy rows (never in a deferred step)
    int32_t real_rows = 0;
    bool decode_only = false;
    bool deferred = false;  // ids arrive through Model::WaitIds
    // Constrained rows (never in a deferred step): their masks, built before the launch (a
    // mask depends only on the tokens already accepted).
    std::vector<TokenMask> masks;             // one per constrained row
    std::vector<const TokenMask*> row_masks;  // [rows] the host applies it; null: none (or the
                                              // backend applies it as edits)
    // Prompt-logprobs rows (never in a deferred step): per sequence that needs them, positions
    // [first_pos, first_pos + num_rows), whose logits are the kCopy logits rows from first_row on
    // (after the sampled rows).
    struct PromptRows {
      size_t scheduled_index = 0;
      int32_t first_pos = 0, num_rows = 0, first_row = 0;
    };
    std::vector<PromptRows> prompt_rows;
  };
  // Builds and launches one step; completes it at once unless it is deferred (then it stays in
  // flight until the next step has launched).
  void RunStep(const StepPlan& plan);
  // Reads the step's tokens, commits its KV blocks, streams the tokens, ends finished sequences.
  void CompleteStep(LaunchedStep& step);
  void CompleteInFlight();
  void BuildMasks(const StepPlan& plan, LaunchedStep& step);
  // Adds the logits rows of the step's prompt-logprobs positions (LaunchedStep::prompt_rows).
  void AddPromptRows(const StepPlan& plan, BatchPlan& batch, LaunchedStep& step);
  // The prompt logprobs of a completed step's prompt rows, into their sequences.
  void ComputePromptLogprobs(const LaunchedStep& step);
  void FailStep(const LaunchedStep& step);
  void ReleaseStep(const LaunchedStep& step);  // the step no longer holds its sequences
  void FinishSequence(Sequence* seq, FinishReason reason);
  void EmitFinalEvent(Sequence* seq, FinishReason reason);
  // Publishes the step's counters for Stats(), then closes the streams of requests that ended.
  void PublishStatsAndCloseStreams();
  bool HasWork() const { return !live_.empty(); }

  Model* model_;
  const EngineConfig config_;
  const int32_t num_blocks_;
  const int64_t kv_cache_bytes_;
  const int32_t context_length_;
  const int32_t vocab_size_;

  // Engine-thread state.
  kv::KvCacheManager kv_;
  Scheduler scheduler_;
  std::unordered_map<kv::SeqId, std::unique_ptr<Sequence>> live_;
  kv::SeqId next_seq_id_ = 1;
  std::vector<RowSampling> row_sampling_;          // [rows] kSample rows' parameters and draw
  std::vector<uint8_t> host_skip_;                 // [rows] rows the host sampler leaves alone
  std::vector<const SamplingParams*> row_params_;  // [rows] of the step's sampling sequences
  std::vector<SamplerState*> row_states_;          // [rows]
  std::vector<SampleOutput> row_outputs_;          // [rows]
  // Decode steps are padded to these row counts (Backend::DecodeGraphBuckets); the padding rows
  // write their K/V to scratch_block_, a KV block no sequence owns.
  std::vector<int32_t> graph_buckets_;
  int32_t scratch_block_ = 0;
  std::optional<LaunchedStep> in_flight_;  // a deferred step whose ids are not read yet
  // Ended sequences that a step in flight still has rows of (destroyed once it completes).
  std::vector<std::unique_ptr<Sequence>> retired_;
  EngineStats counters_;                           // engine-thread running totals
  std::vector<std::shared_ptr<ResponseStream>> streams_to_close_;  // finished this step

  // Shared with callers.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<RequestState>> inbox_;
  bool stopping_ = false;
  bool drain_ = true;
  uint64_t next_request_id_ = 1;
  std::atomic<int32_t> num_queued_{0};
  EngineStats published_;  // snapshot for Stats()
  std::thread thread_;
};

// Default KV pool size when none is given: at most room for max_running full contexts; on a GPU
// what --gpu-memory-fraction of its memory leaves after the weights and a step's workspace
// (StepWorkspaceBytes; an error when nothing is left); on the CPU min(4 GiB, MemAvailable / 2).
Result<int64_t> DefaultKvCacheBytes(const Model& model, const EngineConfig& config);
int64_t StepWorkspaceBytes(const Model& model, const EngineConfig& config);
// The limits a config leaves at 0, by where the model runs. On a GPU: 256 sequences, and steps of
// 8,192 tokens, halved (to 512 at least) while a step's workspace would take more than a quarter
// of the memory --gpu-memory-fraction leaves after the weights (GpuStepTokens). On the CPU: 64
// and 512. A negative limit is an error naming its flag. (H200, 128 concurrent 512-token prompts
// with 128 tokens out: 256 / 8,192 made 5,730-5,749 output tok/s on an 8B and 29,355-29,516 on a
// 1B, against 4,452 and 20,907 with 64 / 512; docs/perf.md, session 27.)
Result<EngineConfig> ResolveEngineLimits(const Model& model, EngineConfig config);
// The largest of 8,192, 4,096, ..., 512 step tokens whose StepWorkspaceBytes (with the config's
// max_running) is at most `bytes`; 512 when none is.
int32_t GpuStepTokens(const Model& model, EngineConfig config, int64_t bytes);
// Rows of one step whose logits are kept for prompt logprobs: config.prompt_logits_bytes of
// float32 rows of `vocab_size` (64 MiB: 110 rows of a 152k vocabulary, 512 of a 32k one), at
// least 1, at most max_step_tokens.
int32_t PromptLogitsRows(const EngineConfig& config, int32_t vocab_size);

}  // namespace ember
