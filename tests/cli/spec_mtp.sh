#!/bin/sh
# `ember run --spec-method mtp`: a tiny-deepseek-v3 synth written with its multi-token-prediction
# module (`ember synth --mtp`, random weights) prints exactly the output without speculation and
# reports its drafts; the same synth without the module is refused naming the missing tensors;
# the deepseek_v3 fixture (transformers dropped its module) likewise; qwen3_next is refused naming
# its recurrent state; llama3 naming its model type; --draft-model with mtp is refused. Skips (77)
# when the fixtures are absent. Env: EMBER_BIN, EMBER_FIXTURES (or EMBER_FIXTURES_DEFAULT).
set -u
. "$(dirname "$0")/common.sh"
models="$(dirname "$model")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$EMBER_BIN" synth --like tiny-deepseek-v3 --layers 2 --mtp --out "$tmp/mtp" >/dev/null ||
  fail "synth --mtp exited $?"
"$EMBER_BIN" synth --like tiny-deepseek-v3 --layers 2 --out "$tmp/plain" >/dev/null ||
  fail "synth exited $?"
run() { "$EMBER_BIN" run --prompt-ids "[5, 17, 300, 42, 7, 99, 256, 3]" --max-tokens 24 \
  --temperature 0 --device cpu --output ids "$@"; }

plain=$(run --model "$tmp/mtp" 2>/dev/null) || fail "plain run exited $?"
spec=$(run --model "$tmp/mtp" --spec-method mtp 2>"$tmp/log") ||
  fail "mtp run exited $?: $(cat "$tmp/log")"
[ "$plain" = "$spec" ] || fail "outputs differ: $plain / $spec"
grep -q "speculation: [1-9][0-9]* drafted" "$tmp/log" || fail "no drafts reported: $(cat "$tmp/log")"

out=$(run --model "$tmp/plain" --spec-method mtp 2>&1) && fail "a folder without the module was accepted"
echo "$out" | grep -q "model.layers.2.eh_proj.weight" || fail "no missing tensor named in: $out"
if [ -f "$models/deepseek_v3/config.json" ]; then
  out=$(run --model "$models/deepseek_v3" --spec-method mtp 2>&1) && fail "the fixture was accepted"
  echo "$out" | grep -q "no multi-token-prediction weights" || fail "no reason in: $out"
fi
if [ -f "$models/qwen3_next/config.json" ]; then
  out=$(run --model "$models/qwen3_next" --spec-method mtp 2>&1) && fail "the qwen3_next fixture was accepted"
  echo "$out" | grep -q "no multi-token-prediction weights" || fail "no reason in: $out"
fi
if [ -f "$models/llama3/config.json" ]; then
  out=$(run --model "$models/llama3" --spec-method mtp 2>&1) && fail "llama3 was accepted"
  echo "$out" | grep -q '"llama" has no multi-token-prediction module' || fail "no reason in: $out"
fi
out=$(run --model "$tmp/mtp" --spec-method mtp --draft-model "$tmp/mtp" 2>&1) &&
  fail "--draft-model with mtp was accepted"
echo "$out" | grep -q "only used with --spec-method draft" || fail "no reason in: $out"
exit 0
