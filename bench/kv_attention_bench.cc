// Decode attention over a long context per KV-cache format (issue 42), one backend's Attention
// op alone: one layer of Llama-3.2-1B's shape by default (32 query heads, 8 KV heads, head_dim
// 64), `--rows` sequences each at `--context` tokens, the formats timed in interleaved rounds (so
// a shared machine's load hits them alike); reports µs per call (median and min of the rounds),
// the KV bytes the call reads and, with `--device cuda`, the bandwidth that is (each round times
// `--reps` back-to-back calls and one synchronising read; the GPU's bf16 mode, `bf16` the
// default pool).
//
//   kv_attention_bench [--device cpu|cuda] [--context 4096] [--rows 1] [--rounds 15] [--reps 1]
//                      [--threads 1] [--formats f32,bf16,f16,fp8,int8,int4]
//                      [--heads 32 --kv-heads 8 --head-dim 64]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_loader.h"
#include "backend/kv_quant.h"
#include "util/flags.h"

namespace ember {
namespace {

int Run(int argc, char** argv) {
  int64_t context = 4096, rows = 1, rounds = 15, reps = 1, threads = 1, heads = 32, kv_heads = 8,
          hd = 64;
  std::string list = "f32,bf16,f16,fp8,int8,int4", device = "cpu";
  FlagParser flags(
      "usage: kv_attention_bench [--device cpu|cuda] [--context N] [--rows R] [--formats LIST] "
      "...");
  flags.AddString("--device", &device, "cpu or cuda (default cpu)");
  flags.AddInt("--reps", &reps, "calls timed together per round (default 1)");
  flags.AddInt("--context", &context, "tokens in each sequence's KV (default 4096)");
  flags.AddInt("--rows", &rows, "sequences decoded in the step (default 1)");
  flags.AddInt("--rounds", &rounds, "interleaved rounds (default 15)");
  flags.AddInt("--threads", &threads, "CPU threads (default 1)");
  flags.AddString("--formats", &list, "KV dtypes");
  flags.AddInt("--heads", &heads, "query heads (default 32)");
  flags.AddInt("--kv-heads", &kv_heads, "KV heads (default 8)");
  flags.AddInt("--head-dim", &hd, "head dim (default 64)");
  bool help = false;
  if (Status st = flags.Parse(argc, argv, 1, &help); !st.ok() || help) {
    std::fprintf(stderr, "%s\n%s", st.message().c_str(), flags.Help().c_str());
    return help ? 0 : 2;
  }
  const bool cuda = device == "cuda";
  if (!cuda && device != "cpu") {
    std::fprintf(stderr, "--device: cpu or cuda, got %s\n", device.c_str());
    return 2;
  }
  if (reps < 1 || rounds < 1) {
    std::fprintf(stderr, "--reps and --rounds must be positive\n");
    return 2;
  }
  constexpr int32_t kBlock = 16;
  const int32_t blocks_per_seq = static_cast<int32_t>((context + kBlock - 1) / kBlock);
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(rows * heads * hd));
  for (float& x : q) x = g(rng);
  struct Entry {
    KvDType dtype;
    std::unique_ptr<Backend> be;
    BatchPlan plan;
    std::vector<double> us;
  };
  std::vector<Entry> entries;
  std::stringstream in(list);
  for (std::string name; std::getline(in, name, ',');) {
    auto dtype = ParseKvDType(name, "--formats");
    if (!dtype.ok()) {
      std::fprintf(stderr, "%s\n", dtype.message().c_str());
      return 2;
    }
    std::unique_ptr<Backend> be;
    if (cuda) {
      auto loaded = LoadCudaBackend(0, CudaBackendOptions{});
      if (!loaded.ok()) {
        std::fprintf(stderr, "%s\n", loaded.status().message().c_str());
        return 2;
      }
      be = std::move(loaded).value();
    } else {
      CpuBackendOptions options;
      options.num_threads = static_cast<int32_t>(threads);
      be = MakeCpuBackend(options);
    }
    Entry e{*dtype, std::move(be), {}, {}};
    KvFormat format;
    format.layers = {*dtype};
    if (Status st = e.be->SetKvFormat(format, static_cast<int32_t>(hd)); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.message().c_str());
      return 2;
    }
    CHECK(e.be->AllocateKvPool(1, static_cast<int32_t>(rows) * blocks_per_seq, kBlock,
                               static_cast<int32_t>(kv_heads), static_cast<int32_t>(hd)).ok());
    // Fill every sequence's KV with one prefill step (random rows), then plan the decode step.
    for (int64_t s = 0; s < rows; ++s) {
      std::vector<int32_t> table(static_cast<size_t>(blocks_per_seq));
      for (int32_t b = 0; b < blocks_per_seq; ++b)
        table[static_cast<size_t>(b)] = static_cast<int32_t>(s) * blocks_per_seq + b;
      BatchPlan fill;
      fill.block_size = kBlock;
      fill.AddSequence(std::vector<int32_t>(static_cast<size_t>(context), 1), 0, table, false);
      CHECK(e.be->BeginStep(fill).ok());
      Tensor k = e.be->Alloc({context, kv_heads, hd}), v = e.be->Alloc({context, kv_heads, hd});
      std::vector<float> host(static_cast<size_t>(k.numel()));
      for (Tensor* t : {&k, &v}) {
        for (float& x : host) x = g(rng);
        CHECK(e.be->CopyFromHost(host, *t).ok());
      }
      e.be->WriteKv(0, k, v);
      e.plan.block_size = kBlock;
      e.plan.AddSequence({1}, static_cast<int32_t>(context - 1), table, true);
    }
    entries.push_back(std::move(e));
  }
  AttentionParams p;
  p.num_heads = static_cast<int32_t>(heads);
  p.num_kv_heads = static_cast<int32_t>(kv_heads);
  p.head_dim = static_cast<int32_t>(hd);
  p.scale = 0.125f;
  for (int64_t r = 0; r < rounds; ++r) {
    for (Entry& e : entries) {
      CHECK(e.be->BeginStep(e.plan).ok());
      Tensor qt = e.be->Alloc({rows, heads, hd}), out = e.be->Alloc({rows, heads * hd});
      CHECK(e.be->CopyFromHost(q, qt).ok());
      std::vector<float> readback(q.size());  // (each read waits for the work before it)
      CHECK(e.be->CopyToHost(qt, readback).ok());
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < reps; ++i) e.be->Attention(p, qt, out);
      CHECK(e.be->CopyToHost(out, readback).ok());
      e.us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          static_cast<double>(reps));
    }
  }
  std::printf("context %lld, %lld row(s), %lld/%lld heads, head_dim %lld, %lld thread(s), %lld rounds\n\n",
              static_cast<long long>(context), static_cast<long long>(rows),
              static_cast<long long>(heads), static_cast<long long>(kv_heads),
              static_cast<long long>(hd), static_cast<long long>(threads),
              static_cast<long long>(rounds));
  std::printf(
      "| KV dtype | KV MiB read | µs per call (median) | min | vs first (median) | GB/s (median) "
      "|\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
  double base = 0;
  for (Entry& e : entries) {
    std::sort(e.us.begin(), e.us.end());
    const double median = e.us[e.us.size() / 2];
    if (base == 0) base = median;
    const double mib = 2.0 * static_cast<double>(rows * context * kv_heads) *
                       static_cast<double>(KvRowBytes(e.dtype, static_cast<int32_t>(hd))) / 1048576.0;
    std::printf("| %s | %.2f | %.1f | %.1f | %.2fx | %.0f |\n", KvDTypeName(e.dtype), mib, median,
                e.us.front(), median / base, mib * 1048576.0 / median / 1e3);
  }
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) { return ember::Run(argc, argv); }
