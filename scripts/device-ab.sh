#!/usr/bin/env bash
# device-ab.sh: same-instance A/B runs on the GPU machine, after `scripts/device-test.sh --stage`
# here (carry .devbin/ to the GPU machine).
#   scripts/device-ab.sh [--models "M ..."] [--rounds R]
#                        [--engine [--concurrency C] [--prompt P] [--gen G] [--sustain N]]
#                        LABEL[:VAR=VALUE[,VAR=VALUE...]] ...
# M: an `ember synth --like` shape (default: llama-3.2-1b llama-3.1-8b; synthesized as bf16 into
# /tmp/ember-ab-M once per machine) or a model folder. Each LABEL runs with its variables set,
# e.g. base:EMBER_CUDA_MODULE=.devbin/mods/base.so or simt:EMBER_MOE_MMA=0 (modules put
# in .devbin/mods/ xz-compressed are unpacked first; EMBER_AB_BIN=DIR runs another build's
# ember, engine_bench and libember_cuda.so staged in DIR, e.g. base:EMBER_AB_BIN=.devbin/base, for
# a whole-build A/B when the backend interface changed). The configurations run in turn, R rounds
# over (drift between rounds shows the instance's noise), each under a timeout, and print one
# line per run: model, label, round, then
# - by default `ember bench -p 0 -n 128 -r 2` (tg128): the median tok/s and its range;
# - with --engine `engine_bench --concurrency C --prompt-len P --gen-len G --prefix-len 0` (C 128,
#   P 512, G 128, the engine's defaults otherwise): output tok/s of the whole run / of the decode
#   after the last first token, and the mean TTFT; with --sustain N also the closed loop of C
#   clients over N requests (engine_bench --sustain): its steady output tok/s.
# EMBER_AB_DEVICE=cpu runs the same on the CPU backend (to try the script on a small model).
set -uo pipefail
cd "$(dirname "$0")/.."

models="llama-3.2-1b llama-3.1-8b"
rounds=1
engine=0
concurrency=128
prompt=512
gen=128
sustain=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --models) models=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --engine) engine=1; shift ;;
    --concurrency) concurrency=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --sustain) sustain=$2; shift 2 ;;
    *) break ;;
  esac
done
if [[ $# -lt 1 ]]; then
  echo "usage: scripts/device-ab.sh [--models \"M ...\"] [--rounds R] [--engine [--concurrency C]" \
    "[--prompt P] [--gen G] [--sustain N]] LABEL[:VAR=VALUE,...] ..." >&2
  exit 2
fi
device=${EMBER_AB_DEVICE:-cuda}

bash scripts/device-test.sh --unpack
chmod +x .devbin/bin/* 2>/dev/null
for packed in .devbin/mods/*.xz .devbin/*/ember.xz .devbin/*/engine_bench.xz \
  .devbin/*/libember_cuda.so.xz; do
  [[ -e $packed && ! -e ${packed%.xz} ]] && xz -d -k "$packed"
done
export LD_LIBRARY_PATH="$PWD/.devbin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"

# The model folder of M.
model_dir() { if [[ -d $1 ]]; then echo "$1"; else echo "/tmp/ember-ab-$1"; fi; }
for m in $models; do
  dir=$(model_dir "$m")
  if [[ ! -f $dir/config.json ]]; then
    timeout 300 .devbin/bin/ember synth --like "$m" --dtype bf16 --out "$dir" >/dev/null || {
      echo "device-ab: ember synth --like $m failed" >&2
      exit 1
    }
  fi
done

# One run in model folder $1 with the variables $2...: its result on one line.
run_one() {
  local dir=$1 row bin=.devbin/bin v
  shift
  for v in "$@"; do [[ $v == EMBER_AB_BIN=* ]] && bin=${v#EMBER_AB_BIN=}; done
  chmod +x "$bin"/ember "$bin"/engine_bench 2>/dev/null
  if ((engine)); then
    row=$(env "$@" timeout 300 "$bin"/engine_bench --device "$device" --model "$dir" \
      --concurrency "$concurrency" --prompt-len "$prompt" --gen-len "$gen" --prefix-len 0 \
      --sustain "$sustain" 2>&1 | grep -E "^\| $concurrency ")
    # The first table's row: | concurrency | whole tok/s | decode tok/s | wall s | mean TTFT ms |;
    # the closed loop's: | clients | whole tok/s | steady tok/s | steady s | wall s | TTFT | ...
    awk -F'|' '{gsub(/ /, "")} NR == 1 {printf "%s / %s, TTFT %s ms", $3, $4, $6}
               NR == 2 {printf "; closed loop %s steady, TTFT %s ms", $4, $7}' <<<"$row"
  else
    row=$(env "$@" timeout 300 "$bin"/ember bench --device "$device" --model "$dir" -p 0 \
      -n 128 -r 2 2>&1 | grep tg128)
    # The table row: | model | size | params | backend | threads | test | t/s | min .. max |
    awk -F'|' '{print $8 "(" $9 ")"}' <<<"$row"
  fi
}

for ((round = 1; round <= rounds; ++round)); do
  for m in $models; do
    dir=$(model_dir "$m")
    for config in "$@"; do
      label=${config%%:*}
      vars=()
      [[ $config == *:* ]] && IFS=, read -ra vars <<<"${config#*:}"
      echo "$(basename "$m") $label round $round: $(run_one "$dir" "${vars[@]}")"
    done
  done
done
