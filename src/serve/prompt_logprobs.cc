#include "serve/prompt_logprobs.h"

#include <algorithm>

#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace ember::serve {

namespace {

std::string DecodeAlone(const Tokenizer& tokenizer, int32_t id) {
  return tokenizer.Decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
}

// The first `num_top` alternatives (the engine may have computed more for another field).
std::span<const TokenLogprob> Top(const PromptLogprob& lp, int32_t num_top) {
  const size_t n = std::min(lp.top_logprobs.size(), static_cast<size_t>(std::max(num_top, 0)));
  return std::span<const TokenLogprob>(lp.top_logprobs).first(n);
}

}  // namespace

std::vector<TokenLogprobEntry> EchoLogprobEntries(const Tokenizer& tokenizer,
                                                  std::span<const int32_t> prompt_ids,
                                                  const std::vector<PromptLogprob>& logprobs,
                                                  int32_t num_top, const std::string& echo_text) {
  CHECK_EQ(logprobs.size() + 1, prompt_ids.size());
  std::vector<TokenLogprobEntry> entries(prompt_ids.size());
  IncrementalDetokenizer pieces(tokenizer, /*skip_special_tokens=*/false);
  for (size_t i = 0; i < prompt_ids.size(); ++i) entries[i].token = pieces.Push(prompt_ids[i]);
  entries.back().token += pieces.Flush();
  // Offsets in the decoded prompt, less what it has before the echoed text when it ends with it.
  std::string decoded;
  for (const TokenLogprobEntry& e : entries) decoded += e.token;
  const bool ends_with_echo =
      decoded.size() >= echo_text.size() &&
      decoded.compare(decoded.size() - echo_text.size(), echo_text.size(), echo_text) == 0;
  const int64_t shift =
      ends_with_echo ? static_cast<int64_t>(decoded.size() - echo_text.size()) : 0;
  int64_t position = 0;  // in `decoded`
  for (size_t i = 0; i < entries.size(); ++i) {
    TokenLogprobEntry& e = entries[i];
    e.text_offset =
        std::clamp<int64_t>(position - shift, 0, static_cast<int64_t>(echo_text.size()));
    position += static_cast<int64_t>(e.token.size());
    if (i == 0) {
      e.null_logprob = true;
      continue;
    }
    const PromptLogprob& lp = logprobs[i - 1];
    e.logprob = lp.logprob;
    for (const TokenLogprob& t : Top(lp, num_top))
      e.top.emplace_back(DecodeAlone(tokenizer, t.token_id), t.logprob);
  }
  return entries;
}

nlohmann::json VllmPromptLogprobs(const Tokenizer& tokenizer, std::span<const int32_t> prompt_ids,
                                  const std::vector<PromptLogprob>& logprobs, int32_t num_top) {
  CHECK_EQ(logprobs.size() + 1, prompt_ids.size());
  auto item = [&](int32_t id, float logprob, int32_t rank) {
    return nlohmann::json{{"logprob", SafeLogprob(logprob)},
                          {"rank", rank},
                          {"decoded_token", DecodeAlone(tokenizer, id)}};
  };
  nlohmann::json out = nlohmann::json::array({nullptr});
  for (size_t p = 1; p < prompt_ids.size(); ++p) {
    const PromptLogprob& lp = logprobs[p - 1];
    nlohmann::json position = nlohmann::json::object();
    const std::span<const TokenLogprob> top = Top(lp, num_top);
    for (size_t k = 0; k < top.size(); ++k)
      position[std::to_string(top[k].token_id)] =
          item(top[k].token_id, top[k].logprob, static_cast<int32_t>(k) + 1);
    position[std::to_string(prompt_ids[p])] = item(prompt_ids[p], lp.logprob, lp.rank);
    out.push_back(std::move(position));
  }
  return out;
}

}  // namespace ember::serve
