#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <queue>
#include <thread>

#include "tokenizer/unicode.h"

namespace ember::tok {
namespace {

std::atomic<uint64_t> g_next_model_id{1};

// Per-thread cache of encoded words for the model used last on this thread.
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>> words;
  size_t num_bytes = 0;
};
thread_local WordCache t_word_cache;
constexpr size_t kMaxCachedWordBytes = 1024;
constexpr size_t kMaxCacheBytes = size_t{16} << 20;  // per thread; cleared when exceeded

}  // namespace

bool BpeModel::VocabMap::Matches(const Slot& slot, uint32_t tag, std::string_view s,
                                 const std::vector<std::string>& strings) {
  if (slot.tag != tag || slot.len != std::min<size_t>(s.size(), 255)) return false;
  size_t n = std::min(s.size(), kInline);
  if (std::memcmp(slot.head, s.data(), n) != 0) return false;
  return s.size() <= kInline || strings[size_t(slot.id)] == s;
}

void BpeModel::VocabMap::Build(const std::vector<std::string>* strings) {
  strings_ = strings;
  size_t cap = 16;
  while (cap < strings->size() * 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  std::vector<uint64_t> hashes(strings->size());
  for (size_t id = 0; id < strings->size(); ++id) hashes[id] = Hash((*strings)[id]);
  constexpr size_t kAhead = 16;  // prefetch distance: inserts are bound by cache misses
  for (size_t id = 0; id < strings->size(); ++id) {
    if (id + kAhead < strings->size()) Prefetch(hashes[id + kAhead]);
    const std::string& s = (*strings)[id];
    if (s.empty()) continue;
    uint64_t h = hashes[id];
    uint32_t tag = uint32_t(h >> 32);
    size_t i = h & mask_;
    bool duplicate = false;
    while (slots_[i].id >= 0) {
      if (Matches(slots_[i], tag, s, *strings)) {
        duplicate = true;
        break;
      }
      i = (i + 1) & mask_;
    }
    if (duplicate) continue;
    Slot& slot = slots_[i];
    slot.tag = tag;
    slot.id = int32_t(id);
    slot.len = uint8_t(std::min<size_t>(s.size(), 255));
    std::memcpy(slot.head, s.data(), std::min(s.size(), kInline));
  }
}

std::optional<int32_t> BpeModel::VocabMap::Find(std::string_view s, uint64_t h) const {
  uint32_t tag = uint32_t(h >> 32);
  for (size_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& slot = slots_[i];
    if (slot.id < 0) return std::nullopt;
    if (Matches(slot, tag, s, *strings_)) return slot.id;
  }
}

void BpeModel::MergeMap::Reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Entry{});
  mask_ = cap - 1;
}

void BpeModel::MergeMap::Insert(uint64_t key, uint64_t value) {
  size_t i = Mix(key) & mask_;
  while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
  if (slots_[i].key == key) return;  // first (lowest-rank) occurrence wins
  slots_[i] = {key, value};
}

Result<std::unique_ptr<BpeModel>> BpeModel::FromJson(Json json) {
  std::string type = JsonTypeOf(json);
  if (!type.empty() && type != "BPE") return Status::Error("unsupported model type '" + type + "'");
  auto m = std::make_unique<BpeModel>();
  m->cache_owner_ = g_next_model_id.fetch_add(1);

  // Vocab: string -> id. Strings are stored by id so the map can hold views into them.
  simdjson::dom::object vocab;
  auto vf = JsonField(json, "vocab");
  if (!vf || vf->get_object().get(vocab) != simdjson::SUCCESS)
    return Status::Error("model: expected an object 'vocab'");
  int64_t max_id = -1;
  for (auto field : vocab) {
    int64_t id;
    if (field.value.get_int64().get(id) != simdjson::SUCCESS || id < 0 || id > INT32_MAX)
      return Status::Error("model.vocab: id of '" + std::string(field.key) + "' is not a valid id");
    max_id = std::max(max_id, id);
  }
  m->id_to_token_.resize(size_t(max_id + 1));
  for (auto field : vocab) {
    int64_t id = field.value.get_int64().value_unsafe();
    m->id_to_token_[size_t(id)] = std::string(field.key);
  }
  m->InitVocab();

  m->continuing_subword_prefix_ = JsonStringOr(json, "continuing_subword_prefix", "");
  m->end_of_word_suffix_ = JsonStringOr(json, "end_of_word_suffix", "");
  m->fuse_unk_ = JsonBoolOr(json, "fuse_unk", false);
  m->byte_fallback_ = JsonBoolOr(json, "byte_fallback", false);
  m->ignore_merges_ = JsonBoolOr(json, "ignore_merges", false);
  if (auto unk = JsonField(json, "unk_token")) {
    std::string_view u;
    if (unk->get_string().get(u) == simdjson::SUCCESS) {
      auto id = m->Lookup(u);
      if (!id) return Status::Error("model.unk_token '" + std::string(u) + "' is not in the vocab");
      m->unk_id_ = *id;
    }
  }
  if (auto dropout = JsonField(json, "dropout")) {
    double d = 0;
    if (dropout->get_double().get(d) == simdjson::SUCCESS && d > 0)
      return Status::Error("model.dropout is not supported (must be null)");
  }
  if (auto merges = JsonField(json, "merges")) {
    EMBER_RETURN_IF_ERROR(m->LoadMerges(*merges));
  } else {
    m->merges_.Reserve(1);
  }
  return m;
}

Result<std::unique_ptr<BpeModel>> BpeModel::FromVocab(std::vector<std::string> id_to_token,
                                                      const std::vector<std::string>& merges,
                                                      bool ignore_merges) {
  auto m = std::make_unique<BpeModel>();
  m->cache_owner_ = g_next_model_id.fetch_add(1);
  m->id_to_token_ = std::move(id_to_token);
  m->ignore_merges_ = ignore_merges;
  m->InitVocab();
  std::vector<MergePair> pairs(merges.size());
  for (size_t r = 0; r < merges.size(); ++r)
    EMBER_RETURN_IF_ERROR(SplitMerge(merges[r], r, &pairs[r]));
  EMBER_RETURN_IF_ERROR(m->LoadMergePairs(pairs));
  return m;
}

void BpeModel::InitVocab() {
  vocab_.Build(&id_to_token_);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[b] = Lookup(name).value_or(-1);
  }
}

Status BpeModel::SplitMerge(std::string_view line, size_t rank, MergePair* pair) {
  size_t sp = line.find(' ');
  if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
    return Status::Error("merges[" + std::to_string(rank) + "]: expected 'a b', got '" +
                         std::string(line) + "'");
  *pair = {line.substr(0, sp), line.substr(sp + 1)};
  return Status::Ok();
}

// Merges: "a b" strings or ["a", "b"] pairs; rank = position. Resolving a merge to ids is bound
// by cache misses in the vocab table, so it runs on several threads (read-only lookups), each in
// chunks whose hash slots are prefetched first; the merge table is then filled in rank order.
Status BpeModel::LoadMerges(Json json) {
  simdjson::dom::array merges;
  if (json.get_array().get(merges) != simdjson::SUCCESS)
    return Status::Error("model: 'merges' must be an array");
  std::vector<MergePair> pairs;
  pairs.reserve(merges.size());
  for (Json e : merges) {
    const size_t r = pairs.size();
    MergePair pair;
    std::string_view line;
    if (e.get_string().get(line) == simdjson::SUCCESS) {
      EMBER_RETURN_IF_ERROR(SplitMerge(line, r, &pair).WithContext("model"));
    } else {
      simdjson::dom::array arr;
      if (e.get_array().get(arr) != simdjson::SUCCESS || arr.size() != 2 ||
          arr.at(0).get_string().get(pair.first) != simdjson::SUCCESS ||
          arr.at(1).get_string().get(pair.second) != simdjson::SUCCESS)
        return Status::Error("model.merges[" + std::to_string(r) +
                             "]: expected a string or a pair of strings");
    }
    pairs.push_back(pair);
  }
  return LoadMergePairs(pairs);
}

Status BpeModel::LoadMergePairs(const std::vector<MergePair>& pairs) {
  const size_t n = pairs.size();
  std::vector<uint64_t> keys(n), values(n);

  size_t num_threads = n < 20000 ? 1 : std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  std::vector<Status> statuses(num_threads);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < num_threads; ++t) {
    size_t begin = n * t / num_threads, end = n * (t + 1) / num_threads;
    auto work = [this, &pairs, &keys, &values, &statuses, t, begin, end] {
      statuses[t] = ResolveMerges(pairs, begin, end, keys.data(), values.data());
    };
    if (t + 1 == num_threads) work();
    else threads.emplace_back(work);
  }
  for (std::thread& th : threads) th.join();
  for (const Status& st : statuses) EMBER_RETURN_IF_ERROR(st);

  merges_.Reserve(n);
  constexpr size_t kAhead = 16;
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) merges_.Prefetch(keys[i + kAhead]);
    merges_.Insert(keys[i], values[i]);  // the first occurrence of a pair wins
  }
  return Status::Ok();
}

Status BpeModel::ResolveMerges(const std::vector<MergePair>& pairs, size_t begin, size_t end,
                               uint64_t* keys, uint64_t* values) const {
  constexpr size_t kChunk = 32;
  struct Item {
    std::string_view a, b;
    size_t joined_begin, joined_len;
    uint64_t ha, hb, hj;
  };
  Item items[kChunk];
  std::string joined;
  const size_t prefix = continuing_subword_prefix_.size();
  for (size_t base = begin; base < end; base += kChunk) {
    const size_t n = std::min(kChunk, end - base);
    // 1. Hash a chunk's strings, prefetch their vocab slots.
    joined.clear();
    for (size_t k = 0; k < n; ++k) {
      Item& item = items[k];
      item.a = pairs[base + k].first;
      item.b = pairs[base + k].second;
      item.joined_begin = joined.size();
      joined.append(item.a);
      joined.append(item.b.substr(std::min(prefix, item.b.size())));
      item.joined_len = joined.size() - item.joined_begin;
      item.ha = VocabMap::Hash(item.a);
      item.hb = VocabMap::Hash(item.b);
      vocab_.Prefetch(item.ha);
      vocab_.Prefetch(item.hb);
    }
    const std::string_view all_joined = joined;
    for (size_t k = 0; k < n; ++k) {
      items[k].hj = VocabMap::Hash(all_joined.substr(items[k].joined_begin, items[k].joined_len));
      vocab_.Prefetch(items[k].hj);
    }
    // 2. Resolve ids.
    for (size_t k = 0; k < n; ++k) {
      const Item& item = items[k];
      const size_t r = base + k;
      std::string_view j = all_joined.substr(item.joined_begin, item.joined_len);
      auto a_id = vocab_.Find(item.a, item.ha), b_id = vocab_.Find(item.b, item.hb);
      auto new_id = vocab_.Find(j, item.hj);
      if (!a_id || !b_id)
        return Status::Error("model.merges[" + std::to_string(r) + "]: token '" +
                             std::string(!a_id ? item.a : item.b) + "' is not in the vocab");
      if (!new_id)
        return Status::Error("model.merges[" + std::to_string(r) + "]: merged token '" +
                             std::string(j) + "' is not in the vocab");
      keys[r] = (uint64_t(uint32_t(*a_id)) << 32) | uint32_t(*b_id);
      values[r] = (uint64_t(r) << 32) | uint32_t(*new_id);
    }
  }
  return Status::Ok();
}

std::optional<int32_t> BpeModel::Lookup(std::string_view s) const {
  return vocab_.Find(s);
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const { return Lookup(token); }

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_token_.size()) return nullptr;
  const std::string& s = id_to_token_[size_t(id)];
  if (s.empty()) return nullptr;
  return &s;
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (word.size() > kMaxCachedWordBytes) {
    Encode(word, ids);
    return;
  }
  WordCache& cache = t_word_cache;
  if (cache.owner != cache_owner_) {
    cache.words.clear();
    cache.num_bytes = 0;
    cache.owner = cache_owner_;
  }
  // Heterogeneous lookup is C++20 for unordered_map only with transparent hashers; keep a key.
  thread_local std::string key;
  key.assign(word);
  auto it = cache.words.find(key);
  if (it != cache.words.end()) {
    ids->insert(ids->end(), it->second.begin(), it->second.end());
    return;
  }
  size_t start = ids->size();
  Encode(word, ids);
  if (cache.num_bytes > kMaxCacheBytes) {
    cache.words.clear();
    cache.num_bytes = 0;
  }
  cache.num_bytes += 64 + key.size() + (ids->size() - start) * sizeof(int32_t);
  cache.words.emplace(key, std::vector<int32_t>(ids->begin() + long(start), ids->end()));
}

// tokenizers' BPE::merge_word: one symbol per character (byte fallback or unk when the
// character is not in the vocab), then all merges.
void BpeModel::Encode(std::string_view word, std::vector<int32_t>* ids) const {
  if (ignore_merges_) {
    if (auto id = Lookup(word)) {
      ids->push_back(*id);
      return;
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id, uint32_t len) {
    int32_t idx = int32_t(symbols.size());
    symbols.push_back({id, idx - 1, idx + 1, len});
  };
  int32_t unk_pending = -1;  // pending unk id (fused while consecutive)
  uint32_t unk_len = 0;
  std::string buf;
  for (size_t i = 0; i < word.size();) {
    size_t len = Utf8SeqLen(uint8_t(word[i]));
    if (i + len > word.size()) len = word.size() - i;
    std::string_view ch = word.substr(i, len);
    bool is_first = i == 0, is_last = i + len == word.size();
    std::string_view key = ch;
    if ((!is_first && !continuing_subword_prefix_.empty()) ||
        (is_last && !end_of_word_suffix_.empty())) {
      buf.clear();
      if (!is_first) buf += continuing_subword_prefix_;
      buf += ch;
      if (is_last) buf += end_of_word_suffix_;
      key = buf;
    }
    i += len;
    if (auto id = Lookup(key)) {
      if (unk_pending >= 0) {
        add(unk_pending, unk_len);
        unk_pending = -1;
      }
      add(*id, uint32_t(len));
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : key) all = all && byte_ids_[c] >= 0;
      if (all) {
        for (unsigned char c : key) add(byte_ids_[c], 1);
        continue;
      }
    }
    if (unk_id_) {
      if (unk_pending >= 0 && fuse_unk_) {
        unk_len += uint32_t(len);
      } else {
        if (unk_pending >= 0) add(unk_pending, unk_len);
        unk_pending = *unk_id_;
        unk_len = uint32_t(len);
      }
    }
  }
  if (unk_pending >= 0) add(unk_pending, unk_len);
  if (symbols.empty()) return;
  symbols.back().next = -1;
  MergeAll(&symbols);
  for (const Symbol& s : symbols)
    if (s.len != 0) ids->push_back(s.id);
}

// tokenizers' Word::merge_all: a heap of candidate merges ordered by (rank, position); stale
// entries are skipped when the pair at that position no longer produces the same token.
void BpeModel::MergeAll(std::vector<Symbol>* symbols_ptr) const {
  std::vector<Symbol>& sym = *symbols_ptr;
  struct Cand {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> queue;
  auto pair_of = [&](int32_t l, int32_t r) {
    return merges_.Find((uint64_t(uint32_t(sym[size_t(l)].id)) << 32) | uint32_t(sym[size_t(r)].id));
  };
  constexpr uint64_t kNone = ~uint64_t{0};
  for (size_t i = 0; i + 1 < sym.size(); ++i) {
    uint64_t m = pair_of(int32_t(i), int32_t(i + 1));
    if (m != kNone) queue.push({uint32_t(m >> 32), int32_t(i), int32_t(uint32_t(m))});
  }
  while (!queue.empty()) {
    Cand top = queue.top();
    queue.pop();
    Symbol& cur = sym[size_t(top.pos)];
    if (cur.len == 0 || cur.next == -1) continue;
    int32_t next_pos = cur.next;
    uint64_t m = pair_of(top.pos, next_pos);
    if (m == kNone || int32_t(uint32_t(m)) != top.new_id) continue;
    Symbol right = sym[size_t(next_pos)];
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    sym[size_t(next_pos)].len = 0;
    if (right.next > -1 && size_t(right.next) < sym.size()) sym[size_t(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      uint64_t pm = pair_of(cur.prev, top.pos);
      if (pm != kNone) queue.push({uint32_t(pm >> 32), cur.prev, int32_t(uint32_t(pm))});
    }
    if (cur.next >= 0 && size_t(cur.next) < sym.size()) {
      uint64_t nm = pair_of(top.pos, cur.next);
      if (nm != kNone) queue.push({uint32_t(nm >> 32), top.pos, int32_t(uint32_t(nm))});
    }
  }
}

}  // namespace ember::tok
