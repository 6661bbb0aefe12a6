// Minimal leveled logging to stderr. Thread-safe (one write per line).
#pragma once

#include <sstream>
#include <string>

namespace ember {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void LogLine(LogLevel level, const std::string& line);

namespace internal {
class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage() { LogLine(level_, stream_.str()); }
  template <typename T>
  LogMessage& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal

}  // namespace ember

#define EMBER_LOG(level)                                            \
  if (::ember::LogLevel::level < ::ember::GetLogLevel()) {          \
  } else                                                            \
    ::ember::internal::LogMessage(::ember::LogLevel::level)
#define LOG_INFO EMBER_LOG(kInfo)
#define LOG_WARN EMBER_LOG(kWarning)
#define LOG_ERROR EMBER_LOG(kError)
#define LOG_DEBUG EMBER_LOG(kDebug)
