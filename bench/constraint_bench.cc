// constraint_bench: what a structured-output token mask costs per generated token. Walks a
// document's tokens through a constraint (JSON mode, a JSON schema, or a GBNF grammar) over a
// real tokenizer's vocabulary and times Allowed() at every step twice: cold (a fresh constraint,
// so the mask cache is empty: the full walk of the vocabulary; for a grammar, also its per-element
// local masks) and warm (the one constraint of the whole walk, whose caches hold what was seen
// before). Also the schema's or grammar's compile time (median of 9; for a grammar, with its
// class vocabulary, gbnf_constraint.cc). With a grammar and
// --document2, a second request with the same grammar (through GbnfCache, as the server shares
// it: the first request's automaton and local masks) writes that other text, timed the same way.
//
//   constraint_bench --tokenizer DIR [--schema FILE | --grammar FILE [--document2 FILE]]
//                    [--document FILE]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling/gbnf_constraint.h"
#include "sampling/json_constraint.h"
#include "sampling/json_schema.h"
#include "tokenizer/tokenizer.h"
#include "util/flags.h"
#include "util/mapped_file.h"

namespace {

using Clock = std::chrono::steady_clock;

const char* kDocument =
    R"({"title": "Weekly report — Zürich office", "tags": ["sales", "北京", "naïve", "emoji 👍"],
  "n": 42, "items": [{"name": "widget", "price": 12.5, "ok": true}, {"name": "gadget", "price": -3e2, "ok": false}],
  "note": "Line one\nLine two with \"quotes\" and a \\ backslash", "empty": null})";

struct Stats {
  double mean_ms = 0, median_ms = 0, p99_ms = 0, max_ms = 0;
};
Stats Summarize(std::vector<double> ms) {
  Stats s;
  if (ms.empty()) return s;
  for (double v : ms) s.mean_ms += v / double(ms.size());
  std::sort(ms.begin(), ms.end());
  s.median_ms = ms[ms.size() / 2];
  s.p99_ms = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  s.max_ms = ms.back();
  return s;
}

double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

// Times one Allowed(): wall and thread CPU (which a loaded machine's other work does not inflate).
int64_t TimedAllowed(ember::TokenConstraint& c, std::vector<uint8_t>& allowed,
                     std::vector<double>* wall_ms, std::vector<double>* cpu_ms) {
  const auto t0 = Clock::now();
  const double cpu0 = ThreadCpuMs();
  const int64_t count = c.Allowed(allowed);
  cpu_ms->push_back(ThreadCpuMs() - cpu0);
  wall_ms->push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  return count;
}

void Print(const char* what, const std::vector<double>& wall, const std::vector<double>& cpu) {
  const Stats w = Summarize(wall), c = Summarize(cpu);
  std::printf("  %s: mean %.1f us, p50 %.1f us, p99 %.1f us, max %.1f us per mask (wall); "
              "thread CPU mean %.1f, p50 %.1f, p99 %.1f us\n",
              what, w.mean_ms * 1e3, w.median_ms * 1e3, w.p99_ms * 1e3, w.max_ms * 1e3,
              c.mean_ms * 1e3, c.median_ms * 1e3, c.p99_ms * 1e3);
}

// The median of 9 runs of `compile`, in µs: wall, and thread CPU in *cpu_us.
template <typename F>
double CompileMicros(F compile, double* cpu_us) {
  std::vector<double> us, cpu;
  for (int i = 0; i < 9; ++i) {
    const auto t0 = Clock::now();
    const double cpu0 = ThreadCpuMs();
    compile();
    cpu.push_back((ThreadCpuMs() - cpu0) * 1e3);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  std::sort(cpu.begin(), cpu.end());
  *cpu_us = cpu[cpu.size() / 2];
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_dir, schema_path, grammar_path, document_path, document2_path;
  ember::FlagParser flags("usage: constraint_bench --tokenizer DIR [--schema FILE | --grammar FILE] "
                          "[--document FILE]");
  flags.AddString("--tokenizer", &tokenizer_dir, "folder with tokenizer.json");
  flags.AddString("--schema", &schema_path, "JSON schema file (default: JSON mode)");
  flags.AddString("--grammar", &grammar_path, "GBNF grammar file (default: JSON mode)");
  flags.AddString("--document", &document_path, "the JSON text to walk (default: a built-in one)");
  flags.AddString("--document2", &document2_path, "with --grammar: a second request's text");
  bool help = false;
  const ember::Status parsed = flags.Parse(argc, argv, 1, &help);
  if (const int status = flags.ExitStatusAfterParse(parsed, help); status >= 0) return status;
  if (tokenizer_dir.empty()) {
    std::fprintf(stderr, "--tokenizer is required\n");
    return 2;
  }
  auto tokenizer = ember::Tokenizer::Load(tokenizer_dir);
  if (!tokenizer.ok()) return std::fprintf(stderr, "%s\n", tokenizer.message().c_str()), 1;
  std::string document = kDocument;
  if (!document_path.empty()) {
    auto text = ember::ReadFileToString(document_path);
    if (!text.ok()) return std::fprintf(stderr, "%s\n", text.message().c_str()), 1;
    document = *text;
  }
  const auto build_start = Clock::now();
  auto texts =
      ember::TokenTexts::Build((*tokenizer)->TokenBytesTable((*tokenizer)->vocab_size()));
  const double build_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - build_start).count();

  std::shared_ptr<const ember::CompiledJsonSchema> schema;
  std::shared_ptr<const ember::GbnfGrammar> grammar;
  std::string grammar_text;
  ember::GbnfCache grammars(texts, {});
  double compile_us = 0, compile_cpu_us = 0;
  if (!schema_path.empty()) {
    auto text = ember::ReadFileToString(schema_path);
    if (!text.ok()) return std::fprintf(stderr, "%s\n", text.message().c_str()), 1;
    const auto parsed = nlohmann::ordered_json::parse(*text);
    auto compiled = ember::CompileJsonSchema(parsed, "schema");
    if (!compiled.ok()) return std::fprintf(stderr, "%s\n", compiled.message().c_str()), 1;
    schema = *compiled;
    compile_us = CompileMicros([&] { (void)ember::CompileJsonSchema(parsed, "schema"); },
                               &compile_cpu_us);
  } else if (!grammar_path.empty()) {
    auto text = ember::ReadFileToString(grammar_path);
    if (!text.ok()) return std::fprintf(stderr, "%s\n", text.message().c_str()), 1;
    auto compiled = ember::ParseGbnf(*text, "grammar");
    if (!compiled.ok()) return std::fprintf(stderr, "%s\n", compiled.message().c_str()), 1;
    grammar = *compiled;
    grammar_text = *text;
    // A request compiles the grammar and builds its constraint (the automaton's start state).
    compile_us = CompileMicros(
        [&] {
          auto g = ember::ParseGbnf(*text, "grammar");
          (void)ember::MakeGbnfConstraint(texts, *g, {});
        },
        &compile_cpu_us);
  }
  auto fresh = [&]() -> std::shared_ptr<ember::TokenConstraint> {
    if (schema) return ember::MakeJsonSchemaConstraint(texts, schema);
    if (grammar) return ember::MakeGbnfConstraint(texts, grammar, {});
    return std::make_shared<ember::JsonObjectConstraint>(texts);
  };
  const std::vector<int32_t> ids = (*tokenizer)->Encode(document, /*add_special_tokens=*/false);
  std::shared_ptr<ember::TokenConstraint> warm =
      grammar ? *grammars.Constraint(grammar_text, "grammar") : fresh();
  std::vector<uint8_t> allowed;
  std::vector<double> cold_ms, warm_ms, cold_cpu, warm_cpu;
  int64_t allowed_sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::shared_ptr<ember::TokenConstraint> cold = fresh();
    for (size_t j = 0; j < i; ++j) cold->Accept(ids[j]);
    TimedAllowed(*cold, allowed, &cold_ms, &cold_cpu);
    allowed_sum += TimedAllowed(*warm, allowed, &warm_ms, &warm_cpu);
    if (!allowed[static_cast<size_t>(ids[i])] || !warm->Accept(ids[i])) {
      std::fprintf(stderr, "token %zu (id %d) of the document is not allowed: is it valid?\n", i,
                   ids[i]);
      return 1;
    }
  }
  // A second request with the same grammar, writing another text.
  std::vector<double> second_ms, second_cpu;
  if (grammar && !document2_path.empty()) {
    auto text = ember::ReadFileToString(document2_path);
    if (!text.ok()) return std::fprintf(stderr, "%s\n", text.message().c_str()), 1;
    auto second = *grammars.Constraint(grammar_text, "grammar");
    for (int32_t id : (*tokenizer)->Encode(*text, /*add_special_tokens=*/false)) {
      TimedAllowed(*second, allowed, &second_ms, &second_cpu);
      if (!allowed[static_cast<size_t>(id)] || !second->Accept(id))
        return std::fprintf(stderr, "--document2: token id %d is not allowed\n", id), 1;
    }
  }
  std::printf("vocab %d, %zu document tokens, %s; TokenTexts::Build %.1f ms; mean allowed %.0f; "
              "compile %.1f us (thread CPU %.1f us)\n",
              (*tokenizer)->vocab_size(), ids.size(),
              schema ? "JSON schema" : grammar ? "GBNF grammar" : "JSON mode", build_ms,
              double(allowed_sum) / double(std::max<size_t>(1, ids.size())), compile_us,
              compile_cpu_us);
  Print("cold (no cache)", cold_ms, cold_cpu);
  Print("warm (cached)  ", warm_ms, warm_cpu);
  if (!second_ms.empty()) {
    std::printf("  second request: %zu tokens\n", second_ms.size());
    Print("second request ", second_ms, second_cpu);
  }
  return 0;
}
