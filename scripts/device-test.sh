#!/usr/bin/env bash
# device-test.sh: the GPU tests and benchmarks in one go.
#   scripts/device-test.sh --stage   on the build machine: builds the GPU binaries ($STAGE_BUILD,
#                                    default build/cuda-dev)
#                                    and stages them, the non-system .so files they need and the
#                                    small fixture models into .devbin/ (git-ignored).
#   scripts/device-test.sh --unpack  on the GPU machine: only unpacks the xz-compressed binaries
#                                    (for ad-hoc commands; OUTDIR runs do it themselves).
#   scripts/device-test.sh OUTDIR    on the GPU machine (CUDA 13 toolkit, no Debian libraries):
#                                    runs everything staged in .devbin/ and writes logs and
#                                    summary.txt to OUTDIR. Stages first when .devbin/ is absent.
# Env: BENCH=0 skips the benchmarks; MODELS=0 skips the ones on synth 1B/8B models (ember bench,
# engine_bench: ~5 min and 20 GB of disk); SANITIZER=1 also runs the op tests under
# compute-sanitizer.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

stage() {
  set -e
  local build=${STAGE_BUILD:-build/cuda-dev}
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_CUDA=ON >/dev/null
  local targets=(cuda_ops_test cuda_attention_test cuda_forward_bench model_test model_loader_test engine_test
                 threshold_sampling_test argmax_rows_test ember engine_bench ember_cuda gemm_bench
                 gemv_bench cuda_sample_bench moe_bench stream_bench)
  cmake --build "$build" --target "${targets[@]}" -j2
  rm -rf .devbin && mkdir -p .devbin/bin .devbin/lib .devbin/fixtures/models
  # The CUDA backend module (libember_cuda.so) is loaded from the executable's own folder.
  cp "$build/src/backend/cuda/cuda_ops_test" "$build/src/backend/cuda/cuda_attention_test" \
     "$build/bench/cuda_forward_bench" \
     "$build/src/model/model_test" "$build/src/model/model_loader_test" \
     "$build/src/engine/engine_test" \
     "$build/src/backend/threshold_sampling_test" "$build/src/backend/argmax_rows_test" \
     "$build/ember" "$build/bench/engine_bench" "$build/bench/gemm_bench" \
     "$build/bench/gemv_bench" "$build/bench/cuda_sample_bench" "$build/bench/moe_bench" \
     "$build/bench/stream_bench" \
     "$build/libember_cuda.so" \
     .devbin/bin/
  # Libraries outside glibc/libstdc++ and the CUDA toolkit (the GPU machine has those).
  for bin in .devbin/bin/*; do
    ldd "$bin" | awk '/=> \//{print $3}' | grep -vE 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libpthread|libdl|librt|/cuda' |
      xargs -r -I{} cp -L {} .devbin/lib/ || true
  done
  # The binaries that carry all the kernels (~12 MB each) travel xz-compressed (~3.7 MB): the
  # GPU runs carry at most 64 MiB. The run below unpacks them.
  find .devbin/bin -type f -size +1M -exec xz -T2 -3 {} +
  # The GPU machine gets the checkout only (../shared stays here): the fixture models travel in
  # .devbin (STAGE_FIXTURES=0 leaves them out, for runs that need none).
  local fixtures=${EMBER_FIXTURES:-$root/../shared/fixtures}
  if [ "${STAGE_FIXTURES:-1}" = 1 ]; then
    for m in llama3 qwen2 qwen3 qwen3_moe gpt_oss mistral gemma2 gemma3 phi3 tinystories-656k; do
      [ -d "$fixtures/models/$m" ] && cp -r "$fixtures/models/$m" .devbin/fixtures/models/
    done
  fi
  du -sh .devbin
}

unpack() {
  for packed in .devbin/bin/*.xz; do
    [ -e "$packed" ] && [ ! -e "${packed%.xz}" ] && xz -d -k "$packed" && chmod +x "${packed%.xz}"
  done
  return 0
}

if [ "${1:-}" = "--stage" ]; then stage; exit $?; fi
if [ "${1:-}" = "--unpack" ]; then unpack; exit $?; fi
out=${1:?usage: scripts/device-test.sh --stage | --unpack | OUTDIR}
mkdir -p "$out"
unpack
[ -x .devbin/bin/cuda_ops_test ] || stage
cublas_dir=$(dirname "$(ls /usr/local/cuda/lib64/libcublas.so.13 /usr/local/cuda*/lib*/libcublas.so.13 \
  2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$root/.devbin/lib:${cublas_dir:-/usr/local/cuda/lib64}:${LD_LIBRARY_PATH:-}"
if [ -d "$root/.devbin/fixtures/models/tinystories-656k" ]; then
  export EMBER_FIXTURES="$root/.devbin/fixtures"
else
  export EMBER_FIXTURES="${EMBER_FIXTURES:-$root/../shared/fixtures}"
fi
summary="$out/summary.txt"
: >"$summary"
log() { echo "$*" | tee -a "$summary"; }

log "== device-test $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader \
  2>&1 | tee -a "$summary"

# gtest NAME FILTER: one GPU test binary, its result lines in the summary.
gtest() {
  log "== $1 ${2:+--gtest_filter=$2}"
  timeout 300 ".devbin/bin/$1" ${2:+--gtest_filter="$2"} --gtest_output="xml:$out/$1.xml" \
    >"$out/$1.log" 2>&1
  local rc=$?
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|tests ran' "$out/$1.log" | tee -a "$summary"
  grep -B3 -E 'Failure|error' "$out/$1.log" | head -60 >>"$summary"
  log "$1 exit: $rc"
}
gtest cuda_ops_test
EMBER_MOE_MMA=0 gtest cuda_ops_test '*Moe*'  # bf16 batches on the SIMT tile kernels == solo by pair
gtest cuda_attention_test
gtest model_test '*Cuda*:*Argmax*'        # f32 parity 1e-4, bf16 parity 3e-2, device argmax
gtest model_loader_test '*Mxfp4*'         # packed MXFP4 experts == their bf16 dequantization
EMBER_MOE_MMA=1 gtest model_loader_test '*Mxfp4*'  # the same, decode on the tensor-core experts too
EMBER_MOE_MMA=0 gtest model_loader_test '*Mxfp4*'  # the same, prefill on the SIMT tile kernels
gtest engine_test '*Cuda*:*Backend*'      # batched == solo on the GPU, device logits processors
gtest threshold_sampling_test             # SampleRows / logit-edit kernels == their CPU twins
gtest argmax_rows_test
log "== tinystories-656k greedy via ember run --device cuda (bf16)"
.devbin/bin/ember run --device cuda --model "$EMBER_FIXTURES/models/tinystories-656k" \
  --prompt-ids '[1,80,147,201,282,57]' --max-tokens 64 --temperature 0 --output ids 2>&1 |
  tail -1 | tee -a "$summary"

if [ "${SANITIZER:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  log "== compute-sanitizer memcheck (attention + elementwise)"
  for bin in cuda_ops_test cuda_attention_test; do
    timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 ".devbin/bin/$bin" \
      --gtest_filter='*PrefillMixedAndDecode/D64*:*LongContextSplitK/D80*:CudaOpsTest.*' \
      >"$out/memcheck-$bin.log" 2>&1
    log "memcheck $bin exit: $? ($(grep -c 'Invalid' "$out/memcheck-$bin.log") invalid accesses)"
    tail -3 "$out/memcheck-$bin.log" >>"$summary"
  done
  log "== compute-sanitizer racecheck (attention, shared-memory kernels)"
  timeout 180 compute-sanitizer --tool racecheck --error-exitcode 9 .devbin/bin/cuda_attention_test \
    --gtest_filter='*PrefillMixedAndDecode/D64*' >"$out/racecheck.log" 2>&1
  log "racecheck exit: $?"
  tail -3 "$out/racecheck.log" >>"$summary"
fi

if [ "${BENCH:-1}" = 1 ]; then
  log "== cuda_forward_bench (random bf16 weights, backend ops only, device argmax per step)"
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
  log "== gemv_bench (the batch-1 decode GEMV per weight group)"
  for shape in llama-3.2-1b llama-3.1-8b; do
    timeout 120 .devbin/bin/gemv_bench --shape $shape 2>&1 | tee -a "$summary" >/dev/null
  done
  log "== stream_bench (DRAM -> shared memory by bulk copies into a ring, against plain loads)"
  timeout 120 .devbin/bin/stream_bench 2>&1 | tee -a "$summary" >/dev/null
  log "== cuda_sample_bench (SampleRows per launch, 128 and 1 rows of a 128k vocabulary)"
  for rows in 128 1; do
    timeout 120 .devbin/bin/cuda_sample_bench --rows $rows 2>&1 | tee -a "$summary" >/dev/null
  done
  log "== gemm_bench (cuBLAS / cuBLASLt ceilings of the prefill GEMMs)"
  timeout 120 .devbin/bin/gemm_bench --shape llama-3.1-8b --tokens 4096 2>&1 | tee -a "$summary" >/dev/null
  log "== per-op GPU time (events, op by op; decode steps)"
  bench --shape llama-3.2-1b --batch 1 --prompt 512 --gen 16 --profile
  bench --shape llama-3.1-8b --batch 1 --prompt 512 --gen 16 --profile
  bench --shape llama-3.2-1b --batch 128 --prompt 512 --gen 16 --profile
  if [ "${MODELS:-1}" = 1 ]; then
    log "== ember bench / engine_bench on synth models (bf16, random weights)"
    models=${TMPDIR:-/tmp}/ember-synth
    run() {
      log "-- $*"
      timeout 300 "$@" 2>&1 | grep -E '^\||TTFT|^concurrency|^closed loop|graphs for' | tee -a "$summary" >/dev/null
    }
    for shape in llama-3.2-1b llama-3.1-8b; do
      .devbin/bin/ember synth --like $shape --dtype bf16 --out "$models/$shape" >/dev/null 2>&1
    done
    run .devbin/bin/ember bench --device cuda --model "$models/llama-3.2-1b" -p 512 -n 128 -r 3
    run .devbin/bin/ember bench --device cuda --model "$models/llama-3.1-8b" -p 4096 -n 128 -r 2
    eb=(--device cuda --prompt-len 512 --gen-len 128)  # steps of the GPU default size
    run .devbin/bin/engine_bench --model "$models/llama-3.2-1b" "${eb[@]}" --concurrency 1,128 \
      --prefix-len 2000
    run .devbin/bin/engine_bench --model "$models/llama-3.2-1b" "${eb[@]}" --concurrency 1,128 \
      --prefix-len 0 --temperature 1 --top-p 0.9
    run .devbin/bin/engine_bench --model "$models/llama-3.2-1b" "${eb[@]}" --concurrency 128 \
      --prefix-len 0 --batch-invariant
    # The 128-concurrent runs also as serve_bench's closed loop (--sustain: N requests through
    # 128 client slots).
    run .devbin/bin/engine_bench --model "$models/llama-3.2-1b" "${eb[@]}" --concurrency 128 \
      --prefix-len 0 --sustain 2048
    run .devbin/bin/engine_bench --model "$models/llama-3.1-8b" "${eb[@]}" --concurrency 128 \
      --prefix-len 0 --sustain 1024
    rm -rf "$models"
  fi
fi
log "== done $(date -u +%FT%TZ)"
