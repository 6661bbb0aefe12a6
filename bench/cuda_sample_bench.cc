// cuda_sample_bench: GPU time of one SampleRows launch (backend/cuda/sample_rows.cu) over R rows
// of a V-column logits matrix, for common parameter mixes and three logit distributions:
//   flat    N(0, 1): what a random-weight (`ember synth`) model's head gives;
//   lm      N(0, 2) with 20 entries at 12 + N(0, 2): a real LM head's shape (sampler_bench's);
//   peaked  N(0, 36).
// Usage: cuda_sample_bench [--rows 128] [--vocab 128256] [--reps 20]
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "cuda_timing.h"
#include "util/flags.h"

namespace {

using ember::cuda::SampleRowParams;

std::vector<float> Logits(const std::string& kind, int64_t rows, int64_t vocab) {
  std::mt19937 gen(7);
  std::vector<float> x(static_cast<size_t>(rows * vocab));
  const float sigma = kind == "flat" ? 1.0f : kind == "lm" ? 2.0f : 6.0f;
  std::normal_distribution<float> dist(0.0f, sigma);
  for (float& v : x) v = dist(gen);
  if (kind == "lm") {
    std::normal_distribution<float> head(0.0f, 2.0f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int i = 0; i < 20; ++i) {
        x[static_cast<size_t>(r * vocab + static_cast<int64_t>(gen() % vocab))] = 12.0f + head(gen);
      }
    }
  }
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 128, vocab = 128256, reps = 20;
  bool help = false;
  ember::FlagParser flags("cuda_sample_bench [flags]");
  flags.AddInt("--rows", &rows, "sampled rows per launch");
  flags.AddInt("--vocab", &vocab, "columns (vocabulary size)");
  flags.AddInt("--reps", &reps, "timed launches per case (the median counts)");
  const ember::Status parsed = flags.Parse(argc, argv, 1, &help);
  if (const int status = flags.ExitStatusAfterParse(parsed, help); status >= 0) return status;
  if (rows < 1 || vocab < 1 || reps < 1) {
    std::fprintf(stderr, "--rows, --vocab and --reps must be positive\n");
    return 2;
  }
  struct Mix {
    const char* name;
    float temperature;
    int32_t top_k;
    float top_p, min_p;
  };
  const Mix mixes[] = {{"T 1", 1.0f, 0, 1.0f, 0.0f},
                       {"T 1 top_p 0.9", 1.0f, 0, 0.9f, 0.0f},
                       {"T 0.7 top_k 50", 0.7f, 50, 1.0f, 0.0f},
                       {"T 1 min_p 0.05", 1.0f, 0, 1.0f, 0.05f},
                       {"top_k 40 top_p 0.9 min_p 0.05", 1.0f, 40, 0.9f, 0.05f}};
  float* x = nullptr;
  int32_t *row_ids = nullptr, *ids = nullptr;
  SampleRowParams* params = nullptr;
  CUDA_CHECK(cudaMalloc(&x, static_cast<size_t>(rows * vocab) * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&row_ids, static_cast<size_t>(rows) * sizeof(int32_t)));
  CUDA_CHECK(cudaMalloc(&ids, static_cast<size_t>(rows) * sizeof(int32_t)));
  CUDA_CHECK(cudaMalloc(&params, static_cast<size_t>(rows) * sizeof(SampleRowParams)));
  std::vector<int32_t> order(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) order[static_cast<size_t>(r)] = static_cast<int32_t>(r);
  CUDA_CHECK(cudaMemcpy(row_ids, order.data(), order.size() * sizeof(int32_t),
                        cudaMemcpyHostToDevice));
  std::printf("SampleRows, %lld rows x %lld columns, median of %lld launches (ms)\n\n",
              static_cast<long long>(rows), static_cast<long long>(vocab),
              static_cast<long long>(reps));
  std::printf("| mix | flat | lm | peaked |\n|---|---|---|---|\n");
  std::vector<std::vector<float>> data;
  for (const char* kind : {"flat", "lm", "peaked"}) data.push_back(Logits(kind, rows, vocab));
  std::mt19937 gen(11);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (const Mix& m : mixes) {
    std::printf("| %s |", m.name);
    for (const std::vector<float>& d : data) {
      CUDA_CHECK(cudaMemcpy(x, d.data(), d.size() * sizeof(float), cudaMemcpyHostToDevice));
      std::vector<SampleRowParams> p(static_cast<size_t>(rows));
      for (SampleRowParams& q : p) q = {m.temperature, m.top_k, m.top_p, m.min_p, uniform(gen)};
      CUDA_CHECK(cudaMemcpy(params, p.data(), p.size() * sizeof(SampleRowParams),
                            cudaMemcpyHostToDevice));
      const double ms = ember::bench::MedianMs(nullptr, reps, [&] {
        ember::cuda::LaunchSampleRows(x, vocab, row_ids, params, static_cast<int32_t>(rows), ids,
                                      nullptr);
      });
      std::printf(" %.3f |", ms);
    }
    std::printf("\n");
  }
  CUDA_CHECK(cudaFree(x));
  CUDA_CHECK(cudaFree(row_ids));
  CUDA_CHECK(cudaFree(ids));
  CUDA_CHECK(cudaFree(params));
  return 0;
}
