#!/usr/bin/env bash
# gguf-quality.sh: issue 41's quality table in one command. The trained TinyStories fixture is
# written to GGUF by `ember quantize` in each type, and its perplexity on held-out text measured by
# Ember on the GGUF file (bench/perplexity_bench, llama-perplexity's protocol), by Ember on the
# safetensors folder with --quantize T (same blocks: the numbers must be equal), and by llama.cpp's
# llama-perplexity on the same GGUF file: same text, same context, same thread count. Prints a
# markdown table (docs/perf.md).
#   scripts/gguf-quality.sh [--build DIR] [--llama DIR] [--text FILE] [--ctx N] [--threads N]
# DIR defaults: build/cpu (needs the ember and perplexity_bench targets), /work/llama.cpp/build/bin
# (llama-perplexity, llama-quantize). Q4_K cannot hold TinyStories' rows of 128 / 384 values, so
# `ember quantize --type q4_k` refuses (the table says so). The mixed recipes (q4_k_m, q4_k_s,
# q5_k_m, q5_k_s) fall back per tensor as llama-quantize does; each file is compared with
# llama-quantize's from the f32 file (scripts/gguf-compare.py) and the last column says so.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build/cpu LLAMA=/work/llama.cpp/build/bin TEXT=bench/kv_quality_text.txt CTX=128 THREADS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;; --llama) LLAMA=$2; shift 2 ;; --text) TEXT=$2; shift 2 ;;
    --ctx) CTX=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;;
    *) echo "gguf-quality.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
FIX=${EMBER_FIXTURES:-../shared/fixtures}
MODEL=$FIX/models/tinystories-656k
[ -d "$MODEL" ] || { echo "gguf-quality.sh: $MODEL not found (set EMBER_FIXTURES)" >&2; exit 1; }
for bin in "$BUILD/ember" "$BUILD/bench/perplexity_bench" "$LLAMA/llama-perplexity" "$LLAMA/llama-quantize"; do
  [ -x "$bin" ] || { echo "gguf-quality.sh: $bin not found" >&2; exit 1; }
done
OUT=$(mktemp -d /tmp/ember-gguf-quality-XXXXXX)
trap 'rm -rf "$OUT"' EXIT
export LD_LIBRARY_PATH=$LLAMA${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ppl() { grep -o 'Final estimate: PPL = [0-9.]*' | awk '{print $5}'; }
ember_ppl() { "$BUILD/bench/perplexity_bench" --text "$TEXT" --ctx "$CTX" --threads "$THREADS" "$@" 2>/dev/null | ppl; }
llama_ppl() { "$LLAMA/llama-perplexity" -m "$1" -f "$TEXT" -c "$CTX" -t "$THREADS" 2>&1 | ppl; }

"$BUILD/ember" quantize --model "$MODEL" --out "$OUT/ts-f32.gguf" --type f32 >/dev/null
echo "| type | file size | Ember, GGUF from \`ember quantize\` | Ember, folder \`--quantize\` | llama.cpp \`llama-perplexity\`, same GGUF |"
echo "|---|---:|---:|---:|---:|"
for t in f32 bf16 q8_0 q4_0 q4_k q4_k_m q4_k_s q5_k_m q5_k_s; do
  f=$OUT/ts-$t.gguf
  if ! err=$("$BUILD/ember" quantize --model "$MODEL" --out "$f" --type "$t" 2>&1 >/dev/null); then
    echo "| $t | — | refused: ${err#ember quantize: } | — | — |"
    continue
  fi
  case $t in
    f32) folder=$(ember_ppl --model "$MODEL") ;;
    bf16) folder="— (no bf16 load flag)" ;;
    q?_k_?) T=$(echo "$t" | tr a-z A-Z)
      "$LLAMA/llama-quantize" "$OUT/ts-f32.gguf" "$OUT/ts-$t-llama.gguf" "$T" >/dev/null 2>&1
      if python3 scripts/gguf-compare.py "$f" "$OUT/ts-$t-llama.gguf" --keys=general.file_type --quiet >/dev/null; then
        folder="— (no recipe load flag; file byte-identical to \`llama-quantize $T\`'s)"
      else
        folder="— (no recipe load flag; file DIFFERS from \`llama-quantize $T\`'s)"
      fi ;;
    *) folder=$(ember_ppl --model "$MODEL" --quantize "$t") ;;
  esac
  echo "| $t | $(stat -c %s "$f") | $(ember_ppl --model "$f") | $folder | $(llama_ppl "$f") |"
done
echo
echo "text: $TEXT ($(wc -c < "$TEXT") bytes), context $CTX, $THREADS threads, $(date -u +%Y-%m-%dT%H:%MZ)"
