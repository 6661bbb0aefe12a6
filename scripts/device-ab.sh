#!/usr/bin/env bash
# device-ab.sh: same-instance A/B runs of `ember bench` tg128 on the GPU machine, after
# `scripts/device-test.sh --stage` here (carry .devbin/ to the GPU machine).
#   scripts/device-ab.sh [--models "M ..."] [--rounds R] LABEL[:VAR=VALUE[,VAR=VALUE...]] ...
# M: an `ember synth --like` shape (default: llama-3.2-1b llama-3.1-8b; synthesized as bf16 into
# /tmp/ember-ab-M once per machine) or a model folder. Each LABEL runs with its variables set,
# e.g. base:EMBER_CUDA_MODULE=.devbin/mods/base.so or ring96:EMBER_GEMV_RING_KB=96 (modules put
# in .devbin/mods/ xz-compressed are unpacked first). The configurations run in turn, R rounds
# over (drift between rounds shows the instance's noise), each `ember bench -p 0 -n 128 -r 2`.
# Prints one line per run: model, label, round, then the median tok/s and its range.
# EMBER_AB_DEVICE=cpu runs the same on the CPU backend (to try the script on a small model).
set -uo pipefail
cd "$(dirname "$0")/.."

models="llama-3.2-1b llama-3.1-8b"
rounds=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --models) models=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) break ;;
  esac
done
if [[ $# -lt 1 ]]; then
  echo "usage: scripts/device-ab.sh [--models \"M ...\"] [--rounds R] LABEL[:VAR=VALUE,...] ..." >&2
  exit 2
fi
device=${EMBER_AB_DEVICE:-cuda}

bash scripts/device-test.sh --unpack
chmod +x .devbin/bin/* 2>/dev/null
for packed in .devbin/mods/*.xz; do
  [[ -e $packed && ! -e ${packed%.xz} ]] && xz -d -k "$packed"
done
export LD_LIBRARY_PATH="$PWD/.devbin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
ember=.devbin/bin/ember

# The model folder of M.
model_dir() { if [[ -d $1 ]]; then echo "$1"; else echo "/tmp/ember-ab-$1"; fi; }
for m in $models; do
  dir=$(model_dir "$m")
  if [[ ! -f $dir/config.json ]]; then
    "$ember" synth --like "$m" --dtype bf16 --out "$dir" >/dev/null || {
      echo "device-ab: ember synth --like $m failed" >&2
      exit 1
    }
  fi
done

for ((round = 1; round <= rounds; ++round)); do
  for m in $models; do
    dir=$(model_dir "$m")
    for config in "$@"; do
      label=${config%%:*}
      vars=()
      [[ $config == *:* ]] && IFS=, read -ra vars <<<"${config#*:}"
      row=$(env "${vars[@]}" "$ember" bench --device "$device" --model "$dir" -p 0 -n 128 -r 2 \
        2>&1 | grep tg128)
      # The table row: | model | size | params | backend | threads | test | t/s | min .. max |
      echo "$(basename "$m") $label round $round: $(awk -F'|' '{print $8 "(" $9 ")"}' <<<"$row")"
    done
  done
done
