// `ember bench`: llama-bench-style throughput of one model on this machine: prompt processing
// (ppP: one forward of P tokens) and text generation (tgN: N single-token decode steps), median
// and spread over R repetitions. Checks the machine first and warns when it is noisy.
// tg generates greedily as the engine does: each step's argmax is computed where the logits are
// (on the GPU for --device cuda), only its id comes back, and it is the next step's input, fed
// where it was made: each step launches before the host reads the previous step's id (the
// engine's overlapped steps; --no-overlap waits for each id first).
// --tg-logits instead copies every step's logits row to the host and feeds a fixed token
// sequence (what llama-bench's tg measures: llama_decode with its logits read back).
// --spec-method ngram|draft|mtp (draft: --draft-model DIR) adds two rows that generate through the engine (one greedy request of N
// tokens after a copy-heavy prompt: 64 synthetic tokens four times), speculation off and on, and
// a line with the drafted and accepted tokens and the tokens per target step.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include <dirent.h>

#include "app/commands.h"
#include "app/common.h"
#include "engine/model_draft_source.h"
#include "model/model.h"
#include "util/flags.h"

namespace ember::app {
namespace {

using Clock = std::chrono::steady_clock;

// CPU ticks (utime + stime) of every process but this one, keyed by pid, with its name.
std::map<int, std::pair<std::string, int64_t>> ProcessTicks() {
  std::map<int, std::pair<std::string, int64_t>> out;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return out;
  const int self = getpid();
  while (dirent* e = readdir(dir)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == self) continue;
    std::ifstream f("/proc/" + std::string(e->d_name) + "/stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    const size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    std::vector<std::string> fields;
    while (rest >> field) fields.push_back(field);
    if (fields.size() < 13) continue;  // fields[11], [12] = utime, stime
    out[pid] = {line.substr(open + 1, close - open - 1),
                std::atoll(fields[11].c_str()) + std::atoll(fields[12].c_str())};
  }
  closedir(dir);
  return out;
}

int64_t MeminfoKb(const std::string& key) {
  std::ifstream f("/proc/meminfo");
  std::string name;
  int64_t value = 0;
  std::string unit;
  while (f >> name >> value >> unit)
    if (name == key + ":") return value;
  return -1;
}

// One line per reason the timings may be unreliable; empty when the machine looks quiet.
std::vector<std::string> MachineNoise(int64_t weight_bytes) {
  std::vector<std::string> reasons;
  double load1 = 0;
  if (std::ifstream f("/proc/loadavg"); f >> load1) {
    if (load1 > 0.5) reasons.push_back("load average " + std::to_string(load1).substr(0, 4));
  }
  const int64_t avail_kb = MeminfoKb("MemAvailable");
  if (avail_kb >= 0 && avail_kb * 1024 < weight_bytes * 6 / 5)
    reasons.push_back("only " + std::to_string(avail_kb / 1024) + " MiB memory available for " +
                      std::to_string(weight_bytes >> 20) + " MiB of weights");
  const int64_t swap_total = MeminfoKb("SwapTotal"), swap_free = MeminfoKb("SwapFree");
  if (swap_total > 0 && swap_total - swap_free > 0)
    reasons.push_back(std::to_string((swap_total - swap_free) / 1024) + " MiB of swap in use");
  auto before = ProcessTicks();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto after = ProcessTicks();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  std::vector<std::pair<double, std::string>> busy;
  for (const auto& [pid, info] : after) {
    auto it = before.find(pid);
    if (it == before.end()) continue;
    const double cpu = static_cast<double>(info.second - it->second.second) / hz / secs;
    if (cpu > 0.1) busy.emplace_back(cpu, info.first);
  }
  std::sort(busy.rbegin(), busy.rend());
  if (!busy.empty()) {
    std::string s = "busy processes:";
    for (size_t i = 0; i < std::min<size_t>(busy.size(), 4); ++i)
      s += " " + busy[i].second + " (" + std::to_string(static_cast<int>(busy[i].first * 100)) + "%)";
    reasons.push_back(s);
  }
  return reasons;
}

struct Stats {
  double median = 0, min = 0, max = 0;
};
Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  s.min = v.front();
  s.max = v.back();
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return s;
}

// One sequence's `tokens` at positions [first_pos, ...) in blocks 0.., logits of the last row.
BatchPlan OneSequencePlan(const Model& model, const std::vector<int32_t>& tokens,
                          int32_t first_pos, const std::vector<int32_t>& blocks) {
  BatchPlan plan;
  plan.block_size = model.kv_block_size();
  plan.AddSequence(tokens, first_pos, blocks, true);
  return plan;
}

// One forward of `tokens`, the last row's logits copied to the host.
Status Step(Model& model, const std::vector<int32_t>& tokens, int32_t first_pos,
            const std::vector<int32_t>& blocks, std::vector<float>& logits) {
  return model.Forward(OneSequencePlan(model, tokens, first_pos, blocks), logits);
}

// One decode step of `token` at `pos` (-1: the previous step's id, fed where it was made); `*id`
// gets the argmax of its logits, computed by the backend, at once or (defer) by Model::WaitIds.
// (`logits` is the one-row host buffer Forward requires; this row's logits stay where they are.)
Status GreedyStep(Model& model, int32_t token, int32_t pos, const std::vector<int32_t>& blocks,
                  std::vector<float>& logits, int32_t* id, bool defer) {
  static const RowOutput kind = RowOutput::kArgmax;
  static const RowSampling unused;  // (kSample rows only)
  StepOutputs out;
  out.logits = logits;
  out.row_kinds = std::span<const RowOutput>(&kind, 1);
  out.sampling = std::span<const RowSampling>(&unused, 1);
  out.ids = std::span<int32_t>(id, 1);
  out.defer_ids = defer;
  return model.Forward(OneSequencePlan(model, {token}, pos, blocks), out);
}

// One greedy request of `n` tokens through a fresh engine over the model folder (EOS ignored),
// after a copy-heavy prompt; its decode rate (tokens after the first over the time after it).
struct EngineTg {
  double tps = 0;
  EngineStats stats;
};
Result<EngineTg> RunEngineTg(const std::string& model_dir, const ModelLoadOptions& opts,
                             const EngineConfig& config, int64_t n) {
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(model_dir, opts));
  std::unique_ptr<DraftSource> draft;
  if (config.speculation.method == SpeculationConfig::Method::kDraft ||
      config.speculation.method == SpeculationConfig::Method::kMtp) {
    EMBER_ASSIGN_OR_RETURN(draft, LoadDraftSource(config.speculation, opts,
                                                  model->config().vocab_size, model_dir));
  }
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                         Engine::Create(model.get(), config, std::move(draft)));
  GenerationRequest r;
  for (int copy = 0; copy < 4; ++copy)
    for (int32_t i = 0; i < 64; ++i)
      r.prompt_ids.push_back(static_cast<int32_t>((i * 7919 + 13) % model->config().vocab_size));
  r.max_tokens = static_cast<int32_t>(n);
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  auto submitted = engine->Submit(r);
  if (auto* error = std::get_if<SubmitError>(&submitted)) return Status::Error(error->message);
  auto stream = std::get<std::shared_ptr<ResponseStream>>(submitted);
  std::vector<TokenEvent> events;
  int64_t first_ns = 0, last_ns = 0, count = 0;
  while (stream->Next(&events)) {
    for (const TokenEvent& e : events) {
      if (e.token_id < 0) continue;
      if (count++ == 0) first_ns = e.time_ns;
      last_ns = e.time_ns;
    }
    events.clear();
  }
  engine->Shutdown(/*drain=*/true);
  EngineTg out;
  out.stats = engine->Stats();
  if (count > 1 && last_ns > first_ns)
    out.tps = static_cast<double>(count - 1) / (static_cast<double>(last_ns - first_ns) * 1e-9);
  return out;
}

}  // namespace

int BenchCommand(int argc, char** argv, int first) {
  std::string model_dir;
  int64_t n = 128, reps = 5, threads = 0, depth = 0;
  std::string p_list = "512", device = "auto", batch_invariant = "auto", cpu_matmul = "exact",
              quantize, kv_dtype = "auto", kv_dtype_layers;
  bool tg_logits = false, no_overlap = false;
  std::string spec_method = "none", draft_model;
  int64_t num_spec_tokens = 4;
  FlagParser flags(
      "usage: ember bench --model DIR [-p 512[,P2...]] [-n 128] [-d 0] [-r 5] [--threads N] "
      "[--device D] [--quantize T] [--kv-cache-dtype T] [--tg-logits | --no-overlap]");
  flags.AddString("--model", &model_dir, "model folder (config.json + safetensors) or .gguf file");
  flags.AddString("-p,--n-prompt", &p_list,
                  "prompt tokens of the pp test (0: skip); a comma-separated list runs one pp test "
                  "per size");
  flags.AddInt("-n,--n-gen", &n, "generated tokens of the tg test (0: skip)");
  flags.AddInt("-d,--depth", &depth,
               "tokens already in the KV cache when each test starts (prefilled once, untimed; "
               "llama-bench's -d): the tests then run at a long context");
  flags.AddInt("-r,--repetitions", &reps, "repetitions of each test");
  flags.AddInt("--threads", &threads, "CPU threads (0: all cores)");
  flags.AddString("--device", &device, "cpu | cuda | auto (default: cuda when present)");
  flags.AddString("--quantize", &quantize,
                  "q8_0 | q4_0: quantize the linear projections at load (see ember run --help)");
  flags.AddString("--kv-cache-dtype", &kv_dtype,
                  "auto | f32 | bf16 | f16 | fp8 | int8 | int4: the KV cache's element type (see "
                  "ember run --help)");
  flags.AddString("--kv-cache-dtype-layers", &kv_dtype_layers,
                  "per-layer overrides, e.g. 0:1=bf16,-1=bf16 (see ember run --help)");
  flags.AddBool("--tg-logits", &tg_logits,
                "tg copies each step's logits row to the host and feeds fixed tokens (llama-bench's "
                "tg) instead of generating greedily with the argmax where the logits are");
  flags.AddBool("--no-overlap", &no_overlap,
                "tg waits for each step's id before launching the next (the engine with "
                "overlapped steps off)");
  flags.AddString("--batch-invariant", &batch_invariant,
                  "on | off | auto: CUDA fixed-order GEMM (see ember run --help)");
  flags.AddString("--cpu-matmul", &cpu_matmul,
                  "exact | f32 | bf16 | auto: CPU matrix products (see ember run --help)");
  flags.AddString("--spec-method", &spec_method,
                  "none | ngram | draft | mtp: also run tg through the engine with speculation "
                  "off and on, after a copy-heavy prompt (see ember run --help)");
  flags.AddInt("--num-spec-tokens", &num_spec_tokens, "most drafts per step (default 4)");
  flags.AddString("--draft-model", &draft_model, "draft model for --spec-method draft");
  bool help = false;
  if (Status st = flags.Parse(argc, argv, first, &help); !st.ok()) {
    std::fprintf(stderr, "ember bench: %s\n%s", st.message().c_str(), flags.Help().c_str());
    return 2;
  }
  if (help) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  if (tg_logits && no_overlap) {
    std::fprintf(stderr, "ember bench: --tg-logits and --no-overlap are two different tg tests\n");
    return 2;
  }
  std::vector<int64_t> pp_sizes;
  for (size_t at = 0; at <= p_list.size();) {
    const size_t comma = std::min(p_list.find(',', at), p_list.size());
    const std::string item = p_list.substr(at, comma - at);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0) {
      std::fprintf(stderr, "ember bench: -p takes sizes >= 0 separated by commas, got '%s'\n",
                   p_list.c_str());
      return 2;
    }
    if (v > 0) pp_sizes.push_back(v);
    at = comma + 1;
  }
  const int64_t p = pp_sizes.empty() ? 0 : *std::max_element(pp_sizes.begin(), pp_sizes.end());
  if (model_dir.empty() || n < 0 || depth < 0 || reps < 1 || threads < 0) {
    std::fprintf(stderr, "ember bench: --model is required; -p, -n, -d >= 0; -r >= 1\n");
    return 2;
  }
  EngineFlags device_flags;
  device_flags.device = device;
  device_flags.threads = threads;
  device_flags.batch_invariant = batch_invariant;
  device_flags.cpu_matmul = cpu_matmul;
  device_flags.quantize = quantize;
  device_flags.kv_cache_dtype = kv_dtype;
  device_flags.kv_cache_dtype_layers = kv_dtype_layers;
  device_flags.spec_method = spec_method;
  device_flags.num_spec_tokens = num_spec_tokens;
  device_flags.draft_model = draft_model;
  if (Status st = device_flags.CheckSpeculation(); !st.ok()) {
    std::fprintf(stderr, "ember bench: %s\n", st.message().c_str());
    return 2;
  }
  auto opts = device_flags.LoadOptions();
  if (!opts.ok()) {
    std::fprintf(stderr, "ember bench: %s\n", opts.message().c_str());
    return 2;
  }
  auto loaded = Model::Load(model_dir, *opts);
  if (!loaded.ok()) {
    std::fprintf(stderr, "ember bench: %s\n", loaded.message().c_str());
    return 1;
  }
  Model& model = **loaded;
  const ModelConfig& c = model.config();
  if (depth + std::max(p, n) >= c.max_position_embeddings) {
    std::fprintf(
        stderr, "ember bench: -d + max(-p, -n) = %lld must be below max_position_embeddings (%d)\n",
        static_cast<long long>(depth + std::max(p, n)), c.max_position_embeddings);
    return 2;
  }
  constexpr int32_t kBlockSize = 16;
  const int32_t num_blocks =
      static_cast<int32_t>((depth + std::max(p, n) + 1 + kBlockSize - 1) / kBlockSize);
  if (Status st = model.AllocateKvCache(num_blocks, kBlockSize); !st.ok()) {
    std::fprintf(stderr, "ember bench: %s\n", st.message().c_str());
    return 1;
  }
  std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
  for (int32_t i = 0; i < num_blocks; ++i) blocks[static_cast<size_t>(i)] = i;
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  std::vector<int32_t> prompt;  // the pp test's tokens (resized per size)

  for (const std::string& r : MachineNoise(model.WeightBytes()))
    std::printf("warning: noisy machine: %s\n", r.c_str());

  // The depth context: positions [0, depth), prefilled in chunks of kDepthChunk tokens.
  constexpr int64_t kDepthChunk = 2048;
  for (int64_t start = 0; start < depth; start += kDepthChunk) {
    std::vector<int32_t> chunk(static_cast<size_t>(std::min(kDepthChunk, depth - start)));
    for (size_t i = 0; i < chunk.size(); ++i) {
      const int64_t pos = start + static_cast<int64_t>(i);
      chunk[i] = static_cast<int32_t>((pos * 104729 + 7) % c.vocab_size);
    }
    if (Status st = Step(model, chunk, static_cast<int32_t>(start), blocks, logits); !st.ok()) {
      std::fprintf(stderr, "ember bench: prefilling the -d context: %s\n", st.message().c_str());
      return 1;
    }
  }
  const int32_t first_pos = static_cast<int32_t>(depth);

  auto run_pp = [&]() -> Result<double> {
    const auto t0 = Clock::now();
    EMBER_RETURN_IF_ERROR(Step(model, prompt, first_pos, blocks, logits));
    return static_cast<double>(prompt.size()) /
           std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto run_tg = [&](int64_t count) -> Result<double> {
    const auto t0 = Clock::now();
    int32_t ids[2] = {5, 5};  // step i's id lands in ids[i % 2]
    for (int64_t i = 0; i < count; ++i) {
      const int32_t pos = first_pos + static_cast<int32_t>(i);
      int32_t* id = &ids[i % 2];
      if (tg_logits) {
        EMBER_RETURN_IF_ERROR(Step(model, {static_cast<int32_t>((i * 31 + 5) % c.vocab_size)},
                                   pos, blocks, logits));
      } else if (no_overlap) {
        EMBER_RETURN_IF_ERROR(GreedyStep(model, ids[(i + 1) % 2], pos, blocks, logits, id, false));
      } else {
        // Launch step i with step i - 1's id fed, then read that id (as the engine does).
        EMBER_RETURN_IF_ERROR(GreedyStep(model, i == 0 ? 5 : -1, pos, blocks, logits, id, true));
        if (i > 0) EMBER_RETURN_IF_ERROR(model.WaitIds());
      }
    }
    if (!tg_logits && !no_overlap && count > 0) EMBER_RETURN_IF_ERROR(model.WaitIds());
    return static_cast<double>(count) / std::chrono::duration<double>(Clock::now() - t0).count();
  };

  const double gib = static_cast<double>(model.WeightBytes()) / (1024.0 * 1024 * 1024);
  const double params_b = static_cast<double>(model.NumParameters()) / 1e9;
  const int used_threads = threads > 0 ? static_cast<int>(threads)
                                       : static_cast<int>(std::thread::hardware_concurrency());
  const char* backend_name = opts->device == DeviceKind::kCuda ? "CUDA" : "CPU";
  std::printf("| model | size | params | backend | threads | test | t/s (median) | min .. max |\n");
  std::printf("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n");
  // --quantize: the projections' type after the stored one (the size is still the file's).
  const std::string weights = c.torch_dtype + (quantize.empty() ? "" : " -> " + quantize) +
                              (kv_dtype == "auto" && kv_dtype_layers.empty()
                                   ? ""
                                   : ", KV " + model.KvDTypes());
  auto row = [&](const std::string& test, const std::vector<double>& rates) {
    Stats s = Summarize(rates);
    std::printf("| %s %s | %.2f GiB | %.2f B | %s | %d | %s | %.2f | %.2f .. %.2f |\n",
                c.model_type.c_str(), weights.c_str(), gib, params_b, backend_name,
                used_threads,
                test.c_str(), s.median, s.min, s.max);
    std::fflush(stdout);
  };
  std::vector<int64_t> tests = pp_sizes;  // pp sizes, then tg (-1)
  if (n > 0) tests.push_back(-1);
  for (const int64_t test : tests) {
    const bool is_pp = test > 0;
    const int64_t size = is_pp ? test : n;
    if (is_pp) {
      prompt.resize(static_cast<size_t>(size));
      for (int64_t i = 0; i < size; ++i)
        prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
    }
    // Warm-up (page in the weights, size the workspace), not timed.
    auto warm = is_pp ? run_pp() : run_tg(std::min<int64_t>(n, 4));
    if (!warm.ok()) {
      std::fprintf(stderr, "ember bench: %s\n", warm.message().c_str());
      return 1;
    }
    std::vector<double> rates;
    for (int64_t r = 0; r < reps; ++r) {
      auto rate = is_pp ? run_pp() : run_tg(n);
      if (!rate.ok()) {
        std::fprintf(stderr, "ember bench: %s\n", rate.message().c_str());
        return 1;
      }
      rates.push_back(*rate);
    }
    row((is_pp ? "pp" : "tg") + std::to_string(size) +
            (depth > 0 ? " @ d" + std::to_string(depth) : std::string()),
        rates);
  }
  if (spec_method != "none" && n > 0) {
    std::string spec_line;
    for (const bool spec : {false, true}) {
      EngineConfig config = device_flags.Config();
      if (!spec) config.speculation = SpeculationConfig{};  // off (and no --draft-model)
      std::vector<double> rates;
      EngineStats stats;
      for (int64_t r = 0; r <= reps; ++r) {  // the first run warms up
        auto tg = RunEngineTg(model_dir, *opts, config, n);
        if (!tg.ok()) {
          std::fprintf(stderr, "ember bench: %s\n", tg.message().c_str());
          return 1;
        }
        if (r > 0) rates.push_back(tg->tps);
        stats = tg->stats;
      }
      row("tg" + std::to_string(n) + " engine" + (spec ? " " + spec_method + " k=" +
                                                            std::to_string(num_spec_tokens)
                                                      : std::string()),
          rates);
      if (spec) spec_line = SpeculationSummary(stats);
    }
    std::printf("engine tg (last run)%s\n", spec_line.empty() ? ": nothing drafted" : spec_line.c_str());
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf("peak RSS %.2f GiB (weight files %.2f GiB)\n",
              static_cast<double>(usage.ru_maxrss) / (1024.0 * 1024), gib);
  return 0;
}

}  // namespace ember::app
