#!/bin/sh
# --kv-cache-dtype / --kv-cache-dtype-layers end to end on the tinystories fixture: `ember run`
# with an f16 KV cache gives the float32 cache's greedy ids, int8 and int4 (+ a per-layer
# override) run, bad values are refused naming the flag and the value, and `ember bench` labels
# its rows with the KV format. Skips (77) when the fixture is absent. Env: EMBER_BIN,
# EMBER_FIXTURES (or EMBER_FIXTURES_DEFAULT).
set -u
. "$(dirname "$0")/common.sh"

run() {
  "$EMBER_BIN" run --model "$model" --device cpu --prompt-ids '[1, 400, 37, 901, 12]' \
    --max-tokens 24 --temperature 0 --output ids "$@" 2>&1
}
f32=$(run) || fail "run exited $?: $f32"
f16=$(run --kv-cache-dtype f16) || fail "run --kv-cache-dtype f16 exited $?: $f16"
[ "$(echo "$f32" | tail -n 1)" = "$(echo "$f16" | tail -n 1)" ] ||
  fail "f16 KV changed the greedy ids: $(echo "$f32" | tail -n 1) vs $(echo "$f16" | tail -n 1)"
out=$(run --kv-cache-dtype int8) || fail "run --kv-cache-dtype int8 exited $?: $out"
out=$(run --kv-cache-dtype int4 --kv-cache-dtype-layers=-1=bf16) ||
  fail "run int4 with a bf16 last layer exited $?: $out"
echo "$out" | tail -n 1 | grep -q '^\[' || fail "no ids line: $out"

out=$(run --kv-cache-dtype int5) && fail "--kv-cache-dtype int5 was accepted: $out"
echo "$out" | grep -q "\-\-kv-cache-dtype must be .* got 'int5'" || fail "bad dtype message: $out"
out=$(run --kv-cache-dtype-layers 0:7=bf16) && fail "layers 0:7 of 2 were accepted: $out"
echo "$out" | grep -q "\-\-kv-cache-dtype-layers: layers 0:7" || fail "bad layers message: $out"
out=$(run --kv-cache-dtype-layers 0-1=bf16) && fail "item 0-1=bf16 was accepted: $out"
echo "$out" | grep -q "item '0-1=bf16'" || fail "bad item message: $out"

out=$("$EMBER_BIN" bench --model "$model" -p 16 -n 8 -r 1 --device cpu --kv-cache-dtype int4 2>&1) ||
  fail "bench --kv-cache-dtype int4 exited $?: $out"
echo "$out" | grep -q 'KV int4 |.*| tg8 |' || fail "no tg8 row labelled KV int4: $out"
echo "ok"
