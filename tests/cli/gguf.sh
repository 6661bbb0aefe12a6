#!/bin/sh
# `--model FILE.gguf` end to end on the fixture GGUFs: `ember run` on ts-f32.gguf gives the same
# greedy ids as on the safetensors folder and logs the f32 tensors as read in place (q and k as
# un-permuted copies); on ts-q4_0.gguf the log says its Q4_0/Q8_0 tensors stay quantized for the
# CPU's kernels, as do small-k-q4_k_m.gguf's Q4_K/Q6_K ones (and small-k-iq4_xs.gguf's Q6_K, while
# its IQ4_XS tensors are dequantized), on ts-q5_1.gguf which tensors were dequantized at load;
# `ember tokenize` reads the file's vocabulary; a .gguf path that is not a file, and a file that is not GGUF, are clear
# errors. Skips (77) when the fixtures are absent. Env: EMBER_BIN, EMBER_FIXTURES (or
# EMBER_FIXTURES_DEFAULT).
set -u
. "$(dirname "$0")/common.sh"
gguf="$(dirname "$(dirname "$model")")/gguf"
if [ ! -f "$gguf/ts-f32.gguf" ]; then
  echo "skipped: no GGUF fixtures at $gguf"
  exit 77
fi

run() {
  "$EMBER_BIN" run --model "$1" --prompt "Once upon a time" --max-tokens 24 --temperature 0 \
    --output ids --device cpu 2>&1
}
want=$(run "$model") || fail "run on the safetensors folder exited $?: $want"
out=$(run "$gguf/ts-f32.gguf") || fail "run on ts-f32.gguf exited $?: $out"
[ "$(echo "$out" | tail -n 1)" = "$(echo "$want" | tail -n 1)" ] ||
  fail "ts-f32.gguf ids differ from the safetensors model's: $out // $want"
echo "$out" | grep -q "read in place: 16 F32; q/k rows of 4 tensors put back" || fail "no in-place line for ts-f32.gguf: $out"

out=$(run "$gguf/ts-q4_0.gguf") || fail "run on ts-q4_0.gguf exited $?: $out"
echo "$out" | grep -q "kept quantized for the backend's kernels: 14 Q4_0, 1 Q8_0" ||
  fail "no kept-quantized line for ts-q4_0.gguf: $out"
out=$(run "$gguf/ts-q5_1.gguf") || fail "run on ts-q5_1.gguf exited $?: $out"
echo "$out" | grep -q "kept quantized for the backend's kernels: 1 Q8_0; dequantized to f32 at load (the backend has no kernels for them): 14 Q5_1" ||
  fail "no dequantization line for ts-q5_1.gguf: $out"
out=$(run "$gguf/small-k-q4_k_m.gguf") || fail "run on small-k-q4_k_m.gguf exited $?: $out"
echo "$out" | grep -q "read in place: 5 F32; kept quantized for the backend's kernels: 12 Q4_K, 3 Q6_K; q/k" ||
  fail "no kept-quantized line for small-k-q4_k_m.gguf: $out"
out=$(run "$gguf/small-k-iq4_xs.gguf") || fail "run on small-k-iq4_xs.gguf exited $?: $out"
echo "$out" | grep -q "kept quantized for the backend's kernels: 1 Q6_K; dequantized to f32 at load (the backend has no kernels for them): 14 IQ4_XS" ||
  fail "no dequantization line for small-k-iq4_xs.gguf: $out"

ids=$(printf 'Hello world' | "$EMBER_BIN" tokenize --tokenizer "$gguf/ts-f32.gguf") ||
  fail "tokenize with a .gguf exited $?: $ids"
[ "$ids" = "[80,1288,139,410,555]" ] || fail "tokenize via ts-f32.gguf gave $ids"

out=$("$EMBER_BIN" run --model "$gguf/absent.gguf" --prompt x 2>&1) && fail "absent.gguf ran: $out"
echo "$out" | grep -q "absent.gguf: model directory not found" || fail "absent.gguf: $out"
notgguf="${TMPDIR:-/tmp}/ember_not_a_gguf_$$.gguf"
printf 'not a gguf file at all' > "$notgguf"
out=$("$EMBER_BIN" run --model "$notgguf" --prompt x 2>&1) && fail "a non-GGUF file ran: $out"
rm -f "$notgguf"
echo "$out" | grep -q "$notgguf" || fail "the error does not name the file: $out"
echo "ok"
