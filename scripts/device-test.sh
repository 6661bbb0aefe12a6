#!/usr/bin/env bash
# device-test.sh: the GPU tests and benchmarks in one go.
#   scripts/device-test.sh --stage   on the build machine: builds the GPU binaries ($STAGE_BUILD,
#                                    default build/cuda-dev)
#                                    and stages them, the non-system .so files they need and the
#                                    small fixture models into .devbin/ (git-ignored).
#   scripts/device-test.sh OUTDIR    on the GPU machine (CUDA 13 toolkit, no Debian libraries):
#                                    runs everything staged in .devbin/ and writes logs and
#                                    summary.txt to OUTDIR. Stages first when .devbin/ is absent.
# Env: BENCH=0 skips the benchmarks; SANITIZER=1 also runs the op tests under compute-sanitizer.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

stage() {
  set -e
  local build=${STAGE_BUILD:-build/cuda-dev}
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_CUDA=ON >/dev/null
  local targets=(cuda_ops_test cuda_forward_bench)
  cmake --build "$build" --target "${targets[@]}" -j2
  rm -rf .devbin && mkdir -p .devbin/bin .devbin/lib .devbin/fixtures
  cp "$build/src/backend/cuda/cuda_ops_test" "$build/bench/cuda_forward_bench" .devbin/bin/
  # The CUDA backend module: ember, model_test and engine_bench load it from their own folder.
  cmake --build "$build" --target ember_cuda -j2 && cp "$build/libember_cuda.so" .devbin/bin/
  # Libraries outside glibc/libstdc++ and the CUDA toolkit (the GPU machine has those).
  for bin in .devbin/bin/*; do
    ldd "$bin" | awk '/=> \//{print $3}' | grep -vE 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libpthread|libdl|librt|/cuda' |
      xargs -r -I{} cp -L {} .devbin/lib/ || true
  done
  local fixtures=${EMBER_FIXTURES:-$root/../shared/fixtures}
  for m in llama3 qwen2 qwen3 mistral gemma2 gemma3 phi3 tinystories-656k; do
    [ -d "$fixtures/models/$m" ] && cp -r "$fixtures/models/$m" .devbin/fixtures/
  done
  du -sh .devbin
}

if [ "${1:-}" = "--stage" ]; then stage; exit $?; fi
out=${1:?usage: scripts/device-test.sh --stage | OUTDIR}
mkdir -p "$out"
[ -x .devbin/bin/cuda_ops_test ] || stage
cublas_dir=$(dirname "$(ls /usr/local/cuda/lib64/libcublas.so.13 /usr/local/cuda*/lib*/libcublas.so.13 \
  2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$root/.devbin/lib:${cublas_dir:-/usr/local/cuda/lib64}:${LD_LIBRARY_PATH:-}"
export EMBER_FIXTURES="$root/.devbin/fixtures"
summary="$out/summary.txt"
: >"$summary"
log() { echo "$*" | tee -a "$summary"; }

log "== device-test $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader \
  2>&1 | tee -a "$summary"

log "== cuda_ops_test"
timeout 300 .devbin/bin/cuda_ops_test --gtest_output="xml:$out/cuda_ops_test.xml" >"$out/cuda_ops_test.log" 2>&1
rc=$?
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|tests ran' "$out/cuda_ops_test.log" | tee -a "$summary"
grep -B3 -E 'Failure|error' "$out/cuda_ops_test.log" | head -60 >>"$summary"
log "cuda_ops_test exit: $rc"

if [ "${SANITIZER:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  log "== compute-sanitizer memcheck (attention + elementwise)"
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 .devbin/bin/cuda_ops_test \
    --gtest_filter='*PrefillMixedAndDecode/D64*:*LongContextSplitK/D80*:CudaOpsTest.*' \
    >"$out/memcheck.log" 2>&1
  log "memcheck exit: $? ($(grep -c 'Invalid' "$out/memcheck.log") invalid accesses)"
  tail -3 "$out/memcheck.log" >>"$summary"
  log "== compute-sanitizer racecheck (attention, shared-memory kernels)"
  timeout 180 compute-sanitizer --tool racecheck --error-exitcode 9 .devbin/bin/cuda_ops_test \
    --gtest_filter='*PrefillMixedAndDecode/D64*' >"$out/racecheck.log" 2>&1
  log "racecheck exit: $?"
  tail -3 "$out/racecheck.log" >>"$summary"
fi

if [ "${BENCH:-1}" = 1 ]; then
  log "== cuda_forward_bench (random bf16 weights, backend ops only, host logits; no device sampling)"
  bench() {
    log "-- cuda_forward_bench $*"
    timeout 240 .devbin/bin/cuda_forward_bench "$@" 2>&1 | tee -a "$summary" >/dev/null
  }
  bench --shape llama-3.2-1b --batch 1 --prompt 512 --gen 128
  bench --shape llama-3.2-1b --batch 1 --prompt 512 --gen 128 --no-graphs
  bench --shape llama-3.1-8b --batch 1 --prompt 512 --gen 128
  bench --shape llama-3.1-8b --batch 1 --prompt 4096 --gen 4 --prefill-chunk 4096
  bench --shape llama-3.2-1b --batch 128 --prompt 512 --gen 128
  bench --shape llama-3.1-8b --batch 128 --prompt 512 --gen 128
  log "== per-op GPU time (events, op by op; decode steps)"
  bench --shape llama-3.2-1b --batch 1 --prompt 512 --gen 16 --profile
  bench --shape llama-3.1-8b --batch 1 --prompt 512 --gen 16 --profile
  bench --shape llama-3.2-1b --batch 128 --prompt 512 --gen 16 --profile
fi
log "== done $(date -u +%FT%TZ)"
