// Test-only: opens one reference tokenizer's chat goldens for the template tests — its
// golden.json (from the fixtures) and its tokenizer folder (fetched into .cache/tokenizers).
// Skips the calling test, naming the path, when either is absent; callers return when
// ::testing::Test::IsSkipped() or HasFatalFailure().
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "util/mapped_file.h"
#include "util/testing.h"

namespace ember::testing {

struct TemplateGolden {
  std::string model_dir;          // tokenizer.json, tokenizer_config.json, chat template
  nlohmann::ordered_json golden;  // golden.json, keys in file order
};

inline void LoadTemplateGolden(const std::string& name, TemplateGolden* out) {
  const std::string golden_path = FixturesDir() + "/tokenizers/" + name;
  out->model_dir = TokenizersDir() + "/" + name;
  EMBER_REQUIRE_DIR(golden_path);
  EMBER_REQUIRE_DIR(out->model_dir);
  auto text = ReadFileToString(golden_path + "/golden.json");
  ASSERT_TRUE(text.ok()) << text.message();
  out->golden = nlohmann::ordered_json::parse(*text);
}

}  // namespace ember::testing
