// Engine: owns the scheduler, the KV bookkeeping and the step loop on ONE engine thread; callers
// on any thread Submit() requests and read tokens from the returned ResponseStream. A step passes
// three seams: the StepBuilder decides its rows (step_builder.h), the ModelRunner runs them
// (model_runner.h), the StepPostprocessor accepts their tokens (step_postprocessor.h). With
// overlapped steps (EngineConfig::overlap_steps) step N + 1 is built and launched before step N
// is completed (Engine::Loop shows both). Requests are validated up front against the limits
// (engine_limits.h): one that can never run is refused with the numbers instead of failing later.
// Submit/Stats/Shutdown are thread-safe; everything else is the engine thread's. The state they
// share with the engine thread is GUARDED_BY(mu_) (checked by clang -Wthread-safety).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "engine/adapter_registry.h"
#include "engine/engine_config.h"
#include "engine/engine_limits.h"
#include "engine/live_sequences.h"
#include "engine/model_runner.h"
#include "engine/prompt_tier.h"
#include "engine/request.h"
#include "engine/response_stream.h"
#include "engine/scheduler.h"
#include "engine/speculator.h"
#include "engine/state_slots.h"
#include "engine/step_builder.h"
#include "engine/step_postprocessor.h"
#include "kv/kv_cache_manager.h"
#include "kv/state_checkpoints.h"
#include "model/model.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace ember {

class Engine {
 public:
  // `model` must outlive the engine. Allocates the KV pool and starts the engine thread.
  // `draft_source` (tests): speculate with this source instead of config.speculation's method.
  static Result<std::unique_ptr<Engine>> Create(Model* model, const EngineConfig& config,
                                                std::unique_ptr<DraftSource> draft_source = {});
  ~Engine();  // Shutdown(/*drain=*/false)
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  using SubmitResult = std::variant<std::shared_ptr<ResponseStream>, SubmitError>;
  SubmitResult Submit(GenerationRequest request) EXCLUDES(mu_);

  // Stops accepting; drain=true finishes in-flight requests, false cancels them. Joins the thread.
  void Shutdown(bool drain) EXCLUDES(mu_);

  EngineStats Stats() const EXCLUDES(mu_);

  // Drops cached prompt KV (POST /v1/cache/clear): of every namespace (nullopt), or of the
  // namespace of requests with this cache_salt. The RAM and disk tiers' records go at once
  // (returned: how many); the pool's cached blocks before the engine's next step. Any thread.
  PromptCacheCleared ClearPromptCache(std::optional<std::string> cache_salt) EXCLUDES(mu_);
  // The prefix-cache namespace of a request with this namespace and cache_salt (Submit applies
  // it): `ns` itself without a salt, else a 64-bit digest of both.
  static uint64_t CacheNamespaceOf(uint64_t ns, const std::string& cache_salt);
  // The prefix-cache namespace of a request under the LoRA adapter of this digest (Submit
  // applies it before the salt): blocks computed under one adapter never serve another.
  static uint64_t AdapterNamespaceOf(uint64_t ns, uint64_t adapter_digest);
  // The LoRA adapters by name (null when EngineConfig::max_loras is 0). Thread-safe.
  AdapterRegistry* adapters() const { return adapters_.get(); }
  // A prompt cache below the pool (--prompt-cache-ram-bytes or --prompt-cache-dir).
  bool has_prompt_cache_tiers() const { return tier_ != nullptr; }
  int32_t context_length() const { return context_length_; }
  int64_t kv_capacity_tokens() const { return int64_t{num_blocks_} * config_.block_size; }
  int64_t kv_cache_bytes() const { return kv_cache_bytes_; }
  // The limits in force (a config's 0s resolved by ResolveEngineLimits).
  int32_t max_running() const { return config_.max_running; }
  int32_t max_step_tokens() const { return config_.max_step_tokens; }
  int32_t max_loras() const { return config_.max_loras; }  // 0: LoRA off
  int32_t vocab_size() const { return vocab_size_; }
  const Model& model() const { return *model_; }

 private:
  Engine(Model* model, const EngineSizing& sizing, ModelRunner runner,
         std::unique_ptr<DraftSource> draft_source);
  // Before Start: the prompt cache's tiers below the pool (none when both stores are null).
  void AttachPromptCache(const PromptTierShape& shape, std::unique_ptr<prompt_cache::RamStore> ram,
                         std::unique_ptr<prompt_cache::DiskStore> disk,
                         std::unique_ptr<StateTier> states);
  void Start() EXCLUDES(mu_);  // publishes the first stats and starts the engine thread
  RequestLimits Limits() const;
  void Loop();
  // Waits while there is nothing to do, takes the inbox, ends cancelled sequences. False: stop.
  bool TakeWork() EXCLUDES(mu_);
  // True when the engine thread has something to take: a new request or a stop.
  bool HasIncoming() const REQUIRES(mu_) {
    return !inbox_.empty() || stopping_ || !pool_clears_.empty();
  }
  // Schedules the next step; on an empty plan finishes what is in flight (or waits a little).
  std::optional<StepPlan> ScheduleStep() EXCLUDES(mu_);
  bool Launch(StepBatch& step);  // false: the launch failed and the step was failed
  void CompleteInFlight();
  // Gives the incoming requests (after those still waiting for a LoRA slot) their adapter's
  // slot; those whose adapter finds no free slot, or is still being read (LoraSet::Prepared),
  // wait in lora_waiting_, in order.
  std::vector<std::shared_ptr<RequestState>> TakeLoraSlots(
      std::deque<std::shared_ptr<RequestState>> incoming);
  // Publishes the step's counters for Stats(), then closes the streams of requests that ended.
  void PublishStatsAndCloseStreams() EXCLUDES(mu_);

  Model* model_;
  const EngineConfig config_;
  const int32_t num_blocks_;
  const int64_t kv_cache_bytes_;
  const int32_t context_length_;
  const int32_t vocab_size_;

  // Engine-thread state, deliberately not GUARDED_BY: no lock, only the engine thread touches it
  // once the thread started (the constructor sets it up before starting the thread).
  EngineStats counters_;  // running totals; each seam adds its own (see their constructors)
  kv::KvCacheManager kv_;
  Scheduler scheduler_;
  ModelRunner runner_;
  Speculator speculator_;
  LiveSequences sequences_;
  // The step's helper threads (masks, jump-forward chains): half the host's cores, started once.
  WorkerPool helpers_;
  StepBuilder builder_;
  StepPostprocessor postprocessor_;
  std::unique_ptr<PromptTier> tier_;    // RAM and/or disk tiers below the pool, or null
  // A model with recurrent layers (qwen3_next): one state slot per started sequence; else null.
  std::unique_ptr<StateSlots> state_slots_;
  // Its recurrent-state checkpoints (prefix caching for such a model), or null.
  std::unique_ptr<kv::StateCheckpoints> checkpoints_;
  std::optional<StepBatch> in_flight_;  // a deferred step whose ids are not read yet
  std::deque<std::shared_ptr<RequestState>> lora_waiting_;  // no LoRA slot free yet
  std::unique_ptr<AdapterRegistry> adapters_;  // null: LoRA off

  // Shared with callers: mu_ guards the members marked GUARDED_BY(mu_); cv_ (with mu_) wakes the
  // engine thread for new requests and Shutdown. num_queued_ is an atomic: Submit reads it under
  // mu_, the engine thread decrements it without (LiveSequences holds a pointer to it).
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::shared_ptr<RequestState>> inbox_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  bool drain_ GUARDED_BY(mu_) = true;
  uint64_t next_request_id_ GUARDED_BY(mu_) = 1;
  std::atomic<int32_t> num_queued_{0};
  EngineStats published_ GUARDED_BY(mu_);  // snapshot for Stats()
  // ClearPromptCache's requests for the pool (nullopt: every namespace), applied by TakeWork.
  std::vector<std::optional<uint64_t>> pool_clears_ GUARDED_BY(mu_);
  // Started by the constructor, joined by Shutdown (callers must not race Shutdown with ~Engine).
  std::thread thread_;
};

}  // namespace ember
