// Shared by the engine benches (lora_bench, prompt_cache_bench, spec_bench): the flags that say
// which model a bench runs and where — --model DIR, or --synth PRESET [--layers N] written to a
// temp folder — and --device cpu|cuda; a monotonic clock; a Submit that ends the bench on a
// refusal. Header-only; benches only.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <variant>

#include "backend/backend_factory.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "util/flags.h"
#include "util/status.h"

namespace ember {

struct BenchModelFlags {
  std::string model_dir, synth, device = "cpu";
  int64_t layers = 0;
  bool mtp = false;  // --synth: also the MTP module (SynthOptions::mtp; spec_bench's mtp)

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
    so.mtp = mtp;
    if (Status st = WriteSynthCheckpoint(so); !st.ok()) return st;
    return so.out_dir;
  }
  DeviceKind Device() const { return device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu; }
};

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The request's stream; a refused request ends the bench (exit 1) with the engine's message.
inline std::shared_ptr<ResponseStream> SubmitOrExit(Engine& engine, GenerationRequest r) {
  auto submitted = engine.Submit(std::move(r));
  if (auto* e = std::get_if<SubmitError>(&submitted)) {
    std::fprintf(stderr, "submit refused: %s\n", e->message.c_str());
    std::exit(1);
  }
  return std::get<std::shared_ptr<ResponseStream>>(submitted);
}

}  // namespace ember
