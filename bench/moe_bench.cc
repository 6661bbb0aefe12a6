// Mixture-of-experts MLP (backend/cuda/moe.cu, cuda::LaunchMoeMlp) in isolation, at the small
// step sizes of decode: for each row count, `--chain` MoeMlp launches back to back in one CUDA
// graph, each with its own x and alternating between two copies of every expert (one launch
// touches more expert bytes than the L2 holds, so the weights come from DRAM), random weights.
// Prints microseconds per launch (median of the replays), the distinct experts the last launch
// chose, and those experts' weight bytes (plus the router's) per second. The question it answers:
// how close to the device-copy bandwidth the experts of a small step stream, and what a step costs
// beyond them. `--mma` picks the tensor-core or the SIMT kernels (A/B); the SIMT kernels take
// small steps by pair (kernels.h, MoeByPair).
// usage: moe_bench [--shape gpt-oss-20b|qwen3-30b-a3b] [--mxfp4] [--rows 1,2,4,8]
//                  [--mma -1|0|1] [--chain 16] [--reps 20]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "cuda_timing.h"
#include "util/flags.h"

namespace {

constexpr int kCopies = 2;

struct Shape {
  int64_t d, inter;
  int32_t experts, top_k;
  bool gpt_oss;  // router bias, expert biases, clamped SwiGLU
};

// A device buffer of `bytes` filled from `pattern` (repeated).
void* Upload(size_t bytes, const std::vector<unsigned char>& pattern, size_t offset) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  for (size_t at = 0; at < bytes;) {
    const size_t from = (offset + at) % pattern.size();
    const size_t n = std::min(bytes - at, pattern.size() - from);
    CUDA_CHECK(
        cudaMemcpy(static_cast<char*>(p) + at, pattern.data() + from, n, cudaMemcpyHostToDevice));
    at += n;
  }
  return p;
}

template <typename T>
T* UploadVector(const std::vector<T>& v) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, v.size() * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return static_cast<T*>(p);
}

std::vector<unsigned char> Bf16Pattern(size_t values, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<unsigned char> out(values * 2);
  for (size_t i = 0; i < values; ++i) {
    const __nv_bfloat16 b = __float2bfloat16(u(rng));
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
  return out;
}

std::vector<int64_t> ParseList(const std::string& s) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (at < s.size()) {
    const size_t comma = s.find(',', at);
    out.push_back(std::stoll(s.substr(at, comma - at)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape_name = "gpt-oss-20b", rows_list = "1,2,4,8";
  int64_t chain = 16, reps = 20, mma = -1;
  bool mxfp4 = false, help = false;
  ember::FlagParser flags("moe_bench [flags]");
  flags.AddString("--shape", &shape_name, "gpt-oss-20b | qwen3-30b-a3b");
  flags.AddBool("--mxfp4", &mxfp4, "MXFP4 experts (gpt-oss-20b only)");
  flags.AddString("--rows", &rows_list, "comma-separated row counts");
  flags.AddInt("--mma", &mma,
               "-1: the default mode's choice (cuda::MoeMmaPays); 0: SIMT; 1: tensor cores");
  flags.AddInt("--chain", &chain, "MoeMlp launches per graph replay");
  flags.AddInt("--reps", &reps, "timed graph replays (the median counts)");
  const ember::Status parsed = flags.Parse(argc, argv, 1, &help);
  if (const int status = flags.ExitStatusAfterParse(parsed, help); status >= 0) return status;
  Shape shape{};
  if (shape_name == "gpt-oss-20b") {
    shape = {2880, 2880, 32, 4, true};
  } else if (shape_name == "qwen3-30b-a3b") {
    shape = {2048, 768, 128, 8, false};
  } else {
    std::fprintf(stderr, "unknown --shape %s\n", shape_name.c_str());
    return 2;
  }
  if (mxfp4 && !shape.gpt_oss) {
    std::fprintf(stderr, "--mxfp4 takes --shape gpt-oss-20b\n");
    return 2;
  }
  const std::vector<int64_t> row_counts = ParseList(rows_list);
  if (chain < 1 || reps < 1 || row_counts.empty()) {
    std::fprintf(stderr, "--chain, --reps and --rows must be positive\n");
    return 2;
  }
  const int64_t d = shape.d, inter = shape.inter;
  const int32_t experts = shape.experts;
  std::mt19937 rng(7);
  // Weights: per copy one allocation per matrix kind ([experts, out, in]) and its pointer table.
  const int64_t w_per_byte = mxfp4 ? 2 : 1;
  const size_t elem = mxfp4 ? 1 : 2;
  const size_t gate_bytes = static_cast<size_t>(inter * d / w_per_byte) * elem;
  const size_t down_bytes = static_cast<size_t>(d * inter / w_per_byte) * elem;
  std::vector<unsigned char> pattern;
  if (mxfp4) {
    pattern.resize(size_t{64} << 20);
    for (auto& b : pattern) b = static_cast<unsigned char>(rng());
  } else {
    pattern = Bf16Pattern(size_t{32} << 20, 0.03f, rng);
  }
  std::vector<unsigned char> scale_pattern(size_t{1} << 20);
  for (auto& b : scale_pattern) b = static_cast<unsigned char>(119 + rng() % 5);
  struct Copy {
    const void* const* gate;
    const void* const* up;
    const void* const* down;
    const void* const* scales[3];
    const void* router;
  };
  std::vector<Copy> copies;
  for (int c = 0; c < kCopies; ++c) {
    std::vector<const void*> tables[6];
    for (int part = 0; part < 3; ++part) {
      const size_t bytes = part == 2 ? down_bytes : gate_bytes;
      const auto* base = static_cast<const unsigned char*>(
          Upload(bytes * static_cast<size_t>(experts), pattern, 4096 * (3 * c + part)));
      for (int32_t e = 0; e < experts; ++e) tables[part].push_back(base + bytes * e);
      if (mxfp4) {
        const size_t sbytes = bytes / 16;  // one scale per 32 weights = 16 bytes
        const auto* sbase = static_cast<const unsigned char*>(
            Upload(sbytes * static_cast<size_t>(experts), scale_pattern, 977 * (3 * c + part)));
        for (int32_t e = 0; e < experts; ++e) tables[3 + part].push_back(sbase + sbytes * e);
      }
    }
    Copy copy{};
    copy.gate = UploadVector(tables[0]);
    copy.up = UploadVector(tables[1]);
    copy.down = UploadVector(tables[2]);
    for (int part = 0; part < 3; ++part)
      copy.scales[part] = mxfp4 ? UploadVector(tables[3 + part]) : nullptr;
    copy.router = Upload(static_cast<size_t>(experts * d) * 2,
                         Bf16Pattern(static_cast<size_t>(experts * d), 1.0f, rng), 0);
    copies.push_back(copy);
  }
  // gpt-oss's biases (shared by the copies: small).
  const float* router_bias = nullptr;
  const float* const* biases[3] = {nullptr, nullptr, nullptr};
  if (shape.gpt_oss) {
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    std::vector<float> rb(static_cast<size_t>(experts));
    for (float& v : rb) v = u(rng);
    router_bias = UploadVector(rb);
    for (int part = 0; part < 3; ++part) {
      const int64_t n = part == 2 ? d : inter;
      std::vector<const float*> table;
      for (int32_t e = 0; e < experts; ++e) {
        std::vector<float> b(static_cast<size_t>(n));
        for (float& v : b) v = u(rng);
        table.push_back(UploadVector(b));
      }
      biases[part] = UploadVector(table);
    }
  }
  const int64_t max_rows = *std::max_element(row_counts.begin(), row_counts.end());
  std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
  std::vector<float*> xs;
  for (int64_t i = 0; i < chain; ++i) {
    std::vector<float> x(static_cast<size_t>(max_rows * d));
    for (float& v : x) v = ux(rng);
    xs.push_back(UploadVector(x));
  }
  const int64_t max_pairs = max_rows * shape.top_k;
  const int32_t max_tiles = ember::cuda::MoeMaxTiles(max_rows, shape.top_k, experts);
  auto scratch = [](size_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  };
  auto* logits = static_cast<float*>(scratch(static_cast<size_t>(max_rows * experts) * 4));
  auto* ids = static_cast<int32_t*>(scratch(static_cast<size_t>(max_pairs) * 4));
  auto* weights = static_cast<float*>(scratch(static_cast<size_t>(max_pairs) * 4));
  auto* sorted = static_cast<int32_t*>(scratch(static_cast<size_t>(max_pairs) * 4));
  auto* pair_pos = static_cast<int32_t*>(scratch(static_cast<size_t>(max_pairs) * 4));
  auto* tiles = static_cast<int32_t*>(scratch(static_cast<size_t>(max_tiles) * 12));
  auto* num_tiles = static_cast<int32_t*>(scratch(256));
  auto* act = static_cast<float*>(scratch(static_cast<size_t>(max_pairs * inter) * 4));
  auto* y = static_cast<float*>(scratch(static_cast<size_t>(max_pairs * d) * 4));
  auto* out = static_cast<float*>(scratch(static_cast<size_t>(max_rows * d) * 4));
  ember::cuda::PrepareMoeKernels();
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreate(&st));
  const double expert_bytes =
      static_cast<double>(2 * gate_bytes + down_bytes) * (mxfp4 ? 1.0 + 1.0 / 16 : 1.0);
  const double router_bytes = static_cast<double>(experts * d) * 2;
  std::printf("shape=%s experts=%s chain=%ld reps=%ld mma=%ld (expert %.1f MB)\n",
              shape_name.c_str(), mxfp4 ? "mxfp4" : "bf16", static_cast<long>(chain),
              static_cast<long>(reps), static_cast<long>(mma), expert_bytes / 1e6);
  std::printf("%5s %9s %8s %9s %8s\n", "rows", "us/call", "experts", "MB", "TB/s");
  for (const int64_t rows : row_counts) {
    auto args_for = [&](int64_t i) {
      const Copy& c = copies[static_cast<size_t>(i % kCopies)];
      ember::cuda::MoeArgs a;
      a.router = c.router;
      a.x = xs[static_cast<size_t>(i)];
      a.gate = c.gate;
      a.up = c.up;
      a.down = c.down;
      a.router_bias = router_bias;
      a.gate_bias = biases[0];
      a.up_bias = biases[1];
      a.down_bias = biases[2];
      a.clamped_swiglu = shape.gpt_oss;
      a.w_bf16 = true;
      a.mxfp4 = mxfp4;
      a.gate_scales = c.scales[0];
      a.up_scales = c.scales[1];
      a.down_scales = c.scales[2];
      a.rows = rows;
      a.d = d;
      a.inter = inter;
      a.num_experts = experts;
      a.top_k = shape.top_k;
      a.route.normalize = !shape.gpt_oss;
      a.mma = mma < 0 ? ember::cuda::MoeMmaPays(rows * shape.top_k, experts, mxfp4) : mma == 1;
      a.max_tiles = ember::cuda::MoeMaxTiles(rows, shape.top_k, experts);
      a.logits = logits;
      a.ids = ids;
      a.weights = weights;
      a.sorted = sorted;
      a.pair_pos = pair_pos;
      a.tiles = tiles;
      a.num_tiles = num_tiles;
      a.act = act;
      a.y = y;
      a.out = out;
      return a;
    };
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int64_t i = 0; i < chain; ++i) ember::cuda::LaunchMoeMlp(args_for(i), st);
    CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const double ms =
        ember::bench::MedianMs(st, reps, [&] { CUDA_CHECK(cudaGraphLaunch(exec, st)); });
    const double us = 1e3 * ms / static_cast<double>(chain);
    std::vector<int32_t> chosen(static_cast<size_t>(rows * shape.top_k));
    CUDA_CHECK(cudaMemcpy(chosen.data(), ids, chosen.size() * 4, cudaMemcpyDeviceToHost));
    const std::set<int32_t> distinct(chosen.begin(), chosen.end());
    const double bytes = static_cast<double>(distinct.size()) * expert_bytes + router_bytes;
    std::printf("%5ld %9.2f %8zu %9.1f %8.2f\n", static_cast<long>(rows), us, distinct.size(),
                bytes / 1e6, bytes / us / 1e6);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
  }
  return 0;
}
