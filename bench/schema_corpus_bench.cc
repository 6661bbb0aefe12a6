// schema_corpus_bench: what structured output costs over the schema corpus
// (tests/structured/schemas.jsonl) on a real vocabulary: the compile time of each schema
// (CompileJsonSchema: its automata included), and the time of every token mask (Allowed()) along a
// seeded random walk per schema (corpus_walk.h, the corpus test's walks), each walk with a fresh
// constraint (a request's cold cache). Prints mean / p50 / p99 / max per mask (wall clock, and
// the thread's CPU time: on a loaded machine the wall clock also counts other processes' turns)
// and the compile times' median / p99 / max.
//
//   schema_corpus_bench --tokenizer DIR [--corpus FILE] [--repeat N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling/corpus_walk.h"
#include "sampling/json_schema.h"
#include "tokenizer/tokenizer.h"
#include "util/flags.h"

namespace {

using Clock = std::chrono::steady_clock;

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * double(v.size())))];
}
double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_dir, corpus_path = "tests/structured/schemas.jsonl";
  int64_t repeat = 3, slowest = 0;
  ember::FlagParser flags(
      "usage: schema_corpus_bench --tokenizer DIR [--corpus FILE] [--repeat N]");
  flags.AddString("--tokenizer", &tokenizer_dir, "folder with tokenizer.json");
  flags.AddString("--corpus", &corpus_path, "schemas, one {name, schema} JSON per line");
  flags.AddInt("--repeat", &repeat, "compiles per schema (the median is kept)");
  flags.AddInt("--slowest", &slowest, "also list the N slowest masks (schema, step, text so far)");
  bool help = false;
  const ember::Status parsed = flags.Parse(argc, argv, 1, &help);
  if (const int status = flags.ExitStatusAfterParse(parsed, help); status >= 0) return status;
  if (tokenizer_dir.empty()) return std::fprintf(stderr, "--tokenizer is required\n"), 2;
  auto tokenizer = ember::Tokenizer::Load(tokenizer_dir);
  if (!tokenizer.ok()) return std::fprintf(stderr, "%s\n", tokenizer.message().c_str()), 1;
  std::vector<nlohmann::ordered_json> corpus;
  std::ifstream in(corpus_path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) corpus.push_back(nlohmann::ordered_json::parse(line));
  if (corpus.empty()) return std::fprintf(stderr, "no schemas in %s\n", corpus_path.c_str()), 1;

  const auto build_start = Clock::now();
  auto texts =
      ember::TokenTexts::Build((*tokenizer)->TokenBytesTable((*tokenizer)->vocab_size()));
  const double build_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - build_start).count();
  const ember::WalkBias bias = ember::WalkBias::For(*texts);

  std::vector<double> compile_us, mask_us, mask_cpu_us;
  struct Slow {
    double us;
    size_t schema;
    size_t step;
  };
  std::vector<Slow> slow;
  int finished = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    std::vector<double> times;
    std::shared_ptr<const ember::CompiledJsonSchema> compiled;
    for (int64_t r = 0; r < std::max<int64_t>(1, repeat); ++r) {
      const auto t0 = Clock::now();
      auto c = ember::CompileJsonSchema(corpus[i]["schema"], "schema");
      times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      if (!c.ok()) return std::fprintf(stderr, "%s\n", c.message().c_str()), 1;
      compiled = *c;
    }
    compile_us.push_back(Quantile(times, 0.5));
    auto constraint = ember::MakeJsonSchemaConstraint(texts, compiled);
    std::mt19937 rng(static_cast<uint32_t>(i * 7919 + 1));
    const ember::WalkResult walk = ember::RandomWalk(*constraint, *texts, bias, rng, true);
    if (walk.stranded || walk.refused) {
      return std::fprintf(stderr, "%s: the walk broke\n", corpus[i]["name"].dump().c_str()), 1;
    }
    finished += walk.done;
    mask_us.insert(mask_us.end(), walk.mask_us.begin(), walk.mask_us.end());
    mask_cpu_us.insert(mask_cpu_us.end(), walk.mask_cpu_us.begin(), walk.mask_cpu_us.end());
    for (size_t step = 0; step < walk.mask_cpu_us.size(); ++step)
      slow.push_back({walk.mask_cpu_us[step], i, step});
  }
  std::printf("vocab %d, %zu schemas (%d walks finished), TokenTexts::Build %.0f ms\n",
              (*tokenizer)->vocab_size(), corpus.size(), finished, build_ms);
  std::printf("  mask (wall): %zu masks, mean %.1f us, p50 %.1f us, p99 %.1f us, max %.1f us\n",
              mask_us.size(), Mean(mask_us), Quantile(mask_us, 0.5), Quantile(mask_us, 0.99),
              Quantile(mask_us, 1.0));
  std::printf("  mask (cpu):  %zu masks, mean %.1f us, p50 %.1f us, p99 %.1f us, max %.1f us\n",
              mask_cpu_us.size(), Mean(mask_cpu_us), Quantile(mask_cpu_us, 0.5),
              Quantile(mask_cpu_us, 0.99), Quantile(mask_cpu_us, 1.0));
  std::printf("  compile: median %.1f us, p99 %.1f us, max %.1f us (mean %.1f us)\n",
              Quantile(compile_us, 0.5), Quantile(compile_us, 0.99), Quantile(compile_us, 1.0),
              Mean(compile_us));
  std::sort(slow.begin(), slow.end(), [](const Slow& a, const Slow& b) { return a.us > b.us; });
  for (size_t k = 0; k < std::min<size_t>(slow.size(), static_cast<size_t>(slowest)); ++k)
    std::printf("  slow (cpu): %.0f us, %s, step %zu\n", slow[k].us,
                corpus[slow[k].schema]["name"].get<std::string>().c_str(), slow[k].step);
  return 0;
}
