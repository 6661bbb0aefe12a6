// The release version of Ember, one constant for every place that reports it (`ember --version`,
// `/v1/models`, the startup log). Bumped by hand with each release.
#pragma once

namespace ember {

inline constexpr const char* kEmberVersion = "0.2.0";

}  // namespace ember
