#!/bin/sh
# `ember bench -d`: on the tinystories fixture, the pp/tg rows run at the requested depth and say
# so, a depth past the model's context is refused with the numbers, and no depth keeps the plain
# labels; the tg variants (--tg-logits, --no-overlap) run, and not together; -p takes a list of
# sizes (one pp row each) and refuses a malformed one. Skips (77) when the fixture is absent. Env: EMBER_BIN, EMBER_FIXTURES (or EMBER_FIXTURES_DEFAULT).
set -u
. "$(dirname "$0")/common.sh"

out=$("$EMBER_BIN" bench --model "$model" -p 16 -n 8 -d 200 -r 1 --device cpu 2>&1) ||
  fail "bench -d 200 exited $?: $out"
echo "$out" | grep -q '| pp16 @ d200 |' || fail "no pp16 @ d200 row: $out"
echo "$out" | grep -q '| tg8 @ d200 |' || fail "no tg8 @ d200 row: $out"

out=$("$EMBER_BIN" bench --model "$model" -p 16 -n 8 -r 1 --device cpu 2>&1) ||
  fail "bench without -d exited $?: $out"
echo "$out" | grep -q '| tg8 |' || fail "no plain tg8 row: $out"
echo "$out" | grep -q '@ d' && fail "a depth label without -d: $out"

out=$("$EMBER_BIN" bench --model "$model" -p 8,16 -n 0 -r 1 --device cpu 2>&1) ||
  fail "bench -p 8,16 exited $?: $out"
echo "$out" | grep -q '| pp8 |' || fail "no pp8 row for -p 8,16: $out"
echo "$out" | grep -q '| pp16 |' || fail "no pp16 row for -p 8,16: $out"
echo "$out" | grep -q '| tg' && fail "a tg row with -n 0: $out"
out=$("$EMBER_BIN" bench --model "$model" -p 8,,16 -n 0 -r 1 --device cpu 2>&1)
[ $? = 2 ] || fail "-p 8,,16 was accepted: $out"
echo "$out" | grep -q "got '8,,16'" || fail "-p 8,,16 error does not quote the value: $out"

out=$("$EMBER_BIN" bench --model "$model" -p 0 -n 8 -r 1 --device cpu --tg-logits 2>&1) ||
  fail "bench --tg-logits exited $?: $out"
echo "$out" | grep -q '| tg8 |' || fail "no tg8 row with --tg-logits: $out"

out=$("$EMBER_BIN" bench --model "$model" -p 0 -n 8 -r 1 --device cpu --no-overlap 2>&1) ||
  fail "bench --no-overlap exited $?: $out"
echo "$out" | grep -q '| tg8 |' || fail "no tg8 row with --no-overlap: $out"
out=$("$EMBER_BIN" bench --model "$model" -p 0 -n 8 -r 1 --device cpu --no-overlap --tg-logits 2>&1)
[ $? = 2 ] || fail "--no-overlap with --tg-logits was accepted: $out"

out=$("$EMBER_BIN" bench --model "$model" -p 16 -n 8 -d 500 -r 1 --device cpu 2>&1)
code=$?
[ "$code" = 2 ] || fail "-d 500 on a 512-token model exited $code, want 2: $out"
echo "$out" | grep -q 'max_position_embeddings (512)' || fail "-d 500 error does not name the limit: $out"
echo "ok"
