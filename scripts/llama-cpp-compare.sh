#!/usr/bin/env bash
# llama-cpp-compare.sh: the CPU side-by-side with llama.cpp in one run (issue 41's benchmark).
#  1. llama.cpp's CPU tools: --llama DIR uses built ones (llama-bench); else they are built from
#     --llama-src DIR, or from a shallow clone of github.com/ggml-org/llama.cpp, into
#     .cache/llama.cpp-build (git-ignored; nothing of llama.cpp is committed).
#  2. A Llama-3.2-1B-shaped model with random bf16 weights (`ember synth`) and its GGUF files, one
#     per --types entry (the same file for both engines): f16 by `ember quantize`, the quantized
#     types by llama.cpp's llama-quantize from it (the files people download: embedding and head
#     quantized too), or by `ember quantize` with --ember-quantize (it keeps them in f16/bf16).
#  3. Per file, alternately: llama-bench and `ember bench` (pp512 and tg128, --threads each,
#     --reps repetitions), and a table of tok/s with Ember's ratio to llama.cpp. The load average
#     is printed beside each pair: on a shared machine, compare pairs taken at the same load.
# usage: scripts/llama-cpp-compare.sh [--build DIR] [--llama BIN_DIR | --llama-src SRC_DIR]
#          [--threads N] [--types "f16 q8_0 q4_0 q4_k_m"] [--reps R] [--work DIR] [--tokenizer DIR]
#          [--ember-quantize]
# Defaults: build/release (the ember binary), 2 threads, r 3, .cache/llama-compare for the files,
# the llama3 tokenizer from ../shared/fixtures/tokenizers or .cache/tokenizers. Ember runs f16
# files with --cpu-matmul auto (its prefill on the faster of the CPU's AVX-512 FMAs and bf16 dot
# products; decode rows stay exact).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build/release LLAMA= LLAMA_SRC= THREADS=2 TYPES="f16 q8_0 q4_0 q4_k_m" REPS=3
WORK=.cache/llama-compare TOK= EMBER_QUANTIZE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;; --llama) LLAMA=$2; shift 2 ;; --llama-src) LLAMA_SRC=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;; --types) TYPES=$2; shift 2 ;; --reps) REPS=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;; --tokenizer) TOK=$2; shift 2 ;;
    --ember-quantize) EMBER_QUANTIZE=1; shift ;;
    *) echo "unknown argument: $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
EMBER=$BUILD/ember
[ -x "$EMBER" ] || { echo "no $EMBER: build first (scripts/build.sh)" >&2; exit 1; }
if [ -z "$TOK" ]; then
  for d in ../shared/fixtures/tokenizers/llama3 .cache/tokenizers/llama3; do
    [ -f "$d/tokenizer.json" ] && { TOK=$d; break; }
  done
fi
[ -n "$TOK" ] || { echo "no llama3 tokenizer: give --tokenizer DIR (scripts/fetch-tokenizers.sh)" >&2; exit 1; }

if [ -z "$LLAMA" ]; then
  out=.cache/llama.cpp-build
  if [ ! -x "$out/bin/llama-bench" ]; then
    if [ -z "$LLAMA_SRC" ]; then
      LLAMA_SRC=.cache/llama.cpp
      [ -d "$LLAMA_SRC" ] || git clone --depth 1 https://github.com/ggml-org/llama.cpp "$LLAMA_SRC"
    fi
    cmake -S "$LLAMA_SRC" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
      -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
    cmake --build "$out" -j "$(nproc)" --target llama-bench llama-batched-bench llama-quantize \
      llama-perplexity >/dev/null
  fi
  LLAMA=$out/bin
fi
[ -x "$LLAMA/llama-bench" ] || { echo "no $LLAMA/llama-bench" >&2; exit 1; }

mkdir -p "$WORK"
[ -f "$WORK/model/config.json" ] ||
  "$EMBER" synth --like llama-3.2-1b --tokenizer "$TOK" --out "$WORK/model" >/dev/null
[ -f "$WORK/l1b-f16.gguf" ] ||
  "$EMBER" quantize --model "$WORK/model" --out "$WORK/l1b-f16.gguf" --type f16 >/dev/null
maker=llama
[ "$EMBER_QUANTIZE" = 1 ] || [ ! -x "$LLAMA/llama-quantize" ] && maker=ember
for t in $TYPES; do
  [ "$t" = f16 ] && continue
  f=$WORK/l1b-$t-$maker.gguf
  [ -f "$f" ] && continue
  if [ $maker = llama ]; then
    "$LLAMA/llama-quantize" "$WORK/l1b-f16.gguf" "$f" "${t^^}" >/dev/null 2>&1
  else
    "$EMBER" quantize --model "$WORK/model" --out "$f" --type "$t" >/dev/null
  fi
done

load() { cut -d' ' -f1 /proc/loadavg; }
# llama-bench's CSV: the avg_ts column of the pp and tg rows.
llama_ts() {
  "$LLAMA/llama-bench" -m "$1" -p 512 -n 128 -t "$THREADS" -r "$REPS" -o csv 2>/dev/null |
    python3 -c 'import csv,sys
rows=list(csv.DictReader(sys.stdin))
pp=[r for r in rows if int(r["n_prompt"])>0]; tg=[r for r in rows if int(r["n_gen"])>0]
print(float(pp[0]["avg_ts"]), float(tg[0]["avg_ts"]))'
}
# ember bench's table: the median tok/s of the pp512 and tg128 rows.
ember_ts() {
  local extra=()
  [ "$2" = f16 ] && extra=(--cpu-matmul auto)
  "$EMBER" bench --model "$1" -p 512 -n 128 -r "$REPS" --threads "$THREADS" --device cpu \
    "${extra[@]}" 2>/dev/null |
    awk -F'|' '$7 ~ /pp512/ {pp=$8} $7 ~ /tg128/ {tg=$8} END {gsub(/ /,"",pp); gsub(/ /,"",tg); print pp, tg}'
}
echo "Ember $(git rev-parse --short HEAD) vs llama.cpp ($LLAMA), $THREADS threads, r $REPS," \
  "quantized files by $maker, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "| type | llama.cpp pp512 | Ember pp512 | ratio | llama.cpp tg128 | Ember tg128 | ratio | load before / after |"
echo "|---|---:|---:|---:|---:|---:|---:|---|"
for t in $TYPES; do
  f=$WORK/l1b-$t-$maker.gguf
  [ "$t" = f16 ] && f=$WORK/l1b-f16.gguf
  before=$(load)
  read -r lpp ltg < <(llama_ts "$f")
  read -r epp etg < <(ember_ts "$f" "$t")
  python3 -c "print(f'| $t | {$lpp:.1f} | {$epp:.1f} | {$epp/$lpp:.2f}x | {$ltg:.1f} | {$etg:.1f} | {$etg/$ltg:.2f}x | $before / $(load) |')"
done
