#!/usr/bin/env bash
# gpu-verify.sh PART: the gpu-pending branch's verification on the device (session 37, untracked).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd); out=${OUT:-/tmp/out}; mkdir -p "$out"
start=$(date +%s); budget=${BUDGET:-560}
for p in .devbin/bin/*.xz; do [ -e "${p%.xz}" ] || { xz -d -k "$p"; chmod +x "${p%.xz}"; }; done
export LD_LIBRARY_PATH="$root/.devbin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
for f in "$root/../shared/fixtures" "$root/shared/fixtures" "$root/.devbin/fixtures"; do [ -d "$f/models" ] && export EMBER_FIXTURES=$f; done
S="$out/summary.txt"; log() { echo "$*" | tee -a "$S"; }
left() { echo $(( budget - ($(date +%s) - start) )); }
step() {  # step TIMEOUT NAME CMD...
  local t=$1 name=$2; shift 2
  local l=$(left); [ "$l" -lt 30 ] && { log "SKIP $name (time)"; return; }
  [ "$t" -gt $((l-10)) ] && t=$((l-10))
  log "== $name [$(( $(date +%s) - start ))s]"
  timeout "$t" "$@" >"$out/$name.log" 2>&1; local rc=$?
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|^\||tok/s|speed|TTFT|x$' "$out/$name.log" | head -60 >>"$S"
  log "$name rc=$rc"
}
log "fixtures: ${EMBER_FIXTURES:-none}"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader >>"$S" 2>&1
bin=.devbin/bin
if [ "$1" = tests ]; then
  step 200 cuda_ops $bin/cuda_ops_test
  step 150 cuda_attn $bin/cuda_attention_test
  step 120 model_cuda $bin/model_test --gtest_filter='*Cuda*'
  step 60 lora_test $bin/lora_test
fi
if [ "$1" = tests3 ]; then
  step 150 model_cuda $bin/model_test --gtest_filter='*Cuda*'
  step 60 lora_test $bin/lora_test
  step 200 engine_cuda $bin/engine_test --gtest_filter='*OnCuda*:*Cuda*'
  step 100 lora8 $bin/lora_bench --synth llama-3.1-8b --layers 8 --device cuda --adapters 8 --concurrency 32
  step 100 lora32 $bin/lora_bench --synth llama-3.1-8b --layers 8 --device cuda --adapters 32 --concurrency 32
fi
if [ "$1" = tests2 ]; then
  step 200 engine_cuda $bin/engine_test --gtest_filter='*OnCuda*:*Cuda*'
  step 120 lora8 $bin/lora_bench --synth llama-3.1-8b --layers 8 --device cuda --adapters 8 --concurrency 32
  step 120 lora32 $bin/lora_bench --synth llama-3.1-8b --layers 8 --device cuda --adapters 32 --concurrency 32
fi
if [ "$1" = json ]; then
  xz -d -k .devbin/tok/tokenizer.json.xz 2>/dev/null; mkdir -p /tmp/tok && cp .devbin/tok/tokenizer.json /tmp/tok/
  for m in llama-3.2-1b llama-3.1-8b; do
    $bin/ember synth --like $m --dtype bf16 --tokenizer /tmp/tok --out /tmp/$m >/dev/null 2>&1
    eb=(--model /tmp/$m --device cuda --concurrency 128 --prompt-len 512 --gen-len 128 --prefix-len 0)
    step 120 free-$m $bin/engine_bench "${eb[@]}"
    step 120 json-$m $bin/engine_bench "${eb[@]}" --schema .devbin/tok/items.json
    rm -rf /tmp/$m
  done
fi
if [ "$1" = bench ]; then
  $bin/ember synth --like llama-3.1-8b --dtype bf16 --out /tmp/m8 >/dev/null 2>&1
  step 150 spec1 $bin/spec_bench --model /tmp/m8 --device cuda --gen 256 --acceptance 0.5,0.7,0.9
  step 150 spec128 $bin/spec_bench --model /tmp/m8 --device cuda --concurrency 128 --prompt 512 --gen 128 --acceptance 0.7
  step 150 pcache $bin/prompt_cache_bench --synth llama-3.1-8b --layers 8 --device cuda --prompt-len 32768 --ram-bytes 8589934592 --repeats 2
  rm -rf /tmp/m8
  $bin/ember synth --like qwen3-next-80b-a3b --layers 4 --out /tmp/qn >/dev/null 2>&1
  step 100 qnext $bin/ember bench --model /tmp/qn -p 4096 -n 32 -r 1 --device cuda
  rm -rf /tmp/qn
  $bin/ember synth --like deepseek-v3 --layers 4 --out /tmp/ds >/dev/null 2>&1
  step 100 dsv3 $bin/ember bench --model /tmp/ds -p 4096 -n 32 -r 1 --device cuda
fi
if [ "$1" = tests4 ]; then
  step 150 model_cuda $bin/model_test --gtest_filter='*Cuda*'
  step 200 engine_cuda $bin/engine_test --gtest_filter='*OnCuda*:*Cuda*'
  step 60 lora1 $bin/lora_bench --synth llama-3.1-8b --layers 8 --device cuda --adapters 1 --concurrency 1 --prompt 64 --gen 64
  step 170 spec1 $bin/spec_bench --synth llama-3.1-8b --device cuda --gen 256 --acceptance 0.5,0.7,0.9
fi
if [ "$1" = bench2 ]; then
  step 150 spec128 $bin/spec_bench --synth llama-3.1-8b --device cuda --concurrency 128 --prompt 512 --gen 128 --acceptance 0.7
  xz -d -k .devbin/tok/tokenizer.json.xz 2>/dev/null; mkdir -p /tmp/tok && cp .devbin/tok/tokenizer.json /tmp/tok/
  $bin/ember synth --like llama-3.1-8b --dtype bf16 --tokenizer /tmp/tok --out /tmp/m8 >/dev/null 2>&1
  eb=(--model /tmp/m8 --device cuda --concurrency 128 --prompt-len 512 --gen-len 128 --prefix-len 0)
  step 90 free-8b $bin/engine_bench "${eb[@]}"
  step 90 json-8b $bin/engine_bench "${eb[@]}" --schema .devbin/tok/items.json
  rm -rf /tmp/m8
  step 120 pcache $bin/prompt_cache_bench --synth llama-3.1-8b --layers 8 --device cuda --prompt-len 32768 --ram-bytes 8589934592 --repeats 2
  $bin/ember synth --like qwen3-next-80b-a3b --layers 4 --out /tmp/qn >/dev/null 2>&1
  step 60 qnext $bin/ember bench --model /tmp/qn -p 4096 -n 32 -r 1 --device cuda
  rm -rf /tmp/qn
  $bin/ember synth --like deepseek-v3 --layers 4 --out /tmp/ds >/dev/null 2>&1
  step 60 dsv3 $bin/ember bench --model /tmp/ds -p 4096 -n 32 -r 1 --device cuda
fi
if [ "$1" = bench3 ]; then
  df -h /tmp | tail -1 | tee -a "$S"; rm -rf /tmp/ember_* /tmp/spec_bench* /tmp/m8 /tmp/qn /tmp/ds /tmp/*synth* 2>/dev/null; ls /tmp | head -20 >> "$S"; df -h /tmp | tail -1 | tee -a "$S"
  xz -d -k .devbin/tok/tokenizer.json.xz 2>/dev/null; mkdir -p /tmp/tok && cp .devbin/tok/tokenizer.json /tmp/tok/
  $bin/ember synth --like llama-3.1-8b --dtype bf16 --tokenizer /tmp/tok --out /tmp/m8 > "$out/synth.log" 2>&1
  eb=(--model /tmp/m8 --device cuda --concurrency 128 --prompt-len 512 --gen-len 128 --prefix-len 0)
  step 90 free-8b $bin/engine_bench "${eb[@]}"
  step 90 json-8b $bin/engine_bench "${eb[@]}" --schema .devbin/tok/items.json
  rm -rf /tmp/m8
  step 150 pcache $bin/prompt_cache_bench --synth llama-3.1-8b --layers 8 --device cuda --prompt-len 32768 --ram-bytes 8589934592 --repeats 2
fi
log "done [$(( $(date +%s) - start ))s]"
