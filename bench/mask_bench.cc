// mask_bench: the host time one engine step spends on structured-output masks at batch size
// --rows (default 128). Each row is its own request (its own constraint and mask cache, as the
// server builds them) at a realistic state: a position drawn at random in a document valid under
// --schema (the built-in documents fit bench/schemas/fixed_keys.json) where a token is sampled
// (more than one allowed: jump-forward fills the others), over a real tokenizer's vocabulary. Per
// step, with the rows spread over --threads helpers as the engine spreads them:
//   probe: the jump-forward check after a token was accepted (TokenConstraint::ForcedToken: a
//          cold walk of the vocabulary, whose mask the request's cache keeps);
//   build: StepBuilder::BuildMasks' masks for rows the backend samples (greedy or backend-sampled
//          rows without logprobs), after the probe (a cache hit);
//   cold:  the same masks for fresh rows without a probe first (--no-jump-forward, first tokens).
// Printed per phase: wall time per step (median and mean over --steps steps) and the thread CPU
// time per row (summed over the helpers, which a loaded machine inflates less than wall time).
//
//   mask_bench --tokenizer DIR --schema FILE [--documents FILE] [--rows N] [--steps N]
//              [--threads N]
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling/json_constraint.h"
#include "sampling/json_schema.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"
#include "util/flags.h"
#include "util/mapped_file.h"
#include "util/worker_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

// Documents valid under bench/schemas/fixed_keys.json (keys in schema order).
const char* kDocuments[] = {
    R"({"name": "Ann", "age": 31, "city": "Paris", "happy": true, "pet": "cat"})",
    R"({"name": "Bob Ray", "age": 7, "city": "London", "happy": false, "pet": "dog"})",
    R"({"name": "Zoë", "age": 99, "city": "Berlin", "happy": true, "pet": "dog"})",
    R"({"name": "J. Smith", "age": 0, "city": "London", "happy": false, "pet": "cat"})",
    R"({"name": "Kim", "age": 42, "city": "Paris", "happy": false, "pet": "dog"})",
    R"({"name": "Li Wei", "age": 18, "city": "Berlin", "happy": true, "pet": "cat"})",
    R"({"name": "O'Neil", "age": 65, "city": "Paris", "happy": true, "pet": "cat"})",
    R"({"name": "Maria", "age": 23, "city": "London", "happy": true, "pet": "dog"})",
};

double ThreadCpuUs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) * 1e-3;
}

// The engine's rule (step_builder.cc MaxMaskEdits): a backend-sampled row's masked ids are
// listed (kMask edits) up to one 16-byte edit per 4 bytes of bits.
int64_t MaxMaskEdits(int32_t vocab_size) {
  return (int64_t{vocab_size} + 31) / 32 * 4 / 16;
}

struct Phase {
  std::vector<double> wall_us;  // per step
  double cpu_us = 0;            // summed over rows
  int64_t rows = 0;
  void Print(const char* name) const {
    std::vector<double> w = wall_us;
    std::sort(w.begin(), w.end());
    double mean = 0;
    for (double v : w) mean += v / double(w.size());
    std::printf(
        "  %s: %.0f us per step (median; mean %.0f, min %.0f, max %.0f); thread CPU %.1f "
        "us per row\n",
        name, w[w.size() / 2], mean, w.front(), w.back(), cpu_us / double(rows));
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_dir, schema_path, documents_path;
  int64_t rows = 128, steps = 20;
  int64_t threads = std::thread::hardware_concurrency() / 2;
  ember::FlagParser flags(
      "usage: mask_bench --tokenizer DIR --schema FILE [--documents FILE] [--rows N] "
      "[--steps N] [--threads N]");
  flags.AddString("--tokenizer", &tokenizer_dir, "folder with tokenizer.json");
  flags.AddString("--schema", &schema_path, "JSON schema file");
  flags.AddString("--documents", &documents_path,
                  "documents valid under the schema, one per line (default: built-in ones for "
                  "bench/schemas/fixed_keys.json)");
  flags.AddInt("--rows", &rows, "constrained rows per step");
  flags.AddInt("--steps", &steps, "steps timed");
  flags.AddInt("--threads", &threads, "helper threads (default: the engine's, half the cores)");
  bool help = false;
  const ember::Status parsed = flags.Parse(argc, argv, 1, &help);
  if (const int status = flags.ExitStatusAfterParse(parsed, help); status >= 0) return status;
  if (tokenizer_dir.empty() || schema_path.empty() || rows < 1 || steps < 1) {
    std::fprintf(stderr, "--tokenizer and --schema are required; --rows, --steps >= 1\n");
    return 2;
  }
  threads = std::max<int64_t>(threads, 1);
  auto tokenizer = ember::Tokenizer::Load(tokenizer_dir);
  if (!tokenizer.ok()) return std::fprintf(stderr, "%s\n", tokenizer.message().c_str()), 1;
  auto texts = ember::TokenTexts::Build((*tokenizer)->TokenBytesTable((*tokenizer)->vocab_size()));
  auto schema_text = ember::ReadFileToString(schema_path);
  if (!schema_text.ok()) return std::fprintf(stderr, "%s\n", schema_text.message().c_str()), 1;
  auto schema = ember::CompileJsonSchema(nlohmann::ordered_json::parse(*schema_text), "schema");
  if (!schema.ok()) return std::fprintf(stderr, "%s\n", schema.message().c_str()), 1;
  std::vector<std::string> documents(std::begin(kDocuments), std::end(kDocuments));
  if (!documents_path.empty()) {
    auto text = ember::ReadFileToString(documents_path);
    if (!text.ok()) return std::fprintf(stderr, "%s\n", text.message().c_str()), 1;
    documents.clear();
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);)
      if (!line.empty()) documents.push_back(line);
  }
  // Each document's tokens and the positions where a row samples (more than one token allowed:
  // jump-forward fills the others).
  struct Document {
    std::vector<int32_t> ids;
    std::vector<size_t> sampled;
  };
  std::vector<Document> docs;
  for (const std::string& d : documents) {
    Document doc;
    doc.ids = (*tokenizer)->Encode(d, /*add_special_tokens=*/false);
    auto walk = ember::MakeJsonSchemaConstraint(texts, *schema);
    for (size_t pos = 0; pos < doc.ids.size(); ++pos) {
      if (walk->ForcedToken() < 0) doc.sampled.push_back(pos);
      if (!walk->Accept(doc.ids[pos]))
        return std::fprintf(stderr, "a document is not valid under the schema: %s\n", d.c_str()), 1;
    }
    docs.push_back(std::move(doc));
  }

  // A row: a fresh request's constraint (its mask cache empty) at a sampled position.
  std::mt19937 rng(42);
  auto make_rows = [&] {
    std::vector<std::shared_ptr<ember::TokenConstraint>> out;
    for (int64_t r = 0; r < rows; ++r) {
      const Document& doc = docs[rng() % docs.size()];
      const size_t pos = doc.sampled[rng() % doc.sampled.size()];
      out.push_back(ember::MakeJsonSchemaConstraint(texts, *schema));
      for (size_t j = 0; j < pos; ++j) out.back()->Accept(doc.ids[j]);
    }
    return out;
  };
  // The rows over the helpers (the engine's pool); each row's thread CPU time is added to
  // *cpu_us.
  ember::WorkerPool helpers(static_cast<size_t>(threads));
  auto run = [&](size_t n, double* cpu_us, auto fn) {
    std::atomic<int64_t> cpu_ns{0};
    const auto t0 = Clock::now();
    helpers.ForEach(n, [&](size_t i) {
      const double c0 = ThreadCpuUs();
      fn(i);
      cpu_ns += static_cast<int64_t>((ThreadCpuUs() - c0) * 1e3);
    });
    const double wall = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    *cpu_us += double(cpu_ns.load()) * 1e-3;
    return wall;
  };

  Phase probe, build, cold;
  int64_t allowed_sum = 0, bits_rows = 0;
  std::vector<ember::TokenMask> masks(static_cast<size_t>(rows));
  const int64_t max_edits = MaxMaskEdits((*tokenizer)->vocab_size());
  for (int64_t step = 0; step < steps; ++step) {
    auto probed = make_rows();
    auto fresh = make_rows();
    probe.wall_us.push_back(
        run(probed.size(), &probe.cpu_us, [&](size_t i) { (void)probed[i]->ForcedToken(); }));
    build.wall_us.push_back(run(probed.size(), &build.cpu_us, [&](size_t i) {
      masks[i].Build(*probed[i], ember::TokenMask::Form::kBits, max_edits);
    }));
    for (const ember::TokenMask& m : masks) {
      allowed_sum += m.num_allowed;
      bits_rows += !m.masked_listed();
    }
    cold.wall_us.push_back(run(fresh.size(), &cold.cpu_us, [&](size_t i) {
      masks[i].Build(*fresh[i], ember::TokenMask::Form::kBits, max_edits);
    }));
    probe.rows += rows;
    build.rows += rows;
    cold.rows += rows;
  }
  std::printf(
      "vocab %d, %zu documents, %ld rows x %ld steps, %ld helper threads; mean allowed %.0f, "
      "%.0f%% of rows as bits (the others as kMask edits)\n",
      (*tokenizer)->vocab_size(), documents.size(), rows, steps, threads,
      double(allowed_sum) / double(build.rows), 100.0 * double(bits_rows) / double(build.rows));
  probe.Print("probe (ForcedToken, cold)");
  build.Print("build (after the probe)  ");
  cold.Print("build (cold)             ");
  return 0;
}
