// GgufVocab: a tokenizer described the way GGUF files describe it (the tokenizer.ggml.* keys) as
// plain data, and Tokenizer::FromGgufVocab, which builds the tokenizer.json pipeline it stands for:
//   "llama" (SentencePiece): Prepend "▁" (add_space_prefix) and spaces -> "▁", score-driven merges
//     with "<0xNN>" byte fallback (SpmModel), decoded by "▁" -> space, bytes, and one leading space
//     stripped (add_space_prefix);
//   "gpt2" (byte-level BPE): the pre-tokenizer regex that tokenizer.ggml.pre names, the byte-level
//     alphabet, ranked merges (BpeModel), the byte-level decoder.
// Control and unknown tokens become special added tokens and user-defined ones plain added tokens,
// all matched in the raw text as llama.cpp does; add_bos/add_eos wrap Encode(..., true). Nothing
// here reads a GGUF file (model/ fills the struct). Value type; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ember {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class GgufTokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

struct GgufVocab {
  std::string model;                 // tokenizer.ggml.model: "llama" or "gpt2"
  std::string pre;                   // tokenizer.ggml.pre ("gpt2" only; empty: "default")
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens, by id
  std::vector<float> scores;         // tokenizer.ggml.scores ("llama": one per token)
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type (empty: all normal)
  std::vector<std::string> merges;   // tokenizer.ggml.merges ("gpt2": "a b", rank = position)
  std::optional<int32_t> bos_token_id, eos_token_id, unknown_token_id, padding_token_id;
  std::optional<bool> add_bos_token, add_eos_token;  // absent: the model's default
  std::optional<bool> add_space_prefix;              // tokenizer.ggml.add_space_prefix
};

// The tokenizer.ggml.pre values FromGgufVocab accepts, comma separated.
std::string SupportedGgufPreTokenizers();
// The tokenizer.ggml.pre value whose split regex is `regex` (a tokenizer.json Split pattern), as
// llama.cpp's converter spells it ("llama-bpe", "qwen2", "gpt-4o"); nullopt for another regex.
std::optional<std::string> GgufPreForRegex(std::string_view regex);

}  // namespace ember
