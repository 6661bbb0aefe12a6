#!/usr/bin/env bash
# llama-cpp-concurrent.sh: issue 41's concurrent comparison with llama.cpp on the CPU, in one run:
# C sequences at once, each a P-token prompt and G generated tokens, on the same GGUF file, the
# whole run's wall time and the decode rate of each engine.
#  - llama.cpp: `llama-batched-bench -npp P -ntg G -npl C` (its T s and S_TG t/s columns);
#  - Ember: `engine_bench --concurrency C --prompt-len P --gen-len G` (its wall s and decode tok/s
#    columns; f16 files with --cpu-matmul auto).
# The files are scripts/llama-cpp-compare.sh's (run it first, or give --file). Rounds alternate the
# two engines; the load average is printed beside each pair.
# usage: scripts/llama-cpp-concurrent.sh [--build DIR] --llama BIN_DIR [--file F.gguf]
#          [--type f16|q8_0|...] [--threads 2] [--concurrency 16] [--prompt 128] [--gen 64]
#          [--rounds 2]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build/release LLAMA= FILE= TYPE=f16 THREADS=2 C=16 P=128 G=64 ROUNDS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;; --llama) LLAMA=$2; shift 2 ;; --file) FILE=$2; shift 2 ;;
    --type) TYPE=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;;
    --concurrency) C=$2; shift 2 ;; --prompt) P=$2; shift 2 ;; --gen) G=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) echo "unknown argument: $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
BENCH=$BUILD/bench/engine_bench
[ -x "$BENCH" ] || { echo "no $BENCH: build first (scripts/build.sh)" >&2; exit 1; }
[ -x "$LLAMA/llama-batched-bench" ] || { echo "no llama-batched-bench in --llama '$LLAMA'" >&2; exit 1; }
if [ -z "$FILE" ]; then
  FILE=.cache/llama-compare/l1b-$TYPE-llama.gguf
  [ "$TYPE" = f16 ] && FILE=.cache/llama-compare/l1b-f16.gguf
fi
[ -f "$FILE" ] || { echo "no $FILE: run scripts/llama-cpp-compare.sh first, or give --file" >&2; exit 1; }
extra=()
[ "$TYPE" = f16 ] && extra=(--cpu-matmul auto)

load() { cut -d' ' -f1 /proc/loadavg; }
# llama-batched-bench's table row for the run: T s (whole run) and S_TG t/s (decode).
llama_run() {
  "$LLAMA/llama-batched-bench" -m "$FILE" -c $((C * (P + G) + 256)) -b 2048 -ub 512 \
    -npp "$P" -ntg "$G" -npl "$C" -t "$THREADS" 2>/dev/null |
    awk -F'|' -v p="$P" -v g="$G" '$2+0 == p && $3+0 == g {t=$10; s=$9} END {gsub(/ /,"",t); gsub(/ /,"",s); print t, s}'
}
# engine_bench's row for the level: wall s and decode tok/s (all running).
ember_run() {
  "$BENCH" --model "$FILE" --device cpu --threads "$THREADS" --concurrency "$C" \
    --prompt-len "$P" --gen-len "$G" --prefix-len 0 "${extra[@]}" 2>/dev/null |
    awk -F'|' -v c="$C" '$2+0 == c && NF > 5 {w=$5; d=$4} END {gsub(/ /,"",w); gsub(/ /,"",d); print w, d}'
}
echo "Ember $(git rev-parse --short HEAD) vs llama.cpp ($LLAMA), $FILE, $THREADS threads," \
  "$C x ($P + $G), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "| round | llama.cpp whole s | Ember whole s | time ratio | llama.cpp decode tok/s | Ember decode tok/s | ratio | load before / after |"
echo "|---|---:|---:|---:|---:|---:|---:|---|"
for r in $(seq 1 "$ROUNDS"); do
  before=$(load)
  read -r lt ld < <(llama_run)
  read -r et ed < <(ember_run)
  python3 -c "print(f'| $r | {$lt:.1f} | {$et:.1f} | {$et/$lt:.2f}x | {$ld:.1f} | {$ed:.1f} | {$ed/$ld:.2f}x | $before / $(load) |')"
done
