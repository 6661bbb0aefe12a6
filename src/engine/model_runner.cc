#include "engine/model_runner.h"

#include <algorithm>

#include "engine/clock.h"
#include "util/log.h"

namespace ember {

namespace {

// A decode step's padding row: token 0 at position 0, its K/V in the scratch block (which no
// sequence owns), a logits row whose argmax is dropped. The warm-up captures steps of these rows,
// so serving's padded steps must use the same. Recurrent state: the scratch slot (the one past
// the sequences').
struct Scratch {
  int32_t block = 0, state_slot = 0;
};
void AddPaddingRow(BatchPlan& plan, Scratch scratch) {
  plan.AddSequence({0}, 0, {scratch.block}, true);
  plan.seqs.back().state_slot = scratch.state_slot;
}

// The backend's decode graph buckets this engine can use: up to the first that holds
// max_running sequences.
std::vector<int32_t> UsableGraphBuckets(const Model& model, int32_t max_running) {
  std::vector<int32_t> buckets = model.DecodeGraphBuckets();
  const auto holds = std::lower_bound(buckets.begin(), buckets.end(), max_running);
  if (holds != buckets.end()) buckets.erase(holds + 1, buckets.end());
  return buckets;
}

// One warm-up step: every logits row an argmax nobody reads.
Status RunDummyStep(Model& model, const BatchPlan& plan) {
  const size_t rows = plan.logits_rows.size();
  std::vector<RowOutput> kinds(rows, RowOutput::kArgmax);
  std::vector<RowSampling> sampling(rows);
  std::vector<int32_t> ids(rows);
  const std::span<float> logits = model.HostLogitsBuffer(rows * model.config().vocab_size);
  return model.Forward(plan, StepOutputs{logits, kinds, sampling, ids, {}});
}

// Runs decode steps of every graph bucket (two each; two more batch-invariant ones where drafting
// may run, SpeculationConfig::invariant_steps) before serving, so each is captured now: a
// capture costs 6 to 50 ms on an H200 (1B and 8B shapes), which a step of a new batch size would
// otherwise pay mid-stream. A first step of max_step_tokens prompt rows in up to max_running
// sequences, each with a logits row, grows the backend's step workspace and plan buffer to their
// serving size first (the graphs hold their addresses). Every row is a dummy: token 0, its K/V
// in the scratch block (AddPaddingRow); the outputs are dropped.
Status WarmUpDecodeGraphs(Model& model, const EngineConfig& config,
                          const std::vector<int32_t>& buckets, Scratch scratch) {
  if (buckets.empty()) return Status::Ok();
  const int64_t start = NowNs();
  const int32_t bs = config.block_size;
  const int32_t tokens = std::min(config.max_step_tokens, model.config().max_position_embeddings);
  const int32_t seqs = std::min(config.max_running, tokens);
  BatchPlan prefill;
  prefill.block_size = bs;
  for (int32_t s = 0; s < seqs; ++s) {
    const int32_t len = tokens / seqs + (s < tokens % seqs ? 1 : 0);
    const std::vector<int32_t> table(static_cast<size_t>((len + bs - 1) / bs), scratch.block);
    prefill.AddSequence(std::vector<int32_t>(static_cast<size_t>(len), 0), 0, table, true);
    prefill.seqs.back().state_slot = scratch.state_slot;
  }
  // With speculation under `--batch-invariant auto`, the steps where drafting may run (at most
  // max_batch sequences) are batch-invariant: their buckets get a graph of that kind too, and the
  // workspace is grown by such a prefill step first (the fixed-order GEMM keeps its operands in
  // float32: a larger workspace, which a later step would otherwise grow mid-serving, past the
  // memory the KV pool left it).
  const SpeculationConfig& spec = config.speculation;
  const int32_t invariant_rows =
      spec.invariant_steps && spec.method != SpeculationConfig::Method::kNone ? spec.max_batch : 0;
  if (invariant_rows > 0) {
    prefill.batch_invariant = true;
    EMBER_RETURN_IF_ERROR(RunDummyStep(model, prefill));
    prefill.batch_invariant = false;
  }
  EMBER_RETURN_IF_ERROR(RunDummyStep(model, prefill));
  int32_t smaller = 0;  // the bucket before `rows`
  for (int32_t rows : buckets) {
    BatchPlan decode;
    decode.block_size = bs;
    for (int32_t s = 0; s < rows; ++s) AddPaddingRow(decode, scratch);
    // Twice: consecutive steps alternate between two sets of plan and ids buffers (the CUDA
    // backend's staging halves), so a bucket has a graph for each.
    for (bool invariant : {false, true}) {
      if (invariant && smaller >= invariant_rows) continue;  // no step of this bucket drafts
      decode.batch_invariant = invariant;
      EMBER_RETURN_IF_ERROR(RunDummyStep(model, decode));
      EMBER_RETURN_IF_ERROR(RunDummyStep(model, decode));
    }
    smaller = rows;
  }
  LOG_INFO << "decode-step graphs for " << buckets.size() << " batch sizes (1 to " << buckets.back()
           << " rows) captured in " << (NowNs() - start) / 1000000 << " ms";
  return Status::Ok();
}

}  // namespace

Result<ModelRunner> ModelRunner::Create(Model* model, const EngineConfig& config,
                                        int32_t num_blocks, int32_t num_state_checkpoints,
                                        int32_t num_spec_snapshots) {
  const Scratch scratch{num_blocks, config.max_running};
  // Recurrent state (a hybrid model): a slot per running sequence, the scratch one, the
  // checkpoints', the speculation snapshots'.
  EMBER_RETURN_IF_ERROR(model->AllocateKvCache(
      num_blocks + 1, config.block_size,
      config.max_running + 1 + num_state_checkpoints + num_spec_snapshots));
  std::vector<int32_t> buckets = UsableGraphBuckets(*model, config.max_running);
  EMBER_RETURN_IF_ERROR(WarmUpDecodeGraphs(*model, config, buckets, scratch));
  return ModelRunner(model, std::move(buckets), scratch.block, scratch.state_slot);
}

int32_t ModelRunner::PadToGraphBucket(BatchPlan& batch) const {
  const int32_t rows = batch.num_seqs();
  const auto bucket = std::lower_bound(graph_buckets_.begin(), graph_buckets_.end(), rows);
  if (bucket == graph_buckets_.end()) return 0;
  for (int32_t r = rows; r < *bucket; ++r) AddPaddingRow(batch, {scratch_block_, scratch_slot_});
  return *bucket - rows;
}

std::span<float> ModelRunner::LogitsBuffer(size_t rows) {
  return model_->HostLogitsBuffer(rows * static_cast<size_t>(vocab_size()));
}

void ModelRunner::AddForwardTime(int64_t ns, bool decode_only) {
  counters_.forward_ns += ns;
  if (decode_only) counters_.decode_forward_ns += ns;
}

Status ModelRunner::Launch(const BatchPlan& batch, const StepOutputs& outputs, bool decode_only) {
  const int64_t start = NowNs();
  Status st = model_->Forward(batch, outputs);
  AddForwardTime(NowNs() - start, decode_only);
  ++counters_.steps;
  counters_.computed_tokens += batch.num_tokens();
  if (st.ok() && outputs.defer_ids) ++counters_.overlapped_steps;
  return st;
}

Status ModelRunner::WaitIds(bool decode_only) {
  const int64_t start = NowNs();
  Status st = model_->WaitIds();
  AddForwardTime(NowNs() - start, decode_only);
  return st;
}

}  // namespace ember
