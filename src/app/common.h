// Helpers shared by the `ember` subcommands: flag groups that several commands accept (sampling,
// engine sizing), loading a model + tokenizer + engine, failure printing, and timing summaries.
// Used from main's thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "model/model.h"
#include "sampling/request_sampling.h"
#include "serve/request_builder.h"
#include "tokenizer/tokenizer.h"
#include "util/flags.h"
#include "util/status.h"

namespace ember::app {

// Prints "ember: MESSAGE" to stderr; returns exit code 1.
int Fail(const std::string& message);
// Parses flags; returns -1 to continue, else the exit code to return (help printed, or error).
int ParseOrExit(FlagParser& flags, int argc, char** argv, int first);

// --cpu-matmul exact|f32|bf16|auto into `opts` (cpu_matmul, cpu_chunked_delta_rule); an error
// names the flag (an unknown value, or a kernel this CPU cannot run).
Status ApplyCpuMatmulFlag(const std::string& cpu_matmul, ModelLoadOptions& opts);

// --temperature --top-p --top-k --min-p --seed --repetition-penalty ... as a SamplingRequest:
// the flags that were given, for the resolver (sampling/request_sampling.h), which falls back to
// generation_config.json, then to OpenAI's defaults, and checks the values as the server does.
struct GenerationFlags {
  double temperature = 1.0, top_p = 1.0, min_p = 0.0;
  double repetition_penalty = 1.0, presence_penalty = 0.0, frequency_penalty = 0.0;
  int64_t top_k = 0, seed = 0;
  // llama.cpp's samplers (SamplingParams defines them).
  double top_n_sigma = -1.0, typical_p = 1.0, xtc_probability = 0.0, xtc_threshold = 0.1;
  double dry_multiplier = 0.0, dry_base = 1.75;
  int64_t dry_allowed_length = 2, dry_penalty_last_n = -1;
  std::string dry_sequence_breakers;  // a JSON array of strings
  void Register(FlagParser& flags);
  Result<SamplingRequest> Request(const FlagParser& flags) const;
};

// --device --threads --quantize --max-batch --kv-cache-bytes --kv-cache-dtype
// --kv-cache-dtype-layers --max-step-tokens --max-model-len
// --spec-method --num-spec-tokens --spec-max-batch --draft-model --draft-kv-cache-bytes
struct EngineFlags {
  std::string device = "auto";
  std::string quantize;  // --quantize: "" (as stored), q8_0, q4_0 (model/quantize.h)
  std::string batch_invariant = "auto";  // on | off | auto (on with speculation)
  std::string cpu_matmul = "exact";  // --cpu-matmul exact|f32|bf16|auto
  std::string kv_cache_dtype = "auto", kv_cache_dtype_layers;  // backend/kv_format.h
  int64_t threads = 0, max_batch = 0, kv_cache_bytes = 0, max_step_tokens = 0;
  int64_t max_model_len = 0;  // --max-model-len (alias --ctx-size); 0: the model's
  int64_t max_queue = 1024;
  double gpu_memory_fraction = 0.9;
  bool no_prefix_cache = false;
  int64_t state_checkpoint_bytes = -1, state_checkpoint_interval = 512;
  std::string prompt_cache_dir;  // --prompt-cache-dir
  int64_t prompt_cache_disk_bytes = 0, prompt_cache_ram_bytes = 0;
  bool no_overlap = false;
  bool no_jump_forward = false;
  std::string spec_method = "none";  // --spec-method none|ngram|draft
  std::string draft_model;           // --draft-model DIR
  int64_t num_spec_tokens = 4, spec_max_batch = 0;
  int64_t draft_kv_cache_bytes = 0;  // --draft-kv-cache-bytes; 0: the default (128 MiB)
  // LoRA adapters: --lora NAME=DIR (repeatable), --adapter NAME (the default of requests that
  // name none), --max-loras (slots; 0: 4 when --lora is given, else LoRA is off), --max-lora-rank.
  std::vector<std::string> loras;
  std::string adapter;
  int64_t max_loras = 0, max_lora_rank = 64;
  void Register(FlagParser& flags, bool serving);
  Result<ModelLoadOptions> LoadOptions() const;
  // The speculation flags, checked (a method not supported yet is an error naming it): what a
  // command calls before it loads anything.
  Status CheckSpeculation() const;
  EngineConfig Config() const;
};

struct LoadedModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the folder has no tokenizer.json
  std::unique_ptr<Engine> engine;
  std::string default_adapter;  // --adapter ("": the base model)
};
// Checks the flags, loads the tokenizer (`tokenizer` when the caller already loaded it; none when
// the folder has no tokenizer.json) before the weights, then the model, with --spec-method draft
// the draft model (CheckDraftTokenizer, LoadDraftSource), and the engine.
Result<LoadedModel> LoadModelAndEngine(const std::string& model_dir, const EngineFlags& flags,
                                       std::unique_ptr<Tokenizer> tokenizer = nullptr);
// --draft-model's tokenizer against the model's: the same size and the same token text at every
// id, else an error naming the first difference. Only a warning when either has none (a bare
// checkpoint: the vocabulary sizes are still compared by ModelDraftSource::Create).
Status CheckDraftTokenizer(const Tokenizer* target, const std::string& draft_dir);
// What the request builder needs of a loaded model: its tokenizer, engine, generation_config.json
// and sizes (the name, chat template, parsers and JSON-mode texts are left to the caller).
serve::ServedModel ServedModelOf(const LoadedModel& lm);

// A usage object's completion_tokens_details: a speculating request's drafted tokens under
// OpenAI's names (accepted_prediction_tokens, rejected_prediction_tokens), and the tokens
// jump-forward appended without sampling (forced_tokens) when it ran for the request. Nothing
// when neither ran.
void AddCompletionTokensDetails(const RequestUsage& usage, nlohmann::json* usage_json);
// "; speculation: D drafted, A accepted (R%), T tokens per target step" from the engine's
// counters, or "" when nothing was drafted.
std::string SpeculationSummary(const EngineStats& stats);

// Time to first token and decode rate of one generation, from TokenEvent stamps.
class GenerationTimer {
 public:
  GenerationTimer();
  void OnToken(int64_t time_ns);
  nlohmann::json ToJson() const;
  std::string Summary(const RequestUsage& usage) const;

 private:
  int64_t start_ns_, first_ns_ = 0, last_ns_ = 0;
  int64_t num_tokens_ = 0;
};

}  // namespace ember::app
