// cuda_forward_bench: a Llama-shaped forward pass (random bf16 weights) driven straight through
// the CUDA backend's ops, without the model/engine layers: prefill of `batch` prompts, then
// `gen` decode steps of `batch` rows; every step ends as the engine's greedy steps do, with the
// device argmax of each row's logits and only the ids copied to the host (copying every row's
// logits, 66 MB a step at 128 rows of the 1B, would time PCIe, not the GPU).
// Reports tokens/s and the fraction of the device-copy bandwidth the decode step reaches.
// Usage: cuda_forward_bench --shape llama-3.2-1b|llama-3.1-8b [--batch 1] [--prompt 512]
//        [--gen 128] [--prefill-chunk 8192] [--f32]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "util/flags.h"
#include "util/half.h"

namespace ember {
namespace {

struct Shape {
  const char* name;
  int64_t hidden, inter, layers, heads, kv_heads, head_dim, vocab;
  double rope_theta;
};
constexpr Shape kShapes[] = {
    {"llama-3.2-1b", 2048, 8192, 16, 32, 8, 64, 128256, 500000.0},
    {"llama-3.1-8b", 4096, 14336, 32, 32, 8, 128, 128256, 500000.0},
};

struct Layer {
  Tensor ln1, wq, wk, wv, wo, ln2, w_gate, w_up, w_down;
};

// Uniform with standard deviation `scale` (xorshift: the 8B embedding has 525M entries).
std::vector<uint16_t> RandomBf16(int64_t n, uint32_t seed, float scale) {
  uint64_t state = 0x9E3779B97F4A7C15ull * (seed + 1);
  const float half_width = scale * 1.7320508f;  // sqrt(3): U(-a, a) has std a / sqrt(3)
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& x : v) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const float u = static_cast<float>(state >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    x = F32ToBf16((2.0f * u - 1.0f) * half_width);
  }
  return v;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Run(int argc, char** argv) {
  std::string shape_name = "llama-3.2-1b";
  int64_t batch = 1, prompt = 512, gen = 128, chunk = 8192;
  bool f32 = false, no_graphs = false, profile = false, invariant = false, help = false;
  FlagParser flags("cuda_forward_bench [flags]");
  flags.AddString("--shape", &shape_name, "llama-3.2-1b | llama-3.1-8b");
  flags.AddInt("--batch", &batch, "concurrent sequences");
  flags.AddInt("--prompt", &prompt, "prompt tokens per sequence");
  flags.AddInt("--gen", &gen, "decode steps");
  flags.AddInt("--prefill-chunk", &chunk, "max tokens per prefill step");
  flags.AddBool("--f32", &f32, "f32 compute mode");
  flags.AddBool("--no-graphs", &no_graphs, "launch decode steps op by op (no CUDA graphs)");
  flags.AddBool("--profile", &profile, "time each op kind with events (decode steps only)");
  flags.AddBool("--batch-invariant", &invariant, "the fixed-order GEMM instead of GEMV/cuBLAS");
  Status st = flags.Parse(argc, argv, 1, &help);
  if (const int status = flags.ExitStatusAfterParse(st, help); status >= 0) return status;
  const Shape* s = nullptr;
  for (const Shape& c : kShapes)
    if (shape_name == c.name) s = &c;
  if (s == nullptr) {
    std::fprintf(stderr, "unknown --shape %s\n", shape_name.c_str());
    return 2;
  }
  CudaBackendOptions options;
  options.f32_compute = f32;
  options.cuda_graphs = !no_graphs;
  options.profile_ops = profile;
  options.batch_invariant = invariant;
  auto created = CreateCudaBackend(0, options);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().message().c_str());
    return 1;
  }
  Backend& b = **created;
  const int64_t H = s->hidden, I = s->inter, D = s->head_dim, NH = s->heads, NKV = s->kv_heads;

  // Weights: one host array per matrix shape, uploaded into distinct device buffers per layer.
  auto up = [&](const std::vector<uint16_t>& host, std::vector<int64_t> shape) {
    auto r = b.UploadWeight("w", DType::kBF16, shape, host.data());
    CHECK(r.ok()) << r.status().message();
    return r.value();
  };
  std::vector<float> ones(static_cast<size_t>(H), 1.0f);
  auto up_norm = [&]() {
    auto r = b.UploadWeight("norm", DType::kF32, std::vector<int64_t>{H}, ones.data());
    CHECK(r.ok());
    return r.value();
  };
  const float wscale = 0.02f;
  const auto h_q = RandomBf16(NH * D * H, 1, wscale), h_kv = RandomBf16(NKV * D * H, 2, wscale);
  const auto h_o = RandomBf16(H * NH * D, 3, wscale), h_gu = RandomBf16(I * H, 4, wscale);
  const auto h_down = RandomBf16(H * I, 5, wscale), h_emb = RandomBf16(s->vocab * H, 6, 1.0f);
  std::vector<Layer> layers(static_cast<size_t>(s->layers));
  for (Layer& L : layers) {
    L.ln1 = up_norm();
    L.ln2 = up_norm();
    L.wq = up(h_q, {NH * D, H});
    L.wk = up(h_kv, {NKV * D, H});
    L.wv = up(h_kv, {NKV * D, H});
    L.wo = up(h_o, {H, NH * D});
    L.w_gate = up(h_gu, {I, H});
    L.w_up = up(h_gu, {I, H});
    L.w_down = up(h_down, {H, I});
  }
  const Tensor embed = up(h_emb, {s->vocab, H});
  const Tensor lm_head = up(h_emb, {s->vocab, H});
  const Tensor final_norm = up_norm();
  const double weight_bytes =
      static_cast<double>(DTypeSize(layers[0].wq.dtype)) *
      (s->layers * (H * NH * D * 2 + 2 * H * NKV * D + 3 * H * I) + s->vocab * H);

  const int32_t block_size = 16;
  const int64_t blocks_per_seq = (prompt + gen + block_size - 1) / block_size;
  CHECK(b.AllocateKvPool(static_cast<int32_t>(s->layers),
                         static_cast<int32_t>(batch * blocks_per_seq), block_size,
                         static_cast<int32_t>(NKV), static_cast<int32_t>(D)).ok());
  RopeSpec rope;
  rope.head_dim = static_cast<int32_t>(D);
  rope.rotary_dim = static_cast<int32_t>(D);
  rope.theta = s->rope_theta;
  rope.max_positions = static_cast<int32_t>(prompt + gen + 1);
  const int32_t rope_id = b.CreateRope(rope).value();
  AttentionParams ap;
  ap.num_heads = static_cast<int32_t>(NH);
  ap.num_kv_heads = static_cast<int32_t>(NKV);
  ap.head_dim = static_cast<int32_t>(D);
  ap.scale = 1.0f / std::sqrt(static_cast<float>(D));

  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
  for (int64_t q = 0; q < batch; ++q)
    for (int64_t i = 0; i < blocks_per_seq; ++i)
      tables[static_cast<size_t>(q)].push_back(static_cast<int32_t>(q * blocks_per_seq + i));
  std::vector<int32_t> ids;

  // One forward over `plan`; returns when the rows' greedy ids are on the host.
  double record_s = 0;  // host time spent recording the ops (before the step can start)
  auto forward = [&](const BatchPlan& plan) {
    const double record_start = Now();
    CHECK(b.BeginStep(plan).ok());
    const int64_t T = plan.num_tokens();
    Tensor x = b.Alloc({T, H}), h = b.Alloc({T, H});
    Tensor q = b.Alloc({T, NH * D}), k = b.Alloc({T, NKV * D}), v = b.Alloc({T, NKV * D});
    Tensor attn = b.Alloc({T, NH * D}), o = b.Alloc({T, H});
    Tensor gate = b.Alloc({T, I}), upv = b.Alloc({T, I}), down = b.Alloc({T, H});
    Tensor act = b.AllocMatMulInput({T, I});  // as the model (architecture.h) allocates it
    b.Embedding(embed, 1.0f, x);
    b.RmsNorm(x, layers[0].ln1, 1e-5f, RmsNormKind::kPlain, h);
    for (size_t l = 0; l < layers.size(); ++l) {
      const Layer& L = layers[l];
      const MatMulPart qkv[] = {{&L.wq, nullptr, q}, {&L.wk, nullptr, k}, {&L.wv, nullptr, v}};
      b.MatMulGroup(h, qkv);
      ap.layer = static_cast<int32_t>(l);
      b.RopeWriteKvAttention(rope_id, ap, q.Reshape({T, NH, D}), k.Reshape({T, NKV, D}), v, attn);
      b.MatMul(attn, L.wo, nullptr, o);
      b.AddRmsNorm(x, o, L.ln2, 1e-5f, RmsNormKind::kPlain, h);
      b.GateUpActivation(h, L.w_gate, L.w_up, GateActivation::kSilu, gate, upv, act);
      b.MatMul(act, L.w_down, nullptr, down);
      const Tensor& next = l + 1 < layers.size() ? layers[l + 1].ln1 : final_norm;
      b.AddRmsNorm(x, down, next, 1e-5f, RmsNormKind::kPlain, h);
    }
    const int64_t R = static_cast<int64_t>(plan.logits_rows.size());
    Tensor last = b.Alloc({R, H}), out = b.Alloc({R, s->vocab});
    b.GatherLogitsRows(h, last);
    b.MatMul(last, lm_head, nullptr, out);
    ids.resize(static_cast<size_t>(R));
    record_s += Now() - record_start;
    CHECK(b.ArgmaxRows(out, ids).ok());
  };

  // Prefill: whole prompts, packed into steps of at most `chunk` tokens.
  const double t0 = Now();
  for (int64_t first = 0; first < batch;) {
    BatchPlan plan;
    plan.block_size = block_size;
    int64_t q = first;
    for (; q < batch && (plan.num_tokens() == 0 || plan.num_tokens() + prompt <= chunk); ++q) {
      std::vector<int32_t> tokens(static_cast<size_t>(prompt));
      for (int64_t i = 0; i < prompt; ++i)
        tokens[static_cast<size_t>(i)] = static_cast<int32_t>((q * 131 + i * 17) % s->vocab);
      plan.AddSequence(tokens, 0, tables[static_cast<size_t>(q)], true);
    }
    forward(plan);
    first = q;
  }
  const double prefill_s = Now() - t0;

  // Decode: `gen` steps of `batch` rows; the first 3 are warm-up, untimed.
  const std::vector<CudaOpTime> prefill_profile = CudaGetOpProfile(b);
  const int64_t warm = std::min<int64_t>(3, gen);
  double t1 = Now(), first_step_s = 0;
  for (int64_t step = 0; step < gen; ++step) {
    if (step == 1) first_step_s = Now() - t1;
    if (step == warm) {
      t1 = Now();
      record_s = 0;
    }
    BatchPlan plan;
    plan.block_size = block_size;
    for (int64_t q = 0; q < batch; ++q)
      plan.AddSequence({static_cast<int32_t>((q + step) % s->vocab)},
                       static_cast<int32_t>(prompt + step), tables[static_cast<size_t>(q)], true);
    forward(plan);
  }
  const double decode_s = Now() - t1;
  const int64_t timed = gen - warm;
  const double step_s = timed > 0 ? decode_s / static_cast<double>(timed) : 0;
  const CudaGraphStats gs = CudaGetGraphStats(b);
  std::printf("shape=%s mode=%s batch=%ld prompt=%ld gen=%ld graphs=%s (captures %ld, replays %ld)\n",
              s->name, f32 ? "f32" : "bf16", static_cast<long>(batch), static_cast<long>(prompt),
              static_cast<long>(gen), no_graphs ? "off" : "on", static_cast<long>(gs.captures),
              static_cast<long>(gs.replays));
  std::printf("prefill: %.1f ms, %.0f tok/s\n", prefill_s * 1e3,
              static_cast<double>(batch * prompt) / prefill_s);
  if (timed > 0)
    std::printf("decode: %.3f ms/step, %.1f tok/s (output), weights %.2f GB/step = %.0f GB/s "
                "(%.0f%% of 4300 GB/s)\n",
                step_s * 1e3, static_cast<double>(batch) / step_s, weight_bytes / 1e9,
                weight_bytes / step_s / 1e9, 100.0 * weight_bytes / step_s / 4.3e12);
  if (timed > 0)
    std::printf("decode host recording: %.3f ms/step (the GPU starts a step only after it); "
                "first decode step (graph capture + instantiation with graphs on): %.3f ms\n",
                record_s * 1e3 / static_cast<double>(timed), first_step_s * 1e3);
  if (profile) {
    std::printf("prefill op profile (GPU ms, all prefill steps):\n");
    for (const CudaOpTime& p : prefill_profile)
      std::printf("  %-18s %8.3f ms  %6ld calls\n", p.op.c_str(), p.total_ms,
                  static_cast<long>(p.calls));
    // Decode-only GPU time per op kind (all decode steps, warm-up included).
    std::printf("decode op profile (GPU ms per step, %ld steps):\n", static_cast<long>(gen));
    for (const CudaOpTime& t : CudaGetOpProfile(b)) {
      double ms = t.total_ms;
      int64_t calls = t.calls;
      for (const CudaOpTime& p : prefill_profile)
        if (p.op == t.op) {
          ms -= p.total_ms;
          calls -= p.calls;
        }
      if (calls > 0)
        std::printf("  %-18s %8.3f ms/step  %6.1f calls/step\n", t.op.c_str(),
                    ms / static_cast<double>(gen),
                    static_cast<double>(calls) / static_cast<double>(gen));
    }
  }
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) { return ember::Run(argc, argv); }
