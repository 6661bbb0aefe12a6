// The BPE model of tokenizer.json: vocab, ranked merges, byte fallback, unk (fused or not),
// continuing_subword_prefix / end_of_word_suffix and ignore_merges, reproducing Hugging Face
// `tokenizers` (merges applied lowest rank first, leftmost first). Merges live in a hash map
// keyed by the packed pair of ids; each thread keeps a cache of recently encoded words.
// Immutable after FromJson / FromVocab; Tokenize is safe from several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/json.h"
#include "tokenizer/word_model.h"

namespace ember::tok {

class BpeModel : public WordModel {
 public:
  // `json` is tokenizer.json's "model" object (type BPE).
  static Result<std::unique_ptr<BpeModel>> FromJson(Json json);
  // A byte-level vocabulary given as plain data (GGUF's "gpt2" model): the token of each id and
  // the merges ("a b", rank = position); no unk token, no byte fallback.
  static Result<std::unique_ptr<BpeModel>> FromVocab(std::vector<std::string> id_to_token,
                                                     const std::vector<std::string>& merges,
                                                     bool ignore_merges);
  // Appends the ids of one pre-tokenized word.
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const override;

  std::optional<int32_t> TokenToId(std::string_view token) const override;
  // nullptr when the id is not in the vocab.
  const std::string* IdToToken(int32_t id) const override;
  int32_t max_id() const override { return int32_t(id_to_token_.size()) - 1; }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t len;  // 0 once merged away
  };
  // Open-addressing map token string -> id over the strings in id_to_token_. A slot keeps a
  // hash tag and the first bytes inline, so most probes (short tokens) touch one cache line.
  class VocabMap {
   public:
    void Build(const std::vector<std::string>* strings);
    std::optional<int32_t> Find(std::string_view s) const { return Find(s, Hash(s)); }
    std::optional<int32_t> Find(std::string_view s, uint64_t hash) const;
    void Prefetch(uint64_t hash) const { __builtin_prefetch(&slots_[hash & mask_]); }
    static uint64_t Hash(std::string_view s) { return std::hash<std::string_view>{}(s); }

   private:
    static constexpr size_t kInline = 7;
    struct Slot {
      uint32_t tag = 0;
      int32_t id = -1;
      uint8_t len = 0;  // min(length, 255)
      char head[kInline] = {};
    };
    static bool Matches(const Slot& slot, uint32_t tag, std::string_view s,
                        const std::vector<std::string>& strings);
    std::vector<Slot> slots_;
    size_t mask_ = 0;
    const std::vector<std::string>* strings_ = nullptr;
  };
  // Open-addressing map: (left id << 32 | right id) -> (rank << 32 | merged id).
  class MergeMap {
   public:
    void Reserve(size_t n);
    void Insert(uint64_t key, uint64_t value);
    void Prefetch(uint64_t key) const { __builtin_prefetch(&slots_[Mix(key) & mask_]); }
    // Returns UINT64_MAX when absent.
    uint64_t Find(uint64_t key) const {
      size_t i = Mix(key) & mask_;
      while (true) {
        const Entry& e = slots_[i];
        if (e.key == key) return e.value;
        if (e.key == kEmpty) return kEmpty;
        i = (i + 1) & mask_;
      }
    }

   private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    struct Entry {
      uint64_t key = kEmpty, value = kEmpty;
    };
    static uint64_t Mix(uint64_t k) {
      k ^= k >> 33;
      k *= 0xff51afd7ed558ccdULL;
      k ^= k >> 33;
      return k;
    }
    std::vector<Entry> slots_;
    size_t mask_ = 0;
  };

  using MergePair = std::pair<std::string_view, std::string_view>;
  void InitVocab();  // after id_to_token_ is set: the vocab map and the byte-fallback ids
  Status LoadMerges(Json merges);
  // Splits "a b" merge strings (error messages say where they came from: `what`).
  static Status SplitMerge(std::string_view line, size_t rank, MergePair* pair);
  Status LoadMergePairs(const std::vector<MergePair>& pairs);
  // Resolves merges [begin, end) to (left << 32 | right) keys and (rank << 32 | merged) values.
  Status ResolveMerges(const std::vector<MergePair>& pairs, size_t begin, size_t end,
                       uint64_t* keys, uint64_t* values) const;
  void Encode(std::string_view word, std::vector<int32_t>* ids) const;
  void MergeAll(std::vector<Symbol>* symbols) const;
  std::optional<int32_t> Lookup(std::string_view s) const;

  std::vector<std::string> id_to_token_;  // "" for ids the vocab does not use
  VocabMap vocab_;
  MergeMap merges_;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int32_t byte_ids_[256];  // byte fallback "<0xNN>" ids, -1 when absent
  uint64_t cache_owner_;   // distinguishes this model in the thread-local word cache
};

}  // namespace ember::tok
