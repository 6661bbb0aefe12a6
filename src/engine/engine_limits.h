// Engine limits and defaults: the config's 0s resolved by where the model runs, the default KV
// pool size, the rows a step may keep for prompt logprobs, and the one check of a request against
// these limits (ValidateRequest). Functions of their arguments and the device's memory (read
// through the model, so before the engine thread drives it: Engine::Create); ValidateRequest
// from any thread. The workspace a step needs is the model's to say (Model::StepWorkspaceBytes);
// this file only says how many rows a step has.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/engine_config.h"
#include "engine/request.h"
#include "model/model.h"
#include "util/status.h"

namespace ember {

// Rows of one step whose logits are kept for prompt logprobs: config.prompt_logits_bytes of
// float32 rows of `vocab_size` (64 MiB: 110 rows of a 152k vocabulary, 512 of a 32k one), at
// least 1, at most max_step_tokens.
int32_t PromptLogitsRows(const EngineConfig& config, int32_t vocab_size);
// The model's StepWorkspaceBytes for a step at the config's limits: max_step_tokens rows, and a
// logits row per running sequence plus the prompt-logprobs rows (PromptLogitsRows).
int64_t StepWorkspaceBytes(const Model& model, const EngineConfig& config);
// vLLM's rule: this process may use `fraction` of the device's memory, and what is in use now
// (weights, runtime) counts against it. The bytes that leaves (negative when none).
int64_t DeviceBytesLeft(const BackendMemory& mem, double fraction);
// Default KV pool size when none is given: at most room for max_running full contexts; on a GPU
// what --gpu-memory-fraction of its memory leaves after the weights and a step's workspace
// (StepWorkspaceBytes; an error when nothing is left); on the CPU min(4 GiB, MemAvailable / 2).
Result<int64_t> DefaultKvCacheBytes(const Model& model, const EngineConfig& config);
// The limits a config leaves at 0, by where the model runs. On a GPU: 256 sequences, and steps of
// 8,192 tokens, halved (to 512 at least) while a step's workspace would take more than a quarter
// of the memory --gpu-memory-fraction leaves after the weights (GpuStepTokens). On the CPU: 64
// and 512. A negative limit is an error naming its flag. Why the GPU defaults are that large:
// concurrent serving throughput grows with both over the CPU's 64 / 512 (docs/perf.md).
Result<EngineConfig> ResolveEngineLimits(const Model& model, EngineConfig config);
// The largest of 8,192, 4,096, ..., 512 step tokens whose StepWorkspaceBytes (with the config's
// max_running) is at most `bytes`; 512 when none is.
int32_t GpuStepTokens(const Model& model, EngineConfig config, int64_t bytes);

// Everything Engine::Create decides before it allocates: the checked config with its limits
// resolved, and the KV pool in blocks (config.kv_cache_bytes, or DefaultKvCacheBytes).
struct EngineSizing {
  EngineConfig config;
  int32_t num_blocks = 0;
  int64_t kv_cache_bytes = 0;  // what num_blocks hold
  // A model with recurrent layers: the state slots' bytes (max_running + 1 slots plus the
  // speculation snapshots below, of Model::StateBytesPerSequence), taken from an explicit
  // --kv-cache-bytes before the blocks or added to the default budget; else 0.
  int64_t state_bytes = 0;
  // Of those, speculative decoding's snapshot slots (the state after each verification row, to
  // roll back rejected drafts): num_spec_tokens for each of min(max_running, spec max_batch)
  // drafting sequences, after the checkpoint slots; 0 without speculation.
  int32_t num_spec_snapshot_slots = 0;
  // Its recurrent-state checkpoints (EngineConfig::state_checkpoint_bytes): how many, and their
  // bytes, taken from the KV budget before the blocks. 0 turns its prefix cache off.
  int32_t num_state_checkpoints = 0;
  int64_t state_checkpoint_bytes = 0;
};
Result<EngineSizing> SizeEngine(const Model& model, const EngineConfig& requested);

// What a request is checked against (Engine::Submit): a request that can never run is refused
// with the numbers and the field to blame, instead of failing later.
struct RequestLimits {
  int32_t vocab_size = 0;
  int32_t context_length = 0;
  int64_t kv_capacity_tokens = 0;
  int32_t max_n = 0;
};
std::optional<SubmitError> ValidateRequest(const GenerationRequest& request,
                                           const RequestLimits& limits);

}  // namespace ember
