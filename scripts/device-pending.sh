#!/usr/bin/env bash
# device-pending.sh: the GPU checks and benchmarks that wait for a device, staged in one go.
#   scripts/device-pending.sh --stage   on the build machine: copies the release build's binaries
#                                       the runs need (build/release, scripts/build.sh with nvcc),
#                                       xz-compressed, and the fixtures into .devbin/ (git-ignored
#                                       through .git/info/exclude); name .devbin in the run's carry
#   scripts/device-pending.sh MODE      on the GPU machine, from the repo root:
#     kv      the quantized-KV attention: its op tests (both paths), then kv_attention_bench at
#             11 x 32k and 64 x 4k, direct operands (EMBER_KV_DIRECT=1) against the bf16 tiles
#     verify  the session-45 kernels: cuda_ops_test Mla / Recurrent (the chunked delta rule
#             included), kv_dtype_test on CUDA with the direct operands, the CUDA MTP test, and the
#             chunked delta rule's A/B on a 2-layer Qwen3-Next synth (pp4096)
#     e2e     8B synth, 32k-token sequences, engine_bench per KV dtype: 11 of them (bf16, int8,
#             fp8), then 22 (int8, fp8: the same KV bytes): issue 42's long-context decode target
#     b45     issue 45's benchmark set: Qwen3-Next 4-layer pp4096 / depth 8192 / 64 concurrent,
#             DeepSeek-V3 4-layer (3 dense, 1 MoE) the same, then 3-layer with MTP: the MTP bench
#     kvp     the quantized pool's prefill and the int4 writer's least-error step: their tests,
#             then pp16384 per KV dtype on an 8B cut to 4 layers
#     lora    issue 44's LoRA costs split by phase: 128 x (512 + 1) (prefill), 128 x (8 + 256)
#             (decode) and the issue's 128 x (512 + 128), 8 and 32 adapters mixed, 8B cut to 8
#             layers; LORA_SHAPES picks the shapes, LORA_GEMM_ROWS=N moves the cuBLAS
#             segments' threshold
#     lorafused  the batch-1 LoRA update inside the GEMV launch (the default since session 49;
#             EMBER_LORA_GEMV_FUSED=0: two launches before it, the bias fold): the LoRA op
#             tests, lora_test's CUDA parity with it off, then on with and without graphs
#             (EMBER_CUDA_GRAPHS), the engine tests, then batch-1 lora_bench fused against the
#             bias fold (8B cut to 8 layers, rank 16)
#     lorachain  the fused GEMV's chain test (FusedGemvLoraChain) variant by variant, with each
#             failing layer's largest difference
#     lorafull  batch-1 lora_bench on the whole 8B (32 layers): fused against the bias fold
#     loraprof  the op profile (EMBER_CUDA_PROFILE_OUT: events around every op, no graphs) of
#             lora_bench with 8 adapters, per shape (LORA_SHAPES, default 512:128): all its runs
#             together; each op kind's calls, GPU ms and us a call
#     lorastk the stacked LoRA form (RecordLoraStacked): loratests, then lora_bench per shape
#             (LORA_SHAPES, default 512:128 8:256) and adapter count (LORA_ADAPTERS, default 8 32),
#             EMBER_LORA_STACKED_ROWS=1024 (stacked) against 0 (the BGMV kernels); LORA_STACKED
#             lists the values, LORA_FIRST the EMBER_LORA_UPDATE_FIRST_ROWS values (default 0),
#             NO_TESTS=1 skips loratests
#     (lora, lorafused, lorafull, loraprof, lorastk: LORA_ARGS adds lora_bench flags, e.g. --max-running 128
#             --step-tokens 8192, ember serve's GPU defaults)
#     prof    Nsight Compute counters of the decode attention kernel per KV dtype (11 x 32k)
# Each test's output is cut to its failures and summary; each command has its own timeout.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if [ "${1:-}" = "--stage" ]; then
  set -e
  build=${STAGE_BUILD:-build/release}
  fixtures=${EMBER_FIXTURES:-$root/../shared/fixtures}
  rm -rf .devbin && mkdir -p .devbin/bin .devbin/fixtures .git/info
  for b in src/backend/cuda/cuda_attention_test src/backend/cuda/cuda_ops_test \
           src/engine/kv_dtype_test src/engine/spec_decode_test bench/kv_attention_bench \
           bench/engine_bench bench/lora_bench src/engine/engine_test src/model/lora_test ember \
           libember_cuda.so; do
    # (a binary not built is left out: its modes fail on the GPU machine)
    if [ -e "$build/$b" ]; then cp "$build/$b" .devbin/bin/; else echo "not built: $b"; fi
  done
  # the shared libraries from Debian's packages that the GPU machine's image lacks
  for l in libsimdjson.so.14 libutf8proc.so.2 libpcre2-8.so.0; do
    cp -L "/lib/x86_64-linux-gnu/$l" .devbin/bin/
  done
  strip --strip-unneeded .devbin/bin/* 2>/dev/null || true
  xz -T2 -3 .devbin/bin/*
  cp -r "$fixtures/models" "$fixtures/adapters" .devbin/fixtures/
  grep -qx '/.devbin/' .git/info/exclude 2>/dev/null || echo /.devbin/ >>.git/info/exclude
  du -sh .devbin
  exit 0
fi

B=/tmp/devbin
mkdir -p "$B"
for p in .devbin/bin/*.xz; do
  n=$(basename "$p" .xz)
  [ -e "$B/$n" ] || { xz -dc "$p" >"$B/$n" && chmod +x "$B/$n"; }
done
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export EMBER_FIXTURES=$root/.devbin/fixtures
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader

t() {  # a test binary: failures, crashes and the summary
  echo "== $*"
  timeout "${TL:-240}" "$@" 2>&1 | grep -E "rror|CHECK|llegal|Failure|^\[  FAILED|^\[  PASSED" | head -30
}
synth() {  # PRESET LAYERS(0: all) DIR [extra flags] (no tokenizer: the benches feed ids)
  [ -d "$3" ] && return
  local layers=()
  [ "$2" -gt 0 ] && layers=(--layers "$2")
  "$B/ember" synth --like "$1" "${layers[@]}" --out "$3" "${@:4}" >/dev/null 2>&1 ||
    { echo "synth $1 failed"; rm -rf "$3"; }
}
kvb() {  # kv_attention_bench on the 8B's attention shape
  timeout 120 "$B/kv_attention_bench" --device cuda --formats "${F:-bf16,int8,fp8,int4}" --heads 32 \
    --kv-heads 8 --head-dim 128 --rounds 5 --reps 10 "$@" 2>&1 | grep -v '^$'
}
bench() {  # the table's rows, or the output's tail where there are none
  local out
  out=$(timeout 150 "$B/ember" bench "$@" 2>&1)
  grep -E "pp|tg|spec|rror" <<<"$out" || tail -4 <<<"$out"
}
engine() { timeout 240 "$B/engine_bench" "$@" 2>&1 | grep -iE "tok/s|steps|rror|^\| [0-9]" | head -8; }
lorabench() {  # TIMEOUT ADAPTERS PROMPT GEN [CONCURRENCY [MODEL]]: rank 16; by default 128
  # concurrent on the 8B cut to 8 layers
  # concurrent on the 8B cut to 8 layers; LORA_ARGS: more flags (--max-running 128
  # --step-tokens 8192: ember serve's GPU defaults)
  # shellcheck disable=SC2086
  timeout "$1" "$B/lora_bench" --model "${6:-/tmp/s8l8}" --device cuda --rank 16 --adapters "$2" \
    --concurrency "${5:-128}" --prompt "$3" --gen "$4" ${LORA_ARGS:-} 2>&1 |
    grep -E "tok/s|rror|Check|ailed|bort" | cut -c1-160
}

loratests() {  # the LoRA op, model-parity and engine tests; lora_test with the fused batch-1
  # update off, then on launched one by one and in graphs
  TL=240 t "$B/cuda_ops_test" --gtest_filter='*Lora*'
  for run in 0:1 1:0 1:1; do
    echo "== lora_test CudaLoraParity, EMBER_LORA_GEMV_FUSED=${run%:*} EMBER_CUDA_GRAPHS=${run#*:}"
    EMBER_LORA_GEMV_FUSED=${run%:*} EMBER_CUDA_GRAPHS=${run#*:} timeout 120 "$B/lora_test" \
      --gtest_filter='CudaLoraParity.*' 2>&1 | grep -vE '^\[ +(RUN|OK) ' |
      grep -A4 -E 'Failure|FAILED  \]|PASSED' | head -30
  done
  t "$B/engine_test" --gtest_filter='*Lora*'
}

case "${1:-}" in
  kv)
    TL=200 t "$B/cuda_attention_test" --gtest_filter='*KvQuant*:*QuantizedPool*'
    for shape in "--rows 11 --context 32768" "--rows 64 --context 4096"; do
      echo "-- direct operands: $shape"
      # shellcheck disable=SC2086
      EMBER_KV_DIRECT=1 kvb $shape
      echo "-- bf16 tiles: $shape"
      # shellcheck disable=SC2086
      F=bf16,int8,fp8 EMBER_KV_DIRECT=0 kvb $shape
    done
    ;;
  verify)
    TL=150 t "$B/cuda_ops_test" --gtest_filter='*Mla*:*Recurrent*'
    t env EMBER_KV_DIRECT=1 "$B/kv_dtype_test" --gtest_filter='*Cuda*'
    t "$B/spec_decode_test" --gtest_filter='*Cuda*'
    synth qwen3-next-80b-a3b 4 /tmp/qn4
    for c in 1 0; do
      echo "EMBER_DELTA_CHUNKED=$c"
      EMBER_DELTA_CHUNKED=$c bench --model /tmp/qn4 --device cuda -p 4096 -n 16 -r 2
    done
    ;;
  kvp)  # quantized-KV prefill against bf16
    # (and the int4 writer's least-error step: its bytes against the CPU's, session 47)
    TL=240 t "$B/cuda_attention_test" --gtest_filter='*QuantizedPool*:*KvQuant*'
    t "$B/kv_dtype_test" --gtest_filter='*Cuda*'
    synth llama-3.1-8b 4 /tmp/s8l4
    for dtype in auto int8 fp8; do
      echo "-- --kv-cache-dtype $dtype"
      bench --model /tmp/s8l4 --device cuda -p 16384 -n 0 -r 2 --kv-cache-dtype "$dtype"
    done
    ;;
  lora)  # LoRA: where the mixed-adapter runs lose, by phase
    synth llama-3.1-8b 8 /tmp/s8l8
    for shape in ${LORA_SHAPES:-512:1 8:256 512:128}; do
      for a in 8 32; do
        echo "-- ${a} adapters, 128 x (${shape%:*} + ${shape#*:})," \
          "EMBER_LORA_GEMM_ROWS=${LORA_GEMM_ROWS:-256}"
        EMBER_LORA_GEMM_ROWS=${LORA_GEMM_ROWS:-256} lorabench 200 "$a" "${shape%:*}" "${shape#*:}"
      done
    done
    ;;
  lorafused)
    loratests
    synth llama-3.1-8b 8 /tmp/s8l8
    for round in 1 2; do
      for fused in 1 0; do
        echo "-- batch 1, EMBER_LORA_GEMV_FUSED=$fused (round $round)"
        EMBER_LORA_GEMV_FUSED=$fused lorabench 120 1 64 128 1
      done
    done
    ;;
  lorastk)
    [ -n "${NO_TESTS:-}" ] || loratests
    synth llama-3.1-8b 8 /tmp/s8l8
    for shape in ${LORA_SHAPES:-512:128 8:256}; do
      for a in ${LORA_ADAPTERS:-8 32}; do
        for rows in ${LORA_STACKED:-1024 0}; do
          for first in ${LORA_FIRST:-0}; do
            echo "-- $a adapters, 128 x (${shape%:*} + ${shape#*:}), EMBER_LORA_STACKED_ROWS=$rows" \
              "EMBER_LORA_UPDATE_FIRST_ROWS=$first"
            EMBER_LORA_STACKED_ROWS=$rows EMBER_LORA_UPDATE_FIRST_ROWS=$first \
              lorabench 200 "$a" "${shape%:*}" "${shape#*:}"
          done
        done
      done
    done
    ;;
  lorachain)  # the chain test, one line per variant with its failing layers
    timeout 120 "$B/cuda_ops_test" --gtest_filter='FusedGemvLoraChain.*' 2>&1 |
      grep -E 'fused|fold|layer|largest|step [0-9]|OK \]|FAILED  \]' | sed 's/.*cc:[0-9]*: //' |
      paste -sd' ' | sed 's/\[ *\(OK\|FAILED\) *\]/\n&/g' | cut -c1-1500
    ;;
  lorafull)
    synth llama-3.1-8b 0 /tmp/s8
    for fused in 1 0 1 0; do
      echo "-- whole 8B, batch 1, EMBER_LORA_GEMV_FUSED=$fused"
      EMBER_LORA_GEMV_FUSED=$fused lorabench 200 1 64 128 1 /tmp/s8
    done
    ;;
  loraprof)  # per shape: each op kind's calls, GPU ms in all and us a call, largest first
    synth llama-3.1-8b 8 /tmp/s8l8
    for shape in ${LORA_SHAPES:-512:128}; do
      echo "-- 8 adapters, 128 x (${shape%:*} + ${shape#*:}) ${LORA_ARGS:-}"
      rm -f /tmp/lora.prof
      EMBER_CUDA_PROFILE_OUT=/tmp/lora.prof lorabench 300 8 "${shape%:*}" "${shape#*:}"
      head -1 /tmp/lora.prof
      sort -k3 -g -r /tmp/lora.prof | grep -v '^#' | head -12 |
        awk '{printf "%-24s %8d %10.1f %8.1f\n", $1, $2, $3, 1000 * $3 / $2}'
    done
    ;;
  prof)  # Nsight Compute on the decode attention at 11 x 32k: bf16, then int8 direct and tiles
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    for run in bf16:1 int8:1 int8:0 fp8:1; do
      echo "== ${run%:*}, EMBER_KV_DIRECT=${run#*:}"
      EMBER_KV_DIRECT=${run#*:} timeout 150 "$ncu" --clock-control none \
        -k regex:AttentionInvariantKernel --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section ComputeWorkloadAnalysis --section LaunchStats \
        --section InstructionStats --section SourceCounters \
        --metrics smsp__inst_executed.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio \
        "$B/kv_attention_bench" --device cuda --formats "${run%:*}" --heads 32 --kv-heads 8 \
        --head-dim 128 --rows 11 --context 32768 --rounds 2 --reps 1 2>&1 |
        tee "${OUT:-/tmp}/ncu-${run%:*}-${run#*:}.txt" | grep -vE "^ +(-|[A-Z][a-z].*[a-z.]$|$)|^==PROF==|^\|" | grep -E "  [a-zA-Z_].* [0-9.,]+$|Kernel|ms$|us$" | head -70
    done
    ;;
  e2e)
    synth llama-3.1-8b 0 /tmp/s8
    # DTYPE:SEQUENCES; the same KV bytes hold 11 such contexts in bf16, 22 in int8 / FP8
    for run in auto:11 int8:11 fp8:11 int8:22 fp8:22; do
      echo "-- --kv-cache-dtype ${run%:*}, ${run#*:} sequences"
      engine --model /tmp/s8 --device cuda --concurrency "${run#*:}" \
        --prompt-len 32768 --gen-len 64 --prefix-len 0 --kv-cache-bytes 49392123904 \
        --kv-cache-dtype "${run%:*}"
    done
    ;;
  b45)
    export EMBER_DELTA_CHUNKED=${EMBER_DELTA_CHUNKED:-1}
    synth qwen3-next-80b-a3b 4 /tmp/qn4
    bench --model /tmp/qn4 --device cuda -p 4096 -n 64 -r 2
    bench --model /tmp/qn4 --device cuda -p 0 -d 8192 -n 32 -r 1
    engine --model /tmp/qn4 --device cuda --concurrency 64 --prompt-len 512 --gen-len 64 --prefix-len 0
    rm -rf /tmp/qn4
    # DeepSeek-V3 cut to 4 layers: its 3 dense layers and one of its 256-expert MoE layers
    synth deepseek-v3 4 /tmp/ds4
    bench --model /tmp/ds4 --device cuda -p 4096 -n 64 -r 2
    bench --model /tmp/ds4 --device cuda -p 0 -d 8192 -n 32 -r 1
    engine --model /tmp/ds4 --device cuda --concurrency 64 --prompt-len 512 --gen-len 64 --prefix-len 0
    rm -rf /tmp/ds4
    # with its MTP module (a MoE layer of its own) as the draft
    synth deepseek-v3 3 /tmp/ds3m --mtp
    bench --model /tmp/ds3m --device cuda -p 512 -n 128 -r 1 --spec-method mtp
    rm -rf /tmp/ds3m
    ;;
  *)
    echo "usage: scripts/device-pending.sh --stage | kv | kvp | verify | e2e | b45 | prof" >&2
    exit 2
    ;;
esac
