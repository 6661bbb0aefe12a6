// `ember`: one binary, one subcommand per job. See README.md for each command's flags.
#include <cstdio>
#include <cstring>
#include <string>

#include "app/commands.h"
#include "util/version.h"

namespace {

struct Command {
  const char* name;
  int (*fn)(int, char**, int);
  const char* summary;
};

// Register a subcommand here once its app/cmd_*.cc exists.
constexpr Command kCommands[] = {
    {"version", nullptr, "print the version (also --version)"},
    {"help", nullptr, "this list (also --help); `ember COMMAND --help` for a command's flags"},
    {"run", ember::app::RunCommand, "generate from one prompt (text, ids or JSON output)"},
    {"batch", ember::app::BatchCommand, "offline generation for a JSONL file of prompts"},
    {"synth", ember::app::SynthCommand, "write a random-weight checkpoint shaped like a real model"},
    {"quantize", ember::app::QuantizeCommand, "write a safetensors folder as a GGUF file (f16 ... q4_k)"},
    {"bench", ember::app::BenchCommand, "prompt-processing and generation tokens/s (llama-bench style)"},
    {"serve", ember::app::ServeCommand, "OpenAI-compatible HTTP server (chat, completions, SSE)"},
    {"chat-template", ember::app::ChatTemplateCommand, "render a chat (JSON on stdin) with the model's template"},
    {"tokenize", ember::app::TokenizeCommand, "UTF-8 text on stdin -> JSON array of token ids"},
    {"detokenize", ember::app::DetokenizeCommand, "JSON array of token ids on stdin -> text"},
};

void PrintUsage() {
  std::fprintf(stderr, "usage: ember COMMAND [flags]   (ember COMMAND --help for its flags)\n\n");
  for (const Command& c : kCommands) std::fprintf(stderr, "  %-14s %s\n", c.name, c.summary);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage();
    return 2;
  }
  const std::string name = argv[1];
  if (name == "help" || name == "-h" || name == "--help") {
    PrintUsage();
    return 0;
  }
  if (name == "version" || name == "--version" || name == "-V") {
    std::printf("ember %s\n", ember::kEmberVersion);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (name == c.name && c.fn != nullptr) return c.fn(argc, argv, 2);
  }
  std::fprintf(stderr, "ember: unknown command '%s'\n\n", name.c_str());
  PrintUsage();
  return 2;
}
