// Test helpers: where the reference goldens live. EMBER_FIXTURES overrides the fixtures folder
// (default: ../shared/fixtures beside the source tree); EMBER_TOKENIZERS overrides the folder the
// setup script fetched the real tokenizers into (default: .cache/tokenizers). Tests only.
#pragma once

#include <string>

namespace ember::testing {

// The fixtures folder (may not exist: callers GTEST_SKIP with its path).
std::string FixturesDir();
// The fetched tokenizers folder (may not exist).
std::string TokenizersDir();
bool DirExists(const std::string& path);

}  // namespace ember::testing

// Skips the current test, naming the path, when a fixture directory is absent.
#define EMBER_REQUIRE_DIR(path)                                                         \
  do {                                                                                  \
    if (!::ember::testing::DirExists(path))                                             \
      GTEST_SKIP() << "fixture not found: " << (path)                                   \
                   << " (set EMBER_FIXTURES / EMBER_TOKENIZERS or run scripts/setup.sh)"; \
  } while (0)
