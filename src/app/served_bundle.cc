#include "app/served_bundle.h"

#include <utility>

#include "app/model_files.h"
#include "serve/embedding_config.h"
#include "serve/output_parsers.h"
#include "util/log.h"
#include "util/mapped_file.h"

namespace ember::app {

namespace {

Result<ChatTemplate> LoadChatTemplate(const std::string& model_path, const std::string& file,
                                      const Tokenizer& tokenizer) {
  if (file.empty()) return LoadModelChatTemplate(model_path);
  auto source = ReadFileToString(file);
  if (!source.ok()) return source.status();
  auto t = ChatTemplate::FromSource(*source, tokenizer.bos_token(), tokenizer.eos_token());
  if (!t.ok()) return Status::Error(file + ": " + t.message());
  return t;
}

}  // namespace

Result<std::unique_ptr<ServedBundle>> ServedBundle::Load(const std::string& dir,
                                                         const std::string& name,
                                                         const ServeModelOptions& options) {
  // The tokenizer and the chat template before the weights: a missing or broken one fails in
  // milliseconds, not after minutes of loading a large model.
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadModelTokenizer(dir));
  if (tokenizer == nullptr)
    return Status::Error(TokenizerSource(dir) + ": not found (serve needs it)");
  std::unique_ptr<ServedBundle> bundle(new ServedBundle());
  EMBER_ASSIGN_OR_RETURN(bundle->chat_template_,
                         LoadChatTemplate(dir, options.chat_template_file, *tokenizer));
  EMBER_ASSIGN_OR_RETURN(serve::OutputParsers parsers,
                         serve::ChooseOutputParsers(options.reasoning_parser,
                                                    options.tool_call_parser,
                                                    bundle->chat_template_.tools_source()));
  EMBER_ASSIGN_OR_RETURN(bundle->loaded_,
                         LoadModelAndEngine(dir, options.engine, std::move(tokenizer)));
  const LoadedModel& lm = bundle->loaded_;
  serve::ServedModel& served = bundle->served_;
  served = ServedModelOf(lm);
  served.name = name;
  served.chat_template = &bundle->chat_template_;
  served.protected_strings = serve::ProtectedStringsOf(*lm.tokenizer, bundle->chat_template_);
  served.max_n = options.engine.Config().max_n;
  served.token_texts = serve::VocabularyTexts(*lm.tokenizer, served.vocab_size);
  served.grammars = std::make_shared<GbnfCache>(served.token_texts, served.defaults.eos_token_ids);
  served.tool_format = parsers.tools;
  served.reasoning_format = parsers.reasoning;
  served.embeddings = serve::ReadEmbeddingSupport(dir);
  if (served.embeddings.available) {
    LOG_INFO << name << ": embeddings by " << PoolingKindName(served.embeddings.pooling.kind)
             << " pooling" << (served.embeddings.pooling.normalize ? ", L2-normalized" : "")
             << " (" << served.embeddings.source << ")";
  } else {
    LOG_WARN << name << ": embeddings unavailable: " << served.embeddings.unavailable_reason;
  }
  return bundle;
}

ServedBundle::~ServedBundle() {
  if (loaded_.engine != nullptr) loaded_.engine->Shutdown(/*drain=*/false);
}

int64_t ServedBundle::memory_bytes() const {
  return loaded_.model->WeightBytes() + loaded_.engine->kv_cache_bytes();
}

int64_t EstimateServedBytes(const serve::LibraryModelInfo& info, const EngineFlags& flags) {
  // The CPU maps the weight files as they are; a GPU holds them at most at their file size.
  constexpr int64_t kDefaultKvBound = int64_t{4} << 30;  // the CPU default's upper bound
  return info.disk_bytes + (flags.kv_cache_bytes > 0 ? flags.kv_cache_bytes : kDefaultKvBound);
}

}  // namespace ember::app
