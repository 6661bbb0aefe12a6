// NowNs: the engine's one clock (steady_clock nanoseconds) for TokenEvent::time_ns and the
// EngineStats timers. Any thread.
#pragma once

#include <chrono>
#include <cstdint>

namespace ember {

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace ember
