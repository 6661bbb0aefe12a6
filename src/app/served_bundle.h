// ServedBundle: one model as `ember serve` holds it — weights, engine, tokenizer, chat template,
// output parsers, and the serve::ServedModel that borrows them. A serve::ResidentModel, so the
// model library (--models-dir) owns bundles the same way the single-model server does. Loading
// checks the cheap parts first (tokenizer, template, parser flags), then the weights. Immutable
// after Load; destroying it stops its engine (cancelling what is left).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "app/common.h"
#include "serve/model_library.h"
#include "template/chat_template.h"

namespace ember::app {

struct ServeModelOptions {
  std::string chat_template_file;  // empty: the model's own
  std::string reasoning_parser = "auto";
  std::string tool_call_parser = "auto";
  EngineFlags engine;
};

class ServedBundle final : public serve::ResidentModel {
 public:
  // `dir` is a Hugging Face folder (config.json, weights, tokenizer.json) or a .gguf file;
  // `name` is the id clients send.
  static Result<std::unique_ptr<ServedBundle>> Load(const std::string& dir, const std::string& name,
                                                    const ServeModelOptions& options);
  ~ServedBundle() override;

  const serve::ServedModel& served() const override { return served_; }
  // The weight files (what the mapping pins, or their device copy) plus the KV pool's cap.
  int64_t memory_bytes() const override;
  Engine& engine() const { return *loaded_.engine; }
  const ChatTemplate& chat_template() const { return chat_template_; }

 private:
  ServedBundle() = default;
  LoadedModel loaded_;
  ChatTemplate chat_template_;
  serve::ServedModel served_;
};

// What a model will hold once loaded, before loading it (the library's budget check): the
// weights at the dtype the device keeps (float32 on the CPU) plus the KV pool's cap
// (--kv-cache-bytes, else the engine's default for that device).
int64_t EstimateServedBytes(const serve::LibraryModelInfo& info, const EngineFlags& flags);

}  // namespace ember::app
