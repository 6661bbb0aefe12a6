#include "util/testing.h"

#include <sys/stat.h>

#include <cstdlib>

namespace ember::testing {

std::string FixturesDir() {
  const char* env = std::getenv("EMBER_FIXTURES");
  return env != nullptr && *env != '\0' ? env : EMBER_FIXTURES_DEFAULT;
}

std::string TokenizersDir() {
  const char* env = std::getenv("EMBER_TOKENIZERS");
  return env != nullptr && *env != '\0' ? env : EMBER_TOKENIZERS_DEFAULT;
}

bool DirExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace ember::testing
