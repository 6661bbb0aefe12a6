// spec_bench: speculative decoding's speed as a function of its acceptance rate (issue 39).
// C concurrent greedy sequences (P-token random prompts, G new tokens, EOS ignored) run first
// with speculation off for the request (their outputs are recorded), then once per rate a of
// --acceptance with the replay draft (engine/replay_draft_source.h) proposing the recorded
// outputs, each token right with probability a, at most K = --num-spec-tokens a step (adapted
// per sequence as in serving). Prints generated tok/s over each run (prefill included), tokens
// per target step, the measured acceptance (accepted / drafted) and the ratio to the run
// without. The engine runs as `--batch-invariant auto` does with speculation on: its steps are
// batch-invariant (on CUDA, the fixed-order GEMMs) while at most --spec-max-batch sequences run,
// the steps where drafting may run, so greedy verification keeps the recorded tokens, and take
// the default products above it; the baseline "off" row is also run on an engine without
// speculation (the fastest non-speculating configuration, what a user gets with speculation
// off: the default products in every step). The prefix cache is off: every run
// computes its prompts. --spec-method mtp replaces the replay draft by the checkpoint's own
// multi-token-prediction module (deepseek_v3 with model.layers.N.*: --synth tiny-deepseek-v3
// writes one): one run after the baseline, its real acceptance, and whether its outputs equal the
// baseline's. Results go to docs/perf.md with machine, command, date.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <unistd.h>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_engine.h"
#include "engine/engine.h"
#include "engine/model_draft_source.h"
#include "engine/replay_draft_source.h"
#include "util/flags.h"

namespace ember {
namespace {

struct RunOut {
  double tok_per_s = 0;
  std::vector<std::vector<int32_t>> outputs;
  EngineStats stats;  // the engine's counters after the run
};

// Runs `prompts` concurrently (greedy, gen tokens each); speculate: the request field.
RunOut Run(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int32_t gen,
           bool speculate) {
  RunOut out;
  std::vector<std::shared_ptr<ResponseStream>> streams;
  const int64_t start = NowNs();
  for (const std::vector<int32_t>& p : prompts) {
    GenerationRequest r;
    r.prompt_ids = p;
    r.max_tokens = gen;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    r.speculate = speculate;
    streams.push_back(SubmitOrExit(engine, std::move(r)));
  }
  int64_t tokens = 0;
  std::vector<TokenEvent> events;
  for (auto& s : streams) {
    out.outputs.emplace_back();
    while (s->Next(&events)) {
      for (const TokenEvent& e : events)
        if (e.token_id >= 0) {
          out.outputs.back().push_back(e.token_id);
          ++tokens;
        }
      events.clear();
    }
  }
  out.tok_per_s = static_cast<double>(tokens) / (static_cast<double>(NowNs() - start) / 1e9);
  out.stats = engine.Stats();
  return out;
}

std::vector<double> ParseRates(const std::string& text) {
  std::vector<double> rates;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) rates.push_back(std::stod(item));
  return rates;
}

// --spec-method mtp's run: the module's drafts on the prompts `off` ran without speculation.
void PrintMtpRun(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int32_t gen,
                 const RunOut& off) {
  const RunOut on = Run(engine, prompts, gen, true);
  const EngineStats &s = on.stats, &b = off.stats;
  const double steps = static_cast<double>(s.sampled_seq_steps - b.sampled_seq_steps);
  const double drafted = static_cast<double>(s.spec_draft_tokens - b.spec_draft_tokens);
  const double kept = static_cast<double>(s.spec_accepted_tokens - b.spec_accepted_tokens);
  std::printf("%-34s %10.1f %12.2f %11.3f %7.3fx\n",
              on.outputs == off.outputs ? "mtp" : "mtp (OUTPUT DIFFERS)", on.tok_per_s,
              static_cast<double>(s.sampled_tokens - b.sampled_tokens) / std::max(steps, 1.0),
              drafted > 0 ? kept / drafted : 0.0, on.tok_per_s / off.tok_per_s);
  std::printf("mtp: %.0f drafted, %.0f accepted, %.0f target steps\n", drafted, kept, steps);
}

std::unique_ptr<Model> LoadOrExit(const std::string& dir, ModelLoadOptions opts) {
  auto model = Model::Load(dir, opts);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.message().c_str());
    std::exit(1);
  }
  return std::move(model).value();
}

int Main(int argc, char** argv) {
  FlagParser flags(
      "spec_bench (--model DIR | --synth PRESET [--layers N]) [--device cpu|cuda] "
      "[--concurrency 1] [--prompt 128] [--gen 256] [--num-spec-tokens 4] "
      "[--acceptance 0.5,0.7,0.9] [--spec-method replay|mtp]");
  BenchModelFlags model_flags;
  model_flags.Register(flags);
  int64_t concurrency = 1, prompt_len = 128, gen = 256, k = 4, threads = 0, max_batch = 0;
  std::string acceptance = "0.5,0.7,0.9", spec_method = "replay";
  flags.AddString("--spec-method", &spec_method,
                  "replay (the recorded outputs at each --acceptance, default) or mtp (the "
                  "checkpoint's multi-token-prediction module; with --synth, written with it)");
  flags.AddInt("--concurrency", &concurrency, "concurrent sequences (default 1)");
  flags.AddInt("--prompt", &prompt_len, "prompt tokens (default 128)");
  flags.AddInt("--gen", &gen, "generated tokens per sequence (default 256)");
  flags.AddInt("--num-spec-tokens", &k, "K, the most drafts per sequence and step (default 4)");
  flags.AddInt("--spec-max-batch", &max_batch,
               "no sequence drafts while more than this many run (default 0: the device's "
               "default, as serving)");
  flags.AddString("--acceptance", &acceptance, "the replay draft's per-token acceptance rates");
  flags.AddInt("--threads", &threads, "CPU threads (default: all)");
  bool help = false;
  Status parsed = flags.Parse(argc, argv, 1, &help);
  if (int rc = flags.ExitStatusAfterParse(parsed, help); rc >= 0) return rc;
  if (spec_method != "replay" && spec_method != "mtp")
    return flags.ExitStatusAfterParse(
        Status::Error("--spec-method: replay or mtp, not " + spec_method), false);
  const bool mtp = spec_method == "mtp";
  model_flags.mtp = mtp;
  const std::string tmp =
      (std::filesystem::temp_directory_path() / ("ember_spec_bench_" + std::to_string(getpid())))
          .string();
  std::filesystem::create_directories(tmp);
  const Result<std::string> dir = model_flags.Resolve(tmp);
  if (!dir.ok()) return flags.ExitStatusAfterParse(dir.status(), false);
  ModelLoadOptions opts;
  opts.num_threads = static_cast<int32_t>(threads);
  opts.device = model_flags.Device();
  std::unique_ptr<Model> model = LoadOrExit(*dir, opts);
  const int32_t vocab = model->config().vocab_size;
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(concurrency));
  for (auto& p : prompts)
    for (int64_t t = 0; t < prompt_len; ++t)
      p.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));

  EngineConfig config;
  config.max_running = 0;  // the device's defaults, as serving
  config.max_step_tokens = 0;
  config.enable_prefix_caching = false;
  config.speculation.method = SpeculationConfig::Method::kNgram;  // replaced by the replay source
  config.speculation.num_spec_tokens = static_cast<int32_t>(k);
  config.speculation.max_batch = static_cast<int32_t>(max_batch);
  config.speculation.invariant_steps = true;  // --batch-invariant auto
  // The replay source learns the recordings after the engine owns it: it is filled between runs
  // (the engine is idle then; Submit's lock orders the writes before the next run's reads).
  auto owned = std::make_unique<ReplayDraftSource>(std::vector<ReplayDraftSource::Run>{}, vocab,
                                                   ReplayDraftSource::Errors{});
  ReplayDraftSource* replay = owned.get();
  std::unique_ptr<DraftSource> source = std::move(owned);
  if (mtp) {
    config.speculation.method = SpeculationConfig::Method::kMtp;
    auto loaded = LoadDraftSource(config.speculation, opts, vocab, *dir);
    if (!loaded.ok()) return std::fprintf(stderr, "%s\n", loaded.message().c_str()), 1;
    source = std::move(*loaded);
  }
  auto engine = Engine::Create(model.get(), config, std::move(source));
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.message().c_str()), 1;
  const int32_t g = static_cast<int32_t>(gen);
  Run(**engine, prompts, 8, false);  // warm-up (graphs, allocations)
  const RunOut off = Run(**engine, prompts, g, false);
  std::vector<ReplayDraftSource::Run> runs;
  for (size_t i = 0; i < prompts.size(); ++i) runs.push_back({prompts[i], off.outputs[i]});

  std::printf("%s, %lld sequences, prompt %lld, gen %lld, K %lld (adaptive), %s\n",
              model_flags.synth.empty() ? dir->c_str() : model_flags.synth.c_str(),
              static_cast<long long>(concurrency), static_cast<long long>(prompt_len),
              static_cast<long long>(gen), static_cast<long long>(k),
              model_flags.device.c_str());
  std::printf("%-34s %10s %12s %11s %8s\n", "run", "tok/s", "tok/step", "acceptance", "vs off");
  std::printf("%-34s %10.1f %12.2f %11s %7.3fx\n", "off (same model)", off.tok_per_s, 1.0, "-",
              1.0);
  EngineStats before = off.stats;
  if (mtp) PrintMtpRun(**engine, prompts, g, off);
  for (const double a : mtp ? std::vector<double>{} : ParseRates(acceptance)) {
    *replay = ReplayDraftSource(runs, vocab, {0, a});
    const RunOut on = Run(**engine, prompts, g, true);
    const EngineStats& s = on.stats;
    const double steps = static_cast<double>(s.sampled_seq_steps - before.sampled_seq_steps);
    const double drafted = static_cast<double>(s.spec_draft_tokens - before.spec_draft_tokens);
    const double kept = static_cast<double>(s.spec_accepted_tokens - before.spec_accepted_tokens);
    int64_t mismatched = 0;
    for (size_t i = 0; i < runs.size(); ++i) mismatched += on.outputs[i] != runs[i].continuation;
    char name[64];
    std::snprintf(name, sizeof(name), "replay a=%.2f%s", a, mismatched ? " (OUTPUT DIFFERS)" : "");
    std::printf("%-34s %10.1f %12.2f %11.3f %7.3fx\n", name, on.tok_per_s,
                static_cast<double>(s.sampled_tokens - before.sampled_tokens) / std::max(steps, 1.0),
                drafted > 0 ? kept / drafted : 0.0, on.tok_per_s / off.tok_per_s);
    before = s;
  }
  (*engine)->Shutdown(true);
  engine->reset();
  if (opts.device == DeviceKind::kCuda) {  // the fastest non-speculating configuration
    model.reset();  // (its KV pool with it)
    model = LoadOrExit(*dir, opts);
    EngineConfig plain;
    plain.max_running = 0;
    plain.max_step_tokens = 0;
    plain.enable_prefix_caching = false;
    auto e2 = Engine::Create(model.get(), plain);
    if (!e2.ok()) return std::fprintf(stderr, "%s\n", e2.message().c_str()), 1;
    Run(**e2, prompts, 8, false);
    const RunOut fast = Run(**e2, prompts, g, false);
    std::printf("%-34s %10.1f %12.2f %11s %7.3fx\n", "off (default GEMMs)", fast.tok_per_s, 1.0,
                "-", fast.tok_per_s / off.tok_per_s);
    (*e2)->Shutdown(true);
  }
  std::filesystem::remove_all(tmp);
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) { return ember::Main(argc, argv); }
