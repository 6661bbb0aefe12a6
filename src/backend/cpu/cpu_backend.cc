#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gated_delta.h"

#include <immintrin.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "backend/cpu/kv_dequant.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_bf16.h"
#include "backend/cpu/matmul_f32fast.h"
#include "backend/cpu/matmul_quant.h"
#include "backend/cpu/mla_attention.h"
#include "backend/moe_route.h"
#include "backend/rope_table.h"
#include "backend/threshold_sampling.h"
#include "backend/cpu/thread_pool.h"
#include "backend/kv_quant.h"

namespace ember {
namespace {
// The CPUs this process may run on (a taskset/cgroup affinity mask counts, not the machine's).
int32_t UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}


struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using FloatBuffer = std::unique_ptr<float, FreeDeleter>;

FloatBuffer AllocFloats(size_t count) {
  size_t bytes = std::max<size_t>(64, (count * sizeof(float) + 63) / 64 * 64);
  return FloatBuffer(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

// The KV pool: anonymous pages, zero-filled by the kernel when first touched, so a pool sized
// for the worst case costs resident memory only for the blocks sequences actually use.
class KvBuffer {
 public:
  explicit KvBuffer(size_t bytes) : bytes_(std::max<size_t>(bytes, 1)) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~KvBuffer() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  KvBuffer(const KvBuffer&) = delete;
  KvBuffer& operator=(const KvBuffer&) = delete;
  uint8_t* get() const { return data_; }

 private:
  size_t bytes_;
  uint8_t* data_ = nullptr;
};

float* F(const Tensor& t) {
  CHECK(t.dtype == DType::kF32) << "expected an F32 tensor, got " << DTypeName(t.dtype);
  return static_cast<float*>(t.data);
}

// q . k over one head: 8-lane FMA partial sums in k order, then a fixed horizontal sum, then the
// scalar tail (same order for every row, so attention is batch-invariant).
inline float Dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc);
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  float sum = _mm_cvtss_f32(lo);
  for (; j < n; ++j) sum += a[j] * b[j];
  return sum;
}

// Dot(q, k_i) for 4 keys at once, head_dim % 8 == 0: each key's chain is exactly Dot's (the
// four chains only interleave, to hide the FMA latency of one serial chain).
inline void Dot4(const float* q, const float* k0, const float* k1, const float* k2,
                 const float* k3, int64_t n, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 qv = _mm256_loadu_ps(q + j);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + j), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + j), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + j), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + j), a3);
  }
  const __m256 acc[4] = {a0, a1, a2, a3};
  for (int i = 0; i < 4; ++i) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    out[i] = _mm_cvtss_f32(lo);
  }
}

// acc += p * v over one head.
inline void Axpy(float p, const float* v, float* acc, int64_t n) {
  const __m256 pv = _mm256_set1_ps(p);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(acc + j, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + j), _mm256_loadu_ps(acc + j)));
  for (; j < n; ++j) acc[j] += p * v[j];
}

// exp(x) for 8 lanes: Cody-Waite range reduction + degree-6 polynomial (about 1 ulp; inputs
// clamped to [-87, 88] so results stay finite and normal).
inline __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

struct CpuRope {  // a BuildRopeTable table and its shape
  int32_t head_dim = 0, rotary_dim = 0, max_positions = 0;
  std::vector<float> cos, sin;  // [max_positions, rotary_dim / 2]
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options)
      : decode_graph_buckets_(options.decode_graph_buckets),
        takes_quantized_(options.takes_quantized_weights) {
    num_threads_ = options.num_threads > 0 ? options.num_threads : UsableCpus();
    const bool runs = options.matmul == CpuMatmul::kBf16  ? cpu::HasBf16Dot()
                      : options.matmul == CpuMatmul::kF32 ? cpu::HasF32Fast()
                                                          : true;
    matmul_ = runs ? options.matmul : CpuMatmul::kExact;
    chunked_delta_rule_ = options.chunked_delta_rule;
    pool_ = std::make_unique<cpu::ThreadPool>(num_threads_);
  }
  std::vector<int32_t> DecodeGraphBuckets() const override { return decode_graph_buckets_; }
  std::string name() const override { return "cpu"; }

  bool KeepsHostWeights() const override { return true; }
  bool TakesQuantizedWeights(DType dtype) const override {
    return takes_quantized_ && IsBlockQuantized(dtype);
  }
  Result<Tensor> UploadWeight(const std::string& name, DType dtype, std::span<const int64_t> shape,
                              const void* host_data) override {
    if (shape.empty() || shape.size() > 4)
      return Status::Error("weight \"" + name + "\": rank must be 1..4");
    Tensor t;
    t.dtype = dtype;
    t.ndim = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
    if (dtype == DType::kU8) {  // packed MXFP4 experts (TakesMxfp4Experts): the bytes as they are
      if (t.ndim != 2) return Status::Error("weight \"" + name + "\": U8 (MXFP4) must be 2-D");
      t.data = const_cast<void*>(host_data);
      return t;
    }
    if (IsBlockQuantized(dtype)) {  // Q8_0 / Q4_0 / k-quant matrices: the blocks as they are
      if (t.ndim != 2 || t.cols() % DTypeBlockValues(dtype) != 0)
        return Status::Error("weight \"" + name + "\": " + DTypeName(dtype) +
                             " must be a 2-D matrix with rows of a multiple of " +
                             std::to_string(DTypeBlockValues(dtype)) + " values, got " +
                             ShapeString(t));
      t.data = const_cast<void*>(host_data);
      return t;
    }
    if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16)
      return Status::Error("weight \"" + name + "\": dtype must be F32, F16, BF16 or U8");
    if (t.ndim == 1) {  // small: keep an f32 copy so norms and biases read plain floats
      owned_.push_back(AllocFloats(static_cast<size_t>(t.numel())));
      cpu::ConvertToF32(host_data, dtype, t.numel(), owned_.back().get());
      t.data = owned_.back().get();
      t.dtype = DType::kF32;
    } else {
      t.data = const_cast<void*>(host_data);  // read-only use: never written through
    }
    return t;
  }

  // Formats: each layer's rows in its dtype (kv_quant.h); kAuto is float32. int4 rows hold the
  // Hadamard-rotated K and V unless the format says otherwise (Attention rotates q and its output).
  Status SetKvFormat(const KvFormat& format, int32_t head_dim) override {
    if (!kv_.empty()) return Status::Error("SetKvFormat after AllocateKvPool");
    KvFormat own = format;
    for (size_t l = 0; l < own.layers.size(); ++l) {
      KvDType& t = own.layers[l];
      if (t == KvDType::kAuto) t = KvDType::kF32;
      if (std::string why = KvHeadDimUnsupported(t, head_dim); !why.empty())
        return Status::Error("--kv-cache-dtype " + std::string(KvDTypeName(t)) + " (layer " +
                             std::to_string(l) + "): " + why);
    }
    kv_format_ = std::move(own);
    return Status::Ok();
  }
  int64_t KvTokenBytes(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim) const override {
    if (kv_format_.layers.empty()) return Backend::KvTokenBytes(num_layers, num_kv_heads, head_dim);
    CHECK_EQ(static_cast<int32_t>(kv_format_.layers.size()), num_layers);
    int64_t bytes = 0;
    for (KvDType t : kv_format_.layers) bytes += 2 * num_kv_heads * KvRowBytes(t, head_dim);
    return bytes;
  }
  std::string KvFormatText(int32_t /*head_dim*/) const override {
    return kv_format_.layers.empty() ? "f32" : kv_format_.Describe();
  }

  Status AllocateKvPool(int32_t num_layers, int32_t num_blocks, int32_t block_size,
                        int32_t num_kv_heads, int32_t head_dim) override {
    if (!kv_.empty()) return Status::Error("the KV pool is already allocated");
    if (num_blocks <= 0 || block_size <= 0) return Status::Error("KV pool needs positive num_blocks and block_size");
    if (kv_format_.layers.empty()) kv_format_.layers.assign(static_cast<size_t>(num_layers), KvDType::kF32);
    if (static_cast<int32_t>(kv_format_.layers.size()) != num_layers)
      return Status::Error("the KV format has " + std::to_string(kv_format_.layers.size()) +
                           " layers, the pool " + std::to_string(num_layers));
    num_blocks_ = num_blocks;
    block_size_ = block_size;
    kv_heads_ = num_kv_heads;
    kv_head_dim_ = head_dim;
    for (int32_t l = 0; l < 2 * num_layers; ++l) {
      kv_.push_back(std::make_unique<KvBuffer>(static_cast<size_t>(num_blocks * KvLayerBlockBytes(l / 2))));
      if (kv_.back()->get() == nullptr) return Status::Error("out of memory allocating the KV pool");
    }
    return Status::Ok();
  }

  // One tensor per layer of [latent | rope] rows (kv_heads_ 1, kv_head_dim_ the width): the
  // block copies below then move each layer's latent rows.
  Status AllocateLatentKvPool(int32_t num_layers, int32_t num_blocks, int32_t block_size,
                              int32_t width) override {
    if (!kv_.empty()) return Status::Error("the KV pool is already allocated");
    if (num_blocks <= 0 || block_size <= 0 || width <= 0)
      return Status::Error("latent KV pool needs positive num_blocks, block_size and width");
    num_blocks_ = num_blocks;
    block_size_ = block_size;
    kv_heads_ = 1;
    kv_head_dim_ = width;
    latent_ = true;
    for (int32_t l = 0; l < num_layers; ++l) {
      kv_.push_back(std::make_unique<KvBuffer>(static_cast<size_t>(num_blocks) * block_size * width *
                                                sizeof(float)));
      if (kv_.back()->get() == nullptr) return Status::Error("out of memory allocating the KV pool");
    }
    return Status::Ok();
  }
  bool TakesMla() const override { return true; }

  std::string MtpUnsupported() const override { return ""; }
  Status CopyFromHost(std::span<const float> in, Tensor out) override {
    if (in.size() != static_cast<size_t>(out.numel()))
      return Status::Error("CopyFromHost: " + std::to_string(in.size()) + " floats for tensor " +
                           ShapeString(out));
    std::memcpy(F(out), in.data(), in.size() * sizeof(float));
    return Status::Ok();
  }
  Status ZeroRows(Tensor x, std::span<const int32_t> rows) override {
    float* v = F(x);
    const int64_t cols = x.cols();
    for (int32_t r : rows) {
      if (r < 0 || r >= x.rows())
        return Status::Error("ZeroRows: row " + std::to_string(r) + " of " + ShapeString(x));
      std::fill_n(v + int64_t{r} * cols, cols, 0.0f);
    }
    return Status::Ok();
  }

  void MlaAttention(int32_t rope_id, const MlaParams& p, Tensor q, const Tensor& c,
                    const Tensor& k_rope, Tensor out) override {
    CHECK(latent_) << "MlaAttention without AllocateLatentKvPool";
    CHECK_EQ(kv_head_dim_, p.latent_dim + p.rope_dim);
    const int64_t n = plan_->num_tokens();
    CHECK(q.numel() == n * p.num_heads * (p.nope_dim + p.rope_dim) &&
          c.numel() == n * p.latent_dim && k_rope.numel() == n * p.rope_dim &&
          out.numel() == n * p.num_heads * p.v_dim)
        << "MlaAttention shapes: q " << ShapeString(q) << ", c " << ShapeString(c) << ", k_rope "
        << ShapeString(k_rope) << ", out " << ShapeString(out);
    const CpuRope& table = ropes_.at(static_cast<size_t>(rope_id));
    CHECK_EQ(table.rotary_dim, p.rope_dim);
    const cpu::LatentKv kv{reinterpret_cast<float*>(kv_[static_cast<size_t>(p.layer)]->get()),
                           static_cast<int64_t>(num_blocks_) * block_size_, block_size_};
    cpu::MlaAttention(*plan_, p, {table.cos.data(), table.sin.data(), table.max_positions}, F(q),
                      F(c), F(k_rope), kv, F(out), *pool_);
  }

  int64_t KvBlockBytes() const override {
    int64_t bytes = 0;
    for (size_t t = 0; t < kv_.size(); ++t) bytes += KvTensorBlockBytes(t);
    return bytes;
  }

  Status CopyKvBlockToHost(int32_t block_id, std::span<uint8_t> out) override {
    EMBER_RETURN_IF_ERROR(CheckKvBlockCopy(block_id, out.size()));
    size_t at = 0;
    for (size_t t = 0; t < kv_.size(); ++t) {  // layer-major, K then V
      const size_t n = static_cast<size_t>(KvTensorBlockBytes(t));
      std::memcpy(out.data() + at, kv_[t]->get() + block_id * n, n);
      at += n;
    }
    return Status::Ok();
  }

  Status CopyKvBlockFromHost(int32_t block_id, std::span<const uint8_t> in) override {
    EMBER_RETURN_IF_ERROR(CheckKvBlockCopy(block_id, in.size()));
    size_t at = 0;
    for (size_t t = 0; t < kv_.size(); ++t) {
      const size_t n = static_cast<size_t>(KvTensorBlockBytes(t));
      std::memcpy(kv_[t]->get() + block_id * n, in.data() + at, n);
      at += n;
    }
    return Status::Ok();
  }

  Result<int32_t> CreateRope(const RopeSpec& spec) override {
    EMBER_ASSIGN_OR_RETURN(RopeTable built, BuildRopeTable(spec));
    CpuRope table;
    table.head_dim = spec.head_dim;
    table.rotary_dim = spec.rotary_dim;
    table.max_positions = spec.max_positions;
    table.cos = std::move(built.cos);
    table.sin = std::move(built.sin);
    ropes_.push_back(std::move(table));
    return static_cast<int32_t>(ropes_.size() - 1);
  }

  Status BeginStep(const BatchPlan& plan) override {
    if (kv_.empty()) return Status::Error("BeginStep before AllocateKvPool");
    if (plan.block_size != block_size_)
      return Status::Error("plan block_size " + std::to_string(plan.block_size) +
                           " differs from the KV pool's " + std::to_string(block_size_));
    plan_ = &plan;
    next_buffer_ = 0;
    fed_ids_.swap(step_ids_);  // this step's fed tokens are the last step's ids
    step_ids_.clear();
    return Status::Ok();
  }

  Tensor Alloc(std::initializer_list<int64_t> shape) override {
    Tensor t;
    t.dtype = DType::kF32;
    t.ndim = static_cast<int32_t>(shape.size());
    size_t i = 0;
    for (int64_t d : shape) t.shape[i++] = d;
    const size_t count = static_cast<size_t>(t.numel());
    if (next_buffer_ == buffers_.size()) buffers_.push_back({nullptr, 0});
    auto& [buf, capacity] = buffers_[next_buffer_++];
    if (capacity < count) {
      buf = AllocFloats(count);
      capacity = count;
    }
    t.data = buf.get();
    return t;
  }

  void Embedding(const Tensor& table, float scale, Tensor out) override {
    const int64_t n = plan_->num_tokens(), d = table.cols(), vocab = table.rows();
    CHECK_EQ(out.rows(), n);
    CHECK_EQ(out.cols(), d);
    float* y = F(out);
    for (int64_t i = 0; i < n; ++i) {
      int32_t id = plan_->token_ids[static_cast<size_t>(i)];
      if (id < 0) {  // fed: the previous step's id of its logits row -1 - id
        const size_t r = static_cast<size_t>(-1 - static_cast<int64_t>(id));
        CHECK(r < fed_ids_.size()) << "fed token of row " << r << ": the last step made "
                                   << fed_ids_.size() << " ids";
        id = fed_ids_[r];
      }
      CHECK(id >= 0 && id < vocab) << "token id " << id << " outside vocab " << vocab;
      const void* row = static_cast<const uint8_t*>(table.data) +
                        static_cast<size_t>(id) * DTypeRowBytes(table.dtype, d);
      if (IsBlockQuantized(table.dtype))  // a quantized table: the row dequantized on lookup
        cpu::DequantizeQuantRow(table.dtype, row, d, y + i * d);
      else
        cpu::ConvertToF32(row, table.dtype, d, y + i * d);
      if (scale != 1.0f)
        for (int64_t j = 0; j < d; ++j) y[i * d + j] *= scale;
    }
  }

  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, RmsNormKind kind,
               Tensor out) override {
    const int64_t rows = x.rows(), d = x.cols();
    CHECK_EQ(weight.numel(), d);
    const float* in = F(x);
    const float* w = F(weight);
    float* y = F(out);
    pool_->ParallelFor(
        rows, [&](int64_t r, int) { NormRow(in + r * d, w, d, eps, kind, y + r * d); },
        ThreadsFor(rows * d));
  }

  void AddRmsNorm(Tensor residual, const Tensor& delta, const Tensor& weight, float eps,
                  RmsNormKind kind, Tensor out) override {
    const int64_t rows = residual.rows(), d = residual.cols();
    float* res = F(residual);
    const float* dl = F(delta);
    const float* w = F(weight);
    float* y = F(out);
    pool_->ParallelFor(
        rows,
        [&](int64_t r, int) {
          for (int64_t j = 0; j < d; ++j) res[r * d + j] += dl[r * d + j];
          NormRow(res + r * d, w, d, eps, kind, y + r * d);
        },
        ThreadsFor(rows * d));
  }

  void MatMul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor out) override {
    const int64_t n = x.rows(), k = x.cols(), m = weight.rows();
    CHECK_EQ(weight.cols(), k) << "MatMul " << ShapeString(x) << " x " << ShapeString(weight) << "^T";
    CHECK_EQ(out.rows(), n);
    CHECK_EQ(out.cols(), m);
    const float* b = bias != nullptr ? F(*bias) : nullptr;
    MatMulRows(F(x), n, k, weight.data, weight.dtype, m, b, F(out));
  }

  void Rope(int32_t rope_id, Tensor q, Tensor k) override {
    const CpuRope& table = ropes_.at(static_cast<size_t>(rope_id));
    const int64_t n = plan_->num_tokens();
    const int32_t hd = table.head_dim, half = table.rotary_dim / 2;
    CHECK_EQ(q.cols() % hd, 0);
    for (Tensor* t : {&q, &k}) {
      float* data = F(*t);
      const int64_t heads = t->numel() / (n * hd);
      CHECK_EQ(heads * n * hd, t->numel());
      for (int64_t i = 0; i < n; ++i) {
        const int32_t pos = plan_->positions[static_cast<size_t>(i)];
        CHECK(pos >= 0 && pos < table.max_positions) << "position " << pos << " beyond the rope table";
        const float* c = table.cos.data() + static_cast<size_t>(pos) * half;
        const float* s = table.sin.data() + static_cast<size_t>(pos) * half;
        for (int64_t h = 0; h < heads; ++h) {
          float* v = data + (i * heads + h) * hd;
          for (int32_t j = 0; j < half; ++j) {
            const float x1 = v[j], x2 = v[j + half];
            v[j] = x1 * c[j] - x2 * s[j];
            v[j + half] = x2 * c[j] + x1 * s[j];
          }
        }
      }
    }
  }

  void WriteKv(int32_t layer, const Tensor& k, const Tensor& v) override {
    CHECK(!latent_) << "WriteKv into the latent (MLA) pool";
    const int64_t n = plan_->num_tokens();
    const int32_t hd = kv_head_dim_;
    const int64_t width = static_cast<int64_t>(kv_heads_) * hd;
    CHECK_EQ(k.numel(), n * width);
    CHECK_EQ(v.numel(), n * width);
    const KvDType dtype = kv_format_.layers[static_cast<size_t>(layer)];
    const int64_t row_bytes = KvRowBytes(dtype, hd);
    const bool rotate = KvRotates(layer);
    std::vector<float> rotated(rotate ? static_cast<size_t>(hd) : 0);
    const float* src[2] = {F(k), F(v)};
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = plan_->slot_mapping[static_cast<size_t>(i)];
      CHECK(slot >= 0 && slot < static_cast<int64_t>(num_blocks_) * block_size_);
      for (int kv = 0; kv < 2; ++kv) {
        uint8_t* pool = kv_[static_cast<size_t>(2 * layer + kv)]->get();
        for (int64_t h = 0; h < kv_heads_; ++h) {
          const float* x = src[kv] + i * width + h * hd;
          if (rotate) {
            std::copy(x, x + hd, rotated.begin());
            HadamardRotate(rotated.data(), hd);
            x = rotated.data();
          }
          QuantizeKvRow(dtype, x, hd, pool + KvRowOffset(dtype, row_bytes, slot, h));
        }
      }
    }
  }

  void Attention(const AttentionParams& p, const Tensor& q, Tensor out) override;

  std::string MoeUnsupported(int32_t, int32_t, int64_t, int64_t) const override { return ""; }

  // ---- recurrent layers (cpu/gated_delta.h kernels; state slots in one host array) ----
  std::string RecurrentUnsupported() const override { return ""; }
  std::string StateSnapshotsUnsupported() const override { return ""; }
  Status AllocateStateSlots(int32_t num_slots, int64_t floats_per_slot) override {
    if (!state_.empty()) return Status::Error("the state slots are already allocated");
    if (num_slots <= 0 || floats_per_slot <= 0)
      return Status::Error("AllocateStateSlots needs positive num_slots and floats_per_slot");
    state_.assign(static_cast<size_t>(num_slots) * static_cast<size_t>(floats_per_slot), 0.0f);
    state_slots_ = num_slots;
    state_floats_ = floats_per_slot;
    return Status::Ok();
  }
  Status CopyStateSlot(int32_t src, int32_t dst) override {
    if (src < 0 || src >= state_slots_ || dst < 0 || dst >= state_slots_)
      return Status::Error("CopyStateSlot: slot " + std::to_string(src) + " -> " +
                           std::to_string(dst) + " outside the " + std::to_string(state_slots_) +
                           " allocated");
    if (src != dst) std::copy_n(SlotState(src), state_floats_, SlotState(dst));
    return Status::Ok();
  }
  Status CopyStateSlotToHost(int32_t slot, std::span<uint8_t> out) override {
    EMBER_RETURN_IF_ERROR(CheckStateSlotCopy(slot, out.size(), state_slots_, state_floats_));
    std::memcpy(out.data(), SlotState(slot), out.size());
    return Status::Ok();
  }
  Status CopyStateSlotFromHost(int32_t slot, std::span<const uint8_t> in) override {
    EMBER_RETURN_IF_ERROR(CheckStateSlotCopy(slot, in.size(), state_slots_, state_floats_));
    std::memcpy(SlotState(slot), in.data(), in.size());
    return Status::Ok();
  }
  Status CausalConv1dSilu(Tensor x, const Tensor& weight, int64_t state_offset) override;
  Status GatedDeltaRule(const GatedDeltaParams& p, const Tensor& qkv, const Tensor& ba,
                        Tensor out) override;
  Status SigmoidGateMul(Tensor x, const Tensor& gate) override {
    const int64_t rows = x.rows(), c = x.cols(), g = gate.cols();
    CHECK_EQ(gate.rows(), rows);
    CHECK_EQ(c % g, 0);
    const int64_t run = c / g;
    float* y = F(x);
    const float* gt = F(gate);
    for (int64_t i = 0; i < rows * g; ++i) {
      const float s = 1.0f / (1.0f + std::exp(-gt[i]));
      for (int64_t j = 0; j < run; ++j) y[i * run + j] *= s;
    }
    return Status::Ok();
  }
  std::string LoraUnsupported() const override { return ""; }  // step buffers are float32
  void LoraDelta(const Tensor& x, std::span<const LoraSegment> segments, Tensor out) override;
  void MoeMlp(const Tensor& x, const MoeExperts& experts, Tensor out) override;
  // gpt-oss's MXFP4 experts stay packed (4.25 bits a weight) and cpu::MatMulMxfp4 converts them
  // as it reads them, to the values their bf16 dequantization holds (the same outputs).
  bool TakesMxfp4Experts() const override { return true; }

  void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) override {
    const int64_t count = gate.numel();
    const float *g = F(gate), *u = F(up);
    float* y = F(out);
    const int64_t count8 = count - count % 8;
    pool_->ParallelFor(
        (count8 + kElementChunk - 1) / kElementChunk,
        [&](int64_t chunk, int) {
          const int64_t end = std::min(count8, (chunk + 1) * kElementChunk);
          for (int64_t i = chunk * kElementChunk; i < end; i += 8) {
            const __m256 x = _mm256_loadu_ps(g + i);
            const __m256 den =
                _mm256_add_ps(_mm256_set1_ps(1.0f), Exp8(_mm256_sub_ps(_mm256_setzero_ps(), x)));
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(x, den), _mm256_loadu_ps(u + i)));
          }
        },
        ThreadsFor(count * 8));
    for (int64_t i = count8; i < count; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }

  void GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor out) override {
    const int64_t count = gate.numel();
    const float *g = F(gate), *u = F(up);
    float* y = F(out);
    const float kAlpha = 0.7978845608028654f;  // sqrt(2 / pi)
    pool_->ParallelFor(
        (count + kElementChunk - 1) / kElementChunk,
        [&](int64_t chunk, int) {
          const int64_t end = std::min(count, (chunk + 1) * kElementChunk);
          for (int64_t i = chunk * kElementChunk; i < end; ++i) {
            const float x = g[i];
            y[i] = 0.5f * x * (1.0f + std::tanh(kAlpha * (x + 0.044715f * x * x * x))) * u[i];
          }
        },
        ThreadsFor(count * 8));
  }

  void Add(const Tensor& a, const Tensor& b, Tensor out) override {
    const int64_t count = a.numel();
    CHECK_EQ(b.numel(), count);
    const float *x = F(a), *y = F(b);
    float* z = F(out);
    for (int64_t i = 0; i < count; ++i) z[i] = x[i] + y[i];
  }

  void Softcap(Tensor x, float cap) override {
    float* v = F(x);
    const int64_t count = x.numel();
    for (int64_t i = 0; i < count; ++i) v[i] = std::tanh(v[i] / cap) * cap;
  }

  void GatherLogitsRows(const Tensor& x, Tensor out) override {
    const int64_t d = x.cols();
    CHECK_EQ(out.rows(), static_cast<int64_t>(plan_->logits_rows.size()));
    for (size_t j = 0; j < plan_->logits_rows.size(); ++j)
      std::memcpy(F(out) + static_cast<int64_t>(j) * d, F(x) + plan_->logits_rows[j] * d,
                  static_cast<size_t>(d) * 4);
  }

  Status CopyToHost(const Tensor& t, std::span<float> out) override {
    if (out.size() != static_cast<size_t>(t.numel()))
      return Status::Error("CopyToHost: output span has " + std::to_string(out.size()) +
                           " floats, tensor " + ShapeString(t));
    std::memcpy(out.data(), F(t), t.nbytes());
    return Status::Ok();
  }

  std::span<float> HostBuffer(size_t count) override {
    if (host_buffer_.size() < count) host_buffer_.resize(count);
    return {host_buffer_.data(), count};
  }

  Result<BackendMemory> MemoryInfo() const override {
    std::ifstream meminfo("/proc/meminfo");
    BackendMemory m;
    for (std::string line; std::getline(meminfo, line);) {  // "MemTotal:   24576000 kB"
      const int64_t kib = std::atoll(line.c_str() + std::min(line.find(':') + 1, line.size()));
      if (line.rfind("MemTotal:", 0) == 0) m.total_bytes = kib * 1024;
      if (line.rfind("MemAvailable:", 0) == 0) m.free_bytes = kib * 1024;
    }
    if (m.total_bytes == 0) return Status::Error("/proc/meminfo: no MemTotal line");
    return m;
  }

  Status ApplyLogitEdits(Tensor x, std::span<const LogitEdit> edits) override {
    return ApplyLogitEditsToRows({F(x), static_cast<size_t>(x.numel())}, x.cols(), edits);
  }

  Status ApplyTokenMasks(Tensor x, std::span<const RowMask> masks) override {
    return ApplyTokenMasksToRows({F(x), static_cast<size_t>(x.numel())}, x.cols(), masks);
  }

  Status SampleRows(const Tensor& x, std::span<const int32_t> rows,
                    std::span<const RowSampling> params, std::span<int32_t> ids) override {
    if (rows.size() != params.size())
      return Status::Error("SampleRows: rows and params differ in length");
    if (ids.size() != static_cast<size_t>(x.rows()))
      return Status::Error("SampleRows: " + std::to_string(ids.size()) + " ids for tensor " +
                           ShapeString(x));
    const int64_t cols = x.cols();
    for (size_t j = 0; j < rows.size(); ++j) {
      if (rows[j] < 0 || rows[j] >= x.rows())
        return Status::Error("SampleRows: row " + std::to_string(rows[j]) + " outside " +
                             ShapeString(x));
    }
    StepIds(x.rows());
    for (size_t j = 0; j < rows.size(); ++j) {
      const size_t r = static_cast<size_t>(rows[j]);
      ids[r] = ThresholdSample({F(x) + rows[j] * cols, static_cast<size_t>(cols)}, params[j]);
      step_ids_[r] = ids[r];
    }
    return Status::Ok();
  }

  Status ArgmaxRows(const Tensor& x, std::span<int32_t> ids) override {
    if (ids.size() != static_cast<size_t>(x.rows()))
      return Status::Error("ArgmaxRows: " + std::to_string(ids.size()) + " ids for tensor " +
                           ShapeString(x));
    const size_t cols = static_cast<size_t>(x.cols());
    StepIds(x.rows());
    for (int64_t r = 0; r < x.rows(); ++r) {
      ids[static_cast<size_t>(r)] = RowArgmax({F(x) + r * x.cols(), cols});
      step_ids_[static_cast<size_t>(r)] = ids[static_cast<size_t>(r)];
    }
    return Status::Ok();
  }

 private:
  // Threads worth waking for `work` (about one flop each): small ops stay on the caller.
  int ThreadsFor(int64_t work) const { return work < (1 << 18) ? 1 : num_threads_; }
  // out [n, m] = x [n, k] W^T (+ bias): Q8_0/Q4_0 weights on their int8 kernels (matmul_quant.h);
  // otherwise products of more than kFastMinRows rows (prefill: compute-bound) on matmul_'s
  // kernel; fewer rows (decode: memory-bound, where the exact kernels stream the weights faster)
  // stay exact.
  void MatMulRows(const float* x, int64_t n, int64_t k, const void* w, DType dtype, int64_t m,
                  const float* bias, float* out) {
    if (IsBlockQuantized(dtype)) return cpu::MatMulQuant(x, n, k, w, dtype, m, bias, out, *pool_);
    if (matmul_ == CpuMatmul::kBf16 && n > kFastMinRows)
      return cpu::MatMulBf16(x, n, k, w, dtype, m, bias, out, *pool_);
    if (matmul_ == CpuMatmul::kF32 && n > kFastMinRows)
      return cpu::MatMulF32Fast(x, n, k, w, dtype, m, bias, out, *pool_);
    cpu::MatMul(x, n, k, w, dtype, m, bias, out, *pool_);
  }
  static constexpr int64_t kElementChunk = 4096;  // elementwise ops: floats per work item (mult. of 8)

  static void NormRow(const float* x, const float* w, int64_t d, float eps, RmsNormKind kind,
                      float* y) {
    double sum = 0.0;
    for (int64_t j = 0; j < d; ++j) sum += static_cast<double>(x[j]) * x[j];
    const float inv = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(d)) + eps);
    if (kind == RmsNormKind::kPlain) {
      for (int64_t j = 0; j < d; ++j) y[j] = w[j] * (x[j] * inv);
    } else {
      for (int64_t j = 0; j < d; ++j) y[j] = (x[j] * inv) * (1.0f + w[j]);
    }
  }

  static constexpr int64_t kFastMinRows = 8;
  int32_t num_threads_ = 1;
  CpuMatmul matmul_ = CpuMatmul::kExact;
  bool chunked_delta_rule_ = false;
  std::vector<int32_t> decode_graph_buckets_;  // CpuBackendOptions::decode_graph_buckets
  bool takes_quantized_;  // CpuBackendOptions::takes_quantized_weights
  std::unique_ptr<cpu::ThreadPool> pool_;  // num_threads_ threads incl. the caller
  const BatchPlan* plan_ = nullptr;
  // The ids this step's ArgmaxRows / SampleRows made, by logits row (-1: none), and the last
  // step's, which this step's fed tokens name. Ids are made at once, so nothing is deferred.
  std::vector<int32_t> step_ids_, fed_ids_;
  void StepIds(int64_t rows) {
    if (step_ids_.size() < static_cast<size_t>(rows)) step_ids_.resize(static_cast<size_t>(rows), -1);
  }
  // MoeMlp's working set, reused by every call: the router logits, the rows routed to each
  // expert (row, weight), and the gathered rows and their expert's activations.
  std::vector<std::vector<std::pair<int64_t, float>>> moe_rows_;
  std::vector<int32_t> moe_ids_;
  std::vector<float> moe_logits_, moe_weights_, moe_x_, moe_gate_, moe_up_, moe_act_, moe_y_;
  std::vector<FloatBuffer> owned_;                          // 1-D weights as f32
  std::vector<std::pair<FloatBuffer, size_t>> buffers_;     // step workspace, reused per step
  size_t next_buffer_ = 0;
  std::vector<CpuRope> ropes_;
  std::vector<float> host_buffer_;  // HostBuffer
  // Bytes of one block in `layer`'s K (or V) tensor: [block_size, kv_heads] rows of its dtype.
  int64_t KvLayerBlockBytes(int32_t layer) const {
    return static_cast<int64_t>(block_size_) * kv_heads_ *
           KvRowBytes(kv_format_.layers[static_cast<size_t>(layer)], kv_head_dim_);
  }
  // Bytes of one block in the pool's tensor t (K or V of layer t / 2; the latent pool: layer t's
  // float32 [block_size, latent + rope] rows).
  int64_t KvTensorBlockBytes(size_t t) const {
    if (latent_) return static_cast<int64_t>(block_size_) * kv_head_dim_ * int64_t{sizeof(float)};
    return KvLayerBlockBytes(static_cast<int32_t>(t / 2));
  }
  // Where the row of (slot, KV head) starts in a layer's K or V buffer. float32 layers are
  // token-major ([blocks, block_size, kv_heads] rows: a token's heads side by side); the other
  // dtypes head-major within a block ([blocks, kv_heads, block_size] rows), so the rows one
  // attention item reads from a block are contiguous (streamed, not strided, when dequantized).
  int64_t KvRowOffset(KvDType dtype, int64_t row_bytes, int64_t slot, int64_t head) const {
    if (dtype == KvDType::kF32) return (slot * kv_heads_ + head) * row_bytes;
    const int64_t block = slot / block_size_, offset = slot % block_size_;
    return ((block * kv_heads_ + head) * block_size_ + offset) * row_bytes;
  }
  // Whether `layer`'s rows hold H k and H v (int4 with rotation; kv_quant.h).
  bool KvRotates(int32_t layer) const {
    return kv_format_.rotate_int4 && kv_format_.layers[static_cast<size_t>(layer)] == KvDType::kInt4;
  }
  Status CheckKvBlockCopy(int32_t block_id, size_t bytes) const {
    if (kv_.empty()) return Status::Error("KV block copy before AllocateKvPool");
    CHECK(block_id >= 0 && block_id < num_blocks_) << "KV block " << block_id << " out of range";
    CHECK_EQ(static_cast<int64_t>(bytes), KvBlockBytes());
    return Status::Ok();
  }
  // Recurrent state: state_slots_ slots of state_floats_ floats (AllocateStateSlots).
  std::vector<float> state_;
  int32_t state_slots_ = 0;
  int64_t state_floats_ = 0;
  // Threads for a recurrent op's sequences: one (plan order) when two of them share a slot
  // (padding rows share the scratch slot), else the pool.
  int ThreadsForSlots() const {
    std::vector<int32_t> slots;
    for (const SequenceSlice& s : plan_->seqs) slots.push_back(s.state_slot);
    std::sort(slots.begin(), slots.end());
    return std::adjacent_find(slots.begin(), slots.end()) != slots.end() ? 1 : num_threads_;
  }
  float* SlotState(int32_t slot) {
    CHECK(slot >= 0 && slot < state_slots_) << "state slot " << slot << " of " << state_slots_;
    return state_.data() + static_cast<size_t>(slot) * static_cast<size_t>(state_floats_);
  }
  // [2 * layer + (0: K, 1: V)] each [blocks, block_size, kv_heads] rows of the layer's dtype
  // (quantized dtypes: [blocks, kv_heads, block_size]; KvRowOffset); latent_ (MLA): [layer] each
  // [blocks, block_size, 1, latent + rope dims] of float32.
  std::vector<std::unique_ptr<KvBuffer>> kv_;
  bool latent_ = false;
  KvFormat kv_format_;  // SetKvFormat's, kAuto as kF32; all f32 when it was never called
  int32_t num_blocks_ = 0, block_size_ = 0, kv_heads_ = 0, kv_head_dim_ = 0;
};

// A recurrent op's rows of one sequence: run(first_row, rows) over all of them at once, or, when
// the sequence keeps snapshots (SequenceSlice::snapshot_slot), one row at a time with
// snapshot(slot) after each row but the last (a row's arithmetic is the same either way, so the
// snapshots and the final state are exactly the unsplit run's).
template <typename Run, typename Snapshot>
void RunRowsWithSnapshots(const SequenceSlice& s, Run run, Snapshot snapshot) {
  if (s.snapshot_slot < 0) {
    run(0, s.query_len);
    return;
  }
  for (int32_t r = 0; r < s.query_len; ++r) {
    run(r, 1);
    if (r + 1 < s.query_len) snapshot(s.snapshot_slot + r);
  }
}

Status CpuBackend::CausalConv1dSilu(Tensor x, const Tensor& weight, int64_t state_offset) {
  const int64_t channels = x.cols();
  const int32_t kernel = static_cast<int32_t>(weight.cols());
  CHECK_EQ(weight.rows(), channels);
  CHECK_EQ(x.rows(), plan_->num_tokens());
  const int64_t window = (kernel - 1) * channels;
  CHECK_LE(state_offset + window, state_floats_);
  pool_->ParallelFor(plan_->num_seqs(), [&](int64_t i, int) {
    const SequenceSlice& s = plan_->seqs[static_cast<size_t>(i)];
    float* win = SlotState(s.state_slot) + state_offset;
    if (s.context_len == s.query_len) std::fill(win, win + window, 0.0f);
    RunRowsWithSnapshots(
        s,
        [&](int32_t r, int32_t rows) {
          cpu::CausalConv1dSiluRows(F(x) + int64_t{s.query_start + r} * channels, rows, channels,
                                    F(weight), kernel, win);
        },
        [&](int32_t slot) { std::copy_n(win, window, SlotState(slot) + state_offset); });
  }, ThreadsForSlots());
  return Status::Ok();
}

Status CpuBackend::GatedDeltaRule(const GatedDeltaParams& p, const Tensor& qkv, const Tensor& ba,
                                  Tensor out) {
  const cpu::DeltaHeadShape shape{p.num_k_heads, p.num_v_heads, p.k_head_dim, p.v_head_dim};
  CHECK_EQ(qkv.cols(), shape.qkv_stride());
  CHECK_EQ(ba.cols(), 2 * p.num_v_heads);
  CHECK_EQ(out.cols(), int64_t{p.num_v_heads} * p.v_head_dim);
  const int64_t head_floats = int64_t{p.k_head_dim} * p.v_head_dim;
  CHECK_LE(p.state_offset + p.num_v_heads * head_floats, state_floats_);
  const int64_t heads = p.num_v_heads;
  pool_->ParallelFor(plan_->num_seqs() * heads, [&](int64_t item, int) {
    const SequenceSlice& s = plan_->seqs[static_cast<size_t>(item / heads)];
    const int32_t h = static_cast<int32_t>(item % heads);
    float* state = SlotState(s.state_slot) + p.state_offset + h * head_floats;
    if (s.context_len == s.query_len) std::fill(state, state + head_floats, 0.0f);
    RunRowsWithSnapshots(
        s,
        [&](int32_t r, int32_t rows) {
          const int64_t first = int64_t{s.query_start} + r;
          cpu::GatedDeltaRuleHead(shape, h, F(qkv) + first * qkv.cols(),
                                  F(ba) + first * ba.cols(), F(*p.a_log), F(*p.dt_bias), rows,
                                  state, F(out) + first * out.cols(), chunked_delta_rule_);
        },
        [&](int32_t slot) {
          std::copy_n(state, head_floats,
                      SlotState(slot) + p.state_offset + h * head_floats);
        });
  }, ThreadsForSlots());
  return Status::Ok();
}

// gpt_oss's expert activation (MoeActivation::kClampedSwiglu), element-wise.
void ClampedSwiglu(const float* gate, const float* up, int64_t n, float limit, float alpha,
                   float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::clamp(up[i], -limit, limit);
    out[i] = (u + 1.0f) * (g / (1.0f + std::exp(-alpha * g)));
  }
}

// Each expert runs over the rows routed to it as one batch (gather, gate/up, activation, down);
// its rows' results are added into out in ascending expert order. cpu::MatMul computes a row the
// same way whatever the batch, so a row's result does not depend on the other rows.
// Grouped: the segments of one adapter (the same a and b) run as one pair of products over their
// rows gathered, the updates added back row by row. The values are the default's (MatMul is
// batch-invariant, each row's update is added once), with each adapter's matrices read once.
void CpuBackend::LoraDelta(const Tensor& x, std::span<const LoraSegment> segments, Tensor out) {
  const int64_t k = x.cols(), m = out.cols();
  std::vector<uint8_t> done(segments.size(), 0);
  for (size_t i = 0; i < segments.size(); ++i) {
    if (done[i] != 0) continue;
    const LoraSegment& first = segments[i];
    std::vector<const LoraSegment*> group;
    int64_t rows = 0;
    for (size_t j = i; j < segments.size(); ++j) {
      if (done[j] != 0 || segments[j].a != first.a || segments[j].b != first.b) continue;
      CHECK(segments[j].rows > 0 && segments[j].first_row + segments[j].rows <= x.rows());
      done[j] = 1;
      group.push_back(&segments[j]);
      rows += segments[j].rows;
    }
    if (group.size() == 1) {
      Backend::LoraDelta(x, segments.subspan(i, 1), out);
      continue;
    }
    Tensor xg = Alloc({rows, k});
    int64_t at = 0;
    for (const LoraSegment* seg : group) {
      std::memcpy(F(xg) + at * k, F(x) + seg->first_row * k,
                  static_cast<size_t>(seg->rows * k) * sizeof(float));
      at += seg->rows;
    }
    Tensor low = Alloc({rows, first.a->rows()});
    MatMul(xg, *first.a, nullptr, low);
    Tensor update = Alloc({rows, m});
    MatMul(low, *first.b, nullptr, update);
    at = 0;
    for (const LoraSegment* seg : group) {
      float* y = F(out) + seg->first_row * m;
      const float* u = F(update) + at * m;
      for (int64_t e = 0; e < seg->rows * m; ++e) y[e] += u[e];
      at += seg->rows;
    }
  }
}

void CpuBackend::MoeMlp(const Tensor& x, const MoeExperts& experts, Tensor out) {
  const int64_t n = x.rows(), d = x.cols();
  const int32_t num_experts = static_cast<int32_t>(experts.gate.size());
  const int32_t k = experts.top_k;
  CHECK(num_experts > 0 && experts.up.size() == experts.gate.size() &&
        experts.down.size() == experts.gate.size());
  CHECK(experts.router.rows() == num_experts && experts.router.cols() == d)
      << "router " << ShapeString(experts.router);
  CHECK_EQ(out.rows(), n);
  CHECK_EQ(out.cols(), d);
  const int64_t inter = experts.gate[0].rows();
  const bool mxfp4 = experts.mxfp4();
  CHECK(!mxfp4 || (experts.up_scales.size() == experts.gate.size() &&
                   experts.down_scales.size() == experts.gate.size() &&
                   experts.gate_scales.size() == experts.gate.size()));
  moe_logits_.resize(static_cast<size_t>(n * num_experts));
  cpu::MatMul(F(x), n, d, experts.router.data, experts.router.dtype, num_experts,
              experts.router_bias ? F(*experts.router_bias) : nullptr, moe_logits_.data(), *pool_);
  const bool biased = experts.biased();
  CHECK(!biased || (experts.gate_bias.size() == experts.gate.size() &&
                    experts.up_bias.size() == experts.gate.size() &&
                    experts.down_bias.size() == experts.gate.size()));
  const float* logits = moe_logits_.data();
  const bool grouped = experts.routing == MoeRouting::kSigmoidGrouped;
  GroupedRouting routing;
  if (grouped) {
    CHECK(experts.score_bias && experts.score_bias->numel() == num_experts) << "score_bias";
    routing = {{F(*experts.score_bias), static_cast<size_t>(num_experts)}, experts.groups,
               experts.top_groups, experts.scale};
  }
  moe_ids_.resize(static_cast<size_t>(n * k));
  moe_weights_.resize(static_cast<size_t>(n * k));
  moe_rows_.resize(static_cast<size_t>(num_experts));
  for (auto& rows : moe_rows_) rows.clear();
  for (int64_t i = 0; i < n; ++i) {
    const size_t at = static_cast<size_t>(i * k);
    const std::span<const float> row(logits + i * num_experts, static_cast<size_t>(num_experts));
    if (grouped)
      MoeRouteGrouped(row, k, experts.normalize, routing, moe_ids_.data() + at,
                      moe_weights_.data() + at);
    else
      MoeRoute(row, k, experts.normalize, moe_ids_.data() + at, moe_weights_.data() + at);
    for (int32_t j = 0; j < k; ++j)
      moe_rows_[static_cast<size_t>(moe_ids_[at + static_cast<size_t>(j)])].emplace_back(
          i, moe_weights_[at + static_cast<size_t>(j)]);
  }
  for (auto* v : {&moe_x_, &moe_y_}) v->resize(static_cast<size_t>(n * d));
  for (auto* v : {&moe_gate_, &moe_up_, &moe_act_}) v->resize(static_cast<size_t>(n * inter));
  float* y = F(out);
  std::fill(y, y + n * d, 0.0f);
  const float* in = F(x);
  for (int32_t e = 0; e < num_experts; ++e) {
    const auto& rows = moe_rows_[static_cast<size_t>(e)];
    if (rows.empty()) continue;
    const Tensor& gate = experts.gate[static_cast<size_t>(e)];
    const Tensor& up = experts.up[static_cast<size_t>(e)];
    const Tensor& down = experts.down[static_cast<size_t>(e)];
    const int64_t per_byte = mxfp4 ? 2 : 1;  // MXFP4: two weights a byte
    CHECK(gate.rows() == inter && gate.cols() * per_byte == d && up.rows() == inter &&
          up.cols() * per_byte == d && down.rows() == d && down.cols() * per_byte == inter)
        << "expert " << e << ": gate " << ShapeString(gate) << ", up " << ShapeString(up)
        << ", down " << ShapeString(down);
    const int64_t r = static_cast<int64_t>(rows.size());
    for (int64_t j = 0; j < r; ++j)
      std::memcpy(moe_x_.data() + j * d, in + rows[static_cast<size_t>(j)].first * d,
                  static_cast<size_t>(d) * 4);
    // out [r, m] = moe rows x [r, k] times part w (+ bias), as stored: a plain or MXFP4 matrix.
    auto matmul = [&](const float* xs, int64_t k, const Tensor& w,
                      const std::vector<Tensor>& scales, int64_t m, const float* b, float* o) {
      if (!mxfp4) return MatMulRows(xs, r, k, w.data, w.dtype, m, b, o);
      const Tensor& sc = scales[static_cast<size_t>(e)];
      CHECK(w.dtype == DType::kU8 && sc.dtype == DType::kU8 && sc.rows() == m &&
            sc.cols() * 32 == k)
          << "MXFP4 expert " << e << ": " << ShapeString(w) << ", scales " << ShapeString(sc);
      cpu::MatMulMxfp4(xs, r, k,
                       {static_cast<const uint8_t*>(w.data), static_cast<const uint8_t*>(sc.data)},
                       m, b, o, *pool_);
    };
    const auto bias = [&](const std::vector<Tensor>& b) {
      return biased ? F(b[static_cast<size_t>(e)]) : nullptr;
    };
    matmul(moe_x_.data(), d, gate, experts.gate_scales, inter, bias(experts.gate_bias),
           moe_gate_.data());
    matmul(moe_x_.data(), d, up, experts.up_scales, inter, bias(experts.up_bias), moe_up_.data());
    Tensor g{moe_gate_.data(), DType::kF32, 2, {r, inter, 0, 0}};
    Tensor u{moe_up_.data(), DType::kF32, 2, {r, inter, 0, 0}};
    Tensor act{moe_act_.data(), DType::kF32, 2, {r, inter, 0, 0}};
    if (experts.activation == MoeActivation::kSilu) {
      SiluMul(g, u, act);
    } else {
      ClampedSwiglu(moe_gate_.data(), moe_up_.data(), r * inter, experts.swiglu_limit,
                    experts.swiglu_alpha, moe_act_.data());
    }
    matmul(moe_act_.data(), inter, down, experts.down_scales, d, bias(experts.down_bias),
           moe_y_.data());
    for (int64_t j = 0; j < r; ++j) {
      const auto [row, weight] = rows[static_cast<size_t>(j)];
      const float* src = moe_y_.data() + j * d;
      float* dst = y + row * d;
      for (int64_t c = 0; c < d; ++c) dst[c] += src[c] * weight;
    }
  }
}

constexpr int64_t kMaxGroup = 64;  // query heads per KV head (GQA group) the CPU attention takes

void CpuBackend::Attention(const AttentionParams& p, const Tensor& q, Tensor out) {
  const BatchPlan& plan = *plan_;
  const int64_t hd = p.head_dim;
  CHECK(!latent_) << "Attention over the latent (MLA) pool";
  CHECK_EQ(hd, kv_head_dim_);
  CHECK_EQ(p.num_kv_heads, kv_heads_);
  const int64_t group = p.num_heads / p.num_kv_heads;
  CHECK(group >= 1 && group <= kMaxGroup && group * p.num_kv_heads == p.num_heads)
      << p.num_heads << " query heads over " << p.num_kv_heads << " KV heads";
  // The layer's rows: float32 ones are read in place; other dtypes are dequantized
  // (cpu/kv_dequant.h, kv_quant.h's values) a key block of one KV head at a time into per-thread scratch that every head of the group
  // then reads from L1 (no separate pass over the cache, no float copy of it).
  const KvDType dtype = kv_format_.layers[static_cast<size_t>(p.layer)];
  const bool rotated = KvRotates(p.layer);
  const int64_t row_bytes = KvRowBytes(dtype, static_cast<int32_t>(hd));
  const uint8_t* kc = kv_[static_cast<size_t>(2 * p.layer)]->get();
  const uint8_t* vc = kv_[static_cast<size_t>(2 * p.layer + 1)]->get();
  const float* qd = F(q);
  float* od = F(out);
  const float* sinks = p.sinks == nullptr ? nullptr : F(*p.sinks);
  if (sinks != nullptr) CHECK_EQ(p.sinks->numel(), p.num_heads);
  // Work items: (sequence row, KV head), each the `group` query heads that share that KV head.
  // Keys are taken in blocks of kKeyBlock, and every head of the group goes through a block
  // before the next one, so a block's K (then V) rows are located (block table) and read from
  // memory once, then from L1 by the other heads, not `group` times as one item per query head
  // would (faster long-context decode, docs/perf.md). Per (row, head) the arithmetic is unchanged: the same Dot4 groups of
  // 4 keys from `first`, Dot for the tail, scores in key order, V accumulated in key order,
  // whatever the other rows of the step, so attention stays batch-invariant (and its bits are
  // those of the per-head version).
  constexpr int64_t kKeyBlock = 64;  // a multiple of Dot4's 4 keys
  std::vector<int32_t> row_seq(static_cast<size_t>(plan.num_tokens()));
  for (int32_t s = 0; s < plan.num_seqs(); ++s)
    for (int32_t i = 0; i < plan.seqs[s].query_len; ++i) row_seq[plan.seqs[s].query_start + i] = s;
  const int64_t items = static_cast<int64_t>(plan.num_tokens()) * p.num_kv_heads;
  int64_t max_ctx = 1;
  for (const SequenceSlice& s : plan.seqs) max_ctx = std::max<int64_t>(max_ctx, s.context_len);
  // Per-thread scratch: scores [group][max_ctx], acc [group][hd], then (rotated rows) the
  // rotated queries [group][hd] and (a dtype other than f32) a dequantized key block [kKeyBlock][hd].
  std::vector<std::vector<float>> scratch(static_cast<size_t>(pool_->num_threads()));
  const int64_t scratch_floats = group * (max_ctx + hd) + (rotated ? group * hd : 0) +
                                 (dtype != KvDType::kF32 ? kKeyBlock * hd : 0);
  pool_->ParallelFor(
      items,
      [&](int64_t item, int thread_idx) {
        std::vector<float>& buffer = scratch[static_cast<size_t>(thread_idx)];
        if (buffer.empty()) buffer.resize(static_cast<size_t>(scratch_floats));
        const int64_t row = item / p.num_kv_heads, kvh = item % p.num_kv_heads;
        const SequenceSlice& s = plan.seqs[row_seq[static_cast<size_t>(row)]];
        const int32_t* blocks = plan.block_tables.data() + s.block_table_start;
        const int64_t pos = plan.positions[static_cast<size_t>(row)];
        const int64_t first = p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
        const int64_t len = pos + 1 - first;
        auto scores = [&](int64_t g) { return buffer.data() + g * max_ctx; };  // [len]
        auto accum = [&](int64_t g) { return buffer.data() + group * max_ctx + g * hd; };
        float* const extra = buffer.data() + group * (max_ctx + hd);
        float* const rotated_q = extra;                            // [group][hd] when rotated
        float* const tile = extra + (rotated ? group * hd : 0);    // [kKeyBlock][hd]
        auto query = [&](int64_t g) -> const float* {
          const float* q0 = qd + (row * p.num_heads + kvh * group + g) * hd;
          return rotated ? rotated_q + g * hd : q0;
        };
        if (rotated) {  // (H q) . (H k) = q . k
          for (int64_t g = 0; g < group; ++g) {
            std::memcpy(rotated_q + g * hd, qd + (row * p.num_heads + kvh * group + g) * hd,
                        static_cast<size_t>(hd) * 4);
            HadamardRotate(rotated_q + g * hd, static_cast<int32_t>(hd));
          }
        }
        auto slot = [&](int64_t t) {
          return static_cast<int64_t>(blocks[t / block_size_]) * block_size_ + t % block_size_;
        };
        // The block's K (or V) rows of this KV head, located once for all heads of the group
        // (the block-table lookup divides by the block size).
        const float* rows[kKeyBlock];
        auto locate = [&](const uint8_t* pool, int64_t b0, int64_t b1) {
          for (int64_t t = b0; t < b1; ++t) {
            const uint8_t* at = pool + KvRowOffset(dtype, row_bytes, slot(t), kvh);
            if (dtype == KvDType::kF32) {
              rows[t - b0] = reinterpret_cast<const float*>(at);
            } else {
              float* dst = tile + (t - b0) * hd;
              cpu::DequantizeKvRowFast(dtype, at, static_cast<int32_t>(hd), dst);
              rows[t - b0] = dst;
            }
          }
        };
        // q . k before scaling.
        for (int64_t b0 = first; b0 <= pos; b0 += kKeyBlock) {
          const int64_t b1 = std::min(pos + 1, b0 + kKeyBlock);
          locate(kc, b0, b1);
          for (int64_t g = 0; g < group; ++g) {
            const float* qv = query(g);
            float* raw = scores(g) + (b0 - first);  // [t - b0]
            int64_t i = 0, n = b1 - b0;
            if (hd % 8 == 0)
              for (; i + 4 <= n; i += 4)
                Dot4(qv, rows[i], rows[i + 1], rows[i + 2], rows[i + 3], hd, raw + i);
            for (; i < n; ++i) raw[i] = Dot(qv, rows[i], hd);
          }
        }
        // Softmax weights per head, unnormalised; inv[g] = 1 / their sum.
        float inv[kMaxGroup];
        for (int64_t g = 0; g < group; ++g) {
          float* sc = scores(g);
          float max_score = -INFINITY;
          for (int64_t i = 0; i < len; ++i) {
            float x = sc[i] * p.scale;
            if (p.softcap > 0.0f) x = std::tanh(x / p.softcap) * p.softcap;
            sc[i] = x;
            max_score = std::max(max_score, x);
          }
          // A sink (gpt_oss) joins the max and the denominator, never the values.
          const float sink = sinks == nullptr ? -INFINITY : sinks[kvh * group + g];
          max_score = std::max(max_score, sink);
          float sum = 0.0f;
          for (int64_t i = 0; i < len; ++i) {
            const float e = std::exp(sc[i] - max_score);
            sc[i] = e;
            sum += e;
          }
          if (sinks != nullptr) sum += std::exp(sink - max_score);
          inv[g] = 1.0f / sum;
          std::fill(accum(g), accum(g) + hd, 0.0f);
        }
        // acc += w_t * v_t in key order.
        for (int64_t b0 = first; b0 <= pos; b0 += kKeyBlock) {
          const int64_t b1 = std::min(pos + 1, b0 + kKeyBlock), n = b1 - b0;
          locate(vc, b0, b1);
          for (int64_t g = 0; g < group; ++g) {
            const float* w = scores(g) + (b0 - first);  // [t - b0]
            float* acc = accum(g);
            if (hd == 64) {  // the common head size: the accumulator lives in 8 registers
              __m256 a[8];
              for (int j = 0; j < 8; ++j) a[j] = _mm256_loadu_ps(acc + 8 * j);
              for (int64_t i = 0; i < n; ++i) {
                const __m256 pv = _mm256_set1_ps(w[i] * inv[g]);
                for (int j = 0; j < 8; ++j)
                  a[j] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(rows[i] + 8 * j), a[j]);
              }
              for (int j = 0; j < 8; ++j) _mm256_storeu_ps(acc + 8 * j, a[j]);
            } else {
              for (int64_t i = 0; i < n; ++i) Axpy(w[i] * inv[g], rows[i], acc, hd);
            }
          }
        }
        for (int64_t g = 0; g < group; ++g) {
          // Rotated values: sum w_t H v_t = H (sum w_t v_t), and H undoes H.
          if (rotated) HadamardRotate(accum(g), static_cast<int32_t>(hd));
          std::memcpy(od + (row * p.num_heads + kvh * group + g) * hd, accum(g),
                      static_cast<size_t>(hd) * 4);
        }
      },
      ThreadsFor(items * group * max_ctx * hd));
}

}  // namespace

const char* CpuMatmulName(CpuMatmul matmul) {
  switch (matmul) {
    case CpuMatmul::kExact: return "exact";
    case CpuMatmul::kF32: return "f32";
    case CpuMatmul::kBf16: return "bf16";
  }
  return "?";
}

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace ember
