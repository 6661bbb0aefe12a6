// `ember quantize`: writes a Hugging Face safetensors folder as one GGUF file, its projections
// quantized with Ember's own quantizers (model/gguf_export.h).
#include <cstdio>
#include <thread>

#include "app/commands.h"
#include "model/gguf_export.h"
#include "template/chat_template.h"
#include "util/flags.h"

namespace ember::app {

int QuantizeCommand(int argc, char** argv, int first) {
  std::string model, out, type, tokenizer;
  int64_t threads = 0;
  FlagParser flags("usage: ember quantize --model DIR --out FILE.gguf --type T [--tokenizer DIR] "
                   "[--threads N]\n  types: " + ExportTypeNames() +
                   "\n  architectures: " + ExportArchitectures());
  flags.AddString("--model", &model, "Hugging Face folder (config.json, safetensors, tokenizer)");
  flags.AddString("--out", &out, "the GGUF file to write (replaced only once complete)");
  flags.AddString("--type", &type,
                  "f32, f16, bf16 (every matrix); q8_0, q4_0, q4_k, q5_k, q6_k (the projections; "
                  "embedding and head keep the checkpoint's type); q4_k_m, q4_k_s, q5_k_m, q5_k_s "
                  "(llama.cpp's mixed recipes, every matrix)");
  flags.AddString("--tokenizer", &tokenizer,
                  "folder with tokenizer.json (+ tokenizer_config.json) when --model has none");
  flags.AddInt("--threads", &threads, "quantizer threads (default: all cores)");
  bool help = false;
  if (Status st = flags.Parse(argc, argv, first, &help); !st.ok()) {
    std::fprintf(stderr, "ember quantize: %s\n%s", st.message().c_str(), flags.Help().c_str());
    return 2;
  }
  if (help) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  if (model.empty() || out.empty() || type.empty()) {
    std::fprintf(stderr, "ember quantize: --model, --out and --type are required\n%s",
                 flags.Help().c_str());
    return 2;
  }
  if (out.size() <= 5 || out.compare(out.size() - 5, 5, ".gguf") != 0) {
    std::fprintf(stderr, "ember quantize: --out '%s' must end in .gguf (how --model knows a GGUF "
                 "file)\n", out.c_str());
    return 2;
  }
  auto parsed = ParseExportType(type, "--type");
  if (!parsed.ok()) {
    std::fprintf(stderr, "ember quantize: %s\n", parsed.message().c_str());
    return 2;
  }
  if (threads < 0 || threads > 4096) {
    std::fprintf(stderr, "ember quantize: --threads must be in [1, 4096], got %lld\n",
                 static_cast<long long>(threads));
    return 2;
  }
  GgufExportOptions opts;
  opts.model_dir = model;
  opts.tokenizer_dir = tokenizer;
  opts.out_path = out;
  opts.type = parsed->type;
  opts.recipe = parsed->recipe;
  opts.threads = threads > 0 ? size_t(threads) : std::max(1u, std::thread::hardware_concurrency());
  auto chat = ChatTemplate::Load(tokenizer.empty() ? model : tokenizer);
  if (!chat.ok()) {
    std::fprintf(stderr, "ember quantize: %s\n", chat.message().c_str());
    return 1;
  }
  opts.chat_template = chat->default_source();
  opts.chat_template_tool_use = chat->tool_use_source();
  auto summary = ExportGguf(opts);
  if (!summary.ok()) {
    std::fprintf(stderr, "ember quantize: %s\n", summary.message().c_str());
    return 1;
  }
  std::printf("wrote %s\n", summary->c_str());
  return 0;
}

}  // namespace ember::app
