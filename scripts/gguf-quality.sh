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
# `ember quantize --type q4_k` refuses (the table says so); llama-quantize's Q4_K file (it falls
# back to Q5_0 for such rows) is measured by both instead.
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

echo "| type | file size | Ember, GGUF from \`ember quantize\` | Ember, folder \`--quantize\` | llama.cpp \`llama-perplexity\`, same GGUF |"
echo "|---|---:|---:|---:|---:|"
for t in f32 bf16 q8_0 q4_0 q4_k; do
  f=$OUT/ts-$t.gguf
  if ! err=$("$BUILD/ember" quantize --model "$MODEL" --out "$f" --type "$t" 2>&1 >/dev/null); then
    echo "| $t | — | refused: ${err#ember quantize: } | — | — |"
    continue
  fi
  case $t in
    f32) folder=$(ember_ppl --model "$MODEL") ;;
    bf16) folder="— (no bf16 load flag)" ;;
    *) folder=$(ember_ppl --model "$MODEL" --quantize "$t") ;;
  esac
  echo "| $t | $(stat -c %s "$f") | $(ember_ppl --model "$f") | $folder | $(llama_ppl "$f") |"
done
# llama-quantize's own Q4_K of the f32 file (Q5_0 fallback for rows that are not multiples of 256).
"$BUILD/ember" quantize --model "$MODEL" --out "$OUT/ts-f32.gguf" --type f32 >/dev/null
"$LLAMA/llama-quantize" "$OUT/ts-f32.gguf" "$OUT/ts-q4_k-llama.gguf" Q4_K >/dev/null 2>&1
echo "| Q4_K by llama-quantize (falls back to Q5_0) | $(stat -c %s "$OUT/ts-q4_k-llama.gguf") | $(ember_ppl --model "$OUT/ts-q4_k-llama.gguf") | — | $(llama_ppl "$OUT/ts-q4_k-llama.gguf") |"
echo
echo "text: $TEXT ($(wc -c < "$TEXT") bytes), context $CTX, $THREADS threads, $(date -u +%Y-%m-%dT%H:%MZ)"
