// The GGUF vocabulary (tokenizer.ggml.*) that stands for a Hugging Face tokenizer folder
// (tokenizer.json + tokenizer_config.json), as llama.cpp's converter writes it: the inverse of
// Tokenizer::FromGgufVocab, used by `ember quantize`.
//   - a BPE model with byte fallback or a "▁" normalizer / Metaspace pre-tokenizer (SentencePiece
//     trained as BPE: llama2, gemma, TinyStories) -> "llama": pieces by id, scores from the merge
//     ranks (-rank; pieces no merge makes rank below all of them in id order; user-defined pieces
//     0), "<0xNN>" pieces as byte tokens, add_space_prefix from the "▁" prepend;
//   - a byte-level BPE -> "gpt2": tokens, ranked merges, and tokenizer.ggml.pre named by the
//     pre-tokenizer's split regex (GgufPreForRegex; GPT-2's own ByteLevel regex is "gpt-2", as
//     llama.cpp names it).
// Added tokens: special ones are control tokens, the others user-defined. BOS/EOS ids are the
// tokenizer's; add_bos/add_eos say what Encode(text, true) adds. Any other model type or split
// regex is an error naming it. Pure function; any thread.
#pragma once

#include <string>

#include "tokenizer/gguf_vocab.h"
#include "util/status.h"

namespace ember {

Result<GgufVocab> GgufVocabFromTokenizerDir(const std::string& dir);

}  // namespace ember
