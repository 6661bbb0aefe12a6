// hash_bench: SHA-256 (SHA-NI where the CPU has it, and the portable compression) and CRC-32C
// throughput over one 64 MiB buffer, the speeds util/sha256.h and util/crc32c.h state. Results
// go to docs/perf.md with the machine, the command and the date.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "util/crc32c.h"
#include "util/sha256.h"

namespace {

template <typename F>
double MegabytesPerSecond(size_t bytes, F&& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(bytes) / s / 1e6;
}

}  // namespace

int main() {
  std::vector<uint8_t> data(64 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 + 7);
  volatile uint32_t sink = 0;  // keeps the work observable
  for (bool hardware : {true, false}) {
    ember::Sha256::AllowHardwareForTesting(hardware);
    const double mbs = MegabytesPerSecond(data.size(), [&] {
      sink = sink + ember::Sha256().Update(data).Finish()[0];
    });
    std::printf("sha256 %-9s %8.0f MB/s\n", hardware ? "(default)" : "portable", mbs);
  }
  const double crc = MegabytesPerSecond(data.size(), [&] { sink = sink + ember::Crc32c(data); });
  std::printf("crc32c            %8.0f MB/s\n", crc);
  return 0;
}
