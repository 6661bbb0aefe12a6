// lora_bench: what unmerged LoRA adapters cost the engine on the CPU backend. Writes K random
// adapters (synth: rank R on q/k/v/o/gate/up/down of every layer) for the model, then runs C
// concurrent greedy sequences (P-token random prompts, G new tokens, EOS ignored) three ways:
// every request on the base model; every request on one adapter; requests spread round-robin
// over the K adapters (each step mixes them). Prints generated tokens/s over each run (prefill
// included) and its ratio to the base run. The adapter runs go twice: the first (cold) loads the
// adapters into their slots inside the timed window, the second (warm: the adapters resident, as
// in a serving steady state) is the one the ratio is taken from; both are printed. --device cuda
// runs it on the GPU; --synth writes a random checkpoint of a preset shape first (--layers: fewer
// layers of the same shapes). Results go to docs/perf.md with machine, command, date.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench_engine.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "util/flags.h"

namespace ember {
namespace {

// "a<k>" (built by append: GCC 12 warns falsely on "a" + std::to_string(k)).
std::string AdapterName(int64_t k) {
  std::string name = "a";
  name += std::to_string(k);
  return name;
}

// Generated tokens/s of `c` concurrent requests, request i under adapter_of(i) ("" the base).
template <typename AdapterOf>
double Run(Engine& engine, int32_t c, int32_t prompt_len, int32_t gen, int32_t vocab,
           AdapterOf adapter_of) {
  std::mt19937 rng(7);
  std::vector<std::shared_ptr<ResponseStream>> streams;
  const int64_t start = NowNs();
  for (int32_t i = 0; i < c; ++i) {
    GenerationRequest r;
    for (int32_t t = 0; t < prompt_len; ++t)
      r.prompt_ids.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
    r.max_tokens = gen;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    r.adapter = adapter_of(i);
    streams.push_back(SubmitOrExit(engine, std::move(r)));
  }
  int64_t tokens = 0;
  std::vector<TokenEvent> events;
  for (auto& s : streams) {
    while (s->Next(&events)) {
      for (const TokenEvent& e : events) tokens += e.token_id >= 0;
      events.clear();
    }
  }
  return static_cast<double>(tokens) / (static_cast<double>(NowNs() - start) / 1e9);
}

int Main(int argc, char** argv) {
  FlagParser flags(
      "lora_bench (--model DIR | --synth PRESET [--layers N]) [--device cpu|cuda] [--rank 16] "
      "[--adapters 4] [--concurrency 16]");
  BenchModelFlags model_flags;
  model_flags.Register(flags);
  int64_t rank = 16, adapters = 4, concurrency = 16, prompt = 64, gen = 64, threads = 0;
  flags.AddInt("--rank", &rank, "adapters' rank (default 16)");
  flags.AddInt("--adapters", &adapters, "distinct adapters in the mixed run (default 4)");
  flags.AddInt("--concurrency", &concurrency, "concurrent sequences (default 16)");
  flags.AddInt("--prompt", &prompt, "prompt tokens (default 64)");
  flags.AddInt("--gen", &gen, "generated tokens per sequence (default 64)");
  flags.AddInt("--threads", &threads, "CPU threads (default: all)");
  int64_t max_running = EngineConfig{}.max_running, step_tokens = EngineConfig{}.max_step_tokens;
  flags.AddInt("--max-running", &max_running,
               "sequences decoded together (default: the engine's, 64)");
  flags.AddInt(
      "--step-tokens", &step_tokens,
      "rows per forward step (default: the engine's, 512; ember serve takes 8192 on a GPU)");
  bool help = false;
  Status parsed = flags.Parse(argc, argv, 1, &help);
  if (int rc = flags.ExitStatusAfterParse(parsed, help); rc >= 0) return rc;
  const std::string tmp =
      (std::filesystem::temp_directory_path() / ("ember_lora_bench_" + std::to_string(getpid())))
          .string();
  std::filesystem::create_directories(tmp);
  const Result<std::string> resolved = model_flags.Resolve(tmp);
  if (!resolved.ok()) return flags.ExitStatusAfterParse(resolved.status(), false);
  const std::string& model_dir = *resolved;
  ModelLoadOptions opts;
  opts.num_threads = static_cast<int32_t>(threads);
  opts.device = model_flags.Device();
  auto model = Model::Load(model_dir, opts);
  if (!model.ok()) return std::fprintf(stderr, "%s\n", model.message().c_str()), 1;
  EngineConfig config;
  config.max_loras = static_cast<int32_t>(adapters);
  config.max_lora_rank = static_cast<int32_t>(rank);
  config.max_running = static_cast<int32_t>(max_running);
  config.max_step_tokens = static_cast<int32_t>(step_tokens);
  config.enable_prefix_caching = false;  // every run computes its prompts
  auto engine = Engine::Create(model->get(), config);
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.message().c_str()), 1;
  for (int64_t k = 0; k < adapters; ++k) {
    SynthLoraOptions lora;
    lora.model_dir = model_dir;
    lora.out_dir = tmp + "/" + AdapterName(k);
    lora.rank = static_cast<int32_t>(rank);
    lora.seed = static_cast<uint64_t>(k + 1);
    Status st = WriteSynthLoraAdapter(lora);
    auto info = st.ok() ? (*engine)->adapters()->Register(AdapterName(k), lora.out_dir)
                        : Result<std::shared_ptr<const AdapterInfo>>(st);
    if (!info.ok()) return std::fprintf(stderr, "%s\n", info.message().c_str()), 1;
  }
  const int32_t vocab = (*model)->config().vocab_size, c = static_cast<int32_t>(concurrency);
  const int32_t p = static_cast<int32_t>(prompt), g = static_cast<int32_t>(gen);
  Run(**engine, c, p, g, vocab, [](int32_t) { return std::string(); });  // warm-up
  const double base = Run(**engine, c, p, g, vocab, [](int32_t) { return std::string(); });
  auto on_a0 = [](int32_t) { return std::string("a0"); };
  auto spread = [&](int32_t i) { return AdapterName(i % adapters); };
  const double one_cold = Run(**engine, c, p, g, vocab, on_a0);
  const double one = Run(**engine, c, p, g, vocab, on_a0);
  const double mixed_cold = Run(**engine, c, p, g, vocab, spread);
  const double mixed = Run(**engine, c, p, g, vocab, spread);
  std::printf("%s, rank %lld, %lld sequences x (%lld prompt + %lld generated)\n",
              model_flags.device.c_str(), static_cast<long long>(rank), static_cast<long long>(c),
              static_cast<long long>(p), static_cast<long long>(g));
  std::printf("base model:          %8.1f tok/s\n", base);
  std::printf("one adapter:         %8.1f tok/s (%.3f x base); cold (loading it) %8.1f (%.3f x)\n",
              one, one / base, one_cold, one_cold / base);
  std::printf(
      "%lld adapters mixed:  %8.1f tok/s (%.3f x base); cold (loading them) %8.1f (%.3f x)\n",
      static_cast<long long>(adapters), mixed, mixed / base, mixed_cold, mixed_cold / base);
  std::filesystem::remove_all(tmp);
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  return ember::Main(argc, argv);
}
