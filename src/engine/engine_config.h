// EngineConfig (what the engine is asked to run with; ResolveEngineLimits fills its 0s) and
// EngineStats (its counters). Plain values: a config is fixed once the engine is created; the
// engine thread keeps the running totals and Engine::Stats() returns a snapshot to any thread.
#pragma once

#include <cstdint>
#include <string>

namespace ember {

// Speculative decoding (speculator.h): a draft source proposes up to num_spec_tokens tokens per
// sequence and step, and the step verifies them (1 + k rows of that sequence). Outputs are the
// same with it on or off; only the tokens per step change.
struct SpeculationConfig {
  // kDraft: ModelDraftSource (model_draft_source.h) over --draft-model; kMtp: the same over the
  // target checkpoint's multi-token-prediction module (deepseek_v3).
  enum class Method { kNone, kNgram, kDraft, kMtp };
  Method method = Method::kNone;
  // K: the most tokens one sequence drafts per step (its adaptive length stays within 1..K).
  int32_t num_spec_tokens = 4;
  // Back-off across the batch: no sequence drafts while more than this many sequences are
  // running (a large decode batch is compute-bound: verifying drafts would slow every row).
  // 0: the device's default (ResolveEngineLimits): kGpuSpecMaxBatch on a GPU, where the steps
  // that may draft also take the slower batch-invariant GEMMs (invariant_steps), else
  // kCpuSpecMaxBatch.
  int32_t max_batch = 0;
  static constexpr int32_t kGpuSpecMaxBatch = 8;
  static constexpr int32_t kCpuSpecMaxBatch = 16;
  // `--batch-invariant auto`: the steps where drafting may run (speculation on, at most max_batch
  // sequences running) are batch-invariant (BatchPlan::batch_invariant), so a verified token is
  // the one unspeculated decoding gives; above max_batch nobody drafts and steps take the
  // backend's fastest products. A backend created batch-invariant (`on`) is so in every step.
  bool invariant_steps = false;
  // ngram: the history suffix lengths tried, longest first.
  int32_t ngram_min = 1, ngram_max = 3;
  std::string draft_model;  // kDraft's checkpoint (--draft-model)
  // kDraft: the draft model's own KV pool in bytes (--draft-kv-cache-bytes); 0: the default,
  // kDefaultDraftKvCacheBytes. Apart from the target's pool (--kv-cache-bytes).
  int64_t draft_kv_cache_bytes = 0;
  static constexpr int64_t kDefaultDraftKvCacheBytes = int64_t{128} << 20;
};

// The prompt cache below the KV pool (engine/prompt_tier.h, prompt_cache/ram_store.h and
// disk_store.h).
struct PromptCacheConfig {
  std::string dir;         // --prompt-cache-dir: the disk tier's directory; empty: no disk tier
  int64_t disk_bytes = 0;  // --prompt-cache-disk-bytes: its cap (> 0 with dir)
  // --prompt-cache-ram-bytes: the host-RAM tier's cap (blocks the pool evicts are kept there, and
  // spill to the disk tier when RAM evicts them); 0: no RAM tier.
  int64_t ram_bytes = 0;
  // kCostAware: load a disk hit only when the measured read rate beats the measured prefill rate;
  // kAlways: load every hit (tests, benchmarks).
  enum class Reuse { kCostAware, kAlways } reuse = Reuse::kCostAware;
  int64_t max_queue_bytes = int64_t{256} << 20;  // writes waiting for the disk; beyond: dropped
};

struct EngineConfig {
  // 0 in either of the two limits below: the device's default (ResolveEngineLimits).
  int32_t max_running = 64;          // sequences decoded together (--max-batch)
  int32_t max_step_tokens = 512;     // rows per forward step; longer prompts prefill in chunks
  int64_t kv_cache_bytes = 0;        // KV pool cap (--kv-cache-bytes); 0: DefaultKvCacheBytes()
  double gpu_memory_fraction = 0.9;  // of a GPU's memory this process may use (weights + KV + work)
  int32_t block_size = 16;
  // The served context in tokens (--max-model-len): at most the model's max_position_embeddings
  // and what the KV pool holds (SizeEngine refuses more). 0: the model's, capped to the pool.
  int32_t max_model_len = 0;
  int32_t max_queue = 1024;  // requests waiting for admission before Submit says kQueueFull
  bool enable_prefix_caching = true;
  // A model with recurrent layers (qwen3_next): its prefix cache keeps recurrent-state
  // checkpoints (kv/state_checkpoints.h), one Model::StateBytesPerSequence each, taken out of the
  // KV cache bytes. state_checkpoint_bytes (--state-checkpoint-bytes): -1 auto (an eighth of the
  // KV cache bytes), 0 none (prefix caching then is off for such a model). Interval
  // (--state-checkpoint-interval): tokens between checkpoints within a sequence, a multiple of
  // block_size (0: only at the end of each prompt's last full block, which is always one).
  // Ignored for a model without recurrent layers.
  int64_t state_checkpoint_bytes = -1;
  int32_t state_checkpoint_interval = 512;
  int32_t max_n = 16;  // largest `n` accepted
  // LoRA adapters (--max-loras, --max-lora-rank): 0 slots is off (requests naming an adapter are
  // refused); else the model's LoraSet has max_loras slots for adapters of rank <= max_lora_rank.
  int32_t max_loras = 0;
  int32_t max_lora_rank = 64;
  // Sampled rows without logits processors: drawn by the backend (Backend::SampleRows) when it
  // prefers that (a GPU), or always (tests of the CPU twin), else by the host sampler.
  enum class BackendSampling { kAuto, kAlways } backend_sampling = BackendSampling::kAuto;
  // Overlapped steps: when every row's token is made by the backend from state the host already
  // has (greedy or backend-sampled, no penalties, min_tokens reached, no logprobs), a step is
  // launched before the previous step's ids are read: its decode rows take those ids as fed
  // tokens, and the host's bookkeeping of step N runs while step N + 1 computes. A sequence that
  // stops at step N has one wasted row in step N + 1. Outputs are identical either way.
  bool overlap_steps = true;
  // Jump-forward (StepPostprocessor::JumpForward): where a sample's token constraint allows
  // exactly one token, that token is appended without sampling (it is what any sampler picks
  // from a row masked to one token) and a chain of such tokens becomes prefill rows of the
  // sequence's next step. Outputs are token-identical either way; off with --no-jump-forward.
  bool jump_forward = true;
  // Prompt logprobs keep the float32 logits of every prompt row of such a request: one step holds
  // at most this many bytes of them (PromptLogitsRows), so a long prompt prefills in more, shorter
  // steps instead of holding gigabytes of logits (a 150k vocabulary is 600 KB a row).
  int64_t prompt_logits_bytes = int64_t{64} << 20;
  SpeculationConfig speculation;
  PromptCacheConfig prompt_cache;
};

// The RAM tier's counters (PromptTier::Stats). Blocks are full KV blocks (block_size tokens).
struct PromptCacheRamStats {
  bool enabled = false;  // --prompt-cache-ram-bytes > 0
  int64_t records = 0, bytes = 0, capacity_bytes = 0;
  // Page-locked memory taken for the records (a GPU's: the device copies them without staging;
  // taken at start-up, up to the cap; 0 on the CPU).
  int64_t pinned_bytes = 0;
  int64_t lookup_misses = 0;  // admissions that looked past the pool and found no next block here
  int64_t hits = 0;           // blocks read and verified
  int64_t misses = 0;         // reads of a block that was gone
  int64_t promotions = 0;     // blocks copied into the pool (counted as computed)
  int64_t demotions = 0;      // pool evictions copied in (a block already held is only refreshed)
  int64_t demote_failures = 0;  // pool evictions that could not be copied out
  int64_t evictions = 0;      // blocks evicted to stay under the cap (LRU)
  int64_t spills = 0;         // ... of them queued for the disk tier (not on disk yet)
  // The prefetcher (both tiers on): blocks of waiting requests moved from disk to RAM, reads
  // that found a block gone or refused it, and requests not prefetched (its queue was full).
  int64_t prefetched = 0, prefetch_failed = 0, prefetch_dropped = 0;
  int64_t insert_drops = 0;   // blocks larger than the cap
  int64_t corrupt_dropped = 0;  // records refused on read (identity or checksum)
  int64_t bytes_read = 0, bytes_written = 0;
  // Measured so far (0: not yet): bytes over the host's time in reads (lookup and identity
  // check; not the copy into the pool, which on a GPU the device makes itself, later), so the
  // cost rule loads from RAM whenever RAM holds the blocks.
  double read_bytes_per_s = 0;
  // A hybrid model's recurrent-state checkpoints here (engine/state_tier.h): records and bytes
  // (part of `bytes`, as their cap is part of capacity_bytes; their evictions, refused records,
  // insert drops, spills and failed or dropped prefetches count in the fields above),
  // checkpoints read and verified, and checkpoints moved from disk by the prefetcher.
  int64_t state_records = 0, state_bytes = 0, state_hits = 0, state_prefetched = 0;
};

// The disk tier's counters (PromptTier::Stats), the cost decisions of both tiers, and `ram`.
struct PromptCacheStats {
  // The last cost decision: load from disk (rates measured, or not yet), or recompute.
  enum class Choice : uint8_t { kNone, kLoad, kLoadUnmeasured, kRecompute };
  bool enabled = false;  // the disk tier (--prompt-cache-dir); the fields below are its own,
                         // except lookups, loads, recomputes and the rates (both tiers)
  int64_t records = 0, bytes = 0, capacity_bytes = 0, queued_bytes = 0;
  int64_t lookups = 0;         // admissions that looked past the pool's hit
  int64_t lookup_misses = 0;   // ... and found no next block in any tier
  int64_t hits = 0;            // blocks read and verified
  int64_t misses = 0;          // blocks read that were gone (evicted between lookup and read)
  int64_t promotions = 0;      // blocks copied into the pool (counted as computed)
  int64_t evictions = 0, writes = 0, write_drops = 0, write_errors = 0;
  int64_t corrupt_dropped = 0, stale_temps_removed = 0;
  int64_t bytes_read = 0, bytes_written = 0;
  int64_t loads = 0, recomputes = 0;  // cost decisions
  double read_bytes_per_s = 0, prefill_tokens_per_s = 0;  // measured so far (0: not yet)
  // The last decision: its choice and the rates it compared.
  Choice last_choice = Choice::kNone;
  double last_read_bytes_per_s = 0, last_prefill_tokens_per_s = 0;
  // A hybrid model's recurrent-state checkpoints on disk (engine/state_tier.h): records and bytes
  // (part of `bytes`, their cap part of capacity_bytes; their evictions, refused records, queued
  // bytes and write drops count in the fields above) and checkpoints read and verified. Both
  // tiers: state_restores, sequences resumed from a tier's checkpoint (written into their state
  // slot); state_misses, lookups whose blocks found below the pool had no readable checkpoint
  // (recomputed).
  bool state_checkpoints = false;  // a hybrid model: the tiers keep its state checkpoints
  int64_t state_records = 0, state_bytes = 0, state_hits = 0;
  int64_t state_restores = 0, state_misses = 0;
  PromptCacheRamStats ram;
};
// What a clear removed from the tiers below the pool (the pool's blocks go at the next step).
struct PromptCacheCleared {
  int64_t ram_blocks = 0, disk_blocks = 0;
  int64_t state_checkpoints = 0;  // a hybrid model's, from both tiers
};
// "none", "load", "load_unmeasured", "recompute".
const char* PromptCacheChoiceName(PromptCacheStats::Choice choice);

// Who counts what: LiveSequences the requests and tokens (requests_*, prompt_tokens,
// generated_tokens), ModelRunner the launches (steps, computed_tokens, forward_ns,
// decode_forward_ns, overlapped_steps), StepBuilder the decode steps (decode_steps, decode_rows,
// decode_padding_rows), StepPostprocessor finish_ns and the sampled/speculation counts, the
// Engine schedule_ns and the gauges.
struct EngineStats {
  int64_t requests_submitted = 0, requests_finished = 0, requests_cancelled = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t computed_tokens = 0;  // rows run through the model
  int64_t steps = 0, preemptions = 0;
  int32_t num_queued = 0;   // requests not yet admitted
  int32_t num_running = 0;  // sequences in the running batch
  int32_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0, block_size = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  // False when the prefix cache is off (--no-prefix-cache, or a model with recurrent layers
  // without room for a state checkpoint: SizeEngine).
  bool prefix_caching = true;
  // A model with recurrent layers: the state slots' bytes (EngineSizing::state_bytes); else 0.
  int64_t recurrent_state_bytes = 0;
  // Its recurrent-state checkpoints (kv/state_checkpoints.h): live now and their bytes, the
  // bytes reserved for them (EngineSizing::state_checkpoint_bytes), checkpoints committed so
  // far and live ones dropped to make room.
  int32_t state_checkpoints = 0;
  int64_t state_checkpoint_bytes = 0, state_checkpoint_capacity_bytes = 0;
  int64_t state_checkpoint_saves = 0, state_checkpoint_evictions = 0;
  // LoRA (EngineConfig::max_loras > 0): adapters loaded into a slot, loads that evicted an idle
  // one, and requests waiting for a slot now.
  int64_t lora_loads = 0, lora_evictions = 0;
  int32_t lora_waiting = 0;
  // Engine-thread wall time, summed over steps: scheduling, the model forward (recording and
  // launching the step, waiting for its outputs) and the rest of the step (host sampling, token
  // bookkeeping, prefix-cache commits, streaming the events).
  int64_t schedule_ns = 0, forward_ns = 0, finish_ns = 0;
  // The steps whose rows are all decode rows (one new token per sequence): count, rows, forward,
  // and the padding rows added to reach a graph bucket (Backend::DecodeGraphBuckets).
  int64_t decode_steps = 0, decode_rows = 0, decode_forward_ns = 0, decode_padding_rows = 0;
  // Steps launched before the previous step's ids were read (EngineConfig::overlap_steps).
  int64_t overlapped_steps = 0;
  // Per sequence and step that sampled: how many such (sequence, step) pairs, and the tokens they
  // produced (more than one when drafts were accepted): tokens per target step = their ratio.
  int64_t sampled_seq_steps = 0, sampled_tokens = 0;
  // Speculative decoding: sequence-steps that verified drafts, tokens drafted, drafts accepted.
  int64_t spec_verify_steps = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  // Jump-forward: tokens appended because the constraint allowed only them (not sampled; counted
  // in generated_tokens too).
  int64_t forced_tokens = 0;
  // Constrained sampled rows by where their token mask was applied: on the host (a kCopy row:
  // logprobs wanted, a host-sampled draw, or a mask that allows nothing), by the backend as
  // kMask edits (few ids masked), by the backend as packed bits (Backend::ApplyTokenMasks).
  int64_t masked_rows_host = 0, masked_rows_edits = 0, masked_rows_bits = 0;
  PromptCacheStats prompt_cache;  // enabled with --prompt-cache-dir, ram.enabled with -ram-bytes
};

}  // namespace ember
