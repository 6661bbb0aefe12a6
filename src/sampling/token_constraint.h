// A constraint on which token may come next in a sample (structured output). The engine asks it
// for the allowed set before sampling each token of a constrained sample (before the step's
// launch, on a helper thread: Allowed is const and depends only on the accepted tokens), masks
// the rest to -inf (after the raw logprobs on the host; where the backend samples the row, as
// logit edits when few tokens are masked, else as packed bits), tells it the chosen token, and
// ends the sample with finish reason "stop" once the constraint says the output is complete. Its
// steps never overlap (engine.h). One instance per sample: a request's prototype is cloned for
// each of its n. After each accepted token the engine asks ForcedToken (jump-forward): a token
// that is the only one allowed is accepted without sampling (engine thread or one helper thread
// per sample).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace ember {

// A mask as 0/1 bytes ([vocab]) packed into bits ([ceil(vocab / 32)] uint32 words, bit id % 32 of
// word id / 32; the bits past vocab are 0): the form a backend applies (Backend::ApplyTokenMasks).
inline void PackAllowedBits(const std::vector<uint8_t>& allowed, std::vector<uint32_t>* bits) {
  const size_t n = allowed.size();
  bits->assign((n + 31) / 32, 0);
  size_t id = 0;
  // Eight 0/1 bytes to eight bits: the multiply moves byte k's low bit to bit 56 + k.
  for (; id + 8 <= n; id += 8) {
    uint64_t x;
    std::memcpy(&x, allowed.data() + id, 8);
    const auto byte =
        static_cast<uint32_t>(((x & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56);
    (*bits)[id / 32] |= byte << (id % 32);
  }
  for (; id < n; ++id) (*bits)[id / 32] |= uint32_t{allowed[id] != 0} << (id % 32);
}

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual std::unique_ptr<TokenConstraint> Clone() const = 0;
  virtual int32_t vocab_size() const = 0;
  // allowed[id] = 1 for each id that may come next, 0 for the others (resized to vocab_size()).
  // Returns how many are allowed; 0 means the sample cannot go on (the engine ends it with an
  // error).
  virtual int64_t Allowed(std::vector<uint8_t>& allowed) const = 0;
  // The same set as packed bits (PackAllowedBits' form; resized to ceil(vocab_size() / 32)
  // words); returns the count. The default packs Allowed(); constraints that cache masks as bits
  // answer a cached state with a copy of them (no 0/1 byte per token).
  virtual int64_t AllowedBits(std::vector<uint32_t>& bits) const {
    thread_local std::vector<uint8_t> allowed;
    const int64_t count = Allowed(allowed);
    PackAllowedBits(allowed, &bits);
    return count;
  }
  // Advances past `id`. False when `id` was not allowed (a sampler fallback on a broken logits
  // row can pick one): the state is then undefined and the engine ends the sample with an error.
  virtual bool Accept(int32_t id) = 0;
  // The output is complete: nothing may follow.
  virtual bool Done() const = 0;
  // The one token that may come next, or -1 when none or several may (jump-forward: a row
  // masked to one allowed token yields that token under every sampler). The default counts
  // Allowed (which constraints with a MaskCache answer from the cache on the next step).
  virtual int32_t ForcedToken() const {
    thread_local std::vector<uint8_t> allowed;
    if (Allowed(allowed) != 1) return -1;
    for (size_t id = 0; id < allowed.size(); ++id)
      if (allowed[id] != 0) return static_cast<int32_t>(id);
    return -1;
  }
};

}  // namespace ember
