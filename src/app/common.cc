#include "app/common.h"

#include <nlohmann/json.hpp>

#include "app/model_files.h"
#include "engine/model_draft_source.h"
#include "model/lora_adapter.h"
#include "model/quantize.h"

#include "util/log.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "util/mapped_file.h"

#include "backend/backend_factory.h"
#include "backend/cuda_loader.h"

namespace ember::app {

int Fail(const std::string& message) {
  std::fprintf(stderr, "ember: %s\n", message.c_str());
  return 1;
}

int ParseOrExit(FlagParser& flags, int argc, char** argv, int first) {
  bool help = false;
  Status st = flags.Parse(argc, argv, first, &help);
  if (help) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  if (!st.ok()) return Fail(st.message());
  return -1;
}

void GenerationFlags::Register(FlagParser& flags) {
  flags.AddDouble("--temperature", &temperature, "sampling temperature; 0 = greedy");
  flags.AddDouble("--top-p", &top_p, "nucleus sampling mass (0, 1]");
  flags.AddInt("--top-k", &top_k, "keep the k most likely tokens (0 = off)");
  flags.AddDouble("--min-p", &min_p, "drop tokens below min_p * p(top)");
  flags.AddDouble("--repetition-penalty", &repetition_penalty, "HF repetition penalty (1 = off)");
  flags.AddDouble("--presence-penalty", &presence_penalty, "OpenAI presence penalty");
  flags.AddDouble("--frequency-penalty", &frequency_penalty, "OpenAI frequency penalty");
  flags.AddInt("--seed", &seed,
               "sampling seed, any 64-bit integer as in the API (default: random)");
  flags.AddDouble("--top-n-sigma", &top_n_sigma,
                  "keep logits >= max - n * stddev (llama.cpp's top_n_sigma; <= 0 = off)");
  flags.AddDouble("--typical-p", &typical_p, "locally typical sampling mass (0, 1] (1 = off)");
  flags.AddDouble("--xtc-probability", &xtc_probability,
                  "XTC: chance per token of removing the top choices (0 = off)");
  flags.AddDouble("--xtc-threshold", &xtc_threshold,
                  "XTC: tokens at or above this probability are top choices [0, 0.5] (0.1)");
  flags.AddDouble("--dry-multiplier", &dry_multiplier, "DRY repetition penalty scale (0 = off)");
  flags.AddDouble("--dry-base", &dry_base, "DRY: penalty growth per extra repeated token (1.75)");
  flags.AddInt("--dry-allowed-length", &dry_allowed_length,
               "DRY: repeats this long are not penalised (2)");
  flags.AddInt("--dry-penalty-last-n", &dry_penalty_last_n,
               "DRY: tokens scanned for repeats (-1 = the whole sequence, 0 = off)");
  flags.AddString("--dry-sequence-breakers", &dry_sequence_breakers,
                  "DRY: a JSON array of strings that end a repeat (default [\"\\n\", \":\", "
                  "\"\\\"\", \"*\"])");
}

Result<SamplingRequest> GenerationFlags::Request(const FlagParser& flags) const {
  SamplingRequest r;
  auto number = [&](const char* flag, double value, std::optional<float>* out) {
    if (flags.WasSet(flag)) *out = static_cast<float>(value);
  };
  number("--temperature", temperature, &r.temperature);
  number("--top-p", top_p, &r.top_p);
  number("--min-p", min_p, &r.min_p);
  number("--repetition-penalty", repetition_penalty, &r.repetition_penalty);
  number("--presence-penalty", presence_penalty, &r.presence_penalty);
  number("--frequency-penalty", frequency_penalty, &r.frequency_penalty);
  if (flags.WasSet("--top-k")) {
    if (top_k < INT32_MIN || top_k > INT32_MAX)
      return Status::Error("--top-k: must be a 32-bit integer, got " + std::to_string(top_k));
    r.top_k = static_cast<int32_t>(top_k);
  }
  // Any 64-bit integer; a negative one keeps its bits, as the API's seed (SamplingRequest).
  if (flags.WasSet("--seed")) r.seed = static_cast<uint64_t>(seed);
  number("--top-n-sigma", top_n_sigma, &r.top_n_sigma);
  number("--typical-p", typical_p, &r.typical_p);
  number("--xtc-probability", xtc_probability, &r.xtc_probability);
  number("--xtc-threshold", xtc_threshold, &r.xtc_threshold);
  number("--dry-multiplier", dry_multiplier, &r.dry_multiplier);
  number("--dry-base", dry_base, &r.dry_base);
  auto int32 = [&](const char* flag, int64_t value, std::optional<int32_t>* out) -> Status {
    if (!flags.WasSet(flag)) return Status::Ok();
    if (value < INT32_MIN || value > INT32_MAX)
      return Status::Error(std::string(flag) + ": must be a 32-bit integer, got " +
                           std::to_string(value));
    *out = static_cast<int32_t>(value);
    return Status::Ok();
  };
  EMBER_RETURN_IF_ERROR(int32("--dry-allowed-length", dry_allowed_length, &r.dry_allowed_length));
  EMBER_RETURN_IF_ERROR(int32("--dry-penalty-last-n", dry_penalty_last_n, &r.dry_penalty_last_n));
  if (flags.WasSet("--dry-sequence-breakers")) {
    const nlohmann::json j = nlohmann::json::parse(dry_sequence_breakers, nullptr, false);
    if (!j.is_array() || j.size() > kMaxDrySequenceBreakers)
      return Status::Error("--dry-sequence-breakers: expected a JSON array of at most " +
                           std::to_string(kMaxDrySequenceBreakers) + " strings");
    r.dry_sequence_breakers.emplace();
    for (const auto& v : j) {
      if (!v.is_string())
        return Status::Error("--dry-sequence-breakers: every element must be a string");
      r.dry_sequence_breakers->push_back(v.get<std::string>());
    }
  }
  return r;
}

void EngineFlags::Register(FlagParser& flags, bool serving) {
  flags.AddString("--device", &device, "cpu | cuda | auto (default: cuda when built and present)");
  flags.AddInt("--threads", &threads, "CPU threads (default: all cores)");
  flags.AddString("--quantize", &quantize,
                  "q8_0 | q4_0 | q4_k | q5_k | q6_k: quantize the linear projections of a "
                  "F32/F16/BF16 checkpoint at load (CPU; embeddings, lm_head and norms stay as "
                  "stored; the k-quants need rows of a multiple of 256 values)");
  flags.AddString("--batch-invariant", &batch_invariant,
                  "on | off | auto: CUDA results bitwise independent of the batch (fixed-order "
                  "GEMM; slower). off: last-bit differences between batch sizes. auto (default): "
                  "with speculative decoding, on in the steps where drafting may run (at most "
                  "--spec-max-batch sequences running), so verified tokens equal unspeculated "
                  "decoding's, and off above it, where nobody drafts; else off. The CPU backend "
                  "always is");
  flags.AddString("--cpu-matmul", &cpu_matmul,
                  "exact | f32 | bf16 | auto: the kernels of prompt-sized CPU matrix products. "
                  "exact (default): the float32 reference; f32: float32 on AVX-512 FMA tiles "
                  "(another summation order; faster prompt processing); bf16: the CPU's bf16 "
                  "dot-product instructions (AVX512_BF16: x and weights rounded to bf16, float32 "
                  "sums); auto: the faster of f32 and bf16 on this CPU (timed at start; bf16 only "
                  "where clearly faster), exact without AVX-512. Decode-sized products stay exact");
  flags.AddInt("--max-batch", &max_batch,
               max_batch > 0
                   ? "sequences decoded together (default " + std::to_string(max_batch) + ")"
                   : std::string("sequences decoded together (default 0: 256 on a "
                                 "GPU, 64 on the CPU)"));
  flags.AddInt("--kv-cache-bytes", &kv_cache_bytes, "KV cache size cap in bytes (default: auto)");
  flags.AddString("--kv-cache-dtype", &kv_cache_dtype,
                  "auto | f32 | bf16 | f16 | fp8 | int8 | int4: the KV cache's element type "
                  "(quantized on write, read quantized by attention; the same --kv-cache-bytes "
                  "holds about 2x the tokens at 16 bits, 4x at 8, 7x at 4 vs f32). auto: f32 on "
                  "the CPU, bf16 on CUDA (which takes bf16, int8, fp8 and int4). int4 rotates K "
                  "and V by a Hadamard matrix and needs a power-of-two head_dim. Default auto");
  flags.AddString("--kv-cache-dtype-layers", &kv_cache_dtype_layers,
                  "per-layer overrides of --kv-cache-dtype: LAYERS=DTYPE items, comma-separated; "
                  "LAYERS is I or I:J (inclusive; negative counts from the end), e.g. "
                  "0:1=bf16,-1=bf16 keeps the first two and the last layer at 16 bits");
  flags.AddDouble("--gpu-memory-fraction", &gpu_memory_fraction,
                  "share of the GPU's memory for weights + KV cache + work (default 0.9)");
  flags.AddInt("--max-step-tokens", &max_step_tokens,
               "tokens per engine step; longer prompts prefill in chunks (default 0: 512 on the "
               "CPU; on a GPU 8192, halved while a step's workspace would take more than a "
               "quarter of the memory left after the weights)");
  flags.AddInt("--ctx-size,--max-model-len", &max_model_len,
               "the served context in tokens, at most the model's and what the KV cache holds "
               "(default 0: the model's, capped to the KV cache)");
  flags.AddBool("--no-prefix-cache", &no_prefix_cache, "disable automatic prefix caching");
  flags.AddInt("--state-checkpoint-bytes", &state_checkpoint_bytes,
               "models with recurrent layers (qwen3_next): bytes of the KV cache kept for "
               "recurrent-state checkpoints, which the prefix cache needs to reuse a prefix "
               "(default -1: an eighth of the KV cache; 0: none, the prefix cache off)");
  flags.AddInt("--state-checkpoint-interval", &state_checkpoint_interval,
               "models with recurrent layers: tokens between recurrent-state checkpoints within "
               "a sequence, a multiple of the block size (16); 0: only at the end of each "
               "prompt's last full block, which is always one (default 512)");
  flags.AddString("--prompt-cache-dir", &prompt_cache_dir,
                  "keep full prompt KV blocks on disk in DIR (a subfolder per model fingerprint), "
                  "so a restart or a pool eviction does not recompute long prompts; needs "
                  "--prompt-cache-disk-bytes");
  flags.AddInt("--prompt-cache-disk-bytes", &prompt_cache_disk_bytes,
               "byte cap of --prompt-cache-dir (least recently used blocks are evicted first)");
  flags.AddInt("--prompt-cache-ram-bytes", &prompt_cache_ram_bytes,
               "host-RAM tier below the KV pool: full blocks the prefix cache evicts are kept "
               "here (least recently used out first, to --prompt-cache-dir when set) and copied "
               "back when a prompt needs them (default 0: off; on a GPU try a few GiB; on the CPU "
               "the pool is host RAM already, so raising --kv-cache-bytes does as much)");
  flags.AddBool("--no-overlap", &no_overlap,
                "launch each step only after the previous step's tokens are read (by default a "
                "step whose tokens need no host work launches first)");
  flags.AddBool("--no-jump-forward", &no_jump_forward,
                "sample every token of a constrained output (response_format, guided_*, grammar, "
                "forced tool calls); by default a token the constraint forces (the only one it "
                "allows) is appended without sampling and computed with the next step. Outputs "
                "are the same either way");
  flags.AddString("--spec-method", &spec_method,
                  "none | ngram | draft | mtp: speculative decoding. ngram drafts from the "
                  "sequence's own prompt and output (prompt lookup, no weights); draft runs "
                  "--draft-model (a small model of the same tokenizer) greedily; mtp runs the "
                  "checkpoint's own multi-token-prediction module (deepseek_v3 checkpoints that "
                  "keep model.layers.N.*, CPU). Outputs are unchanged. Default none");
  flags.AddInt("--num-spec-tokens", &num_spec_tokens,
               "the most tokens a sequence drafts per step, 1..64 (default 4; adapted per sequence "
               "to its acceptance)");
  flags.AddInt("--spec-max-batch", &spec_max_batch,
               "no sequence drafts while more than this many are running (a large batch is "
               "compute-bound; on CUDA the steps that may draft also take the batch-invariant "
               "GEMMs); default 0: 8 on CUDA, 16 on the CPU (docs/perf.md, session 39)");
  flags.AddString("--draft-model", &draft_model,
                  "draft model folder for --spec-method draft: same vocabulary and tokenizer as "
                  "the model; loaded on the same device with the same options");
  flags.AddInt("--draft-kv-cache-bytes", &draft_kv_cache_bytes,
               "the draft model's own KV cache in bytes, apart from --kv-cache-bytes (default 0: "
               "128 MiB); sequences that do not fit get no drafts");
  flags.AddRepeated("--lora", &loras,
                    "NAME=DIR: a PEFT LoRA adapter folder served as NAME (requests: adapter NAME "
                    "or model BASE:NAME; CPU backend, llama family)");
  flags.AddString("--adapter", &adapter,
                  "the LoRA adapter of requests that name none (default: the base model)");
  flags.AddInt("--max-loras", &max_loras,
               "LoRA adapters resident at once (slots, evicted least recently used when idle; "
               "default 4 with --lora, else 0: LoRA off)");
  flags.AddInt("--max-lora-rank", &max_lora_rank, "largest LoRA rank accepted (default 64, <= 256)");
  if (serving) flags.AddInt("--max-queue", &max_queue, "requests waiting before 429 (default 1024)");
}

namespace {
// --spec-method's value as the engine's method; nullopt for an unknown name.
std::optional<SpeculationConfig::Method> SpecMethodOf(const std::string& name) {
  using Method = SpeculationConfig::Method;
  if (name == "none") return Method::kNone;
  if (name == "ngram") return Method::kNgram;
  if (name == "draft") return Method::kDraft;
  if (name == "mtp") return Method::kMtp;
  return std::nullopt;
}
}  // namespace

Status EngineFlags::CheckSpeculation() const {
  if (!SpecMethodOf(spec_method))
    return Status::Error("--spec-method must be none, ngram, draft or mtp, got '" + spec_method +
                         "'");
  if (num_spec_tokens < 1 || num_spec_tokens > 64)
    return Status::Error("--num-spec-tokens: must be in [1, 64], got " +
                         std::to_string(num_spec_tokens));
  if (spec_max_batch < 0 || spec_max_batch > (int64_t{1} << 20))
    return Status::Error("--spec-max-batch: must be in [0, 1048576]");
  return CheckSpeculationConfig(Config().speculation);
}

Result<ModelLoadOptions> EngineFlags::LoadOptions() const {
  ModelLoadOptions opts;
  if (device == "auto") {
    opts.device = DeviceKind::kCpu;
    if (CudaDevicesAvailable() > 0) {
      opts.device = DeviceKind::kCuda;
    } else if (CudaDriverPresent()) {
      LOG_WARN << "--device auto: no usable CUDA device (see above); running on the CPU";
    }
  } else if (device == "cpu") {
    opts.device = DeviceKind::kCpu;
  } else if (device == "cuda") {
    opts.device = DeviceKind::kCuda;
  } else {
    return Status::Error("--device must be cpu, cuda or auto, got '" + device + "'");
  }
  if (threads < 0) return Status::Error("--threads: must be >= 0");
  if (batch_invariant != "on" && batch_invariant != "off" && batch_invariant != "auto")
    return Status::Error("--batch-invariant must be on, off or auto, got '" + batch_invariant +
                         "'");
  // Speculation verifies drafts in multi-row steps: only batch-invariant products give those rows
  // the logits a one-row decode step gives (else a near tie can flip a token). `on`: every step
  // (the backend's option); `auto`: the steps where drafting may run (Config's
  // SpeculationConfig::invariant_steps), so a loaded server keeps its fastest products.
  const bool speculates = spec_method != "none";
  opts.cuda_batch_invariant = batch_invariant == "on";
  if (batch_invariant == "off" && speculates && opts.device == DeviceKind::kCuda) {
    LOG_WARN << "--batch-invariant off with --spec-method " << spec_method
             << ": on CUDA a verified token can differ from unspeculated decoding's at a near tie";
  }
  EMBER_RETURN_IF_ERROR(ApplyCpuMatmulFlag(cpu_matmul, opts));
  opts.num_threads = static_cast<int32_t>(threads);
  EMBER_ASSIGN_OR_RETURN(opts.quantize, ParseQuantizeType(quantize, "--quantize"));
  EMBER_ASSIGN_OR_RETURN(opts.kv_cache.dtype, ParseKvDType(kv_cache_dtype, "--kv-cache-dtype"));
  EMBER_ASSIGN_OR_RETURN(opts.kv_cache.layers, ParseKvLayerOverrides(kv_cache_dtype_layers));
  return opts;
}

Status ApplyCpuMatmulFlag(const std::string& cpu_matmul, ModelLoadOptions& opts) {
  if (cpu_matmul != "exact" && cpu_matmul != "f32" && cpu_matmul != "bf16" && cpu_matmul != "auto")
    return Status::Error("--cpu-matmul must be exact, f32, bf16 or auto, got '" + cpu_matmul + "'");
  if (cpu_matmul == "bf16" && !CpuHasBf16Dot())
    return Status::Error("--cpu-matmul bf16: this CPU has no AVX512_BF16 instructions (use exact or "
                         "auto)");
  if (cpu_matmul == "f32" && !CpuHasF32Fast())
    return Status::Error("--cpu-matmul f32: this CPU has no AVX-512 (F, BW, VL) instructions (use "
                         "exact or auto)");
  opts.cpu_matmul = cpu_matmul == "exact" ? CpuMatmul::kExact
                    : cpu_matmul == "f32" ? CpuMatmul::kF32
                    : cpu_matmul == "bf16" ? CpuMatmul::kBf16
                                           : CpuFastestMatmul();
  if (cpu_matmul == "auto") {
    LOG_INFO << "--cpu-matmul auto: " << CpuMatmulName(opts.cpu_matmul) << " on this CPU";
  }
  opts.cpu_chunked_delta_rule = cpu_matmul != "exact";  // needs no AVX512_BF16
  return Status::Ok();
}

EngineConfig EngineFlags::Config() const {
  EngineConfig c;
  c.max_running = static_cast<int32_t>(max_batch);
  c.kv_cache_bytes = kv_cache_bytes;
  c.gpu_memory_fraction = gpu_memory_fraction;
  c.max_step_tokens = static_cast<int32_t>(max_step_tokens);
  c.max_model_len = static_cast<int32_t>(max_model_len);
  c.max_queue = static_cast<int32_t>(max_queue);
  c.enable_prefix_caching = !no_prefix_cache;
  c.state_checkpoint_bytes = state_checkpoint_bytes;
  c.state_checkpoint_interval =
      static_cast<int32_t>(std::clamp<int64_t>(state_checkpoint_interval, -1, 1 << 30));
  c.overlap_steps = !no_overlap;
  c.jump_forward = !no_jump_forward;
  c.speculation.method = SpecMethodOf(spec_method).value_or(SpeculationConfig::Method::kNone);
  c.speculation.num_spec_tokens = static_cast<int32_t>(num_spec_tokens);
  c.speculation.max_batch = static_cast<int32_t>(spec_max_batch);
  c.speculation.invariant_steps = batch_invariant == "auto";
  c.speculation.draft_model = draft_model;
  c.speculation.draft_kv_cache_bytes = draft_kv_cache_bytes;
  c.prompt_cache.dir = prompt_cache_dir;
  c.prompt_cache.disk_bytes = prompt_cache_disk_bytes;
  c.prompt_cache.ram_bytes = prompt_cache_ram_bytes;
  c.max_loras = static_cast<int32_t>(max_loras > 0 ? max_loras : (loras.empty() ? 0 : 4));
  c.max_lora_rank = static_cast<int32_t>(max_lora_rank);
  return c;
}

namespace {
// --max-loras / --max-lora-rank / --lora / --adapter, checked before anything loads.
Status CheckLoraFlags(const EngineFlags& flags) {
  if (flags.max_loras < 0 || flags.max_loras > 1024)
    return Status::Error("--max-loras: must be in [0, 1024]");
  if (flags.max_lora_rank < 1 || flags.max_lora_rank > kMaxLoraRankLimit)
    return Status::Error("--max-lora-rank: must be in [1, " + std::to_string(kMaxLoraRankLimit) +
                         "]");
  for (const std::string& spec : flags.loras) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      return Status::Error("--lora: expected NAME=DIR, got '" + spec + "'");
    if (const std::string why = AdapterNameProblem(spec.substr(0, eq)); !why.empty())
      return Status::Error("--lora: " + why);
  }
  if (!flags.adapter.empty() && flags.adapter != "none") {
    const bool known = std::any_of(flags.loras.begin(), flags.loras.end(), [&](const auto& s) {
      return s.substr(0, s.find('=')) == flags.adapter;
    });
    if (!known) return Status::Error("--adapter: no --lora " + flags.adapter + "=DIR");
  }
  return Status::Ok();
}

// Registers each --lora NAME=DIR with the engine (a folder that does not fit the model fails).
Status RegisterLoras(const EngineFlags& flags, Engine& engine) {
  for (const std::string& spec : flags.loras) {
    const size_t eq = spec.find('=');
    auto info = engine.adapters()->Register(spec.substr(0, eq), spec.substr(eq + 1));
    if (!info.ok()) return Status::Error("--lora " + spec + ": " + info.message());
  }
  return Status::Ok();
}
}  // namespace

Result<LoadedModel> LoadModelAndEngine(const std::string& model_dir, const EngineFlags& flags,
                                       std::unique_ptr<Tokenizer> tokenizer) {
  constexpr int64_t kMaxLimit = int64_t{1} << 20;
  if (flags.max_batch < 0 || flags.max_batch > kMaxLimit)
    return Status::Error("--max-batch: must be in [0, 1048576] (0: the default)");
  if (flags.max_step_tokens < 0 || flags.max_step_tokens > kMaxLimit)
    return Status::Error("--max-step-tokens: must be in [0, 1048576] (0: the default)");
  if (flags.kv_cache_bytes < 0) return Status::Error("--kv-cache-bytes: must be >= 0");
  if (flags.max_model_len < 0 || flags.max_model_len > (int64_t{1} << 30))
    return Status::Error("--max-model-len: must be in [0, 2^30] (0: the model's context)");
  if (flags.max_queue < 1) return Status::Error("--max-queue: must be >= 1");
  EMBER_RETURN_IF_ERROR(flags.CheckSpeculation());
  EMBER_RETURN_IF_ERROR(CheckLoraFlags(flags));
  if (flags.prompt_cache_disk_bytes < 0 || flags.prompt_cache_ram_bytes < 0)
    return Status::Error("--prompt-cache-disk-bytes / --prompt-cache-ram-bytes: must be >= 0");
  EMBER_ASSIGN_OR_RETURN(ModelLoadOptions opts, flags.LoadOptions());
  LoadedModel lm;
  // The tokenizer first (cheap): a broken one fails before the weights load.
  lm.tokenizer = std::move(tokenizer);
  if (lm.tokenizer == nullptr) {
    EMBER_ASSIGN_OR_RETURN(lm.tokenizer, LoadModelTokenizer(model_dir));
  }
  EMBER_ASSIGN_OR_RETURN(lm.model, Model::Load(model_dir, opts));
  const EngineConfig config = flags.Config();
  std::unique_ptr<DraftSource> draft;
  if (config.speculation.method == SpeculationConfig::Method::kDraft) {
    EMBER_RETURN_IF_ERROR(CheckDraftTokenizer(lm.tokenizer.get(), flags.draft_model));
    EMBER_ASSIGN_OR_RETURN(draft, LoadDraftSource(config.speculation, opts,
                                                  lm.model->config().vocab_size));
  } else if (config.speculation.method == SpeculationConfig::Method::kMtp) {
    EMBER_ASSIGN_OR_RETURN(draft, LoadDraftSource(config.speculation, opts,
                                                  lm.model->config().vocab_size, model_dir));
  }
  EMBER_ASSIGN_OR_RETURN(lm.engine, Engine::Create(lm.model.get(), config, std::move(draft)));
  EMBER_RETURN_IF_ERROR(RegisterLoras(flags, *lm.engine));
  lm.default_adapter = flags.adapter == "none" ? "" : flags.adapter;
  return lm;
}

Status CheckDraftTokenizer(const Tokenizer* target, const std::string& draft_dir) {
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> draft, LoadModelTokenizer(draft_dir));
  if (target == nullptr || draft == nullptr) {
    LOG_WARN << "--draft-model: " << (target == nullptr ? "the model" : "the draft model")
             << " has no tokenizer to compare; only the vocabulary sizes are checked";
    return Status::Ok();
  }
  if (target->vocab_size() != draft->vocab_size())
    return Status::Error("--draft-model " + draft_dir + ": its tokenizer has " +
                         std::to_string(draft->vocab_size()) + " tokens, the model's " +
                         std::to_string(target->vocab_size()));
  for (int32_t id = 0; id < target->vocab_size(); ++id) {
    if (target->IdToToken(id) != draft->IdToToken(id))
      return Status::Error("--draft-model " + draft_dir + ": its tokenizer differs from the "
                           "model's (token " + std::to_string(id) + " is '" +
                           draft->IdToToken(id) + "' there, '" + target->IdToToken(id) + "' here)");
  }
  return Status::Ok();
}

serve::ServedModel ServedModelOf(const LoadedModel& lm) {
  serve::ServedModel served;
  served.tokenizer = lm.tokenizer.get();
  served.engine = lm.engine.get();
  served.default_adapter = lm.default_adapter;
  served.defaults = lm.model->generation_defaults();
  served.context_length = lm.engine->context_length();
  served.vocab_size = lm.engine->vocab_size();
  if (lm.tokenizer != nullptr) {
    served.default_dry_breaker_ids = std::make_shared<const std::vector<int32_t>>(
        serve::DryBreakerIdsOf(*lm.tokenizer, served.vocab_size,
                               SamplingParams::DefaultDrySequenceBreakers()));
  }
  return served;
}

void AddCompletionTokensDetails(const RequestUsage& usage, nlohmann::json* usage_json) {
  if (usage.speculative) {
    (*usage_json)["completion_tokens_details"]["accepted_prediction_tokens"] =
        usage.accepted_prediction_tokens;
    (*usage_json)["completion_tokens_details"]["rejected_prediction_tokens"] =
        usage.rejected_prediction_tokens;
  }
  if (usage.jump_forward)
    (*usage_json)["completion_tokens_details"]["forced_tokens"] = usage.forced_tokens;
}

std::string SpeculationSummary(const EngineStats& s) {
  if (s.spec_draft_tokens == 0) return "";
  char buf[200];
  std::snprintf(buf, sizeof(buf),
                "; speculation: %lld drafted, %lld accepted (%.1f%%), %.3f tokens per target step",
                static_cast<long long>(s.spec_draft_tokens),
                static_cast<long long>(s.spec_accepted_tokens),
                100.0 * static_cast<double>(s.spec_accepted_tokens) /
                    static_cast<double>(s.spec_draft_tokens),
                s.sampled_seq_steps > 0 ? static_cast<double>(s.sampled_tokens) /
                                              static_cast<double>(s.sampled_seq_steps)
                                        : 0.0);
  return buf;
}

namespace {
int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

GenerationTimer::GenerationTimer() : start_ns_(SteadyNowNs()) {}

void GenerationTimer::OnToken(int64_t time_ns) {
  if (num_tokens_ == 0) first_ns_ = time_ns;
  last_ns_ = time_ns;
  ++num_tokens_;
}

nlohmann::json GenerationTimer::ToJson() const {
  double ttft_ms = num_tokens_ > 0 ? (first_ns_ - start_ns_) / 1e6 : 0.0;
  double decode_s = (last_ns_ - first_ns_) / 1e9;
  double decode_tps = num_tokens_ > 1 && decode_s > 0 ? (num_tokens_ - 1) / decode_s : 0.0;
  return {{"ttft_ms", ttft_ms}, {"decode_tokens_per_s", decode_tps}};
}

std::string GenerationTimer::Summary(const RequestUsage& usage) const {
  nlohmann::json j = ToJson();
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "[prompt %d tokens (%d cached), generated %d; first token %.1f ms, %.1f tok/s]",
                usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens,
                j["ttft_ms"].get<double>(), j["decode_tokens_per_s"].get<double>());
  return buf;
}

}  // namespace ember::app
