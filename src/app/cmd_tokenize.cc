// `ember tokenize --tokenizer DIR [--add-special]`: UTF-8 text on stdin -> a JSON array of ids.
// `ember detokenize --tokenizer DIR [--skip-special]`: a JSON array of ids on stdin -> the text,
// exactly (no added newline). Bad input (invalid UTF-8, bad JSON, an id out of range) exits
// non-zero with a one-line message.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/model_files.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/flags.h"

namespace ember::app {
namespace {

int Die(const std::string& message) {
  std::string line = message;
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  std::fprintf(stderr, "ember: %s\n", line.c_str());
  return 1;
}

std::string ReadStdin() {
  std::ios::sync_with_stdio(false);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

// Parses flags; returns -1 to continue, else the exit code (help printed or a bad flag).
int ParseFlags(FlagParser& flags, int argc, char** argv, int first, const std::string& dir,
               const char* command) {
  bool help = false;
  Status st = flags.Parse(argc, argv, first, &help);
  if (!st.ok()) return Die(std::string(command) + ": " + st.message());
  if (help) {
    std::fprintf(stdout, "%s\n", flags.Help().c_str());
    return 0;
  }
  if (dir.empty()) return Die(std::string(command) + ": --tokenizer DIR is required");
  return -1;
}

}  // namespace

int TokenizeCommand(int argc, char** argv, int first) {
  std::string dir;
  bool add_special = false;
  FlagParser flags("usage: ember tokenize --tokenizer DIR [--add-special] < text.txt\n"
                   "  prints the token ids of stdin (UTF-8) as a JSON array");
  flags.AddString("--tokenizer", &dir, "folder with tokenizer.json (+ tokenizer_config.json), or a .gguf file");
  flags.AddBool("--add-special", &add_special, "apply the post-processor (e.g. add BOS)");
  if (int rc = ParseFlags(flags, argc, argv, first, dir, "tokenize"); rc >= 0) return rc;

  std::string text = ReadStdin();
  if (!tok::IsValidUtf8(text)) return Die("tokenize: stdin is not valid UTF-8");
  auto tok = LoadModelTokenizer(dir);
  if (!tok.ok()) return Die("tokenize: " + tok.message());
  if (*tok == nullptr) return Die("tokenize: " + dir + "/tokenizer.json: not found");
  std::vector<int32_t> ids = (*tok)->Encode(text, add_special);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int DetokenizeCommand(int argc, char** argv, int first) {
  std::string dir;
  bool skip_special = false;
  FlagParser flags("usage: ember detokenize --tokenizer DIR [--skip-special] < ids.json\n"
                   "  prints the text of a JSON array of ids exactly (no added newline)");
  flags.AddString("--tokenizer", &dir, "folder with tokenizer.json (+ tokenizer_config.json), or a .gguf file");
  flags.AddBool("--skip-special", &skip_special, "leave out special tokens");
  if (int rc = ParseFlags(flags, argc, argv, first, dir, "detokenize"); rc >= 0) return rc;

  nlohmann::json input = nlohmann::json::parse(ReadStdin(), nullptr, /*allow_exceptions=*/false);
  if (input.is_discarded()) return Die("detokenize: stdin is not valid JSON");
  if (!input.is_array()) return Die("detokenize: expected a JSON array of token ids");
  auto tok = LoadModelTokenizer(dir);
  if (!tok.ok()) return Die("detokenize: " + tok.message());
  if (*tok == nullptr) return Die("detokenize: " + dir + "/tokenizer.json: not found");
  std::vector<int32_t> ids;
  ids.reserve(input.size());
  for (size_t i = 0; i < input.size(); ++i) {
    const nlohmann::json& v = input[i];
    if (!v.is_number_integer())
      return Die("detokenize: element " + std::to_string(i) + " is not an integer: " + v.dump());
    int64_t id = v.get<int64_t>();
    if (id < 0 || id >= (*tok)->vocab_size())
      return Die("detokenize: id " + std::to_string(id) + " at index " + std::to_string(i) +
                 " is out of range [0, " + std::to_string((*tok)->vocab_size()) + ")");
    ids.push_back(int32_t(id));
  }
  std::string text = (*tok)->Decode(ids, skip_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace ember::app
