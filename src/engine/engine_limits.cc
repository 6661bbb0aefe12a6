#include "engine/engine_limits.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "kv/kv_cache_manager.h"
#include "sampling/request_sampling.h"
#include "util/log.h"

namespace ember {

int32_t PromptLogitsRows(const EngineConfig& config, int32_t vocab_size) {
  const int64_t rows = config.prompt_logits_bytes / (int64_t{4} * std::max(vocab_size, 1));
  return static_cast<int32_t>(std::clamp<int64_t>(rows, 1, std::max(config.max_step_tokens, 1)));
}

int64_t StepWorkspaceBytes(const Model& model, const EngineConfig& config) {
  // A step's logits rows: one sampled row per running sequence, and prompt-logprobs rows.
  const int64_t logits_rows =
      int64_t{config.max_running} + PromptLogitsRows(config, model.config().vocab_size);
  return model.StepWorkspaceBytes(config.max_step_tokens, logits_rows);
}

int64_t DeviceBytesLeft(const BackendMemory& mem, double fraction) {
  return static_cast<int64_t>(fraction * static_cast<double>(mem.total_bytes)) -
         (mem.total_bytes - mem.free_bytes);
}

Result<int64_t> DefaultKvCacheBytes(const Model& model, const EngineConfig& config) {
  const int64_t per_token = model.KvBytesPerToken();
  // Never more than every running sequence at full (served) context could use.
  const int64_t context =
      config.max_model_len > 0 ? config.max_model_len : model.config().max_position_embeddings;
  const int64_t want = int64_t{config.max_running} * context * per_token;
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
  const int32_t model_context = model.config().max_position_embeddings;
  if (config.max_model_len < 0 || config.max_model_len > model_context)
    return Status::Error("--max-model-len: must be in [1, " + std::to_string(model_context) +
                         "] (the model's max_position_embeddings; 0: that), got " +
                         std::to_string(config.max_model_len));
  if (config.speculation.max_batch < 0)
    return Status::Error("--spec-max-batch: must be >= 0 (0: the device's default), got " +
                         std::to_string(config.speculation.max_batch));
  if (config.max_running > 0 && config.max_step_tokens > 0 && config.speculation.max_batch > 0)
    return config;
  EMBER_ASSIGN_OR_RETURN(BackendMemory mem, model.MemoryInfo());
  if (config.speculation.max_batch == 0) {
    config.speculation.max_batch =
        mem.device ? SpeculationConfig::kGpuSpecMaxBatch : SpeculationConfig::kCpuSpecMaxBatch;
  }
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

// The served context: --max-model-len when it fits the pool (an error naming both numbers when it
// does not), else the model's context capped to what the pool holds, so that /v1/models never
// advertises more than one request can use.
Status ResolveServedContext(const Model& model, EngineSizing& sizing) {
  EngineConfig& config = sizing.config;
  const int64_t pool_tokens = int64_t{sizing.num_blocks} * config.block_size;
  const int32_t model_context = model.config().max_position_embeddings;
  if (config.max_model_len > 0) {
    if (config.max_model_len > pool_tokens)
      return Status::Error("--max-model-len " + std::to_string(config.max_model_len) +
                           ": the KV cache holds only " + std::to_string(pool_tokens) +
                           " tokens (" + std::to_string(sizing.kv_cache_bytes) +
                           " bytes); raise --kv-cache-bytes (or --gpu-memory-fraction) or lower "
                           "--max-model-len");
    return Status::Ok();
  }
  config.max_model_len = static_cast<int32_t>(std::min<int64_t>(model_context, pool_tokens));
  if (config.max_model_len < model_context) {
    LOG_INFO << "served context: " << config.max_model_len << " tokens (the KV cache holds "
             << pool_tokens << " of the model's " << model_context
             << "; raise --kv-cache-bytes for more)";
  }
  return Status::Ok();
}

// A model with recurrent layers (qwen3_next): the state at a prefix's end is not in its KV
// blocks, so prefix reuse needs state checkpoints (sized in SizeEngine; the prompt cache's RAM
// and disk tiers keep them too: engine/state_tier.h); speculative decoding is refused on a
// backend that cannot keep the per-row state snapshots its rollback needs.
Status ResolveRecurrentModel(const Model& model, EngineConfig& config) {
  if (!model.has_recurrent_state()) return Status::Ok();
  const std::string what = "model_type " + model.config().model_type +
                           " has recurrent (linear-attention) layers";
  if (config.speculation.method != SpeculationConfig::Method::kNone) {
    const std::string why = model.StateSnapshotsUnsupported();
    if (!why.empty())
      return Status::Error("speculative decoding: " + what +
                           ", whose rejected drafts are rolled back from per-row state "
                           "snapshots, and " + why + "; run it with --device cpu");
  }
  const int32_t interval = config.state_checkpoint_interval;
  if (interval < 0 || (config.block_size > 0 && interval % config.block_size != 0))
    return Status::Error("--state-checkpoint-interval " + std::to_string(interval) +
                         ": must be 0 or a positive multiple of the block size (" +
                         std::to_string(config.block_size) + ")");
  if (config.state_checkpoint_bytes < -1)
    return Status::Error("--state-checkpoint-bytes: must be >= 0 (or -1: auto)");
  return Status::Ok();
}

// Speculation on a model with recurrent layers: how many sequences draft in one step at most
// (nobody drafts while more than SpeculationConfig::max_batch run) and so hold snapshot slots.
int32_t SpecSnapshotGroups(const EngineConfig& config) {
  if (config.speculation.method == SpeculationConfig::Method::kNone) return 0;
  return std::min(config.max_running, config.speculation.max_batch);
}

// Its snapshot slots: num_spec_tokens per drafting sequence (the state after each row but the
// last of its 1 + k verification rows; StepBuilder hands them out).
int32_t SpecSnapshotSlots(const EngineConfig& config) {
  return SpecSnapshotGroups(config) * config.speculation.num_spec_tokens;
}

// A model with recurrent layers and the prefix cache on: the state checkpoints' share of the
// KV budget `bytes` (which it lowers). None (the prefix cache off, with a log line) when not one
// checkpoint fits.
Status SizeStateCheckpoints(const Model& model, int64_t& bytes, EngineSizing& sizing) {
  EngineConfig& config = sizing.config;
  if (!config.enable_prefix_caching) return Status::Ok();
  const int64_t per = model.StateBytesPerSequence();
  const bool explicit_bytes = config.state_checkpoint_bytes >= 0;
  const int64_t want = explicit_bytes ? config.state_checkpoint_bytes : bytes / 8;
  if (explicit_bytes && want >= bytes)
    return Status::Error("--state-checkpoint-bytes " + std::to_string(want) +
                         " leaves nothing of the KV cache's " + std::to_string(bytes) +
                         " bytes for its blocks: lower it or raise --kv-cache-bytes");
  const int64_t count = std::min<int64_t>(want / per, 1 << 20);
  if (count == 0) {
    config.enable_prefix_caching = false;
    LOG_INFO << "prefix caching: off (model_type " << model.config().model_type
             << " has recurrent layers and " << want << " bytes hold no state checkpoint of "
             << per << " bytes; raise --state-checkpoint-bytes)";
    return Status::Ok();
  }
  sizing.num_state_checkpoints = static_cast<int32_t>(count);
  sizing.state_checkpoint_bytes = count * per;
  bytes -= sizing.state_checkpoint_bytes;
  LOG_INFO << "prefix caching: " << count << " recurrent-state checkpoints of " << per
           << " bytes (" << sizing.state_checkpoint_bytes << " bytes of the KV cache), every "
           << config.state_checkpoint_interval << " tokens and at each prompt's last full block";
  return Status::Ok();
}

}  // namespace

Result<EngineSizing> SizeEngine(const Model& model, const EngineConfig& requested) {
  if (!(requested.gpu_memory_fraction > 0.0 && requested.gpu_memory_fraction <= 1.0))
    return Status::Error("--gpu-memory-fraction must be in (0, 1], got " +
                         std::to_string(requested.gpu_memory_fraction));
  EngineSizing sizing;
  EMBER_ASSIGN_OR_RETURN(sizing.config, ResolveEngineLimits(model, requested));
  EMBER_RETURN_IF_ERROR(ResolveRecurrentModel(model, sizing.config));
  const EngineConfig& config = sizing.config;
  if (config.block_size <= 0) return Status::Error("block_size must be positive");
  if (requested.max_running == 0 || requested.max_step_tokens == 0) {
    LOG_INFO << "engine limits: " << config.max_running << " sequences, " << config.max_step_tokens
             << " tokens a step";
  }
  int64_t bytes = config.kv_cache_bytes;
  if (bytes <= 0) {
    EMBER_ASSIGN_OR_RETURN(bytes, DefaultKvCacheBytes(model, config));
  }
  const int64_t per_token = model.KvBytesPerToken();
  // A model with recurrent layers: max_running + 1 state slots (the last for padding rows) and,
  // with speculation, its snapshot slots, taken from an explicit --kv-cache-bytes, or added to
  // the default KV budget.
  if (model.has_recurrent_state()) {
    sizing.num_spec_snapshot_slots = SpecSnapshotSlots(config);
    sizing.state_bytes = (int64_t{config.max_running} + 1 + sizing.num_spec_snapshot_slots) *
                         model.StateBytesPerSequence();
    const bool explicit_budget = config.kv_cache_bytes > 0;
    if (explicit_budget && bytes <= sizing.state_bytes)
      return Status::Error("--kv-cache-bytes " + std::to_string(bytes) + " does not hold the " +
                           "recurrent state of " + std::to_string(config.max_running) +
                           " sequences, one scratch slot and " +
                           std::to_string(sizing.num_spec_snapshot_slots) +
                           " speculation snapshots (" +
                           std::to_string(sizing.state_bytes) +
                           " bytes): raise it or lower --max-batch (or --spec-max-batch, "
                           "--num-spec-tokens)");
    if (explicit_budget) bytes -= sizing.state_bytes;
    LOG_INFO << "recurrent state: " << (config.max_running + 1 + sizing.num_spec_snapshot_slots)
             << " slots of " << model.StateBytesPerSequence() << " bytes ("
             << sizing.state_bytes << " bytes"
             << (explicit_budget ? " of --kv-cache-bytes" : " beside the KV cache") << ")";
    if (sizing.num_spec_snapshot_slots > 0) {
      LOG_INFO << "speculative decoding: " << sizing.num_spec_snapshot_slots
               << " recurrent-state snapshot slots (" << sizing.num_spec_snapshot_slots
               << " x " << model.StateBytesPerSequence() << " = "
               << int64_t{sizing.num_spec_snapshot_slots} * model.StateBytesPerSequence()
               << " bytes of the above: " << config.speculation.num_spec_tokens
               << " per drafting sequence, at most " << SpecSnapshotGroups(config)
               << " drafting at once) roll back rejected drafts";
    }
    EMBER_RETURN_IF_ERROR(SizeStateCheckpoints(model, bytes, sizing));
  }
  sizing.num_blocks = kv::NumBlocksForBytes(bytes, per_token, config.block_size);
  if (sizing.num_blocks < 1) {
    return Status::Error("--kv-cache-bytes " + std::to_string(bytes) +
                         " holds no KV block (one block of " + std::to_string(config.block_size) +
                         " tokens needs " + std::to_string(per_token * config.block_size) +
                         " bytes)");
  }
  sizing.kv_cache_bytes = int64_t{sizing.num_blocks} * config.block_size * per_token;
  EMBER_RETURN_IF_ERROR(ResolveServedContext(model, sizing));
  return sizing;
}

namespace {

SubmitError Invalid(std::string message, std::string param) {
  return SubmitError{SubmitError::Code::kInvalidRequest, std::move(message), std::move(param)};
}

// The prompt's ids and the request's counts (max_tokens, prompt_logprobs, n, min_tokens).
std::optional<SubmitError> ValidatePromptAndCounts(const GenerationRequest& r,
                                                   const RequestLimits& limits) {
  if (r.prompt_ids.empty()) return Invalid("the prompt is empty", "prompt");
  for (int32_t id : r.prompt_ids) {
    if (id < 0 || id >= limits.vocab_size) {
      return Invalid("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                         std::to_string(limits.vocab_size) + ")",
                     "prompt");
    }
  }
  if (r.max_tokens < 0) {
    return Invalid("max_tokens must be at least 0, got " + std::to_string(r.max_tokens),
                   "max_tokens");
  }
  if (r.prompt_logprobs < -1 || r.prompt_logprobs > kMaxTopLogprobs) {
    return Invalid("prompt_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) +
                       "] (or -1: off), got " + std::to_string(r.prompt_logprobs),
                   "prompt_logprobs");
  }
  if (r.n < 1 || r.n > limits.max_n) {
    return Invalid(
        "n must be in [1, " + std::to_string(limits.max_n) + "], got " + std::to_string(r.n), "n");
  }
  return std::nullopt;
}

// The prompt plus max_tokens against the context length and the KV pool: the one rule
// (CheckContextFits) the request parsers apply too.
std::optional<SubmitError> ValidateLength(const GenerationRequest& r, const RequestLimits& limits) {
  const TokenLimits token_limits{limits.vocab_size, limits.context_length,
                                 limits.kv_capacity_tokens};
  if (auto error = CheckContextFits(static_cast<int64_t>(r.prompt_ids.size()), r.max_tokens,
                                    token_limits, "prompt"))
    return Invalid(error->message, error->field);
  return std::nullopt;
}

// min_tokens, the output constraint, the sampling parameters and the stop ids.
std::optional<SubmitError> ValidateSampling(const GenerationRequest& r,
                                            const RequestLimits& limits) {
  if (r.sampling.min_tokens > r.max_tokens) {
    return Invalid("min_tokens (" + std::to_string(r.sampling.min_tokens) +
                       ") must not exceed max_tokens (" + std::to_string(r.max_tokens) + ")",
                   "min_tokens");
  }
  if (r.constraint != nullptr && r.constraint->vocab_size() != limits.vocab_size) {
    return Invalid("the output constraint covers " + std::to_string(r.constraint->vocab_size()) +
                       " token ids but the model has " + std::to_string(limits.vocab_size),
                   "response_format");
  }
  Status st = r.sampling.Validate(limits.vocab_size);
  if (!st.ok()) {
    std::string param = st.message().substr(0, st.message().find(':'));
    return Invalid(st.message(), param);
  }
  for (int32_t id : r.stop_token_ids) {
    if (id < 0 || id >= limits.vocab_size)
      return Invalid("stop token id " + std::to_string(id) + " is outside the vocabulary",
                     "stop_token_ids");
  }
  return std::nullopt;
}

// An embedding request computes its prompt only, once (request.h: GenerationRequest::pooling).
std::optional<SubmitError> ValidateEmbedding(const GenerationRequest& r) {
  if (r.pooling.kind == PoolingKind::kNone) return std::nullopt;
  if (r.max_tokens != 0)
    return Invalid("an embedding request generates nothing: max_tokens must be 0", "max_tokens");
  if (r.n != 1) return Invalid("an embedding request has one sample: n must be 1", "n");
  if (r.prompt_logprobs >= 0)
    return Invalid("an embedding request takes no prompt_logprobs", "prompt_logprobs");
  if (r.constraint != nullptr)
    return Invalid("an embedding request takes no output constraint", "response_format");
  return std::nullopt;
}

}  // namespace

std::optional<SubmitError> ValidateRequest(const GenerationRequest& request,
                                           const RequestLimits& limits) {
  if (auto error = ValidatePromptAndCounts(request, limits)) return error;
  if (auto error = ValidateLength(request, limits)) return error;
  if (auto error = ValidateEmbedding(request)) return error;
  return ValidateSampling(request, limits);
}

}  // namespace ember
