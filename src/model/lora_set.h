// LoraSet: the LoRA adapters resident on a model's backend, a bounded pool of `max_loras` slots.
// A request's adapter takes a slot for the request's life (Acquire/Release, counted per user): the
// slot already holding it, else a free one, else the least recently used slot that no request
// holds (evicted); when every slot is held the caller waits. A step's rows name their slot in
// SequenceSlice::lora_slot (-1: the base model); BeginStep groups the plan's rows into runs of one
// slot, and Segments gives a projection's Backend::LoraDelta segments for that step.
// Invariants: a slot with users > 0 is never evicted or reloaded; a slot's matrices reach the
// backend through Backend::UploadLoraSlot (the CPU's tensors point into the slot's host matrices,
// kept while it holds the adapter; CUDA copies them into the slot's device storage, reused in
// place, and the host copy is dropped).
// Reading an adapter's files (LoadLoraAdapter: the read, the SHA-256 digest, the float32
// widening: ~0.2 s for an 8B-shaped rank-16 adapter) can happen on a thread of its own (Prepared),
// so the engine thread only uploads it.
// Not thread-safe: the engine thread only (it drives the model); a preparation's thread touches
// nothing but its own result and the (constant) model config.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <future>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/batch_plan.h"
#include "model/lora_adapter.h"
#include "util/status.h"

namespace ember {

class LoraSet {
 public:
  // Refuses a backend that cannot apply adapters (Backend::LoraUnsupported) and a model outside
  // the families llama.cc and gemma.cc run (LoraUnsupportedModel).
  static Result<std::unique_ptr<LoraSet>> Create(Backend* backend, const ModelConfig* config,
                                                 int32_t max_loras, int32_t max_rank);

  int32_t max_loras() const { return static_cast<int32_t>(slots_.size()); }
  int32_t max_rank() const { return max_rank_; }
  const ModelConfig& model_config() const { return *config_; }

  // A slot holding the adapter of `dir` whose LoadLoraAdapter digest is `digest` (as it was
  // registered), with one more user. nullopt: every slot is held by a request (retry later).
  // Errors: the folder no longer loads, or its digest changed since it was registered.
  Result<std::optional<int32_t>> Acquire(uint64_t digest, const std::string& dir);
  void Release(int32_t slot);
  // Whether Acquire(digest, dir) would read no files on this thread: the adapter is resident, or
  // its files have been read on a thread of their own (a failed read counts: Acquire reports
  // it). Otherwise starts that read (once) and returns false: ask again later. Before a read
  // starts while 2 x max_loras are unclaimed, finished ones are dropped, oldest first, until
  // fewer remain (reads still running are kept).
  bool Prepared(uint64_t digest, const std::string& dir);
  // Starts the read Prepared would start, for a request still queued behind others, unless the
  // adapter is resident, its read is held already, or 2 x max_loras reads are held (running or
  // unclaimed): then nothing happens, and the request's own Prepared starts it later.
  void Prefetch(uint64_t digest, const std::string& dir);
  // Reads held: running, or finished and not yet claimed by Acquire.
  int32_t reads_held() const { return static_cast<int32_t>(preparing_.size()); }

  // Groups the plan's rows by their sequences' lora_slot for this step's Segments.
  void BeginStep(const BatchPlan& plan);
  // True when a row of this step has an adapter targeting `target` (at any layer).
  bool StepTargets(LoraTarget target) const;
  // The LoraDelta segments of (layer, target) this step, in row order (empty: none). Valid until
  // the next call for the same target.
  std::span<const LoraSegment> Segments(int32_t layer, LoraTarget target);

  // Counters (tests, logs): adapters loaded into a slot, and of those, loads that evicted one.
  int64_t loads() const { return loads_; }
  // Of the loads, those whose files were read by Prepared's thread.
  int64_t prepared_loads() const { return prepared_loads_; }
  int64_t evictions() const { return evictions_; }
  // The digest held by `slot` (0: empty).
  uint64_t SlotDigest(int32_t slot) const { return slots_[static_cast<size_t>(slot)].digest; }

 private:
  LoraSet(Backend* backend, const ModelConfig* config, int32_t max_loras, int32_t max_rank);
  Status Load(int32_t slot, const std::string& dir, uint64_t digest);

  struct Weights {
    std::optional<Tensor> a, b;
  };
  struct Slot {
    uint64_t digest = 0;  // 0: empty
    int32_t users = 0;
    uint64_t last_used = 0;
    LoraAdapter host;  // its matrices (layers empty once a copying backend has them)
    std::vector<std::array<Weights, kNumLoraTargets>> tensors;  // [layer][target]
  };
  struct Run {
    int64_t first_row, rows;
    int32_t slot;
  };

  Backend* backend_;
  const ModelConfig* config_;
  int32_t max_rank_;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
  int64_t loads_ = 0, evictions_ = 0, prepared_loads_ = 0;
  // Adapters being read (or read and not yet loaded), by digest, oldest first.
  struct Preparation {
    uint64_t digest;
    std::string dir;
    std::future<Result<LoraAdapter>> adapter;
  };
  std::deque<Preparation> preparing_;
  std::deque<Preparation>::iterator FindPreparation(uint64_t digest, const std::string& dir);
  int32_t SlotOf(uint64_t digest) const;  // the slot holding the adapter, else -1
  // Reads Prepared and Prefetch hold at most (running, or finished and unclaimed).
  size_t MaxHeldReads() const { return 2 * slots_.size(); }
  void StartRead(uint64_t digest, const std::string& dir);
  std::vector<Run> runs_;  // this step's rows with an adapter, merged by slot
  std::array<std::vector<LoraSegment>, kNumLoraTargets> segments_;  // by target
};

}  // namespace ember
