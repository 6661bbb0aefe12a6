// Prompt logprobs as the server returns them (the engine hands them over once per prompt, on
// TokenEvent::prompt_logprobs): the echoed prompt's entries of a completions `logprobs` object
// (echo + logprobs), and vLLM's `prompt_logprobs` list. Pure functions over a const tokenizer;
// thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "serve/openai_response.h"

namespace ember {
class Tokenizer;
}  // namespace ember

namespace ember::serve {

// One entry per prompt token for an echo's completions logprobs. `token` is the text the token
// adds to the decoded prompt (incremental detokenization with special tokens kept: the tokens
// concatenate to the decoded prompt, a character split across tokens belongs to the token that
// completes it); `text_offset` is where that text starts in `echo_text`: its offset in the
// decoded prompt, less what the decoded prompt has before the echoed text when it ends with it
// (special tokens the tokenizer added to a text prompt, such as a BOS, and a normalizer's leading
// space: those tokens get offset 0), clamped to the text. The first token has no logprob
// (`null_logprob`); the others have theirs and up to `num_top` alternatives, each decoded alone (as
// generated tokens' are). `logprobs` has prompt_ids.size() - 1 entries.
std::vector<TokenLogprobEntry> EchoLogprobEntries(const Tokenizer& tokenizer,
                                                  std::span<const int32_t> prompt_ids,
                                                  const std::vector<PromptLogprob>& logprobs,
                                                  int32_t num_top, const std::string& echo_text);

// vLLM's prompt_logprobs: a list with one item per prompt token, null for the first, then an
// object keyed by token id (decimal string) holding {"logprob", "rank", "decoded_token"} for the
// prompt token and its top `num_top` alternatives (rank: 1-based place by logprob, ties by lower
// id; decoded_token: the token decoded alone, special tokens kept).
nlohmann::json VllmPromptLogprobs(const Tokenizer& tokenizer, std::span<const int32_t> prompt_ids,
                                  const std::vector<PromptLogprob>& logprobs, int32_t num_top);

}  // namespace ember::serve
