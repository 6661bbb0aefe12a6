// `ember synth`: writes a random-weight checkpoint shaped like a real model (model/synth.h).
#include <cstdio>

#include "app/commands.h"
#include "model/synth.h"
#include "util/flags.h"

namespace ember::app {

int SynthCommand(int argc, char** argv, int first) {
  std::string like, out, tokenizer, dtype = "bf16";
  int64_t seed = 0, layers = 0;
  bool mxfp4 = false, mtp = false;
  std::string presets;
  for (const std::string& n : SynthPresetNames()) presets += (presets.empty() ? "" : ", ") + n;
  FlagParser flags(
      "usage: ember synth --like PRESET --out DIR [--tokenizer DIR] "
      "[--dtype bf16|f16|f32] [--mxfp4] [--mtp] [--seed S] [--layers N]\n  presets: " +
      presets);
  flags.AddString("--like", &like, "preset: the real model whose shapes and config to copy");
  flags.AddString("--out", &out, "output folder (created)");
  flags.AddString("--tokenizer", &tokenizer, "folder to copy tokenizer.json + tokenizer_config.json from");
  flags.AddString("--dtype", &dtype, "weight dtype: bf16 (default), f16 or f32");
  flags.AddBool("--mxfp4", &mxfp4,
                "gpt_oss presets: MXFP4 experts, as OpenAI's checkpoints (the rest in --dtype)");
  flags.AddBool("--mtp", &mtp,
                "deepseek_v3 presets: also the multi-token-prediction module (model.layers.N.*) "
                "the real checkpoint carries, for --spec-method mtp");
  flags.AddInt("--seed", &seed, "random seed (default 0)");
  flags.AddInt("--layers", &layers,
               "keep only the first N layers (a shallower model of the same layer shapes)");
  bool help = false;
  if (Status st = flags.Parse(argc, argv, first, &help); !st.ok()) {
    std::fprintf(stderr, "ember synth: %s\n%s", st.message().c_str(), flags.Help().c_str());
    return 2;
  }
  if (help) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  SynthOptions opts;
  opts.preset = like;
  opts.out_dir = out;
  opts.tokenizer_dir = tokenizer;
  opts.seed = static_cast<uint64_t>(seed);
  if (layers < 0 || layers > 100000) {
    std::fprintf(stderr, "ember synth: --layers must be a positive layer count, got %lld\n",
                 static_cast<long long>(layers));
    return 2;
  }
  opts.num_layers = static_cast<int32_t>(layers);
  opts.mxfp4 = mxfp4;
  opts.mtp = mtp;
  if (dtype == "bf16") opts.dtype = DType::kBF16;
  else if (dtype == "f16") opts.dtype = DType::kF16;
  else if (dtype == "f32") opts.dtype = DType::kF32;
  else {
    std::fprintf(stderr, "ember synth: --dtype must be bf16, f16 or f32, got '%s'\n", dtype.c_str());
    return 2;
  }
  if (like.empty() || out.empty()) {
    std::fprintf(stderr, "ember synth: --like and --out are required\n%s", flags.Help().c_str());
    return 2;
  }
  if (Status st = WriteSynthCheckpoint(opts); !st.ok()) {
    std::fprintf(stderr, "ember synth: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("wrote %s (%s, %s%s%s)\n", out.c_str(), like.c_str(), dtype.c_str(),
              mxfp4 ? ", MXFP4 experts" : "", mtp ? ", MTP module" : "");
  return 0;
}

}  // namespace ember::app
