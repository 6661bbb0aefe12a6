// LoRA adapters (lora_adapter.h, lora_set.h) on the CPU backend: PEFT configs and tensors that
// Ember does not take are refused by key or tensor name; the four fixture adapters match
// transformers with the adapter merged into float32 weights (logits within relative L2 1e-4,
// greedy tokens exact), on the CPU and, where a GPU exists, on CUDA (f32 mode the same; bf16 mode
// 3e-2 and greedy exact where the choice is clear of the bf16 error); a batch mixing base and
// adapter rows equals each row's solo run bitwise (CUDA: in the batch-invariant mode);
// the slot pool reuses, evicts the least recently used idle adapter and never a held one.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "backend/cpu/matmul.h"  // ConvertToF32
#include "backend/cuda_loader.h"  // CudaDevicesAvailable
#include "model/lora_adapter.h"
#include "model/lora_set.h"
#include "model/mtp_testing.h"
#include "model/safetensors.h"
#include "util/mapped_file.h"
#include "util/testing.h"

namespace ember {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr int32_t kBlockSize = 16;
constexpr int32_t kNumBlocks = 64;

std::string Fixtures() { return ember::testing::FixturesDir(); }
std::string AdapterDir(const std::string& name) { return Fixtures() + "/adapters/" + name; }

const char* kGoodConfig = R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
  "target_modules": ["q_proj", "v_proj"], "bias": "none", "use_rslora": false,
  "modules_to_save": null, "fan_in_fan_out": false})";

Status ParseWith(const std::string& key, const json& value) {
  json j = json::parse(kGoodConfig);
  j[key] = value;
  return ParseLoraConfig(j.dump(), "adapter_config.json", 64).status();
}

void ExpectRefused(const Status& st, const std::string& needle) {
  ASSERT_FALSE(st.ok()) << needle;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(LoraConfig, ParsesScaleAndRefusesUnsupportedOptionsByKey) {
  auto c = ParseLoraConfig(kGoodConfig, "cfg", 64);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->rank, 4);
  EXPECT_DOUBLE_EQ(c->scale(), 2.0);
  json rs = json::parse(kGoodConfig);
  rs["use_rslora"] = true;
  EXPECT_DOUBLE_EQ(ParseLoraConfig(rs.dump(), "cfg", 64)->scale(), 4.0);
  ExpectRefused(ParseWith("use_dora", true), "\"use_dora\"");
  ExpectRefused(ParseWith("modules_to_save", json::array({"lm_head"})), "\"modules_to_save\"");
  ExpectRefused(ParseWith("bias", "all"), "\"bias\"");
  ExpectRefused(ParseWith("layers_to_transform", json::array({0})), "\"layers_to_transform\"");
  ExpectRefused(ParseWith("rank_pattern", json{{"q_proj", 8}}), "\"rank_pattern\"");
  ExpectRefused(ParseWith("fan_in_fan_out", true), "\"fan_in_fan_out\"");
  ExpectRefused(ParseWith("target_parameters", json::array({"experts.gate_up_proj"})),
                "\"target_parameters\"");
  ExpectRefused(ParseWith("target_modules", json::array({"q_proj", "embed_tokens"})),
                "embed_tokens");
  ExpectRefused(ParseWith("target_modules", "all-linear"), "\"target_modules\"");
  ExpectRefused(ParseWith("peft_type", "IA3"), "\"peft_type\"");
  ExpectRefused(ParseWith("r", 300), "\"r\"");
  ExpectRefused(ParseWith("r", 128), "--max-lora-rank");  // above this test's max rank 64
  ExpectRefused(ParseWith("lora_alpha", "x"), "\"lora_alpha\"");
  // Off or empty values of refused keys are fine.
  EXPECT_TRUE(ParseWith("use_dora", false).ok());
  EXPECT_TRUE(ParseWith("modules_to_save", json::array()).ok());
}

using testing::NamedF32;
using testing::WriteF32Safetensors;

// A copy of a fixture adapter in a temp folder, with edits to its config and tensors.
struct TempAdapter {
  std::string dir;
  TempAdapter(const std::string& from, const std::string& name) {
    dir = (fs::temp_directory_path() / ("ember_lora_test_" + name + "_" +
                                        std::to_string(::getpid())))
              .string();
    fs::remove_all(dir);
    fs::create_directories(dir);
    if (!from.empty()) {
      fs::copy_file(from + "/adapter_config.json", dir + "/adapter_config.json");
      fs::copy_file(from + "/adapter_model.safetensors", dir + "/adapter_model.safetensors");
    }
  }
  ~TempAdapter() { fs::remove_all(dir); }
  void EditConfig(const std::string& key, const json& value) {
    json j = json::parse(*ReadFileToString(dir + "/adapter_config.json"));
    j[key] = value;
    std::ofstream(dir + "/adapter_config.json") << j.dump();
  }
  // Writes adapter_model.safetensors with F32 tensors of these shapes (zeros).
  void WriteTensors(const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
    std::vector<NamedF32> named;
    for (const auto& [name, shape] : tensors) named.push_back({name, shape, {}});
    WriteF32Safetensors(dir + "/adapter_model.safetensors", named);
  }
};

ModelConfig LoadConfig(const std::string& model) {
  const std::string path = Fixtures() + "/models/" + model + "/config.json";
  auto c = ParseModelConfig(*ReadFileToString(path), path);
  CHECK(c.ok()) << c.message();
  return *c;
}

TEST(LoraAdapter, RefusesTensorsThatDoNotFitTheModelByName) {
  EMBER_REQUIRE_DIR(AdapterDir("llama3-a"));
  const ModelConfig c = LoadConfig("llama3");
  auto good = LoadLoraAdapter(AdapterDir("llama3-a"), c, 64);
  ASSERT_TRUE(good.ok()) << good.message();
  EXPECT_EQ(good->layers.size(), static_cast<size_t>(c.num_layers));
  EXPECT_FALSE(good->layers[0][static_cast<size_t>(LoraTarget::kDown)].empty());
  EXPECT_NE(good->digest, 0u);
  // The same adapter for a model of other shapes: refused naming the tensor.
  const ModelConfig q = LoadConfig("qwen3");
  if (q.hidden_size != c.hidden_size || q.intermediate_size != c.intermediate_size ||
      q.num_heads * q.head_dim != c.num_heads * c.head_dim) {
    ExpectRefused(LoadLoraAdapter(AdapterDir("llama3-a"), q, 64).status(), "tensor \"");
  }
  TempAdapter t("", "shapes");
  std::ofstream(t.dir + "/adapter_config.json") << kGoodConfig;
  const std::string p = "base_model.model.model.layers.0.self_attn.";
  const int64_t h = c.hidden_size;
  t.WriteTensors({{p + "q_proj.lora_A.weight", {4, h + 1}}, {p + "q_proj.lora_B.weight", {8, 4}}});
  ExpectRefused(LoadLoraAdapter(t.dir, c, 64).status(), "q_proj.lora_A.weight");
  t.WriteTensors({{"base_model.model.model.embed_tokens.lora_embedding_A", {4, 8}}});
  ExpectRefused(LoadLoraAdapter(t.dir, c, 64).status(), "embed_tokens");
  t.WriteTensors({{p + "k_proj.lora_A.weight", {4, h}}, {p + "k_proj.lora_B.weight", {8, 4}}});
  ExpectRefused(LoadLoraAdapter(t.dir, c, 64).status(), "not in target_modules");
  t.WriteTensors({{"base_model.model.model.layers.99.self_attn.q_proj.lora_A.weight", {4, h}}});
  ExpectRefused(LoadLoraAdapter(t.dir, c, 64).status(), "layers.99");
  t.WriteTensors({{p + "q_proj.lora_B.weight", {8, 4}}});
  ExpectRefused(LoadLoraAdapter(t.dir, c, 64).status(), "has no lora_A");
}

// Where a test runs: the CPU (the default), or a CUDA backend mode.
struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  bool f32 = true;         // CUDA: f32 compute mode (else bf16)
  bool invariant = false;  // CUDA bf16: the batch-invariant GEMM
};
constexpr Device kCudaF32{DeviceKind::kCuda, true, false};
constexpr Device kCudaBf16{DeviceKind::kCuda, false, false};
constexpr Device kCudaInvariant{DeviceKind::kCuda, false, true};

ModelLoadOptions OptionsFor(Device device) {
  ModelLoadOptions opts;
  opts.device = device.kind;
  opts.cuda_f32_compute = device.f32;
  opts.cuda_batch_invariant = device.invariant;
  return opts;
}

std::unique_ptr<Model> LoadWithLora(const std::string& model, int32_t max_loras,
                                    Device device = {}) {
  auto m = Model::Load(Fixtures() + "/models/" + model, OptionsFor(device));
  CHECK(m.ok()) << m.message();
  CHECK((*m)->AllocateKvCache(kNumBlocks, kBlockSize).ok());
  Status st = (*m)->EnableLora(max_loras, 64);
  CHECK(st.ok()) << st.message();
  return std::move(m).value();
}

int32_t AcquireOrDie(Model& model, const std::string& dir) {
  auto adapter = LoadLoraAdapter(dir, model.config(), 64);
  CHECK(adapter.ok()) << adapter.message();
  auto slot = model.lora()->Acquire(adapter->digest, dir);
  CHECK(slot.ok() && slot->has_value()) << slot.message();
  return **slot;
}

std::vector<int32_t> Blocks(int32_t first, int32_t count) {
  std::vector<int32_t> b;
  for (int32_t i = 0; i < count; ++i) b.push_back(first + i);
  return b;
}

double RelativeL2(const float* a, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

int32_t Argmax(const float* v, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

// The adapter's goldens: every position's logits within `tolerance` relative L2 (float32: 1e-4;
// CUDA bf16: 3e-2, as model_test's bf16 parity), and the greedy continuation exact. In bf16 a
// step may differ only where the golden's choice is not clear of the bf16 error (model_test's
// CheckBf16Parity rule: our top-1/top-2 margin and the golden's smallest margin both below twice
// the largest absolute logit error of the prefills); float32 admits no difference.
void RunAdapterParity(const std::string& model_name, const std::string& adapter,
                      Device device = {}) {
  const std::string dir = AdapterDir(adapter);
  EMBER_REQUIRE_DIR(dir);
  const bool bf16 = device.kind == DeviceKind::kCuda && !device.f32;
  auto model = LoadWithLora(model_name, 2, device);
  const int32_t slot = AcquireOrDie(*model, dir);
  const int32_t vocab = model->config().vocab_size;
  const json golden = json::parse(*ReadFileToString(dir + "/golden.json"));
  auto logits_store = WeightStore::OpenFile(dir + "/golden_logits.safetensors");
  ASSERT_TRUE(logits_store.ok()) << logits_store.message();
  double max_abs = 0;  // the largest absolute logit error of the prefills so far
  for (auto& [name, ids] : golden["sequences"].items()) {
    const std::vector<int32_t> tokens = ids.get<std::vector<int32_t>>();
    BatchPlan plan;
    plan.block_size = kBlockSize;
    plan.AddSequence(tokens, 0, Blocks(0, kNumBlocks), false);
    plan.seqs.back().lora_slot = slot;
    for (int32_t i = 0; i < plan.num_tokens(); ++i) plan.logits_rows.push_back(i);
    std::vector<float> logits(tokens.size() * static_cast<size_t>(vocab));
    ASSERT_TRUE(model->Forward(plan, logits).ok());
    auto ref = (*logits_store)->Get("logits." + name);
    ASSERT_TRUE(ref.ok()) << ref.message();
    ASSERT_EQ(ref->nbytes / 4, logits.size());
    double worst = 0;
    const float* want_logits = static_cast<const float*>(ref->data);
    for (size_t r = 0; r < tokens.size(); ++r)
      worst = std::max(worst, RelativeL2(logits.data() + r * vocab, want_logits + r * vocab, vocab));
    EXPECT_LT(worst, bf16 ? 3e-2 : 1e-4) << adapter << "/" << name;
    for (size_t i = 0; i < logits.size(); ++i)
      max_abs = std::max(max_abs, std::abs(static_cast<double>(logits[i]) - want_logits[i]));
    // Greedy continuation, one decode step at a time.
    const std::vector<int32_t> want = golden["greedy"][name].get<std::vector<int32_t>>();
    std::vector<int32_t> got, step = tokens;
    int32_t pos = 0;
    std::vector<float> row(static_cast<size_t>(vocab));
    while (got.size() < want.size()) {
      BatchPlan p;
      p.block_size = kBlockSize;
      p.AddSequence(step, pos, Blocks(0, kNumBlocks), true);
      p.seqs.back().lora_slot = slot;
      ASSERT_TRUE(model->Forward(p, row).ok());
      pos += static_cast<int32_t>(step.size());
      got.push_back(Argmax(row.data(), vocab));
      step = {got.back()};
      const size_t i = got.size() - 1;
      if (bf16 && got[i] != want[i]) {
        const double bound = 2 * max_abs;
        float second = -INFINITY;
        for (int32_t j = 0; j < vocab; ++j)
          if (j != got[i]) second = std::max(second, row[static_cast<size_t>(j)]);
        EXPECT_LT(golden["min_greedy_margin"][name].get<double>(), bound)
            << adapter << "/" << name << ": the golden's choices are clear of the bf16 error ("
            << bound << ") but step " << i << " differs";
        EXPECT_LT(row[static_cast<size_t>(got[i])] - second, bound)
            << adapter << "/" << name << " step " << i << ": a clear margin";
        got = want;  // from here the continuations legitimately diverge
        break;
      }
    }
    EXPECT_EQ(got, want) << adapter << "/" << name;
  }
}

TEST(LoraParity, Llama3A) { RunAdapterParity("llama3", "llama3-a"); }
TEST(LoraParity, Llama3B) { RunAdapterParity("llama3", "llama3-b"); }
TEST(LoraParity, Qwen3A) { RunAdapterParity("qwen3", "qwen3-a"); }
TEST(LoraParity, Qwen3B) { RunAdapterParity("qwen3", "qwen3-b"); }

// The same goldens on the CUDA backend, in its f32 and bf16 modes, where a GPU exists.
#define EMBER_REQUIRE_CUDA() \
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)"
TEST(CudaLoraParity, Llama3A) {
  EMBER_REQUIRE_CUDA();
  RunAdapterParity("llama3", "llama3-a", kCudaF32);
  RunAdapterParity("llama3", "llama3-a", kCudaBf16);
}
TEST(CudaLoraParity, Llama3B) {
  EMBER_REQUIRE_CUDA();
  RunAdapterParity("llama3", "llama3-b", kCudaF32);
  RunAdapterParity("llama3", "llama3-b", kCudaBf16);
}
TEST(CudaLoraParity, Qwen3A) {
  EMBER_REQUIRE_CUDA();
  RunAdapterParity("qwen3", "qwen3-a", kCudaF32);
  RunAdapterParity("qwen3", "qwen3-a", kCudaBf16);
}
TEST(CudaLoraParity, Qwen3B) {
  EMBER_REQUIRE_CUDA();
  RunAdapterParity("qwen3", "qwen3-b", kCudaF32);
  RunAdapterParity("qwen3", "qwen3-b", kCudaBf16);
}

// Prefills `tokens` under `slot` (-1: base) alone; the last row's logits.
std::vector<float> SoloLastLogits(Model& model, const std::vector<int32_t>& tokens, int32_t slot) {
  BatchPlan plan;
  plan.block_size = kBlockSize;
  plan.AddSequence(tokens, 0, Blocks(0, 8), true);
  plan.seqs.back().lora_slot = slot;
  std::vector<float> logits(static_cast<size_t>(model.config().vocab_size));
  CHECK(model.Forward(plan, logits).ok());
  return logits;
}

void CheckMixedBatch(Device device) {
  EMBER_REQUIRE_DIR(AdapterDir("llama3-b"));
  auto model = LoadWithLora("llama3", 2, device);
  const int32_t a = AcquireOrDie(*model, AdapterDir("llama3-a"));
  const int32_t b = AcquireOrDie(*model, AdapterDir("llama3-b"));
  const std::vector<int32_t> prompt = {1, 17, 300, 42, 42, 8, 511, 99};
  const int32_t slots[] = {a, -1, b, a, b};
  BatchPlan plan;
  plan.block_size = kBlockSize;
  for (int32_t i = 0; i < 5; ++i) {
    plan.AddSequence(prompt, 0, Blocks(8 + 8 * i, 8), true);
    plan.seqs.back().lora_slot = slots[i];
  }
  const size_t vocab = static_cast<size_t>(model->config().vocab_size);
  std::vector<float> batched(5 * vocab);
  ASSERT_TRUE(model->Forward(plan, batched).ok());
  for (int32_t i = 0; i < 5; ++i) {
    const std::vector<float> solo = SoloLastLogits(*model, prompt, slots[i]);
    EXPECT_EQ(0, std::memcmp(solo.data(), batched.data() + i * vocab, vocab * 4)) << "row " << i;
  }
  // The adapters change the logits (the test can fail).
  EXPECT_NE(SoloLastLogits(*model, prompt, -1), SoloLastLogits(*model, prompt, a));
  EXPECT_NE(SoloLastLogits(*model, prompt, a), SoloLastLogits(*model, prompt, b));
}

TEST(LoraBatch, MixedBaseAndAdapterRowsEqualTheirSoloRuns) { CheckMixedBatch({}); }

// On CUDA in the batch-invariant bf16 mode (--batch-invariant on): the same bitwise equality.
TEST(CudaLoraBatch, MixedBaseAndAdapterRowsEqualTheirSoloRuns) {
  EMBER_REQUIRE_CUDA();
  CheckMixedBatch(kCudaInvariant);
}

TEST(LoraSetPool, ReusesEvictsLeastRecentlyUsedIdleAndNeverAHeldSlot) {
  EMBER_REQUIRE_DIR(AdapterDir("llama3-b"));
  auto model = LoadWithLora("llama3", 2);
  LoraSet& pool = *model->lora();
  TempAdapter c(AdapterDir("llama3-a"), "pool_c");
  c.EditConfig("lora_alpha", 4);  // another adapter (another digest)
  const ModelConfig& cfg = model->config();
  const uint64_t da = LoadLoraAdapter(AdapterDir("llama3-a"), cfg, 64)->digest;
  const uint64_t db = LoadLoraAdapter(AdapterDir("llama3-b"), cfg, 64)->digest;
  const uint64_t dc = LoadLoraAdapter(c.dir, cfg, 64)->digest;
  ASSERT_NE(da, dc);
  const int32_t a = **pool.Acquire(da, AdapterDir("llama3-a"));
  const int32_t b = **pool.Acquire(db, AdapterDir("llama3-b"));
  EXPECT_EQ(**pool.Acquire(da, AdapterDir("llama3-a")), a);  // resident: reused
  EXPECT_EQ(pool.loads(), 2);
  auto full = pool.Acquire(dc, c.dir);
  ASSERT_TRUE(full.ok());
  EXPECT_FALSE(full->has_value());  // both slots held
  pool.Release(b);                  // b idle; a still held twice
  pool.Release(a);
  auto got = pool.Acquire(dc, c.dir);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, b);  // b was the only idle slot: evicted
  EXPECT_EQ(pool.evictions(), 1);
  EXPECT_EQ(pool.SlotDigest(a), da);
  pool.Release(a);
  pool.Release(**got);
  // Both idle now: a was released before c, so a is the least recently used.
  EXPECT_EQ(**pool.Acquire(db, AdapterDir("llama3-b")), a);
  // A digest that no longer matches the folder is refused.
  auto stale = pool.Acquire(da ^ 1, AdapterDir("llama3-a"));
  ExpectRefused(stale.status(), "changed since it was registered");
}

// Prepared reads a non-resident adapter's files on a thread of its own: false until that read
// is done, then Acquire loads from it (prepared_loads) into a slot that gives the same logits as
// a synchronous load; a resident adapter is prepared at once; a read that fails is "prepared"
// and Acquire reports its error.
TEST(LoraSetPool, PreparedReadsTheFilesOffTheCallersThread) {
  EMBER_REQUIRE_DIR(AdapterDir("llama3-a"));
  auto model = LoadWithLora("llama3", 2);
  LoraSet& pool = *model->lora();
  const uint64_t da = LoadLoraAdapter(AdapterDir("llama3-a"), model->config(), 64)->digest;
  auto wait_prepared = [&](uint64_t digest, const std::string& dir) {
    for (int i = 0; i < 2000 && !pool.Prepared(digest, dir); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return pool.Prepared(digest, dir);
  };
  EXPECT_FALSE(pool.Prepared(da, AdapterDir("llama3-a")));  // the read starts
  ASSERT_TRUE(wait_prepared(da, AdapterDir("llama3-a")));
  EXPECT_EQ(pool.loads(), 0);
  const int32_t a = **pool.Acquire(da, AdapterDir("llama3-a"));
  EXPECT_EQ(pool.loads(), 1);
  EXPECT_EQ(pool.prepared_loads(), 1);
  EXPECT_TRUE(pool.Prepared(da, AdapterDir("llama3-a")));  // resident
  pool.Release(a);
  // A folder whose digest no longer matches: prepared (the read ended), refused by Acquire.
  ASSERT_TRUE(wait_prepared(da ^ 1, AdapterDir("llama3-a")));
  ExpectRefused(pool.Acquire(da ^ 1, AdapterDir("llama3-a")).status(),
                "changed since it was registered");
  // A folder that does not load at all.
  TempAdapter gone("", "prepared_gone");
  ASSERT_TRUE(wait_prepared(42, gone.dir));
  EXPECT_FALSE(pool.Acquire(42, gone.dir).ok());
}

// Prefetch starts reads for queued requests up to 2 x max_loras held reads, once per adapter,
// none for a resident one; the read it started is the one Prepared and Acquire then use.
TEST(LoraSetPool, PrefetchStartsReadsWithinTheBound) {
  EMBER_REQUIRE_DIR(AdapterDir("llama3-a"));
  auto model = LoadWithLora("llama3", 2);  // 2 slots: at most 4 reads held
  LoraSet& pool = *model->lora();
  const uint64_t da = LoadLoraAdapter(AdapterDir("llama3-a"), model->config(), 64)->digest;
  pool.Prefetch(da, AdapterDir("llama3-a"));
  pool.Prefetch(da, AdapterDir("llama3-a"));  // held already
  EXPECT_EQ(pool.reads_held(), 1);
  TempAdapter gone("", "prefetch_gone");  // folders that do not load: reads that end at once
  for (uint64_t d = 1; d <= 5; ++d) pool.Prefetch(d, gone.dir);
  EXPECT_EQ(pool.reads_held(), 4);  // 3 of the 5 fit
  for (int i = 0; i < 2000 && !pool.Prepared(da, AdapterDir("llama3-a")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(pool.Prepared(da, AdapterDir("llama3-a")));
  EXPECT_EQ(pool.reads_held(), 4);  // Prepared found the prefetched read: none started
  const int32_t a = **pool.Acquire(da, AdapterDir("llama3-a"));
  EXPECT_EQ(pool.prepared_loads(), 1);
  EXPECT_EQ(pool.reads_held(), 3);
  pool.Prefetch(da, AdapterDir("llama3-a"));  // resident: nothing to read
  EXPECT_EQ(pool.reads_held(), 3);
  pool.Release(a);
}

TEST(LoraAdapter, RefusesExpertModulesAndFamiliesWithoutLora) {
  EMBER_REQUIRE_DIR(Fixtures() + "/models/qwen3_moe");
  TempAdapter t("", "families");
  json config = json::parse(kGoodConfig);
  config["target_modules"] = {"gate_proj"};
  std::ofstream(t.dir + "/adapter_config.json") << config.dump();
  const ModelConfig moe = LoadConfig("qwen3_moe");
  t.WriteTensors({{"base_model.model.model.layers.0.mlp.experts.0.gate_proj.lora_A.weight",
                   {4, moe.hidden_size}}});
  ExpectRefused(LoadLoraAdapter(t.dir, moe, 64).status(), "mixture-of-experts");
  EMBER_REQUIRE_DIR(Fixtures() + "/models/qwen3_next");
  ExpectRefused(LoadLoraAdapter(t.dir, LoadConfig("qwen3_next"), 64).status(), "qwen3_next");
  ModelLoadOptions opts;
  auto next = Model::Load(Fixtures() + "/models/qwen3_next", opts);
  ASSERT_TRUE(next.ok()) << next.message();
  ExpectRefused((*next)->EnableLora(2, 64), "qwen3_next");
}

// An adapter of random rank-4 matrices on `modules` (name -> (out, in)) of every layer of fixture
// `model`, against the model with W + 2 B A merged into float32 weights, built here from the
// fixture, both on `device`: the last prompt row's logits within relative L2 1e-5 (CPU) or 1e-4
// (CUDA f32), and the adapter moves them.
void CheckMergedWeightsParity(const std::string& model,
                              const std::map<std::string, std::pair<int64_t, int64_t>>& modules,
                              Device device = {}) {
  const std::string base = Fixtures() + "/models/" + model;
  EMBER_REQUIRE_DIR(base);
  const ModelConfig c = LoadConfig(model);
  const int64_t r = 4;
  TempAdapter adapter("", model);
  json config = json::parse(kGoodConfig);
  config["target_modules"] = json::array();
  for (const auto& [m, dims] : modules)
    config["target_modules"].push_back(m.substr(m.find('.') + 1));
  config["lora_alpha"] = 8;  // scale 2
  std::ofstream(adapter.dir + "/adapter_config.json") << config.dump();
  uint32_t seed = 1;
  auto rnd = [&seed] {
    seed = seed * 1664525u + 1013904223u;
    return (static_cast<float>(seed >> 8) / 16777216.0f - 0.5f) * 0.2f;
  };
  std::vector<NamedF32> lora;
  std::map<std::string, std::pair<std::vector<float>, std::vector<float>>> ab;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    for (const auto& [m, dims] : modules) {
      const std::string name = "model.layers." + std::to_string(l) + "." + m;
      std::vector<float> a(static_cast<size_t>(r * dims.second)), b(static_cast<size_t>(dims.first * r));
      for (float& v : a) v = rnd();
      for (float& v : b) v = rnd();
      lora.push_back({"base_model.model." + name + ".lora_A.weight", {r, dims.second}, a});
      lora.push_back({"base_model.model." + name + ".lora_B.weight", {dims.first, r}, b});
      ab[name + ".weight"] = {a, b};
    }
  }
  WriteF32Safetensors(adapter.dir + "/adapter_model.safetensors", lora);
  // The merged model: every tensor as float32, the targeted ones plus 2 B A.
  TempAdapter merged("", model + "_merged");
  fs::copy_file(base + "/config.json", merged.dir + "/config.json");
  auto store = WeightStore::Open(base);
  ASSERT_TRUE(store.ok()) << store.message();
  std::vector<NamedF32> weights;
  size_t merged_count = 0;
  for (const std::string& name : (*store)->Names()) {
    const TensorView v = *(*store)->Get(name);
    NamedF32 t{name, v.shape, std::vector<float>(v.nbytes / DTypeSize(v.dtype))};
    cpu::ConvertToF32(v.data, v.dtype, static_cast<int64_t>(t.data.size()), t.data.data());
    if (auto it = ab.find(name); it != ab.end()) {
      const int64_t out = v.shape[0], in = v.shape[1];
      for (int64_t i = 0; i < out; ++i)
        for (int64_t j = 0; j < in; ++j) {
          double sum = 0;
          for (int64_t k = 0; k < r; ++k)
            sum += double{it->second.second[static_cast<size_t>(i * r + k)]} *
                   it->second.first[static_cast<size_t>(k * in + j)];
          t.data[static_cast<size_t>(i * in + j)] += static_cast<float>(2.0 * sum);
        }
      ++merged_count;
    }
    weights.push_back(std::move(t));
  }
  ASSERT_EQ(merged_count, ab.size()) << "an adapter module names no weight of " << model;
  WriteF32Safetensors(merged.dir + "/model.safetensors", weights);
  auto with_adapter = LoadWithLora(model, 1, device);
  const int32_t slot = AcquireOrDie(*with_adapter, adapter.dir);
  auto reference = Model::Load(merged.dir, OptionsFor(device));
  ASSERT_TRUE(reference.ok()) << reference.message();
  ASSERT_TRUE((*reference)->AllocateKvCache(kNumBlocks, kBlockSize).ok());
  const std::vector<int32_t> prompt = {1, 17, 300, 42, 42, 8, 511, 99, 250, 3, 77, 128};
  const std::vector<float> got = SoloLastLogits(*with_adapter, prompt, slot);
  const std::vector<float> want = SoloLastLogits(**reference, prompt, -1);
  EXPECT_LT(RelativeL2(got.data(), want.data(), static_cast<int64_t>(got.size())),
            device.kind == DeviceKind::kCpu ? 1e-5 : 1e-4);
  EXPECT_GT(RelativeL2(SoloLastLogits(*with_adapter, prompt, -1).data(), want.data(),
                       static_cast<int64_t>(got.size())),
            1e-3);  // the adapter matters (the test can fail)
}

// phi3's fused qkv_proj / gate_up_proj adapters (B split per part like the weights).
TEST(LoraParity, Phi3FusedProjectionsEqualMergedWeights) {
  EMBER_REQUIRE_DIR(Fixtures() + "/models/phi3");
  const ModelConfig c = LoadConfig("phi3");
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const int64_t qkv = int64_t{c.num_heads + 2 * c.num_kv_heads} * c.head_dim;
  CheckMergedWeightsParity("phi3", {{"self_attn.qkv_proj", {qkv, h}},
                                    {"self_attn.o_proj", {h, int64_t{c.num_heads} * c.head_dim}},
                                    {"mlp.gate_up_proj", {2 * inter, h}},
                                    {"mlp.down_proj", {h, inter}}});
}

// Gemma 2 / Gemma 3 (gemma.cc: sandwich norms, gelu-tanh MLP; gemma3's q/k norms after the
// projections) on all seven projections.
void CheckGemmaMergedWeights(const std::string& model, Device device = {}) {
  EMBER_REQUIRE_DIR(Fixtures() + "/models/" + model);
  const ModelConfig c = LoadConfig(model);
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const int64_t q = int64_t{c.num_heads} * c.head_dim, kv = int64_t{c.num_kv_heads} * c.head_dim;
  CheckMergedWeightsParity(model,
                           {{"self_attn.q_proj", {q, h}},
                            {"self_attn.k_proj", {kv, h}},
                            {"self_attn.v_proj", {kv, h}},
                            {"self_attn.o_proj", {h, q}},
                            {"mlp.gate_proj", {inter, h}},
                            {"mlp.up_proj", {inter, h}},
                            {"mlp.down_proj", {h, inter}}},
                           device);
}
TEST(LoraParity, Gemma2EqualsMergedWeights) {
  CheckGemmaMergedWeights("gemma2");
}
TEST(LoraParity, Gemma3EqualsMergedWeights) {
  CheckGemmaMergedWeights("gemma3");
}
TEST(CudaLoraParity, GemmaEqualsMergedWeights) {
  EMBER_REQUIRE_CUDA();
  CheckGemmaMergedWeights("gemma2", kCudaF32);
  CheckGemmaMergedWeights("gemma3", kCudaF32);
}

}  // namespace
}  // namespace ember
