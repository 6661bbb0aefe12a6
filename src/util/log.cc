#include "util/log.h"

#include <atomic>
#include <cstdio>

namespace ember {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
const char* LevelTag(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "D";
    case LogLevel::kInfo: return "I";
    case LogLevel::kWarning: return "W";
    case LogLevel::kError: return "E";
  }
  return "?";
}
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

void LogLine(LogLevel level, const std::string& line) {
  std::string out = std::string("[ember ") + LevelTag(level) + "] " + line + "\n";
  std::fwrite(out.data(), 1, out.size(), stderr);
}

}  // namespace ember
