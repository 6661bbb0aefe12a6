#!/usr/bin/env bash
# test.sh [--sanitize]: builds (see build.sh) and runs the whole test suite with CTest.
# Tests read the goldens from ../shared/fixtures (override: EMBER_FIXTURES) and the fetched
# tokenizers from .cache/tokenizers (override: EMBER_TOKENIZERS); absent ones are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh "$@"
dir=build/release
[ "${1:-}" = "--sanitize" ] && dir=build/asan
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cd "$dir"
ctest --output-on-failure -j "$(nproc)"
