// KV-cache quantization quality (issue 42): for each KV format, the perplexity of a model on
// held-out text (or on random tokens) and the mean KL divergence of its next-token distribution
// from the float32-KV one, position by position. Every format's model is loaded at once (the
// weights are one mapping) and each text runs through all of them in the same prefill chunks, so
// later chunks attend to the quantized K/V of earlier ones as in serving.
//
//   kv_quality_bench --model DIR [--text FILE] [--random-tokens N --sequences S]
//                    [--formats f32,bf16,f16,fp8,int8,int4,int4-norot] [--chunk 64] [--threads N]
//
// --text: paragraphs separated by blank lines, each its own sequence (BOS added), tokenized with
// the model's tokenizer.json. --random-tokens: S sequences of N uniform token ids (a random-
// weight model has no text to predict: only the KL divergence is meaningful there).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/kv_format.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/flags.h"

namespace ember {
namespace {

struct Format {
  std::string name;
  KvCacheSpec spec;
};

Result<std::vector<Format>> ParseFormats(const std::string& list) {
  std::vector<Format> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    Format f{item, {}};
    std::string dtype = item;
    if (item == "int4-norot") {
      dtype = "int4";
      f.spec.rotate_int4 = false;
    }
    EMBER_ASSIGN_OR_RETURN(f.spec.dtype, ParseKvDType(dtype, "--formats"));
    out.push_back(f);
  }
  if (out.empty() || out[0].spec.dtype != KvDType::kF32)
    return Status::Error("--formats must start with f32 (the reference)");
  return out;
}

// log-softmax of one row, in double.
void LogSoftmax(const float* x, int64_t n, std::vector<double>& out) {
  out.resize(static_cast<size_t>(n));
  const double m = *std::max_element(x, x + n);
  double z = 0;
  for (int64_t i = 0; i < n; ++i) z += std::exp(x[i] - m);
  const double lz = m + std::log(z);
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = x[i] - lz;
}

struct Totals {
  double nll = 0, kl = 0;
  int64_t tokens = 0, top1_equal = 0;
};

int Run(int argc, char** argv) {
  std::string model_dir, text_file, formats_list = "f32,bf16,f16,fp8,int8,int4,int4-norot";
  int64_t random_tokens = 0, sequences = 4, chunk = 64, threads = 0;
  FlagParser flags("usage: kv_quality_bench --model DIR (--text FILE | --random-tokens N) ...");
  flags.AddString("--model", &model_dir, "model folder");
  flags.AddString("--text", &text_file, "held-out text: paragraphs separated by blank lines");
  flags.AddInt("--random-tokens", &random_tokens, "instead of text: sequences of N random ids");
  flags.AddInt("--sequences", &sequences, "random sequences (default 4)");
  flags.AddString("--formats", &formats_list, "KV formats, f32 first; int4-norot: int4 unrotated");
  flags.AddInt("--chunk", &chunk, "prefill chunk in tokens (default 64)");
  flags.AddInt("--threads", &threads, "CPU threads (0: all)");
  bool help = false;
  if (Status st = flags.Parse(argc, argv, 1, &help); !st.ok() || help) {
    std::fprintf(stderr, "%s\n%s", st.message().c_str(), flags.Help().c_str());
    return help ? 0 : 2;
  }
  auto formats = ParseFormats(formats_list);
  if (!formats.ok() || model_dir.empty() || chunk < 1 || (text_file.empty() == (random_tokens <= 0))) {
    std::fprintf(stderr, "kv_quality_bench: %s\n",
                 formats.ok() ? "--model and one of --text / --random-tokens are required"
                              : formats.message().c_str());
    return 2;
  }
  std::vector<std::unique_ptr<Model>> models;
  for (const Format& f : *formats) {
    ModelLoadOptions opts;
    opts.num_threads = static_cast<int32_t>(threads);
    opts.kv_cache = f.spec;
    auto m = Model::Load(model_dir, opts);
    if (!m.ok()) {
      std::fprintf(stderr, "kv_quality_bench: %s: %s\n", f.name.c_str(), m.message().c_str());
      return 1;
    }
    models.push_back(std::move(m).value());
  }
  const ModelConfig& c = models[0]->config();
  std::vector<std::vector<int32_t>> seqs;
  if (!text_file.empty()) {
    auto tok = Tokenizer::Load(model_dir);
    if (!tok.ok()) {
      std::fprintf(stderr, "kv_quality_bench: %s\n", tok.message().c_str());
      return 1;
    }
    std::ifstream in(text_file);
    std::string line, para;
    auto flush = [&] {
      if (!para.empty()) seqs.push_back((*tok)->Encode(para, true));
      para.clear();
    };
    while (std::getline(in, line)) {
      if (line.empty()) flush();
      else para += (para.empty() ? "" : "\n") + line;
    }
    flush();
  } else {
    std::mt19937 rng(42);
    for (int64_t s = 0; s < sequences; ++s) {
      std::vector<int32_t> ids(static_cast<size_t>(random_tokens));
      for (int32_t& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab_size));
      seqs.push_back(std::move(ids));
    }
  }
  size_t longest = 0;
  for (auto& s : seqs) {
    s.resize(std::min<size_t>(s.size(), static_cast<size_t>(c.max_position_embeddings)));
    longest = std::max(longest, s.size());
  }
  constexpr int32_t kBlock = 16;
  const int32_t num_blocks = static_cast<int32_t>((longest + kBlock - 1) / kBlock);
  for (auto& m : models) {
    if (Status st = m->AllocateKvCache(num_blocks, kBlock); !st.ok()) {
      std::fprintf(stderr, "kv_quality_bench: %s\n", st.message().c_str());
      return 1;
    }
  }
  std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
  for (int32_t b = 0; b < num_blocks; ++b) blocks[static_cast<size_t>(b)] = b;
  std::vector<Totals> totals(models.size());
  const int64_t vocab = c.vocab_size;
  std::vector<std::vector<float>> logits(models.size());
  std::vector<double> ref, lp;
  for (const std::vector<int32_t>& seq : seqs) {
    for (size_t at = 0; at + 1 < seq.size(); at += static_cast<size_t>(chunk)) {
      const size_t end = std::min(seq.size(), at + static_cast<size_t>(chunk));
      const std::vector<int32_t> part(seq.begin() + static_cast<std::ptrdiff_t>(at),
                                      seq.begin() + static_cast<std::ptrdiff_t>(end));
      BatchPlan plan;
      plan.block_size = kBlock;
      plan.AddSequence(part, static_cast<int32_t>(at), blocks, false);
      plan.logits_rows.clear();
      for (int32_t r = 0; r < static_cast<int32_t>(part.size()); ++r) plan.logits_rows.push_back(r);
      for (size_t m = 0; m < models.size(); ++m) {
        logits[m].resize(part.size() * static_cast<size_t>(vocab));
        if (Status st = models[m]->Forward(plan, logits[m]); !st.ok()) {
          std::fprintf(stderr, "kv_quality_bench: %s\n", st.message().c_str());
          return 1;
        }
      }
      for (size_t r = 0; r < part.size() && at + r + 1 < seq.size(); ++r) {
        const int32_t next = seq[at + r + 1];
        LogSoftmax(logits[0].data() + r * vocab, vocab, ref);
        const size_t top_ref = static_cast<size_t>(std::max_element(ref.begin(), ref.end()) - ref.begin());
        for (size_t m = 0; m < models.size(); ++m) {
          LogSoftmax(logits[m].data() + r * vocab, vocab, lp);
          Totals& t = totals[m];
          t.nll -= lp[static_cast<size_t>(next)];
          double kl = 0;
          for (int64_t i = 0; i < vocab; ++i)
            kl += std::exp(ref[static_cast<size_t>(i)]) * (ref[static_cast<size_t>(i)] - lp[static_cast<size_t>(i)]);
          t.kl += kl;
          t.top1_equal += static_cast<size_t>(std::max_element(lp.begin(), lp.end()) - lp.begin()) == top_ref;
          ++t.tokens;
        }
      }
    }
  }
  std::printf("%zu sequences, %lld predicted tokens, chunk %lld\n\n", seqs.size(),
              static_cast<long long>(totals[0].tokens), static_cast<long long>(chunk));
  std::printf("| KV format | bytes/token | perplexity | mean KL vs f32 (nats) | top-1 = f32 |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: |\n");
  for (size_t m = 0; m < models.size(); ++m) {
    const Totals& t = totals[m];
    const double n = static_cast<double>(std::max<int64_t>(t.tokens, 1));
    std::printf("| %s | %lld | %.4f | %.3g | %.2f%% |\n", (*formats)[m].name.c_str(),
                static_cast<long long>(models[m]->KvBytesPerToken()), std::exp(t.nll / n), t.kl / n,
                100.0 * static_cast<double>(t.top1_equal) / n);
  }
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) { return ember::Run(argc, argv); }
