#!/usr/bin/env bash
# build.sh [--sanitize] [--debug]: configures and builds Ember with CMake + Ninja (ccache when
# present). Release build in build/release (the `ember` binary is build/release/ember);
# --sanitize builds the ASan/UBSan variant in build/asan. The CUDA backend is built whenever
# nvcc is found.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build/release; args=(-DCMAKE_BUILD_TYPE=Release)
for a in "$@"; do
  case "$a" in
    --sanitize) dir=build/asan; args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_SANITIZE=ON -DEMBER_CUDA=OFF) ;;
    --debug) dir=build/debug; args=(-DCMAKE_BUILD_TYPE=Debug) ;;
    *) echo "build.sh: unknown option $a" >&2; exit 2 ;;
  esac
done
cmake -S . -B "$dir" -G Ninja "${args[@]}" >/dev/null
cmake --build "$dir" -j "$(nproc)"
