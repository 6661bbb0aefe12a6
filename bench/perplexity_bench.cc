// Perplexity of a model on a text file by llama-perplexity's protocol, so Ember and llama.cpp can
// be compared on the same file, text and context (docs/perf.md, issue 41's quality table): the
// whole text tokenized once (BOS added as the model's tokenizer does), cut into floor(tokens /
// ctx) chunks of ctx tokens, each chunk's first token replaced by BOS (when the tokenizer adds
// one) and run from position 0, and the second half of each chunk scored: the logits at positions
// ctx/2 .. ctx-2 predict the tokens after them. Prints llama-perplexity's "Final estimate" line.
//
//   perplexity_bench --model DIR|FILE.gguf [--quantize T] --text FILE [--ctx 128] [--threads N]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "app/model_files.h"
#include "model/model.h"
#include "model/quantize.h"
#include "util/flags.h"
#include "util/mapped_file.h"

namespace ember {
namespace {

// -log p(next) from one logits row, in double.
double Nll(const float* x, int64_t n, int32_t next) {
  const double m = *std::max_element(x, x + n);
  double z = 0;
  for (int64_t i = 0; i < n; ++i) z += std::exp(x[i] - m);
  return m + std::log(z) - x[next];
}

int Run(int argc, char** argv) {
  std::string model_path, text_file, quantize;
  int64_t ctx = 128, threads = 0;
  FlagParser flags("usage: perplexity_bench --model DIR|FILE.gguf [--quantize T] --text FILE "
                   "[--ctx 128] [--threads N]");
  flags.AddString("--model", &model_path, "model folder or .gguf file");
  flags.AddString("--quantize", &quantize, "quantize the projections at load (" +
                                               QuantizeTypeNames() + ")");
  flags.AddString("--text", &text_file, "the text");
  flags.AddInt("--ctx", &ctx, "tokens per chunk (llama-perplexity's -c; default 128)");
  flags.AddInt("--threads", &threads, "CPU threads (0: all)");
  bool help = false;
  if (Status st = flags.Parse(argc, argv, 1, &help); !st.ok() || help) {
    std::fprintf(stderr, "%s\n%s", st.message().c_str(), flags.Help().c_str());
    return help ? 0 : 2;
  }
  auto qtype = ParseQuantizeType(quantize, "--quantize");
  auto text = ReadFileToString(text_file);
  if (model_path.empty() || !qtype.ok() || !text.ok() || ctx < 4) {
    std::fprintf(stderr, "perplexity_bench: %s\n",
                 !qtype.ok()  ? qtype.message().c_str()
                 : !text.ok() ? text.message().c_str()
                              : "--model, --text and --ctx >= 4 are required");
    return 2;
  }
  auto tok = app::LoadModelTokenizer(model_path);
  ModelLoadOptions opts;
  opts.device = DeviceKind::kCpu;
  opts.num_threads = static_cast<int32_t>(threads);
  opts.quantize = *qtype;
  auto model = Model::Load(model_path, opts);
  if (!tok.ok() || *tok == nullptr || !model.ok()) {
    std::fprintf(stderr, "perplexity_bench: %s\n",
                 !model.ok() ? model.message().c_str()
                 : !tok.ok() ? tok.message().c_str() : "the model has no tokenizer");
    return 1;
  }
  const std::vector<int32_t> ids = (*tok)->Encode(*text, true);
  const bool bos = !ids.empty() && (*tok)->bos_token_id() && ids[0] == *(*tok)->bos_token_id();
  const int64_t chunks = static_cast<int64_t>(ids.size()) / ctx;
  const int64_t vocab = (*model)->config().vocab_size;
  constexpr int32_t kBlock = 16;
  const int32_t blocks = static_cast<int32_t>((ctx + kBlock - 1) / kBlock);
  if (Status st = (*model)->AllocateKvCache(blocks, kBlock); !st.ok() || chunks < 1) {
    std::fprintf(stderr, "perplexity_bench: %s\n",
                 st.ok() ? "the text is shorter than one chunk" : st.message().c_str());
    return 1;
  }
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int32_t b = 0; b < blocks; ++b) table[size_t(b)] = b;
  std::vector<float> logits(static_cast<size_t>(ctx * vocab));
  double nll = 0;
  int64_t scored = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<int32_t> part(ids.begin() + c * ctx, ids.begin() + (c + 1) * ctx);
    if (bos) part[0] = ids[0];
    BatchPlan plan;
    plan.block_size = kBlock;
    plan.AddSequence(part, 0, table, false);
    plan.logits_rows.clear();
    for (int32_t r = 0; r < static_cast<int32_t>(ctx); ++r) plan.logits_rows.push_back(r);
    if (Status st = (*model)->Forward(plan, logits); !st.ok()) {
      std::fprintf(stderr, "perplexity_bench: %s\n", st.message().c_str());
      return 1;
    }
    for (int64_t r = ctx / 2; r + 1 < ctx; ++r, ++scored)
      nll += Nll(logits.data() + r * vocab, vocab, part[static_cast<size_t>(r + 1)]);
  }
  std::printf("%s%s: %zu tokens, %lld chunks of %lld, %lld scored\n", model_path.c_str(),
              quantize.empty() ? "" : (" --quantize " + quantize).c_str(), ids.size(),
              static_cast<long long>(chunks), static_cast<long long>(ctx),
              static_cast<long long>(scored));
  std::printf("Final estimate: PPL = %.4f\n", std::exp(nll / static_cast<double>(scored)));
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) { return ember::Run(argc, argv); }
