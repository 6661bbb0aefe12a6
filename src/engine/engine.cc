#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "sampling/logit_edits.h"
#include "sampling/processors.h"
#include "util/log.h"
#include "util/parallel.h"

namespace ember {

namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

int32_t PromptLogitsRows(const EngineConfig& config, int32_t vocab_size) {
  const int64_t rows = config.prompt_logits_bytes / (int64_t{4} * std::max(vocab_size, 1));
  return static_cast<int32_t>(std::clamp<int64_t>(rows, 1, std::max(config.max_step_tokens, 1)));
}

int64_t StepWorkspaceBytes(const Model& model, const EngineConfig& config) {
  const ModelConfig& c = model.config();
  // Per step row: residual, normed input, q, k, v, attention out, delta, gate, up, the MLP
  // activation, the final norm (float32 at most).
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim,
                kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  int64_t per_row =
      4 * (4 * int64_t{c.hidden_size} + 2 * q_dim + 2 * kv_dim + 3 * int64_t{c.intermediate_size});
  // Mixture of experts: the MLP's f32 input, the router logits, and per (row, expert) pair the
  // expert's activation and output (Backend::MoeMlp's scratch, one layer's at a time).
  if (c.num_experts > 0)
    per_row += 4 * (int64_t{c.hidden_size} + c.num_experts +
                    int64_t{c.num_experts_per_tok} * (c.moe_intermediate_size + c.hidden_size + 4));
  // A step's logits rows: one sampled row per running sequence, and prompt-logprobs rows.
  const int64_t logits_rows = int64_t{config.max_running} + PromptLogitsRows(config, c.vocab_size);
  const int64_t logits = logits_rows * c.vocab_size * 4 * 2;  // + hidden rows
  // x2 for backend scratch (bf16 copies, split-K partials), + 512 MiB for libraries and graphs.
  return 2 * (int64_t{config.max_step_tokens} * per_row + logits) + (int64_t{512} << 20);
}

namespace {
// vLLM's rule: this process may use `fraction` of the device's memory, and what is in use now
// (weights, runtime) counts against it. The bytes that leaves (negative when none).
int64_t DeviceBytesLeft(const BackendMemory& mem, double fraction) {
  return static_cast<int64_t>(fraction * static_cast<double>(mem.total_bytes)) -
         (mem.total_bytes - mem.free_bytes);
}
}  // namespace

Result<int64_t> DefaultKvCacheBytes(const Model& model, const EngineConfig& config) {
  const int64_t per_token = model.KvBytesPerToken();
  // Never more than every running sequence at full context could use.
  const int64_t want =
      int64_t{config.max_running} * model.config().max_position_embeddings * per_token;
  EMBER_ASSIGN_OR_RETURN(BackendMemory mem, model.MemoryInfo());
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  if (mem.device) {
    // A step's workspace stays free.
    const int64_t used = mem.total_bytes - mem.free_bytes;
    const int64_t budget =
        DeviceBytesLeft(mem, config.gpu_memory_fraction) - StepWorkspaceBytes(model, config);
    if (budget < per_token * config.block_size) {
      char msg[256];
      std::snprintf(msg, sizeof(msg),
                    "no GPU memory left for the KV cache: %.1f of %.1f GiB in use after loading "
                    "the weights, --gpu-memory-fraction %.2f allows %.1f GiB and a step needs "
                    "%.1f GiB of workspace (raise the fraction or give --kv-cache-bytes)",
                    used / kGiB, mem.total_bytes / kGiB, config.gpu_memory_fraction,
                    config.gpu_memory_fraction * mem.total_bytes / kGiB,
                    StepWorkspaceBytes(model, config) / kGiB);
      return Status::Error(msg);
    }
    return std::min(want, budget);
  }
  // Host memory: the pool is committed lazily (only used blocks are resident), but admission
  // must not promise more than half of what is available, and at most 4 GiB by default.
  return std::min({want, int64_t{4} << 30, mem.free_bytes / 2});
}

int32_t GpuStepTokens(const Model& model, EngineConfig config, int64_t bytes) {
  config.max_step_tokens = 8192;
  while (config.max_step_tokens > 512 && StepWorkspaceBytes(model, config) > bytes)
    config.max_step_tokens /= 2;
  return config.max_step_tokens;
}

Result<EngineConfig> ResolveEngineLimits(const Model& model, EngineConfig config) {
  if (config.max_running < 0)
    return Status::Error("--max-batch: must be >= 0 (0: the device's default), got " +
                         std::to_string(config.max_running));
  if (config.max_step_tokens < 0)
    return Status::Error("--max-step-tokens: must be >= 0 (0: the device's default), got " +
                         std::to_string(config.max_step_tokens));
  if (config.max_running > 0 && config.max_step_tokens > 0) return config;
  EMBER_ASSIGN_OR_RETURN(BackendMemory mem, model.MemoryInfo());
  if (config.max_running == 0) config.max_running = mem.device ? 256 : 64;
  if (config.max_step_tokens == 0) {
    config.max_step_tokens = 512;
    if (mem.device) {
      config.max_step_tokens =
          GpuStepTokens(model, config, DeviceBytesLeft(mem, config.gpu_memory_fraction) / 4);
    }
  }
  return config;
}

namespace {

// A decode step's padding row: token 0 at position 0, its K/V in the scratch block (which no
// sequence owns), a logits row whose argmax is dropped. The warm-up captures steps of these rows,
// so serving's padded steps must use the same.
void AddPaddingRow(BatchPlan& plan, int32_t scratch_block) {
  plan.AddSequence({0}, 0, {scratch_block}, true);
}

// The backend's decode graph buckets this engine can use: up to the first that holds
// max_running sequences.
std::vector<int32_t> UsableGraphBuckets(const Model& model, int32_t max_running) {
  std::vector<int32_t> buckets = model.DecodeGraphBuckets();
  const auto holds = std::lower_bound(buckets.begin(), buckets.end(), max_running);
  if (holds != buckets.end()) buckets.erase(holds + 1, buckets.end());
  return buckets;
}

// Runs decode steps of every graph bucket (two each) before serving, so each is captured now: a
// capture costs 6 to 50 ms on an H200 (1B and 8B shapes), which a step of a new batch size would
// otherwise pay mid-stream. A first step of max_step_tokens prompt rows in up to max_running
// sequences, each with a logits row, grows the backend's step workspace and plan buffer to their
// serving size first (the graphs hold their addresses). Every row is a dummy: token 0, its K/V
// in the scratch block (AddPaddingRow); the outputs are dropped.
Status WarmUpDecodeGraphs(Model& model, const EngineConfig& config,
                          const std::vector<int32_t>& buckets, int32_t scratch_block) {
  if (buckets.empty()) return Status::Ok();
  const int64_t start = NowNs();
  const int32_t vocab = model.config().vocab_size;
  auto run = [&](const BatchPlan& plan) {
    const size_t rows = plan.logits_rows.size();
    std::vector<RowOutput> kinds(rows, RowOutput::kArgmax);
    std::vector<RowSampling> sampling(rows);
    std::vector<int32_t> ids(rows);
    return model.Forward(plan, StepOutputs{model.HostLogitsBuffer(rows * vocab), kinds, sampling,
                                           ids, {}});
  };
  const int32_t bs = config.block_size;
  const int32_t tokens = std::min(config.max_step_tokens, model.config().max_position_embeddings);
  const int32_t seqs = std::min(config.max_running, tokens);
  BatchPlan prefill;
  prefill.block_size = bs;
  for (int32_t s = 0; s < seqs; ++s) {
    const int32_t len = tokens / seqs + (s < tokens % seqs ? 1 : 0);
    const std::vector<int32_t> table(static_cast<size_t>((len + bs - 1) / bs), scratch_block);
    prefill.AddSequence(std::vector<int32_t>(static_cast<size_t>(len), 0), 0, table, true);
  }
  EMBER_RETURN_IF_ERROR(run(prefill));
  for (int32_t rows : buckets) {
    BatchPlan decode;
    decode.block_size = bs;
    for (int32_t s = 0; s < rows; ++s) AddPaddingRow(decode, scratch_block);
    // Twice: consecutive steps alternate between two sets of plan and ids buffers (the CUDA
    // backend's staging halves), so a bucket has a graph for each.
    EMBER_RETURN_IF_ERROR(run(decode));
    EMBER_RETURN_IF_ERROR(run(decode));
  }
  LOG_INFO << "decode-step graphs for " << buckets.size() << " batch sizes (1 to "
           << buckets.back() << " rows) captured in " << (NowNs() - start) / 1000000 << " ms";
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Create(Model* model, const EngineConfig& requested) {
  if (!(requested.gpu_memory_fraction > 0.0 && requested.gpu_memory_fraction <= 1.0))
    return Status::Error("--gpu-memory-fraction must be in (0, 1], got " +
                         std::to_string(requested.gpu_memory_fraction));
  EMBER_ASSIGN_OR_RETURN(const EngineConfig config, ResolveEngineLimits(*model, requested));
  if (config.block_size <= 0) return Status::Error("block_size must be positive");
  if (requested.max_running == 0 || requested.max_step_tokens == 0) {
    LOG_INFO << "engine limits: " << config.max_running << " sequences, " << config.max_step_tokens
             << " tokens a step";
  }
  int64_t bytes = config.kv_cache_bytes;
  if (bytes <= 0) {
    EMBER_ASSIGN_OR_RETURN(bytes, DefaultKvCacheBytes(*model, config));
  }
  const int32_t num_blocks =
      kv::NumBlocksForBytes(bytes, model->KvBytesPerToken(), config.block_size);
  if (num_blocks < 1) {
    return Status::Error("--kv-cache-bytes " + std::to_string(bytes) +
                         " holds no KV block (one block of " + std::to_string(config.block_size) +
                         " tokens needs " +
                         std::to_string(model->KvBytesPerToken() * config.block_size) + " bytes)");
  }
  // One more block than the sequences get: the scratch block of decode steps' padding rows.
  EMBER_RETURN_IF_ERROR(model->AllocateKvCache(num_blocks + 1, config.block_size));
  std::vector<int32_t> buckets = UsableGraphBuckets(*model, config.max_running);
  EMBER_RETURN_IF_ERROR(WarmUpDecodeGraphs(*model, config, buckets, /*scratch_block=*/num_blocks));
  const int64_t used_bytes = int64_t{num_blocks} * config.block_size * model->KvBytesPerToken();
  return std::unique_ptr<Engine>(
      new Engine(model, config, num_blocks, used_bytes, std::move(buckets)));
}

Engine::Engine(Model* model, const EngineConfig& config, int32_t num_blocks, int64_t kv_bytes,
               std::vector<int32_t> graph_buckets)
    : model_(model),
      config_(config),
      num_blocks_(num_blocks),
      kv_cache_bytes_(kv_bytes),
      context_length_(model->config().max_position_embeddings),
      vocab_size_(model->config().vocab_size),
      kv_(kv::KvCacheConfig{config.block_size, num_blocks, config.enable_prefix_caching}),
      scheduler_(SchedulerConfig{config.max_running, config.max_step_tokens,
                                 PromptLogitsRows(config, model->config().vocab_size)},
                 &kv_),
      graph_buckets_(std::move(graph_buckets)),
      scratch_block_(num_blocks) {
  counters_.kv_blocks_total = num_blocks;
  counters_.block_size = config.block_size;
  published_ = counters_;
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() {
  Shutdown(/*drain=*/false);
}

void Engine::Shutdown(bool drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      drain_ = drain;
    } else if (!drain) {
      drain_ = false;
    }
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::optional<SubmitError> Engine::Validate(const GenerationRequest& r) const {
  auto invalid = [](std::string message, std::string param) {
    return SubmitError{SubmitError::Code::kInvalidRequest, std::move(message), std::move(param)};
  };
  const int64_t prompt_len = static_cast<int64_t>(r.prompt_ids.size());
  if (prompt_len == 0) return invalid("the prompt is empty", "prompt");
  for (int32_t id : r.prompt_ids) {
    if (id < 0 || id >= vocab_size_) {
      return invalid("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                         std::to_string(vocab_size_) + ")",
                     "prompt");
    }
  }
  if (r.max_tokens < 0) {
    return invalid("max_tokens must be at least 0, got " + std::to_string(r.max_tokens),
                   "max_tokens");
  }
  if (r.prompt_logprobs < -1 || r.prompt_logprobs > kMaxTopLogprobs) {
    return invalid("prompt_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) +
                       "] (or -1: off), got " + std::to_string(r.prompt_logprobs),
                   "prompt_logprobs");
  }
  if (r.n < 1 || r.n > config_.max_n) {
    return invalid(
        "n must be in [1, " + std::to_string(config_.max_n) + "], got " + std::to_string(r.n), "n");
  }
  const int64_t total = prompt_len + r.max_tokens;
  if (total > context_length_) {
    return invalid("this model's maximum context length is " + std::to_string(context_length_) +
                       " tokens; the prompt has " + std::to_string(prompt_len) +
                       " tokens and max_tokens asks for " + std::to_string(r.max_tokens) +
                       " more (" + std::to_string(total) + " in total)",
                   "max_tokens");
  }
  if (total > kv_capacity_tokens()) {
    return invalid("the KV cache holds " + std::to_string(kv_capacity_tokens()) +
                       " tokens; the prompt (" + std::to_string(prompt_len) +
                       ") plus max_tokens (" + std::to_string(r.max_tokens) + ") needs " +
                       std::to_string(total) + " (raise --kv-cache-bytes)",
                   "max_tokens");
  }
  if (r.sampling.min_tokens > r.max_tokens) {
    return invalid("min_tokens (" + std::to_string(r.sampling.min_tokens) +
                       ") must not exceed max_tokens (" + std::to_string(r.max_tokens) + ")",
                   "min_tokens");
  }
  if (r.constraint != nullptr && r.constraint->vocab_size() != vocab_size_) {
    return invalid("the output constraint covers " + std::to_string(r.constraint->vocab_size()) +
                       " token ids but the model has " + std::to_string(vocab_size_),
                   "response_format");
  }
  Status st = r.sampling.Validate(vocab_size_);
  if (!st.ok()) {
    std::string param = st.message().substr(0, st.message().find(':'));
    return invalid(st.message(), param);
  }
  for (int32_t id : r.stop_token_ids) {
    if (id < 0 || id >= vocab_size_)
      return invalid("stop token id " + std::to_string(id) + " is outside the vocabulary",
                     "stop_token_ids");
  }
  return std::nullopt;
}

Engine::SubmitResult Engine::Submit(GenerationRequest request) {
  if (auto error = Validate(request)) return *error;
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
    std::lock_guard<std::mutex> lock(mu_);
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
  cv_.notify_all();
  return state->stream;
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = published_;
  s.num_queued = num_queued_.load();
  return s;
}

void Engine::TakeInbox() {
  std::deque<std::shared_ptr<RequestState>> incoming;
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming.swap(inbox_);
  }
  for (std::shared_ptr<RequestState>& state : incoming) {
    ++counters_.requests_submitted;
    counters_.prompt_tokens += state->usage.prompt_tokens;
    for (int32_t i = 0; i < state->request.n; ++i) {
      auto seq = std::make_unique<Sequence>();
      seq->id = next_seq_id_++;
      seq->sample_index = i;
      seq->request = state;
      seq->tokens = state->request.prompt_ids;
      seq->prompt_len = seq->num_tokens();
      seq->sampler = std::make_unique<SamplerState>(
          state->request.sampling, static_cast<uint64_t>(i), seq->tokens, state->stop_ids);
      if (state->request.constraint) seq->constraint = state->request.constraint->Clone();
      if (i == 0 && state->request.prompt_logprobs >= 0) {
        seq->needs_prompt_logits = true;
        seq->prompt_logprobs.resize(static_cast<size_t>(seq->prompt_len - 1));
      }
      scheduler_.AddWaiting(seq.get());
      live_.emplace(seq->id, std::move(seq));
    }
  }
}

namespace {
// A sequence's next event; the first one after its prompt logprobs are complete carries them.
TokenEvent NewEvent(Sequence* seq) {
  TokenEvent event;
  event.sample_index = seq->sample_index;
  if (seq->prompt_logprobs_ready) {
    event.prompt_logprobs = std::move(seq->prompt_logprobs);
    seq->prompt_logprobs.clear();
    seq->prompt_logprobs_ready = false;
  }
  return event;
}
}  // namespace

void Engine::EmitFinalEvent(Sequence* seq, FinishReason reason) {
  TokenEvent event = NewEvent(seq);
  event.finish = reason;
  event.time_ns = NowNs();
  seq->request->stream->Push(std::move(event));
}

void Engine::FinishSequence(Sequence* seq, FinishReason reason) {
  // A token still being chosen by a step in flight is not the sequence's: it ends before it.
  while (!seq->tokens.empty() && seq->tokens.back() < 0) seq->tokens.pop_back();
  seq->finish = reason;
  scheduler_.Remove(seq);
  RequestState& state = *seq->request;
  if (!state.admitted) {
    state.admitted = true;
    num_queued_.fetch_sub(1);
  }
  if (seq->sample_index == 0) {
    state.prompt_prefilled = true;  // let siblings start even if sample 0 ended early
    state.usage.cached_tokens = seq->num_cached_prompt_tokens;
  }
  state.usage.completion_tokens += seq->num_generated();
  counters_.generated_tokens += seq->num_generated();
  if (--state.num_unfinished == 0) {
    state.stream->SetUsage(state.usage);
    streams_to_close_.push_back(state.stream);  // closed after the stats are published
    ++counters_.requests_finished;
    if (reason == FinishReason::kCancelled) ++counters_.requests_cancelled;
  }
  auto it = live_.find(seq->id);
  // A launched step still has rows of it (their K/V goes to blocks it no longer owns, ahead of
  // any later step in the device's order): keep the object until that step completes.
  if (seq->steps_in_flight > 0) retired_.push_back(std::move(it->second));
  live_.erase(it);  // destroys seq unless retired
}

void Engine::ReapCancelled() {
  std::vector<Sequence*> cancelled;
  for (auto& [id, seq] : live_) {
    if (seq->request->stream->cancelled()) cancelled.push_back(seq.get());
  }
  for (Sequence* seq : cancelled) {
    EmitFinalEvent(seq, FinishReason::kCancelled);
    FinishSequence(seq, FinishReason::kCancelled);
  }
}

namespace {
// A constrained row's mask goes to the backend as edits only up to this many masked tokens (a
// longer list costs more to build and upload than sampling the row on the host).
constexpr int64_t kMaxMaskEdits = 8192;

// A token mask (with its `masked` ids) as kMask edits of `row`, after the row's processor edits
// (from first_edit on): each of those edits whose element is masked turns into a kMask (an
// element's edits stay adjacent), every other masked element gets one.
void AppendMaskEdits(const TokenMask& mask, int32_t row, size_t first_edit,
                     std::vector<LogitEdit>& edits) {
  std::vector<int32_t> edited;
  for (size_t i = first_edit; i < edits.size(); ++i) {
    edited.push_back(edits[i].token);
    if (!mask.allowed[static_cast<size_t>(edits[i].token)]) edits[i].op = LogitEditOp::kMask;
  }
  std::sort(edited.begin(), edited.end());
  for (int32_t id : mask.masked)
    if (!std::binary_search(edited.begin(), edited.end(), id))
      edits.push_back(LogitEdit{row, id, LogitEditOp::kMask, 0.0f});
}

// Whether the backend makes this row's token (argmax, or a draw where the backend samples): no
// logprobs wanted. A constrained row's mask then goes along as edits.
bool BackendMakesToken(const Sequence& seq, bool backend_samples) {
  const SamplingParams& p = seq.request->request.sampling;
  return BackendCanSample(p) && (p.is_greedy() || backend_samples);
}

// Whether the backend makes this row's token from state the host already has, so the step may
// launch before the previous step's tokens are known: no processor that depends on the tokens
// (penalties; the min_tokens mask while it applies: the state's count may lag by the one token in
// flight, and once it reaches min_tokens the true count has too).
bool FedRowOk(const Sequence& seq, bool backend_samples) {
  const SamplingParams& p = seq.request->request.sampling;
  return seq.constraint == nullptr && BackendMakesToken(seq, backend_samples) &&
         !p.has_penalties() &&
         (p.min_tokens == 0 || seq.sampler->num_output_tokens() >= p.min_tokens);
}
}  // namespace

void Engine::RunStep(const StepPlan& plan) {
  BatchPlan batch;
  batch.block_size = config_.block_size;
  std::vector<int32_t> chunk;
  for (const ScheduledSequence& s : plan.scheduled) {
    Sequence* seq = s.seq;
    ++seq->steps_in_flight;  // from here on the step holds it (CompleteStep / FailStep let go)
    // Placeholders (-1 - r) of the step in flight pass through as fed tokens: it is the model's
    // previous Forward.
    chunk.assign(seq->tokens.begin() + seq->num_computed_tokens,
                 seq->tokens.begin() + seq->num_computed_tokens + s.num_new_tokens);
    batch.AddSequence(chunk, seq->num_computed_tokens, kv_.BlockTable(seq->id), s.samples);
  }
  LaunchedStep step;
  // A decode step (one sampled row per sequence) is padded to its graph bucket's row count.
  step.real_rows = static_cast<int32_t>(batch.logits_rows.size());
  const int32_t real_rows = step.real_rows;
  step.decode_only = batch.num_tokens() == batch.num_seqs() && real_rows == batch.num_seqs() &&
                     std::none_of(plan.scheduled.begin(), plan.scheduled.end(),
                                  [](const auto& s) { return s.seq->needs_prompt_logits; });
  if (step.decode_only) {
    ++counters_.decode_steps;
    counters_.decode_rows += real_rows;
    const auto bucket = std::lower_bound(graph_buckets_.begin(), graph_buckets_.end(), real_rows);
    if (bucket != graph_buckets_.end()) {
      for (int32_t r = real_rows; r < *bucket; ++r) AddPaddingRow(batch, scratch_block_);
      counters_.decode_padding_rows += *bucket - real_rows;
    }
  }
  AddPromptRows(plan, batch, step);
  const bool backend_samples = model_->prefers_backend_sampling() ||
                               config_.backend_sampling == EngineConfig::BackendSampling::kAlways;
  step.deferred = config_.overlap_steps;
  for (const ScheduledSequence& s : plan.scheduled)
    if (s.samples && !FedRowOk(*s.seq, backend_samples)) step.deferred = false;
  if (!step.prompt_rows.empty()) step.deferred = false;  // their logits come to the host
  // The host builds this step's processors and samples its kCopy rows from the sequences' states:
  // those need the tokens of the step in flight first. (Rows of sequences that end there still
  // run; their tokens are dropped.)
  if (!step.deferred) CompleteInFlight();

  // Rows that want no logprobs get their token from the backend: their processors (bias,
  // penalties, min_tokens mask) as a sparse edit list applied where the logits are, then the
  // argmax, or a draw with the sequence's next uniform where the backend prefers it. Logprobs rows
  // (and sampled rows on a backend that prefers the host) copy their logits to the host sampler.
  const size_t num_rows = batch.logits_rows.size();
  step.logits = model_->HostLogitsBuffer(num_rows * static_cast<size_t>(vocab_size_));
  // Padding rows (past real_rows): an argmax nobody reads.
  step.kinds.assign(num_rows, RowOutput::kArgmax);
  std::fill(step.kinds.begin(), step.kinds.begin() + real_rows, RowOutput::kCopy);
  for (const LaunchedStep::PromptRows& run : step.prompt_rows)
    std::fill_n(step.kinds.begin() + run.first_row, run.num_rows, RowOutput::kCopy);
  row_sampling_.assign(num_rows, RowSampling{});
  step.ids.assign(num_rows, 0);
  row_params_.clear();
  row_states_.clear();
  std::vector<LogitEdit> row_edits;  // allocates only when some row has processors
  BuildMasks(plan, step);
  for (const ScheduledSequence& s : plan.scheduled) {
    if (!s.samples) continue;
    const size_t r = row_params_.size();
    const SamplingParams& p = s.seq->request->request.sampling;
    row_params_.push_back(&p);
    row_states_.push_back(s.seq->sampler.get());
    const TokenMask* mask = step.row_masks.empty() ? nullptr : step.row_masks[r];
    // A constrained row goes to the backend only when its mask is a short edit list (few tokens
    // masked: inside a JSON string); one that allows nothing stays kCopy too (the host ends it).
    const bool mask_as_edits = mask != nullptr && mask->num_allowed > 0 && mask->masked_listed();
    if (!BackendMakesToken(*s.seq, backend_samples) || (mask != nullptr && !mask_as_edits))
      continue;  // kCopy: the host samples it (with its mask)
    if (p.is_greedy()) {
      step.kinds[r] = RowOutput::kArgmax;
    } else {
      step.kinds[r] = RowOutput::kSample;
      row_sampling_[r] = {p.temperature, p.top_k, p.top_p, p.min_p, s.seq->sampler->NextUniform()};
    }
    const size_t first_edit = row_edits.size();
    AppendLogitEdits(p, *s.seq->sampler, static_cast<int32_t>(r), row_edits);
    if (mask != nullptr) {
      AppendMaskEdits(*mask, static_cast<int32_t>(r), first_edit, row_edits);
      step.row_masks[r] = nullptr;  // the backend applies it
    }
  }
  const int64_t forward_start = NowNs();
  StepOutputs outputs{step.logits, step.kinds, row_sampling_, step.ids, row_edits};
  outputs.defer_ids = step.deferred;
  Status st = model_->Forward(batch, outputs);
  const int64_t forward_ns = NowNs() - forward_start;
  counters_.forward_ns += forward_ns;
  if (step.decode_only) counters_.decode_forward_ns += forward_ns;
  ++counters_.steps;
  counters_.computed_tokens += batch.num_tokens();
  step.scheduled = plan.scheduled;
  if (!st.ok()) {
    LOG_ERROR << "forward step failed: " << st.message();
    CompleteInFlight();
    FailStep(step);
    return;
  }
  if (step.deferred) ++counters_.overlapped_steps;

  // The step's rows count as computed now (the next step is planned before this one completes);
  // each sampled row's token is a placeholder until the step completes.
  step.computed_end.reserve(plan.scheduled.size());
  step.token_index.reserve(plan.scheduled.size());
  int32_t row = 0;
  for (const ScheduledSequence& s : plan.scheduled) {
    Sequence* seq = s.seq;
    seq->num_computed_tokens += s.num_new_tokens;
    step.computed_end.push_back(seq->num_computed_tokens);
    if (!s.samples) {
      step.token_index.push_back(-1);
      continue;
    }
    step.token_index.push_back(seq->num_tokens());
    seq->tokens.push_back(-1 - row++);
    if (seq->num_generated() >= seq->request->request.max_tokens) seq->last_token_pending = true;
  }
  CompleteInFlight();  // the previous step, while this one computes
  if (step.deferred) {
    in_flight_ = std::move(step);
  } else {
    CompleteStep(step);
  }
}

// The masks of the step's constrained rows (the tokens they may take next), built before the
// launch on helper threads (at most half the host's cores, rows claimed from a counter). A state
// seen before costs a copy (MaskCache in json_constraint.h). row_masks[r] points to row r's.
void Engine::BuildMasks(const StepPlan& plan, LaunchedStep& step) {
  std::vector<const TokenConstraint*> constraints;
  for (const ScheduledSequence& s : plan.scheduled)
    if (s.samples && s.seq->constraint != nullptr) constraints.push_back(s.seq->constraint.get());
  if (constraints.empty()) return;
  CHECK(!step.deferred);
  step.masks.resize(constraints.size());
  ForEachOnThreads(constraints.size(), std::thread::hardware_concurrency() / 2,
                   [&](size_t i) { step.masks[i].Build(*constraints[i], kMaxMaskEdits); });
  step.row_masks.assign(static_cast<size_t>(step.real_rows), nullptr);
  size_t row = 0, m = 0;
  for (const ScheduledSequence& s : plan.scheduled) {
    if (!s.samples) continue;
    const size_t r = row++;
    if (s.seq->constraint != nullptr) step.row_masks[r] = &step.masks[m++];
  }
}

// Every prompt row of a sequence that needs prompt logprobs gets a logits row, after the sampled
// and padding rows (so the sampled rows keep rows 0..real_rows-1), except the prompt's last row:
// its logits are the sampled row's (or unused, with max_tokens 0). The scheduler bounded these
// rows (SchedulerConfig::max_prompt_logits_rows).
void Engine::AddPromptRows(const StepPlan& plan, BatchPlan& batch, LaunchedStep& step) {
  for (size_t i = 0; i < plan.scheduled.size(); ++i) {
    const Sequence& seq = *plan.scheduled[i].seq;
    if (!seq.needs_prompt_logits) continue;
    const int32_t first_pos = seq.num_computed_tokens;
    const int32_t end = std::min(first_pos + plan.scheduled[i].num_new_tokens, seq.prompt_len - 1);
    if (end <= first_pos) continue;
    LaunchedStep::PromptRows run;
    run.scheduled_index = i;
    run.first_pos = first_pos;
    run.num_rows = end - first_pos;
    run.first_row = static_cast<int32_t>(batch.logits_rows.size());
    for (int32_t r = 0; r < run.num_rows; ++r)
      batch.logits_rows.push_back(batch.seqs[i].query_start + r);
    step.prompt_rows.push_back(run);
  }
}

// The logits row of prompt position p gives the logprob of the prompt token at p + 1, as a
// generated token's is computed (TokenLogprobs on the raw row: no processor ever touched a
// kCopy prompt row), rows in parallel.
void Engine::ComputePromptLogprobs(const LaunchedStep& step) {
  struct Row {
    Sequence* seq;
    int32_t pos;
    size_t logits_row;
  };
  std::vector<Row> rows;
  for (const LaunchedStep::PromptRows& run : step.prompt_rows) {
    Sequence* seq = step.scheduled[run.scheduled_index].seq;
    if (seq->finish != FinishReason::kNone) continue;
    for (int32_t r = 0; r < run.num_rows; ++r)
      rows.push_back({seq, run.first_pos + r, static_cast<size_t>(run.first_row + r)});
  }
  const auto vocab = static_cast<size_t>(vocab_size_);
  ForEachOnThreads(rows.size(), std::thread::hardware_concurrency(), [&](size_t i) {
    const Row& row = rows[i];
    const std::span<const float> logits = step.logits.subspan(row.logits_row * vocab, vocab);
    const int32_t token = row.seq->tokens[static_cast<size_t>(row.pos) + 1];
    SampleOutput raw = TokenLogprobs(logits, token, row.seq->request->request.prompt_logprobs);
    PromptLogprob& out = row.seq->prompt_logprobs[static_cast<size_t>(row.pos)];
    out.logprob = raw.logprob;
    out.rank = LogprobRank(logits, token);
    out.top_logprobs = std::move(raw.top_logprobs);
  });
}

void Engine::CompleteInFlight() {
  if (!in_flight_) return;
  LaunchedStep step = std::move(*in_flight_);
  in_flight_.reset();
  CompleteStep(step);
}

// A step whose Forward failed: its sequences end with an error (their K/V is not trusted).
void Engine::FailStep(const LaunchedStep& step) {
  for (const ScheduledSequence& s : step.scheduled) {
    if (s.seq->finish != FinishReason::kNone) continue;  // ended while it was being planned
    EmitFinalEvent(s.seq, FinishReason::kError);
    FinishSequence(s.seq, FinishReason::kError);
  }
  ReleaseStep(step);
}

void Engine::ReleaseStep(const LaunchedStep& step) {
  for (const ScheduledSequence& s : step.scheduled) --s.seq->steps_in_flight;
  std::erase_if(retired_, [](const auto& seq) { return seq->steps_in_flight == 0; });
}

void Engine::CompleteStep(LaunchedStep& step) {
  const int64_t wait_start = NowNs();
  if (step.deferred) {
    Status st = model_->WaitIds();
    const int64_t wait_ns = NowNs() - wait_start;
    counters_.forward_ns += wait_ns;
    if (step.decode_only) counters_.decode_forward_ns += wait_ns;
    if (!st.ok()) {
      LOG_ERROR << "forward step failed: " << st.message();
      FailStep(step);
      return;
    }
  }
  const int64_t finish_start = NowNs();
  const int32_t real_rows = step.real_rows;
  if (!step.deferred) {
    // The rows the host samples, in parallel across rows (per-sequence RNG: order-independent).
    row_outputs_.assign(static_cast<size_t>(real_rows), SampleOutput{});
    host_skip_.assign(static_cast<size_t>(real_rows), 0);
    for (int32_t r = 0; r < real_rows; ++r) host_skip_[r] = step.kinds[r] != RowOutput::kCopy;
    SampleRows(step.logits.first(static_cast<size_t>(real_rows) * static_cast<size_t>(vocab_size_)),
               vocab_size_, row_params_, row_states_, row_outputs_, host_skip_, step.row_masks);
    ComputePromptLogprobs(step);
  }

  size_t row = 0;
  for (size_t i = 0; i < step.scheduled.size(); ++i) {
    const ScheduledSequence& s = step.scheduled[i];
    Sequence* seq = s.seq;
    const size_t r = row;
    if (s.samples) ++row;
    if (seq->finish != FinishReason::kNone) continue;  // ended while this step was in flight
    RequestState& state = *seq->request;
    // Blocks of a sequence preempted since the launch are gone; it recomputes them.
    if (seq->started)
      kv_.CommitComputed(seq->id, seq->tokens, step.computed_end[i], state.request.cache_namespace);
    if (!state.admitted) {
      state.admitted = true;
      num_queued_.fetch_sub(1);
    }
    const bool prompt_done = step.computed_end[i] >= seq->prompt_len;
    if (seq->sample_index == 0 && prompt_done) state.prompt_prefilled = true;
    if (seq->needs_prompt_logits && prompt_done) {
      seq->needs_prompt_logits = false;
      seq->prompt_logprobs_ready = true;  // sent with the event below
    }
    if (!s.samples) {
      if (state.request.max_tokens == 0 && prompt_done) {  // a prompt-only request
        EmitFinalEvent(seq, FinishReason::kLength);
        FinishSequence(seq, FinishReason::kLength);
      }
      continue;
    }

    SampleOutput out;
    if (step.kinds[r] != RowOutput::kCopy) {
      out.token_id = step.ids[r];
    } else {
      out = std::move(row_outputs_[r]);
    }
    if (out.token_id < 0) {  // its token constraint allowed nothing
      LOG_WARN << "request " << state.request_id << ": the output constraint allows no token";
      EmitFinalEvent(seq, FinishReason::kError);
      FinishSequence(seq, FinishReason::kError);
      continue;
    }
    const int32_t index = step.token_index[i];
    seq->tokens[static_cast<size_t>(index)] = out.token_id;
    seq->sampler->Accept(out.token_id);
    const bool constraint_broken =
        seq->constraint != nullptr && !seq->constraint->Accept(out.token_id);
    if (constraint_broken) {
      LOG_WARN << "request " << state.request_id << ": token " << out.token_id
               << " broke the output constraint (non-finite logits?)";
    }

    FinishReason finish = FinishReason::kNone;
    bool stop_token = false;
    if (constraint_broken) {
      finish = FinishReason::kError;
    } else if (std::find(state.stop_ids.begin(), state.stop_ids.end(), out.token_id) !=
               state.stop_ids.end()) {
      finish = FinishReason::kStop;
      stop_token = true;
    } else if (seq->constraint != nullptr && seq->constraint->Done()) {
      finish = FinishReason::kStop;  // the structured output is complete
    } else if (index + 1 - seq->prompt_len >= state.request.max_tokens) {
      finish = FinishReason::kLength;
    }
    TokenEvent event = NewEvent(seq);
    event.token_id = out.token_id;
    event.logprob = out.logprob;
    event.top_logprobs = std::move(out.top_logprobs);
    event.finish = finish;
    event.stop_token = stop_token;
    event.time_ns = NowNs();
    state.stream->Push(std::move(event));
    if (finish != FinishReason::kNone) FinishSequence(seq, finish);
  }
  ReleaseStep(step);
  counters_.finish_ns += NowNs() - finish_start;
}

void Engine::PublishStatsAndCloseStreams() {
  counters_.preemptions = scheduler_.num_preemptions();
  counters_.num_running = static_cast<int32_t>(scheduler_.running().size());
  counters_.kv_blocks_used = kv_.NumUsedBlocks();
  counters_.kv_blocks_cached = kv_.NumCachedBlocks();
  counters_.prefix_query_tokens = scheduler_.prefix_query_tokens();
  counters_.prefix_hit_tokens = scheduler_.prefix_hit_tokens();
  {
    std::lock_guard<std::mutex> lock(mu_);
    published_ = counters_;
  }
  // A caller that sees its stream end also sees Stats() that include its request.
  for (const std::shared_ptr<ResponseStream>& stream : streams_to_close_) stream->Close();
  streams_to_close_.clear();
}

void Engine::Loop() {
  while (true) {
    bool stop_now = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (live_.empty() && !in_flight_) {
        cv_.wait(lock, [this] { return !inbox_.empty() || stopping_; });
      }
      if (stopping_ && (!drain_ || (live_.empty() && inbox_.empty()))) stop_now = true;
    }
    TakeInbox();
    if (stop_now) {
      for (auto& [id, seq] : live_) seq->request->stream->Cancel();
    }
    ReapCancelled();
    if (stop_now) {
      CompleteInFlight();
      PublishStatsAndCloseStreams();
      return;
    }
    const int64_t schedule_start = NowNs();
    StepPlan plan = scheduler_.Schedule();
    counters_.schedule_ns += NowNs() - schedule_start;
    if (plan.empty() && in_flight_) {
      // Nothing to add behind the step in flight (its sequences are on their last tokens).
      CompleteInFlight();
      PublishStatsAndCloseStreams();
      continue;
    }
    if (plan.empty()) {
      // Nothing fits right now (cannot last: admission guarantees a lone sequence fits).
      PublishStatsAndCloseStreams();
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(5));
      continue;
    }
    RunStep(plan);
    PublishStatsAndCloseStreams();
  }
}

}  // namespace ember
