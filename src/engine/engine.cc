#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <tuple>

#include "engine/clock.h"
#include "model/lora_set.h"
#include "util/log.h"
#include "util/sha256.h"

namespace ember {

namespace {

// The prompt cache's stores for this model: RAM (--prompt-cache-ram-bytes) and disk
// (--prompt-cache-dir), either may be null. Opened after the KV pool is allocated: the block size
// and bytes per block are the pool's.
struct PromptCacheStores {
  PromptTierShape shape;
  std::unique_ptr<prompt_cache::RamStore> ram;
  std::unique_ptr<prompt_cache::DiskStore> disk;
  std::unique_ptr<StateTier> states;  // a hybrid model's checkpoints (engine/state_tier.h)
};

// The backend's page-locked memory for the RAM tier's KV records (Backend::AllocPinnedHost): the
// device copies blocks into and out of them without staging. The model outlives the engine.
class ModelPinnedAllocator final : public prompt_cache::PinnedAllocator {
 public:
  explicit ModelPinnedAllocator(Model* model) : model_(model) {}
  void* Allocate(size_t bytes) override { return model_->AllocPinnedHost(bytes); }
  void Free(void* p) override { model_->FreePinnedHost(p); }

 private:
  Model* model_;
};

// A hybrid model: the tiers keep its state checkpoints too, in a share of each tier's bytes
// (one checkpoint per --state-checkpoint-interval of blocks; 0, only at prompt ends: one per 32
// blocks assumed). `ram_bytes` and `disk_bytes` are the tiers' caps, lowered by that share.
Result<std::unique_ptr<StateTier>> OpenStateTier(const Model& model, const EngineSizing& sizing,
                                                 const std::string& flag,
                                                 const PromptTierShape& shape,
                                                 const std::string& fingerprint_text,
                                                 int64_t& ram_bytes, int64_t& disk_bytes) {
  const EngineConfig& config = sizing.config;
  if (sizing.num_state_checkpoints == 0)
    return Status::Error(flag + ": model_type " + model.config().model_type +
                         " has recurrent layers: its tiers keep the prefix cache's state "
                         "checkpoints, and none fits (raise --state-checkpoint-bytes)");
  StateTierConfig sc;
  sc.kv_fingerprint = shape.fingerprint;
  sc.kv_fingerprint_text = fingerprint_text;
  sc.block_size = config.block_size;
  sc.state_bytes = model.StateBytesPerSequence();
  const int64_t kv_record = prompt_cache::RecordBytes(config.block_size, shape.payload_bytes);
  const int64_t state_record = prompt_cache::RecordBytes(config.block_size, sc.state_bytes);
  const int64_t per = config.state_checkpoint_interval > 0
                          ? config.state_checkpoint_interval / config.block_size
                          : 32;
  for (auto [tier_bytes, share, name] :
       {std::tuple{&ram_bytes, &sc.ram_bytes, "--prompt-cache-ram-bytes"},
        std::tuple{&disk_bytes, &sc.disk_bytes, "--prompt-cache-disk-bytes"}}) {
    if (*tier_bytes <= 0) continue;
    *share = StateShareBytes(*tier_bytes, kv_record, state_record, per);
    if (*share == 0)
      return Status::Error(std::string(name) + " " + std::to_string(*tier_bytes) +
                           " holds no KV block and state checkpoint (" +
                           std::to_string(kv_record + state_record) + " bytes) of model_type " +
                           model.config().model_type);
    *tier_bytes -= *share;
  }
  sc.dir = config.prompt_cache.dir;
  sc.max_queue_bytes = config.prompt_cache.max_queue_bytes;
  return StateTier::Open(sc);
}

Result<PromptCacheStores> OpenPromptCacheStores(Model& model, const EngineSizing& sizing) {
  const EngineConfig& config = sizing.config;
  const int32_t num_blocks = sizing.num_blocks;
  const PromptCacheConfig& pc = config.prompt_cache;
  PromptCacheStores stores;
  if (pc.dir.empty() && pc.disk_bytes > 0)
    return Status::Error("--prompt-cache-disk-bytes: needs --prompt-cache-dir");
  if (pc.ram_bytes < 0) return Status::Error("--prompt-cache-ram-bytes: must be >= 0");
  if (pc.dir.empty() && pc.ram_bytes == 0) return stores;
  const std::string flag = pc.dir.empty() ? "--prompt-cache-ram-bytes" : "--prompt-cache-dir";
  if (!config.enable_prefix_caching)
    return Status::Error(flag + ": needs the prefix cache (drop --no-prefix-cache" +
                         (model.has_recurrent_state()
                              ? std::string("; a model with recurrent layers also needs room for a "
                                            "state checkpoint: --state-checkpoint-bytes)")
                              : std::string(")")));
  if (model.KvBlockBytes() <= 0)
    return Status::Error(flag + ": this backend cannot copy KV blocks to host memory");
  const std::string fingerprint_text =
      model.KvFingerprint() + "block_size " + std::to_string(config.block_size) +
      " record format " + std::to_string(prompt_cache::kFormatVersion) + "\n";
  stores.shape.fingerprint = Sha256Of(fingerprint_text);
  stores.shape.block_size = config.block_size;
  stores.shape.payload_bytes = model.KvBlockBytes();
  stores.shape.num_blocks = num_blocks;
  int64_t ram_bytes = pc.ram_bytes, disk_bytes = pc.dir.empty() ? 0 : pc.disk_bytes;
  // The KV records' memory (RAM tier, disk queue): page-locked where the backend has it.
  std::shared_ptr<prompt_cache::PinnedAllocator> pinned;
  if (model.HasPinnedHost()) pinned = std::make_shared<ModelPinnedAllocator>(&model);
  if (model.has_recurrent_state()) {
    EMBER_ASSIGN_OR_RETURN(stores.states, OpenStateTier(model, sizing, flag, stores.shape,
                                                        fingerprint_text, ram_bytes, disk_bytes));
  }
  if (pc.ram_bytes > 0) {
    prompt_cache::RamStoreConfig ram;
    ram.max_bytes = ram_bytes;
    ram.fingerprint = stores.shape.fingerprint;
    ram.block_size = config.block_size;
    ram.payload_bytes = model.KvBlockBytes();
    ram.pinned = pinned;
    if (prompt_cache::RecordBytes(ram.block_size, ram.payload_bytes) > ram.max_bytes)
      return Status::Error("--prompt-cache-ram-bytes: " + std::to_string(pc.ram_bytes) +
                           " holds no KV block (one takes " +
                           std::to_string(prompt_cache::RecordBytes(ram.block_size,
                                                                    ram.payload_bytes)) +
                           " bytes)");
    stores.ram = std::make_unique<prompt_cache::RamStore>(ram);
  }
  if (pc.dir.empty()) return stores;
  prompt_cache::DiskStoreConfig disk;
  disk.dir = pc.dir;
  disk.max_bytes = disk_bytes;
  disk.block_size = config.block_size;
  disk.payload_bytes = model.KvBlockBytes();
  disk.max_queue_bytes = pc.max_queue_bytes;
  disk.fingerprint_text = fingerprint_text;
  disk.pinned = pinned;
  disk.fingerprint = stores.shape.fingerprint;
  EMBER_ASSIGN_OR_RETURN(stores.disk, prompt_cache::DiskStore::Open(disk));
  return stores;
}

// Ends every sample of a request that never reached the scheduler (no token, `reason`).
void EndUnstarted(RequestState& state, FinishReason reason) {
  for (int32_t i = 0; i < state.request.n; ++i) {
    TokenEvent event;
    event.sample_index = i;
    event.finish = reason;
    state.stream->Push(std::move(event));
  }
  state.stream->SetUsage(state.usage);
  state.stream->Close();
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Create(Model* model, const EngineConfig& requested,
                                               std::unique_ptr<DraftSource> draft_source) {
  if (draft_source == nullptr) {
    EMBER_ASSIGN_OR_RETURN(draft_source, CreateDraftSource(requested.speculation));
  }
  if (requested.max_loras > 0 && model->lora() == nullptr) {
    EMBER_RETURN_IF_ERROR(model->EnableLora(requested.max_loras, requested.max_lora_rank));
  }
  EMBER_ASSIGN_OR_RETURN(const EngineSizing sizing, SizeEngine(*model, requested));
  EMBER_ASSIGN_OR_RETURN(ModelRunner runner,
                         ModelRunner::Create(model, sizing.config, sizing.num_blocks,
                                             sizing.num_state_checkpoints,
                                             sizing.num_spec_snapshot_slots));
  EMBER_ASSIGN_OR_RETURN(PromptCacheStores stores, OpenPromptCacheStores(*model, sizing));
  auto engine = std::unique_ptr<Engine>(
      new Engine(model, sizing, std::move(runner), std::move(draft_source)));
  engine->AttachPromptCache(stores.shape, std::move(stores.ram), std::move(stores.disk),
                            std::move(stores.states));
  engine->Start();
  return engine;
}

uint64_t Engine::CacheNamespaceOf(uint64_t ns, const std::string& cache_salt) {
  if (cache_salt.empty()) return ns;
  const Sha256Digest d = Sha256().UpdateU64(ns).Update(cache_salt).Finish();
  uint64_t out = 0;
  for (int i = 0; i < 8; ++i) out |= static_cast<uint64_t>(d[static_cast<size_t>(i)]) << (8 * i);
  return out;
}

uint64_t Engine::AdapterNamespaceOf(uint64_t ns, uint64_t adapter_digest) {
  const Sha256Digest d = Sha256().UpdateU64(ns).Update("lora").UpdateU64(adapter_digest).Finish();
  uint64_t out = 0;
  for (int i = 0; i < 8; ++i) out |= static_cast<uint64_t>(d[static_cast<size_t>(i)]) << (8 * i);
  return out;
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
                 speculator_.enabled() ? config_.speculation.num_spec_tokens : 0,
                 config_.jump_forward),
      helpers_(std::max(1u, std::thread::hardware_concurrency() / 2)),
      builder_(config_, &runner_, &kv_, &counters_, &helpers_),
      postprocessor_(&runner_, &kv_, &sequences_, &speculator_, &counters_, &helpers_) {
  if (model->lora() != nullptr) {
    adapters_ = std::make_unique<AdapterRegistry>(&model->config(), model->lora()->max_rank());
  }
  if (model->has_recurrent_state()) {
    state_slots_ = std::make_unique<StateSlots>(config_.max_running);
    scheduler_.set_state_slots(state_slots_.get());
  }
  if (sizing.num_spec_snapshot_slots > 0) {  // after the sequences', scratch and checkpoints
    builder_.set_state_snapshots(config_.max_running + 1 + sizing.num_state_checkpoints,
                                 config_.speculation.num_spec_tokens,
                                 sizing.num_spec_snapshot_slots /
                                     config_.speculation.num_spec_tokens);
  }
  if (sizing.num_state_checkpoints > 0) {
    checkpoints_ = std::make_unique<kv::StateCheckpoints>(
        config_.max_running + 1, sizing.num_state_checkpoints, model->StateBytesPerSequence(),
        &kv_.prefix_cache(), num_blocks_);
    kv_.set_prefix_end_filter(checkpoints_.get());
    scheduler_.set_state_checkpoints(checkpoints_.get(), config_.state_checkpoint_interval);
    builder_.set_state_checkpoints(checkpoints_.get());
    postprocessor_.set_state_checkpoints(checkpoints_.get());
    counters_.state_checkpoint_capacity_bytes = sizing.state_checkpoint_bytes;
  }
  builder_.set_capture_final_hidden(speculator_.wants_hidden_states());
  counters_.kv_blocks_total = num_blocks_;
  counters_.prefix_caching = config_.enable_prefix_caching;
  counters_.recurrent_state_bytes = sizing.state_bytes;
  counters_.block_size = config_.block_size;
}

void Engine::AttachPromptCache(const PromptTierShape& shape,
                               std::unique_ptr<prompt_cache::RamStore> ram,
                               std::unique_ptr<prompt_cache::DiskStore> disk,
                               std::unique_ptr<StateTier> states) {
  if (ram == nullptr && disk == nullptr) return;
  tier_ = std::make_unique<PromptTier>(shape, std::move(ram), std::move(disk),
                                       config_.prompt_cache.reuse, &runner_, &kv_, &counters_);
  if (states != nullptr) tier_->AttachStates(std::move(states), checkpoints_.get());
  scheduler_.set_prompt_tier(tier_.get());
  postprocessor_.set_prompt_tier(tier_.get());
  counters_.prompt_cache = tier_->Stats();
}

void Engine::Start() {
  {
    MutexLock lock(&mu_);
    published_ = counters_;
  }
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
  if (request.adapter == "none") request.adapter.clear();
  request.lora = nullptr;
  if (!request.adapter.empty()) {
    if (adapters_ == nullptr)
      return SubmitError{SubmitError::Code::kInvalidRequest,
                         "adapter \"" + request.adapter +
                             "\": LoRA adapters are off (start with --lora or --max-loras)",
                         "adapter"};
    request.lora = adapters_->Find(request.adapter);
    if (request.lora == nullptr)
      return SubmitError{SubmitError::Code::kInvalidRequest,
                         "unknown adapter \"" + request.adapter + "\"", "adapter"};
    request.cache_namespace = AdapterNamespaceOf(request.cache_namespace, request.lora->digest);
  }
  request.cache_namespace = CacheNamespaceOf(request.cache_namespace, request.cache_salt);
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

PromptCacheCleared Engine::ClearPromptCache(std::optional<std::string> cache_salt) {
  const std::optional<uint64_t> ns =
      cache_salt ? std::optional<uint64_t>(CacheNamespaceOf(0, *cache_salt)) : std::nullopt;
  {
    MutexLock lock(&mu_);
    pool_clears_.push_back(ns);
  }
  cv_.NotifyAll();
  return tier_ != nullptr ? tier_->Clear(ns) : PromptCacheCleared{};
}

EngineStats Engine::Stats() const {
  EngineStats s;
  {
    MutexLock lock(&mu_);
    s = published_;
  }
  s.num_queued = num_queued_.load();
  // The disk tier's writer runs between steps too: the stores' counters are read now, not at the
  // last step (the tier object lives as long as the engine; its stores are thread-safe).
  if (tier_ != nullptr) tier_->StoreStats(&s.prompt_cache);
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
    next.batch.batch_invariant =
        speculator_.StepInvariant(scheduler_.running().size(), !next.draft_rows.empty());
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
  std::vector<std::optional<uint64_t>> clears;
  {
    MutexLock lock(&mu_);
    if (sequences_.empty() && !in_flight_ && lora_waiting_.empty()) {
      cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return HasIncoming(); });
    }
    if (stopping_ && (!drain_ || (sequences_.empty() && inbox_.empty()))) stop_now = true;
    incoming.swap(inbox_);
    clears.swap(pool_clears_);
  }
  for (const std::optional<uint64_t>& ns : clears) kv_.DropCached(ns);
  for (const std::shared_ptr<RequestState>& state : TakeLoraSlots(std::move(incoming))) {
    if (tier_ != nullptr) tier_->Prefetch(state->request, kv_);  // disk → RAM while it waits
    sequences_.Add(state);
  }
  if (stop_now) {
    for (const std::shared_ptr<RequestState>& state : lora_waiting_) {
      EndUnstarted(*state, FinishReason::kCancelled);
      num_queued_.fetch_sub(1);
    }
    lora_waiting_.clear();
    sequences_.CancelAll();
  }
  sequences_.ReapCancelled();
  if (!stop_now) return true;
  CompleteInFlight();
  PublishStatsAndCloseStreams();
  return false;
}

std::vector<std::shared_ptr<RequestState>> Engine::TakeLoraSlots(
    std::deque<std::shared_ptr<RequestState>> incoming) {
  std::vector<std::shared_ptr<RequestState>> ready;
  std::deque<std::shared_ptr<RequestState>> pending;
  pending.swap(lora_waiting_);
  for (auto& state : incoming) pending.push_back(std::move(state));
  LoraSet* pool = model_->lora();
  for (std::shared_ptr<RequestState>& state : pending) {
    const std::shared_ptr<const AdapterInfo>& lora = state->request.lora;
    if (lora == nullptr) {
      ready.push_back(std::move(state));
      continue;
    }
    // Behind a request already waiting for a slot: wait too (first come, first served). An
    // adapter that is not resident has its files read on a thread of their own first
    // (LoraSet::Prepared): its request waits for that read, the running sequences do not.
    Result<std::optional<int32_t>> slot =
        lora_waiting_.empty() && pool->Prepared(lora->digest, lora->dir)
            ? pool->Acquire(lora->digest, lora->dir)
            : Result<std::optional<int32_t>>(std::optional<int32_t>());
    if (!slot.ok()) {  // the folder stopped loading since it was registered
      LOG_ERROR << "adapter " << lora->name << ": " << slot.message();
      EndUnstarted(*state, FinishReason::kError);
      num_queued_.fetch_sub(1);
      continue;
    }
    if (!slot->has_value()) {
      // Queued behind another request: its adapter's read may start now (within the pool's
      // bound), so it does not wait for that read once it reaches the head.
      if (!lora_waiting_.empty()) pool->Prefetch(lora->digest, lora->dir);
      lora_waiting_.push_back(std::move(state));
      continue;
    }
    const int32_t index = **slot;
    state->lora_slot = index;
    state->lora_lease =
        std::shared_ptr<void>(nullptr, [pool, index](void*) { pool->Release(index); });
    ready.push_back(std::move(state));
  }
  return ready;
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
  Status st = Status::Ok();
  // Blocks the step's allocations evicted go down to RAM before the step may overwrite them.
  if (tier_ != nullptr) tier_->FlushDemotions();
  // Checkpoint copies: the seeds (states uploaded from a tier) before the forward, the states
  // the step leaves at checkpoint points after it; a failed copy only loses its checkpoint.
  auto save_states = [&](bool before_forward) {
    for (StepBatch::StateSave& save : step.state_saves) {
      if (!st.ok()) break;
      if (save.before_forward != before_forward) continue;
      if (Status copy = runner_.CopyStateSlot(save.copy.src, save.copy.dst); !copy.ok()) {
        LOG_ERROR << "state checkpoint copy failed: " << copy.message();
        checkpoints_->Release(save.copy.dst);
        save.resolved = true;
      }
    }
  };
  for (const StepBatch::StateUpload& u : step.state_uploads)
    if (st.ok()) st = runner_.CopyStateFromHost(u.slot, u.state);
  // Restores before the seeds: a seed may take the slot a restore reads (Reserve's LRU pick).
  for (const StepBatch::StateCopy& c : step.state_restores)
    if (st.ok()) st = runner_.CopyStateSlot(c.src, c.dst);
  save_states(/*before_forward=*/true);
  if (st.ok()) st = runner_.Launch(step.batch, step.outputs(), step.decode_only);
  save_states(/*before_forward=*/false);
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
  if (checkpoints_ != nullptr) {
    counters_.state_checkpoints = checkpoints_->NumLive();
    counters_.state_checkpoint_bytes = checkpoints_->LiveBytes();
    counters_.state_checkpoint_saves = checkpoints_->num_saved();
    counters_.state_checkpoint_evictions = checkpoints_->num_evicted();
  }
  if (tier_ != nullptr) counters_.prompt_cache = tier_->Stats();
  if (const LoraSet* lora = model_->lora(); lora != nullptr) {
    counters_.lora_loads = lora->loads();
    counters_.lora_evictions = lora->evictions();
    counters_.lora_waiting = static_cast<int32_t>(lora_waiting_.size());
  }
  {
    MutexLock lock(&mu_);
    published_ = counters_;
  }
  // A caller that sees its stream end also sees Stats() that include its request.
  sequences_.CloseEndedStreams();
}

}  // namespace ember
