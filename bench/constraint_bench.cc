// constraint_bench: what a structured-output token mask costs per generated token. Walks a JSON
// document's tokens through a constraint (JSON mode, or a JSON schema) over a real tokenizer's
// vocabulary and times Allowed() at every step twice: cold (a fresh constraint, so the mask
// cache is empty: the full walk of the vocabulary) and warm (the one constraint of the whole
// walk, whose cache holds the states seen before).
//
//   constraint_bench --tokenizer DIR [--schema FILE] [--document FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
  double mean_ms = 0, median_ms = 0, max_ms = 0;
};
Stats Summarize(std::vector<double> ms) {
  Stats s;
  if (ms.empty()) return s;
  for (double v : ms) s.mean_ms += v / double(ms.size());
  std::sort(ms.begin(), ms.end());
  s.median_ms = ms[ms.size() / 2];
  s.max_ms = ms.back();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_dir, schema_path, document_path;
  ember::FlagParser flags(
      "usage: constraint_bench --tokenizer DIR [--schema FILE] [--document FILE]");
  flags.AddString("--tokenizer", &tokenizer_dir, "folder with tokenizer.json");
  flags.AddString("--schema", &schema_path, "JSON schema file (default: JSON mode)");
  flags.AddString("--document", &document_path, "the JSON text to walk (default: a built-in one)");
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
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>((*tokenizer)->vocab_size()));
  for (int32_t id = 0; id < (*tokenizer)->vocab_size(); ++id)
    bytes[static_cast<size_t>(id)] = (*tokenizer)->TokenBytes(id);
  auto texts = ember::TokenTexts::Build(std::move(bytes));
  const double build_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - build_start).count();

  std::shared_ptr<const ember::CompiledJsonSchema> schema;
  if (!schema_path.empty()) {
    auto text = ember::ReadFileToString(schema_path);
    if (!text.ok()) return std::fprintf(stderr, "%s\n", text.message().c_str()), 1;
    auto compiled = ember::CompileJsonSchema(nlohmann::ordered_json::parse(*text), "schema");
    if (!compiled.ok()) return std::fprintf(stderr, "%s\n", compiled.message().c_str()), 1;
    schema = *compiled;
  }
  auto fresh = [&]() -> std::shared_ptr<ember::TokenConstraint> {
    if (schema) return ember::MakeJsonSchemaConstraint(texts, schema);
    return std::make_shared<ember::JsonObjectConstraint>(texts);
  };
  const std::vector<int32_t> ids = (*tokenizer)->Encode(document, /*add_special_tokens=*/false);
  std::shared_ptr<ember::TokenConstraint> warm = fresh();
  std::vector<uint8_t> allowed;
  std::vector<double> cold_ms, warm_ms;
  int64_t allowed_sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::shared_ptr<ember::TokenConstraint> cold = fresh();
    for (size_t j = 0; j < i; ++j) cold->Accept(ids[j]);
    auto t0 = Clock::now();
    cold->Allowed(allowed);
    cold_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    t0 = Clock::now();
    allowed_sum += warm->Allowed(allowed);
    warm_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (!allowed[static_cast<size_t>(ids[i])] || !warm->Accept(ids[i])) {
      std::fprintf(stderr, "token %zu (id %d) of the document is not allowed: is it valid?\n", i,
                   ids[i]);
      return 1;
    }
  }
  const Stats cold = Summarize(cold_ms), hot = Summarize(warm_ms);
  std::printf("vocab %d, %zu document tokens, %s; TokenTexts::Build %.1f ms; mean allowed %.0f\n",
              (*tokenizer)->vocab_size(), ids.size(), schema ? "JSON schema" : "JSON mode",
              build_ms, double(allowed_sum) / double(std::max<size_t>(1, ids.size())));
  std::printf("  cold (no cache): mean %.3f ms, median %.3f ms, max %.3f ms per token\n",
              cold.mean_ms, cold.median_ms, cold.max_ms);
  std::printf("  warm (cached):   mean %.3f ms, median %.3f ms, max %.3f ms per token\n",
              hot.mean_ms, hot.median_ms, hot.max_ms);
  return 0;
}
