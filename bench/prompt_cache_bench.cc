// prompt_cache_bench: time to first token of one long prompt (a shared prefix) through the
// prompt cache's tiers, on one model (no HTTP):
//   cold       a fresh engine over an empty --prompt-cache-dir: the whole prompt is prefilled
//              (and its blocks written through to the directory);
//   pool       the same prompt again on that engine: the KV pool's prefix cache;
//   RAM        on that engine (which has --prompt-cache-ram-bytes and a pool of twice the
//              prompt's blocks), two other prompts of the same length push the prompt's blocks
//              out of the pool into the RAM tier; the prompt again is restored from RAM;
//   disk cold  a new engine (a restart) over the directory, its files dropped from the OS page
//              cache first (posix_fadvise DONTNEED): blocks read from the disk itself;
//   disk warm  another restart, the files now in the page cache (the common case on a server
//              that restarts without a reboot);
//   repeat     the same prompt once more on that restarted engine: the pool holds its blocks
//              now (and, for a hybrid model, the checkpoint the disk hit seeded into the pool).
// Each row is --repeats runs (a fresh model, engine and directory state per run where the row
// needs one); the median TTFT is printed with the tokens served from cache and the measured
// read rate of the tier the row read (RAM or disk). max_tokens 1. A hybrid model (qwen3_next)
// resumes from the recurrent-state checkpoint the tiers keep with the prompt's last full block.
// Results go to docs/perf.md with machine, command and date.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench_engine.h"
#include "engine/engine.h"
#include "util/flags.h"

namespace ember {
namespace {

struct Sample {
  double ttft_ms = 0;
  int32_t cached_tokens = 0;
  double read_mb_per_s = 0;  // the disk tier's measured reads so far
  double ram_mb_per_s = 0;   // the RAM tier's
  int64_t ram_promotions = 0;
  int64_t state_restores = 0;  // a hybrid model: sequences resumed from a tier's checkpoint
};

// One request of max_tokens 1: its TTFT (submit to the first token) and cached tokens.
Sample Ask(Engine& engine, const std::vector<int32_t>& prompt) {
  GenerationRequest r;
  r.prompt_ids = prompt;
  r.max_tokens = 1;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  const int64_t start = NowNs();
  auto stream = SubmitOrExit(engine, std::move(r));
  std::vector<TokenEvent> events;
  int64_t first = 0;
  while (stream->Next(&events)) {
    for (const TokenEvent& e : events)
      if (first == 0 && e.token_id >= 0) first = e.time_ns;
    events.clear();
  }
  Sample s;
  s.ttft_ms = static_cast<double>(first - start) / 1e6;
  s.cached_tokens = stream->usage().cached_tokens;
  const PromptCacheStats pc = engine.Stats().prompt_cache;
  s.read_mb_per_s = pc.read_bytes_per_s / 1e6;
  s.ram_mb_per_s = pc.ram.read_bytes_per_s / 1e6;
  s.ram_promotions = pc.ram.promotions;
  s.state_restores = pc.state_restores;
  return s;
}

// Drops the directory's files from the page cache (clean pages only: the engine that wrote them
// is gone and its writer flushed them to the file system; fdatasync makes them clean).
void DropFromPageCache(const std::string& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    (void)::fdatasync(fd);
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  BenchModelFlags model_flags;
  std::string cache_dir = "/tmp/ember_prompt_cache_bench";
  int64_t prompt_len = 2048, threads = 0, repeats = 3, step_tokens = 0;
  int64_t ram_bytes = int64_t{4} << 30;
  FlagParser flags(
      "usage: prompt_cache_bench (--model DIR | --synth PRESET [--layers N]) [--device cpu|cuda]\n"
      "       [--prompt-len 2048] [--cache-dir DIR] [--repeats 3] [--threads N]\n"
      "       [--max-step-tokens N] [--ram-bytes 4294967296]");
  model_flags.Register(flags);
  flags.AddInt("--ram-bytes", &ram_bytes, "the RAM tier's cap on the first engine (0: no RAM row)");
  flags.AddString("--cache-dir", &cache_dir, "prompt cache directory (emptied first)");
  flags.AddInt("--prompt-len", &prompt_len, "prompt tokens");
  flags.AddInt("--repeats", &repeats, "runs per row (the median is printed)");
  flags.AddInt("--threads", &threads, "CPU threads (0: all)");
  flags.AddInt("--max-step-tokens", &step_tokens, "tokens per engine step (0: the default)");
  bool help = false;
  Status st = flags.Parse(argc, argv, 1, &help);
  if (help || !st.ok() || repeats < 1) {
    std::fprintf(stderr, "%s%s\n", st.ok() ? "" : (st.message() + "\n").c_str(),
                 flags.Help().c_str());
    return help ? 0 : 2;
  }
  const std::string synth_dir = cache_dir + ".model";
  const Result<std::string> model_dir = model_flags.Resolve(synth_dir);
  if (!model_dir.ok()) {
    std::fprintf(stderr, "%s\n%s\n", model_dir.message().c_str(), flags.Help().c_str());
    return 2;
  }
  ModelLoadOptions opts;
  opts.num_threads = static_cast<int32_t>(threads);
  opts.device = model_flags.Device();
  EngineConfig config;
  config.max_running = 4;
  config.max_step_tokens = static_cast<int32_t>(step_tokens);
  config.prompt_cache.dir = cache_dir;
  config.prompt_cache.disk_bytes = int64_t{8} << 30;
  // A model per engine (a model holds one KV pool), as a restarted server loads it again; each
  // goes with its engine (two 8B models and their pools do not fit one GPU).
  std::vector<std::unique_ptr<Model>> models;
  // with_ram: a RAM tier and a pool of twice the prompt's blocks (plus a few), so two other
  // prompts of its length evict it.
  auto new_engine = [&](bool with_ram) {
    auto model = Model::Load(*model_dir, opts);
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", model.message().c_str());
      std::exit(1);
    }
    models.push_back(std::move(model).value());
    EngineConfig c = config;
    if (with_ram) {
      const int64_t blocks = 2 * (prompt_len / c.block_size + 2) + 2;
      c.kv_cache_bytes = blocks * c.block_size * models.back()->KvBytesPerToken();
      c.prompt_cache.ram_bytes = ram_bytes;
      // A hybrid model: the budget also holds the state slots and 16 checkpoints (the three
      // prompts' checkpoints stay live until their blocks are evicted to RAM).
      if (const int64_t state = models.back()->StateBytesPerSequence(); state > 0) {
        c.state_checkpoint_bytes = 16 * state;
        c.kv_cache_bytes += (int64_t{c.max_running} + 1) * state + c.state_checkpoint_bytes;
      }
    }
    auto engine = Engine::Create(models.back().get(), c);
    if (!engine.ok()) {
      std::fprintf(stderr, "%s\n", engine.message().c_str());
      std::exit(1);
    }
    return std::move(engine).value();
  };
  std::vector<double> cold, pool, ram, disk_cold, disk_warm, repeat;
  Sample last_pool, last_ram, last_disk_cold, last_disk_warm, last_repeat;
  for (int64_t rep = 0; rep < repeats; ++rep) {
    std::filesystem::remove_all(cache_dir);
    std::mt19937 rng(static_cast<uint32_t>(rep + 1));
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
    {
      auto engine = new_engine(ram_bytes > 0);
      const int32_t vocab = models.back()->config().vocab_size;
      auto random_prompt = [&](std::vector<int32_t>& p) {
        for (int32_t& t : p) t = 3 + static_cast<int32_t>(rng() % (vocab - 3));
      };
      random_prompt(prompt);
      cold.push_back(Ask(*engine, prompt).ttft_ms);
      last_pool = Ask(*engine, prompt);
      pool.push_back(last_pool.ttft_ms);
      if (ram_bytes > 0) {
        std::vector<int32_t> other(prompt.size());
        for (int i = 0; i < 2; ++i) {
          random_prompt(other);
          Ask(*engine, other);
        }
        last_ram = Ask(*engine, prompt);
        ram.push_back(last_ram.ttft_ms);
        const int64_t blocks = prompt_len / config.block_size;
        if (last_ram.ram_promotions < blocks - 2)
          std::fprintf(stderr, "note: only %lld of %lld blocks came from RAM\n",
                       static_cast<long long>(last_ram.ram_promotions),
                       static_cast<long long>(blocks));
      }
    }  // the engine's writer flushes the directory before it goes
    models.clear();
    DropFromPageCache(cache_dir);
    {
      auto engine = new_engine(false);
      last_disk_cold = Ask(*engine, prompt);
      disk_cold.push_back(last_disk_cold.ttft_ms);
    }
    models.clear();
    {
      auto engine = new_engine(false);
      last_disk_warm = Ask(*engine, prompt);
      disk_warm.push_back(last_disk_warm.ttft_ms);
      last_repeat = Ask(*engine, prompt);
      repeat.push_back(last_repeat.ttft_ms);
    }
    models.clear();
  }
  const double c = Median(cold);
  std::printf("prompt %lld tokens, %lld runs per row (median TTFT)\n",
              static_cast<long long>(prompt_len), static_cast<long long>(repeats));
  std::printf("%-28s %10s %8s %14s %9s\n", "path", "TTFT ms", "cached", "read MB/s",
              "vs cold");
  auto row = [&](const char* name, double ms, const Sample& s, double mb_per_s) {
    std::printf("%-28s %10.1f %8d %14.0f %8.1fx\n", name, ms, s.cached_tokens, mb_per_s,
                ms > 0 ? c / ms : 0.0);
  };
  row("cold (prefill)", c, Sample{}, 0);
  row("pool hit", Median(pool), last_pool, 0);
  if (ram_bytes > 0) row("RAM hit (pool evicted)", Median(ram), last_ram, last_ram.ram_mb_per_s);
  row("disk hit, restart, cold pc", Median(disk_cold), last_disk_cold,
      last_disk_cold.read_mb_per_s);
  row("disk hit, restart, warm pc", Median(disk_warm), last_disk_warm,
      last_disk_warm.read_mb_per_s);
  row("repeat after the disk hit", Median(repeat), last_repeat, 0);
  if (last_disk_warm.state_restores > 0 || last_ram.state_restores > 0)
    std::printf("hybrid model: the RAM and disk rows resumed from a state checkpoint read from "
                "the tier (restores on the last runs: RAM %lld, disk %lld, disk then repeat "
                "%lld)\n",
                static_cast<long long>(last_ram.state_restores),
                static_cast<long long>(last_disk_warm.state_restores),
                static_cast<long long>(last_repeat.state_restores));
  std::filesystem::remove_all(cache_dir);
  std::filesystem::remove_all(synth_dir);
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) { return ember::Main(argc, argv); }
