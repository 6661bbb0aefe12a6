// BatchPlan: everything one forward step needs to know about the batch, as plain integers built
// by the engine's scheduler on the host. A step mixes prefill chunks and decode tokens of many
// sequences; each sequence's K/V lives in fixed-size blocks of the paged KV pool named by its
// block table. The backend uploads the plan once per step; the model's ops read it implicitly.
// Invariants (checked by Validate): rows of one sequence are contiguous and in position order;
// slot_mapping[i] = block_table[pos / block_size] * block_size + pos % block_size for row i.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ember {

struct SequenceSlice {
  int32_t query_start = 0;   // first row of this sequence in BatchPlan::token_ids
  int32_t query_len = 0;     // rows this step: a prefill chunk, or 1 when decoding
  int32_t context_len = 0;   // tokens in its KV after this step (computed before + query_len)
  int32_t block_table_start = 0;  // offset of its block ids in BatchPlan::block_tables
  int32_t num_blocks = 0;         // ceil(context_len / block_size) block ids
  int32_t state_slot = 0;  // its recurrent-state slot (models with recurrent layers; Backend)
  // A sequence verifying drafts on a model with recurrent layers: its state after each row
  // r < query_len - 1 is also left in slot snapshot_slot + r (the state slot ends after the last
  // row, as always), so the engine can roll back rejected drafts (Backend::CopyStateSlot).
  // -1: none.
  int32_t snapshot_slot = -1;
  int32_t lora_slot = -1;  // its LoRA adapter's slot (model/lora_set.h); -1: the base model
};

struct BatchPlan {
  int32_t block_size = 16;
  std::vector<int32_t> token_ids;     // [num_tokens]; -1 - r: the previous step's id of its
                                      // logits row r (a fed token, Backend::DeferStepIds)
  std::vector<int32_t> positions;     // [num_tokens] position of each row in its sequence
  std::vector<int32_t> slot_mapping;  // [num_tokens] KV slot (block_id * block_size + offset)
  std::vector<SequenceSlice> seqs;    // [num_seqs]
  std::vector<int32_t> block_tables;  // concatenated block ids of all sequences
  std::vector<int32_t> logits_rows;   // rows whose logits are returned, in output order
  // This step's products must be batch-invariant: each row's bits independent of the step's other
  // rows (CUDA: the fixed-order GEMM; a backend created batch-invariant is so for every step; the
  // CPU's default products always are). The engine sets it in the steps where speculation may
  // verify drafts under `--batch-invariant auto` (SpeculationConfig::invariant_steps).
  bool batch_invariant = false;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(seqs.size()); }

  // Appends one sequence's rows: tokens at positions [first_pos, first_pos + tokens.size()),
  // with `blocks` holding its whole block table (at least ceil(context / block_size) ids).
  // If want_logits, the last row is added to logits_rows.
  void AddSequence(const std::vector<int32_t>& tokens, int32_t first_pos,
                   const std::vector<int32_t>& blocks, bool want_logits);

  // Empty string when consistent, else what is wrong (used by tests and debug builds).
  std::string Validate(int32_t num_kv_blocks) const;
};

}  // namespace ember
