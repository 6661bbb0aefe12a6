#include "backend/batch_plan.h"

namespace ember {

void BatchPlan::AddSequence(const std::vector<int32_t>& tokens, int32_t first_pos,
                            const std::vector<int32_t>& blocks, bool want_logits) {
  SequenceSlice s;
  s.query_start = num_tokens();
  s.query_len = static_cast<int32_t>(tokens.size());
  s.context_len = first_pos + s.query_len;
  s.block_table_start = static_cast<int32_t>(block_tables.size());
  s.num_blocks = (s.context_len + block_size - 1) / block_size;
  for (int32_t b = 0; b < s.num_blocks; ++b) block_tables.push_back(blocks[b]);
  for (int32_t i = 0; i < s.query_len; ++i) {
    int32_t pos = first_pos + i;
    token_ids.push_back(tokens[i]);
    positions.push_back(pos);
    slot_mapping.push_back(blocks[pos / block_size] * block_size + pos % block_size);
  }
  if (want_logits && s.query_len > 0) logits_rows.push_back(s.query_start + s.query_len - 1);
  seqs.push_back(s);
}

std::string BatchPlan::Validate(int32_t num_kv_blocks) const {
  if (positions.size() != token_ids.size() || slot_mapping.size() != token_ids.size())
    return "token_ids, positions and slot_mapping differ in length";
  int32_t expected_start = 0;
  for (const SequenceSlice& s : seqs) {
    if (s.query_start != expected_start) return "sequence rows are not contiguous";
    expected_start += s.query_len;
    if (s.context_len < s.query_len) return "context_len < query_len";
    if (s.num_blocks * block_size < s.context_len) return "block table too short";
    if (s.block_table_start + s.num_blocks > static_cast<int32_t>(block_tables.size()))
      return "block table out of range";
    for (int32_t b = 0; b < s.num_blocks; ++b) {
      int32_t id = block_tables[s.block_table_start + b];
      if (id < 0 || id >= num_kv_blocks) return "block id out of range";
    }
    for (int32_t i = 0; i < s.query_len; ++i) {
      int32_t row = s.query_start + i;
      int32_t pos = s.context_len - s.query_len + i;
      if (positions[row] != pos) return "positions are not consecutive";
      int32_t block = block_tables[s.block_table_start + pos / block_size];
      if (slot_mapping[row] != block * block_size + pos % block_size) return "bad slot_mapping";
    }
  }
  if (expected_start != num_tokens()) return "rows not covered by sequences";
  for (int32_t r : logits_rows)
    if (r < 0 || r >= num_tokens()) return "logits row out of range";
  return "";
}

}  // namespace ember
