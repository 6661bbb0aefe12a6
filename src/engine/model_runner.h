// ModelRunner: runs the engine's steps on the model's device. It owns what belongs to running a
// step rather than deciding it: the KV pool's allocation (with one scratch block that no sequence
// owns), the decode-step graph buckets and their padding rows, the warm-up that captures those
// graphs before serving, launching a step (Model::Forward) and waiting for a deferred step's ids
// (Model::WaitIds), and the forward-time counters. The runner changes no sequence: rows in,
// tokens or logits out. Engine thread only (after Create).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/batch_plan.h"
#include "engine/engine_config.h"
#include "engine/prompt_tier.h"  // KvBlockIo
#include "model/model.h"
#include "util/status.h"

namespace ember {

class ModelRunner : public KvBlockIo {
 public:
  // Allocates the KV pool (num_blocks for the sequences, one more for the padding rows) and, for
  // a model with recurrent layers, its state slots (one per running sequence, the padding rows'
  // scratch slot at max_running, then num_state_checkpoints checkpoint slots, then
  // num_spec_snapshots speculation snapshot slots), picks the graph buckets this engine can use
  // and warms them up (WarmUpDecodeGraphs). `model` must outlive the runner.
  static Result<ModelRunner> Create(Model* model, const EngineConfig& config, int32_t num_blocks,
                                    int32_t num_state_checkpoints = 0,
                                    int32_t num_spec_snapshots = 0);

  // The launches' counters, with EngineStats' meaning (the engine publishes them).
  struct Counters {
    int64_t steps = 0, computed_tokens = 0;  // launches, and their rows (padding included)
    int64_t forward_ns = 0, decode_forward_ns = 0, overlapped_steps = 0;
  };
  const Counters& counters() const { return counters_; }

  const Model& model() const { return *model_; }
  int32_t vocab_size() const { return model_->config().vocab_size; }
  // True when RowOutput::kSample beats copying logits to the host sampler (a GPU backend).
  bool prefers_backend_sampling() const { return model_->prefers_backend_sampling(); }
  // Pads a decode step of batch.num_seqs() rows to the smallest graph bucket that holds it (none
  // when no bucket does) with padding rows; returns how many it added.
  int32_t PadToGraphBucket(BatchPlan& batch) const;
  // Where a step's `rows` logits rows arrive ([rows, vocab] float32; Model::HostLogitsBuffer).
  std::span<float> LogitsBuffer(size_t rows);
  // Launches one step (Model::Forward): with outputs.defer_ids it returns once the step is
  // enqueued and the ids come with WaitIds. decode_only: the step's time also counts as a decode
  // step's (EngineStats::decode_forward_ns).
  Status Launch(const BatchPlan& batch, const StepOutputs& outputs, bool decode_only);
  // Copies recurrent-state slot src over dst (Model::CopyStateSlot), ordered after every step
  // launched so far and before every later one.
  Status CopyStateSlot(int32_t src, int32_t dst) { return model_->CopyStateSlot(src, dst); }
  // Waits for the oldest deferred step's ids (Model::WaitIds); its time counts as forward time.
  Status WaitIds(bool decode_only);
  // KvBlockIo: the prompt cache's block copies (Model::CopyKvBlockToHost / FromHost), ordered
  // after every step launched so far.
  Status CopyBlocksToHost(std::span<const int32_t> blocks,
                          std::span<const std::span<uint8_t>> outs) override {
    return model_->CopyKvBlocksToHost(blocks, outs);
  }
  Status CopyBlockFromHost(int32_t block_id, std::span<const uint8_t> in) override {
    return model_->CopyKvBlockFromHost(block_id, in);
  }
  Status CopyBlockFromPinned(int32_t block_id, std::span<const uint8_t> in) override {
    return model_->CopyKvBlockFromPinned(block_id, in);
  }
  bool PinnedReadsDone(bool wait) override { return model_->PinnedReadsDone(wait); }
  // ... and the state checkpoints' (Model::CopyStateSlotToHost / FromHost), in the same order.
  Status CopyStateToHost(int32_t slot, std::span<uint8_t> out) override {
    return model_->CopyStateSlotToHost(slot, out);
  }
  Status CopyStateFromHost(int32_t slot, std::span<const uint8_t> in) override {
    return model_->CopyStateSlotFromHost(slot, in);
  }

 private:
  ModelRunner(Model* model, std::vector<int32_t> graph_buckets, int32_t scratch_block,
              int32_t scratch_slot)
      : model_(model),
        graph_buckets_(std::move(graph_buckets)),
        scratch_block_(scratch_block),
        scratch_slot_(scratch_slot) {}
  void AddForwardTime(int64_t ns, bool decode_only);

  Model* model_;
  // Decode steps are padded to these row counts (Backend::DecodeGraphBuckets); the padding rows
  // write their K/V to scratch_block_, the KV block past the sequences' num_blocks.
  std::vector<int32_t> graph_buckets_;
  int32_t scratch_block_ = 0;
  int32_t scratch_slot_ = 0;  // their recurrent-state slot (hybrid models): max_running
  Counters counters_;
};

}  // namespace ember
