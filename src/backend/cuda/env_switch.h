// Switches read from the environment for A/B measurements (host code only).
#pragma once

#include <cstdlib>
#include <cstring>

namespace ember::cuda {

// True unless the variable `name` is set to "0": a switch that is on by default. Callers keep
// the answer in a function-local static (the environment is read once).
inline bool EnvSwitchOn(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

}  // namespace ember::cuda
