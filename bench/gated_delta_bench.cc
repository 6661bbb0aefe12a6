// The CPU gated delta rule (backend/cpu/gated_delta.h, qwen3_next's recurrence) over one prefill
// step of one sequence, per layer: the token loop against the chunked form, each run over the
// value heads in parallel on the thread pool as CpuBackend::GatedDeltaRule runs them. Default
// shape: Qwen3-Next-80B-A3B's linear-attention layer (16 key heads, 32 value heads, k_dim = v_dim
// = 128). The forms run in interleaved rounds (so a shared machine's load hits both alike), each
// round from the same random state; reports wall ms per layer (min and median of the rounds), the
// speed-up of the mins, the least process CPU ms of a round (with --threads 1 the work alone, a
// steadier measure on a busy machine; with more it counts the pool's spinning too) and the
// largest output difference relative to the largest output.
//
//   gated_delta_bench [--tokens 512,4096] [--threads 2] [--rounds 5] [--chunk 64]
//                     [--k-heads 16 --v-heads 32 --k-dim 128 --v-dim 128]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cpu/gated_delta.h"
#include "backend/cpu/thread_pool.h"
#include "util/flags.h"

namespace ember {
namespace {

using Clock = std::chrono::steady_clock;

double CpuMs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

struct Timing {
  double wall_ms, cpu_ms;
};

struct Layer {
  cpu::DeltaHeadShape shape;
  int64_t rows = 0;
  std::vector<float> qkv, ba, a_log, dt_bias, state0;  // state0: [v_heads, k_dim, v_dim]
};

// Random inputs; the decays as Qwen3-Next initializes them: A = exp(a_log) uniform in [1, 16],
// softplus(dt_bias) log-uniform in [0.001, 0.1] (ba's decay inputs uniform in [-1, 1] on top).
Layer MakeLayer(const cpu::DeltaHeadShape& shape, int64_t rows) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](size_t n, float scale) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * u(rng);
    return v;
  };
  const auto heads = static_cast<size_t>(shape.num_v_heads);
  Layer l{shape, rows, fill(static_cast<size_t>(rows * shape.qkv_stride()), 1.0f),
          fill(static_cast<size_t>(rows) * 2 * heads, 1.0f), std::vector<float>(heads),
          std::vector<float>(heads),
          fill(heads * static_cast<size_t>(shape.k_dim) * static_cast<size_t>(shape.v_dim), 0.1f)};
  for (size_t h = 0; h < heads; ++h) {
    l.a_log[h] = std::log(8.5f + 7.5f * u(rng));
    const float dt = std::exp(std::log(0.01f) + std::log(10.0f) * u(rng));
    l.dt_bias[h] = dt + std::log(-std::expm1(-dt));  // softplus's inverse
  }
  return l;
}

// One layer's step: every value head from state0 (copied first, not timed).
Timing RunLayer(const Layer& l, int32_t chunk, cpu::ThreadPool& pool, std::vector<float>& state,
                std::vector<float>& out) {
  state = l.state0;
  const int64_t head_floats = int64_t{l.shape.k_dim} * l.shape.v_dim;
  const double c0 = CpuMs();
  const auto t0 = Clock::now();
  pool.ParallelFor(l.shape.num_v_heads, [&](int64_t h, int) {
    float* s = state.data() + h * head_floats;
    const auto head = static_cast<int32_t>(h);
    if (chunk > 0)
      cpu::GatedDeltaRuleChunked(l.shape, head, l.qkv.data(), l.ba.data(), l.a_log.data(),
                                 l.dt_bias.data(), l.rows, chunk, s, out.data());
    else
      cpu::GatedDeltaRuleTokens(l.shape, head, l.qkv.data(), l.ba.data(), l.a_log.data(),
                                l.dt_bias.data(), l.rows, s, out.data());
  });
  return {std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), CpuMs() - c0};
}

int Run(int argc, char** argv) {
  std::vector<int64_t> tokens_list = {512, 4096};
  int64_t threads = 2, rounds = 5, chunk = cpu::kDeltaChunk, k_heads = 16, v_heads = 32,
          k_dim = 128, v_dim = 128;
  FlagParser flags("usage: gated_delta_bench [--tokens LIST] [--threads N] [--rounds N] ...");
  flags.AddIntList("--tokens", &tokens_list, "rows of the step, comma-separated (default 512,4096)");
  flags.AddInt("--threads", &threads, "CPU threads (default 2)");
  flags.AddInt("--rounds", &rounds, "interleaved rounds (default 5)");
  flags.AddInt("--chunk", &chunk, "rows per chunk of the chunked form (default kDeltaChunk, 64)");
  flags.AddInt("--k-heads", &k_heads, "key heads (default 16)");
  flags.AddInt("--v-heads", &v_heads, "value heads (default 32)");
  flags.AddInt("--k-dim", &k_dim, "key head dim (default 128)");
  flags.AddInt("--v-dim", &v_dim, "value head dim, a multiple of 8 (default 128)");
  bool help = false;
  if (Status st = flags.Parse(argc, argv, 1, &help); !st.ok() || help) {
    std::fprintf(stderr, "%s\n%s", st.message().c_str(), flags.Help().c_str());
    return help ? 0 : 2;
  }
  if (chunk <= 0 || chunk % 8 != 0 || v_dim % 8 != 0 || v_heads % k_heads != 0) {
    std::fprintf(stderr, "--chunk and --v-dim must be multiples of 8, --v-heads of --k-heads\n");
    return 2;
  }
  const cpu::DeltaHeadShape shape{static_cast<int32_t>(k_heads), static_cast<int32_t>(v_heads),
                                  static_cast<int32_t>(k_dim), static_cast<int32_t>(v_dim)};
  cpu::ThreadPool pool(static_cast<int>(threads));
  std::printf("%lld/%lld heads, k_dim %lld, v_dim %lld, chunk %lld, %lld thread(s), %lld rounds\n\n",
              static_cast<long long>(k_heads), static_cast<long long>(v_heads),
              static_cast<long long>(k_dim), static_cast<long long>(v_dim),
              static_cast<long long>(chunk), static_cast<long long>(threads),
              static_cast<long long>(rounds));
  std::printf("| tokens | token loop ms (min / median) | chunked ms (min / median) | speed-up (min) "
              "| CPU ms token loop / chunked (min) | largest difference |\n"
              "| ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const int64_t rows : tokens_list) {
    const Layer layer = MakeLayer(shape, rows);
    const size_t out_floats = static_cast<size_t>(layer.rows * v_heads * v_dim);
    std::vector<float> state, out_tokens(out_floats), out_chunked(out_floats);
    std::vector<double> ms_tokens, ms_chunked;
    double cpu_tokens = 1e300, cpu_chunked = 1e300;
    for (int64_t r = 0; r < rounds; ++r) {
      const Timing t = RunLayer(layer, 0, pool, state, out_tokens);
      const Timing c = RunLayer(layer, static_cast<int32_t>(chunk), pool, state, out_chunked);
      ms_tokens.push_back(t.wall_ms);
      ms_chunked.push_back(c.wall_ms);
      cpu_tokens = std::min(cpu_tokens, t.cpu_ms);
      cpu_chunked = std::min(cpu_chunked, c.cpu_ms);
    }
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < out_floats; ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(out_tokens[i] - out_chunked[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(out_tokens[i])));
    }
    std::sort(ms_tokens.begin(), ms_tokens.end());
    std::sort(ms_chunked.begin(), ms_chunked.end());
    std::printf("| %lld | %.1f / %.1f | %.1f / %.1f | %.2fx | %.1f / %.1f | %.2g |\n",
                static_cast<long long>(layer.rows), ms_tokens.front(),
                ms_tokens[ms_tokens.size() / 2], ms_chunked.front(),
                ms_chunked[ms_chunked.size() / 2], ms_tokens.front() / ms_chunked.front(),
                cpu_tokens, cpu_chunked, diff / std::max(scale, 1e-30));
  }
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) { return ember::Run(argc, argv); }
