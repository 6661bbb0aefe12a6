// Shared by the engine benches (lora_bench, prompt_cache_bench): the flags that say which model a
// bench runs and where — --model DIR, or --synth PRESET [--layers N] written to a temp folder —
// and --device cpu|cuda. Header-only; benches only.
#pragma once

#include <string>

#include "backend/backend_factory.h"
#include "model/synth.h"
#include "util/flags.h"
#include "util/status.h"

namespace ember {

struct BenchModelFlags {
  std::string model_dir, synth, device = "cpu";
  int64_t layers = 0;

  void Register(FlagParser& flags) {
    flags.AddString("--model", &model_dir, "model folder");
    flags.AddString("--synth", &synth, "a synth preset (e.g. llama-3.1-8b) written to a temp dir");
    flags.AddInt("--layers", &layers, "--synth: only the first N layers (default: all)");
    flags.AddString("--device", &device, "cpu | cuda (default cpu)");
  }
  // Checks the flags; with --synth, writes the checkpoint to tmp_dir/model. Returns the folder.
  Result<std::string> Resolve(const std::string& tmp_dir) const {
    if (model_dir.empty() == synth.empty()) return Status::Error("give one of --model and --synth");
    if (device != "cpu" && device != "cuda")
      return Status::Error("--device: cpu or cuda, not " + device);
    if (synth.empty()) return model_dir;
    SynthOptions so;
    so.preset = synth;
    so.out_dir = tmp_dir + "/model";
    so.num_layers = static_cast<int32_t>(layers);
    if (Status st = WriteSynthCheckpoint(so); !st.ok()) return st;
    return so.out_dir;
  }
  DeviceKind Device() const { return device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu; }
};

}  // namespace ember
