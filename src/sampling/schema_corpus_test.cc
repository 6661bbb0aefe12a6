// The structured-output schema corpus (tests/structured/schemas.jsonl, make_corpus.mjs) on real
// vocabularies (the fixtures' llama3 and qwen3 tokenizers): every schema compiles; a seeded
// random walk through the allowed tokens never strands (Allowed() > 0 until Done()), every
// accepted token is one it allowed, and each finished text parses as JSON. With
// EMBER_CORPUS_OUTPUTS set, the texts are written there (JSON lines {name, tokenizer, text}) for
// the independent validator (ajv, tests/server/structured_corpus.mjs).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "sampling/corpus_walk.h"
#include "sampling/json_schema.h"
#include "tokenizer/tokenizer.h"
#include "util/testing.h"

namespace ember {
namespace {

using json = nlohmann::ordered_json;

std::vector<json> ReadCorpus() {
  std::vector<json> out;
  std::ifstream in(EMBER_SCHEMA_CORPUS);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

TEST(SchemaCorpusTest, RandomWalksOnRealVocabulariesFinishAsJson) {
  const std::vector<json> corpus = ReadCorpus();
  ASSERT_GE(corpus.size(), 300u) << EMBER_SCHEMA_CORPUS;
  const char* out_path = std::getenv("EMBER_CORPUS_OUTPUTS");
  std::ofstream out;
  if (out_path != nullptr && *out_path != '\0') out.open(out_path);
  for (const char* name : {"llama3", "qwen3"}) {
    SCOPED_TRACE(name);
    const std::string dir = testing::TokenizersDir() + "/" + name;
    EMBER_REQUIRE_DIR(dir);
    auto tok = Tokenizer::Load(dir);
    ASSERT_TRUE(tok.ok()) << tok.message();
    auto texts = TokenTexts::Build((*tok)->TokenBytesTable((*tok)->vocab_size()));
    const WalkBias bias = WalkBias::For(*texts);
    int finished = 0;
    for (size_t i = 0; i < corpus.size(); ++i) {
      const std::string schema_name = corpus[i]["name"].get<std::string>();
      SCOPED_TRACE(schema_name);
      auto compiled = CompileJsonSchema(corpus[i]["schema"], "schema");
      ASSERT_TRUE(compiled.ok()) << compiled.message();
      auto constraint = MakeJsonSchemaConstraint(texts, *compiled);
      std::mt19937 rng(static_cast<uint32_t>(i * 7919 + name[0]));
      const WalkResult walk = RandomWalk(*constraint, *texts, bias, rng, /*time_masks=*/false);
      ASSERT_FALSE(walk.stranded) << "no token allowed after " << walk.text;
      ASSERT_FALSE(walk.refused) << "an allowed token refused after " << walk.text;
      ASSERT_FALSE(walk.miscounted)
          << "Allowed()'s count differs from its mask after " << walk.text;
      if (!walk.done) continue;
      ++finished;
      EXPECT_FALSE(json::parse(walk.text, nullptr, false).is_discarded()) << walk.text;
      if (out.is_open())
        out << json{{"name", schema_name}, {"tokenizer", name}, {"text", walk.text}}.dump() << "\n";
    }
    // Seeded walks: the count is reproducible; most finish within the step budget.
    EXPECT_GE(finished, static_cast<int>(corpus.size() * 9 / 10));
    std::printf("%s: %d of %zu walks finished\n", name, finished, corpus.size());
  }
}

}  // namespace
}  // namespace ember
