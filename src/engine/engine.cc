#include "engine/engine.h"

#include <chrono>

#include "engine/clock.h"
#include "util/log.h"

namespace ember {

Result<std::unique_ptr<Engine>> Engine::Create(Model* model, const EngineConfig& requested,
                                               std::unique_ptr<DraftSource> draft_source) {
  if (draft_source == nullptr) {
    EMBER_ASSIGN_OR_RETURN(draft_source, CreateDraftSource(requested.speculation));
  }
  EMBER_ASSIGN_OR_RETURN(const EngineSizing sizing, SizeEngine(*model, requested));
  EMBER_ASSIGN_OR_RETURN(ModelRunner runner,
                         ModelRunner::Create(model, sizing.config, sizing.num_blocks));
  return std::unique_ptr<Engine>(
      new Engine(model, sizing, std::move(runner), std::move(draft_source)));
}

Engine::Engine(Model* model, const EngineSizing& sizing, ModelRunner runner,
               std::unique_ptr<DraftSource> draft_source)
    : model_(model),
      config_(sizing.config),
      num_blocks_(sizing.num_blocks),
      kv_cache_bytes_(sizing.kv_cache_bytes),
      context_length_(sizing.config.max_model_len),
      vocab_size_(model->config().vocab_size),
      kv_(kv::KvCacheConfig{config_.block_size, num_blocks_, config_.enable_prefix_caching}),
      scheduler_(SchedulerConfig{config_.max_running, config_.max_step_tokens,
                                 PromptLogitsRows(config_, vocab_size_)},
                 &kv_),
      runner_(std::move(runner)),
      speculator_(config_.speculation, std::move(draft_source), &counters_),
      sequences_(&scheduler_, &num_queued_, &counters_,
                 speculator_.enabled() ? config_.speculation.num_spec_tokens : 0),
      builder_(config_, &runner_, &kv_, &counters_),
      postprocessor_(&runner_, &kv_, &sequences_, &speculator_, &counters_) {
  counters_.kv_blocks_total = num_blocks_;
  counters_.block_size = config_.block_size;
  published_ = counters_;
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() {
  Shutdown(/*drain=*/false);
}

void Engine::Shutdown(bool drain) {
  {
    MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      drain_ = drain;
    } else if (!drain) {
      drain_ = false;
    }
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

RequestLimits Engine::Limits() const {
  return RequestLimits{vocab_size_, context_length_, kv_capacity_tokens(), config_.max_n};
}

Engine::SubmitResult Engine::Submit(GenerationRequest request) {
  if (auto error = ValidateRequest(request, Limits())) return *error;
  auto state = std::make_shared<RequestState>();
  state->stream = std::make_shared<ResponseStream>(request.n);
  state->stop_ids = request.stop_token_ids;
  if (!request.ignore_eos) {
    for (int32_t id : model_->generation_defaults().eos_token_ids) state->stop_ids.push_back(id);
  }
  state->num_unfinished = request.n;
  state->usage.prompt_tokens = static_cast<int32_t>(request.prompt_ids.size());
  state->request = std::move(request);
  {
    MutexLock lock(&mu_);
    if (stopping_) {
      return SubmitError{SubmitError::Code::kShuttingDown, "the server is shutting down", ""};
    }
    if (num_queued_.load() >= config_.max_queue) {
      return SubmitError{
          SubmitError::Code::kQueueFull,
          "too many requests are waiting (" + std::to_string(config_.max_queue) + "); retry later",
          ""};
    }
    state->request_id = next_request_id_++;
    num_queued_.fetch_add(1);
    inbox_.push_back(state);
  }
  cv_.NotifyAll();
  return state->stream;
}

EngineStats Engine::Stats() const {
  MutexLock lock(&mu_);
  EngineStats s = published_;
  s.num_queued = num_queued_.load();
  return s;
}

// The step pipeline. Each iteration: schedule; build step N + 1; launch it; complete step N (the
// deferred step in flight) while N + 1 computes; keep N + 1 in flight if it is deferred, else
// complete it now. A step that is not deferred needs step N's tokens before its row outputs are
// decided (its processors, masks and draws read them), so step N completes first; its rows
// already in the batch take step N's ids as fed tokens either way. Before scheduling, the
// speculator proposes drafts for the running sequences whose tokens are all known.
void Engine::Loop() {
  while (TakeWork()) {
    speculator_.Propose(scheduler_.running());
    std::optional<StepPlan> plan = ScheduleStep();
    if (!plan) continue;
    StepBatch next = builder_.Build(*plan);
    if (!next.deferred) CompleteInFlight();
    builder_.DecideRowOutputs(next);
    if (Launch(next)) {
      CompleteInFlight();  // step N, while step N + 1 computes
      if (next.deferred) {
        in_flight_ = std::move(next);
      } else {
        postprocessor_.Complete(next);
      }
    }
    PublishStatsAndCloseStreams();
  }
}

bool Engine::TakeWork() {
  bool stop_now = false;
  std::deque<std::shared_ptr<RequestState>> incoming;
  {
    MutexLock lock(&mu_);
    if (sequences_.empty() && !in_flight_) {
      cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return HasIncoming(); });
    }
    if (stopping_ && (!drain_ || (sequences_.empty() && inbox_.empty()))) stop_now = true;
    incoming.swap(inbox_);
  }
  for (const std::shared_ptr<RequestState>& state : incoming) sequences_.Add(state);
  if (stop_now) sequences_.CancelAll();
  sequences_.ReapCancelled();
  if (!stop_now) return true;
  CompleteInFlight();
  PublishStatsAndCloseStreams();
  return false;
}

std::optional<StepPlan> Engine::ScheduleStep() {
  const int64_t schedule_start = NowNs();
  StepPlan plan = scheduler_.Schedule();
  counters_.schedule_ns += NowNs() - schedule_start;
  if (!plan.empty()) return plan;
  if (in_flight_) {
    // Nothing to add behind the step in flight (its sequences are on their last tokens).
    CompleteInFlight();
    PublishStatsAndCloseStreams();
    return std::nullopt;
  }
  // Nothing fits right now (cannot last: admission guarantees a lone sequence fits).
  PublishStatsAndCloseStreams();
  MutexLock lock(&mu_);
  cv_.WaitFor(&mu_, std::chrono::milliseconds(5));
  return std::nullopt;
}

bool Engine::Launch(StepBatch& step) {
  Status st = runner_.Launch(step.batch, step.outputs(), step.decode_only);
  if (!st.ok()) {
    LOG_ERROR << "forward step failed: " << st.message();
    CompleteInFlight();
    postprocessor_.Fail(step);
    return false;
  }
  postprocessor_.Launched(step);
  return true;
}

void Engine::CompleteInFlight() {
  if (!in_flight_) return;
  StepBatch step = std::move(*in_flight_);
  in_flight_.reset();
  postprocessor_.Complete(step);
}

void Engine::PublishStatsAndCloseStreams() {
  const ModelRunner::Counters& run = runner_.counters();
  counters_.steps = run.steps;
  counters_.computed_tokens = run.computed_tokens;
  counters_.forward_ns = run.forward_ns;
  counters_.decode_forward_ns = run.decode_forward_ns;
  counters_.overlapped_steps = run.overlapped_steps;
  counters_.preemptions = scheduler_.num_preemptions();
  counters_.num_running = static_cast<int32_t>(scheduler_.running().size());
  counters_.kv_blocks_used = kv_.NumUsedBlocks();
  counters_.kv_blocks_cached = kv_.NumCachedBlocks();
  counters_.prefix_query_tokens = scheduler_.prefix_query_tokens();
  counters_.prefix_hit_tokens = scheduler_.prefix_hit_tokens();
  {
    MutexLock lock(&mu_);
    published_ = counters_;
  }
  // A caller that sees its stream end also sees Stats() that include its request.
  sequences_.CloseEndedStreams();
}

}  // namespace ember
