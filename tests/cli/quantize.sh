#!/bin/sh
# `ember quantize` end to end on the tinystories fixture: the Q4_0 file it writes is a GGUF that
# `ember run` loads (its Q4_0 projections kept quantized) with the greedy ids of the folder run
# with `--quantize q4_0`, and `ember tokenize` gives the folder's ids from the file's vocabulary.
# Bad options are clear errors naming the thing (no --type, an unknown type, an --out not ending
# in .gguf, a missing folder, an unwritable destination, a q4_k of rows of 128 values) and leave
# no file behind; an existing destination survives a failed write. The mixed recipe q4_k_m (rows
# of 128 / 384 values: llama.cpp's Q5_0 fallback, Q8_0 for the tied head and the Q6_K layers)
# loads and runs; with LLAMA_QUANTIZE (a llama-quantize binary) and python3, each of q4_k_m,
# q4_k_s, q5_k_m, q5_k_s equals llama-quantize's file from the f32 GGUF tensor for tensor
# (scripts/gguf-compare.py: types, shapes, bytes, general.file_type) and Ember's greedy ids on the
# two files agree. Skips (77) without the fixture. Env: EMBER_BIN, EMBER_FIXTURES (or
# EMBER_FIXTURES_DEFAULT), LLAMA_QUANTIZE (optional).
set -u
. "$(dirname "$0")/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

out=$("$EMBER_BIN" quantize --model "$model" --out "$tmp/ts-q4_0.gguf" --type q4_0 2>&1) ||
  fail "quantize q4_0 exited $?: $out"
echo "$out" | grep -q "wrote $tmp/ts-q4_0.gguf: 20 tensors (6 F32, 14 Q4_0)" || fail "summary: $out"
run() {
  "$EMBER_BIN" run --model "$1" "$2" "$3" --prompt "Once upon a time" --max-tokens 24 \
    --temperature 0 --output ids --device cpu 2>&1
}
want=$(run "$model" --quantize q4_0) || fail "run --quantize q4_0 exited $?: $want"
got=$(run "$tmp/ts-q4_0.gguf" --device cpu) || fail "run on the written file exited $?: $got"
[ "$(echo "$got" | tail -n 1)" = "$(echo "$want" | tail -n 1)" ] ||
  fail "the written file's ids differ from --quantize q4_0's: $got // $want"
echo "$got" | grep -q "kept quantized for the backend's kernels: 14 Q4_0" ||
  fail "no kept-quantized line: $got"
text="Once upon a time, Lily saw a big dog."
a=$(printf '%s' "$text" | "$EMBER_BIN" tokenize --tokenizer "$model" 2>/dev/null)
b=$(printf '%s' "$text" | "$EMBER_BIN" tokenize --tokenizer "$tmp/ts-q4_0.gguf" 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "tokenize differs: $a // $b"

expect_error() {  # expect_error WANT ARGS...: exit status 1 or 2 and WANT in the message
  want_msg=$1
  shift
  msg=$("$EMBER_BIN" quantize "$@" 2>&1) && fail "quantize $* succeeded"
  echo "$msg" | grep -qF -- "$want_msg" || fail "quantize $*: no '$want_msg' in: $msg"
}
expect_error "--model, --out and --type are required" --model "$model" --out "$tmp/x.gguf"
expect_error "--type: unsupported type 'q3_k' (supported: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m, q4_k_s, q5_k_m, q5_k_s)" \
  --model "$model" --out "$tmp/x.gguf" --type q3_k
expect_error "--out '$tmp/x.bin' must end in .gguf" --model "$model" --out "$tmp/x.bin" --type f16
expect_error "$tmp/none: model directory not found" --model "$tmp/none" --out "$tmp/x.gguf" --type f16
expect_error "$tmp/no/dir/x.gguf: cannot create a file beside it" \
  --model "$model" --out "$tmp/no/dir/x.gguf" --type f16
expect_error "GGUF tensor 'blk.0.attn_k.weight': a row of 128 Q4_K elements is not a whole number of 256-element blocks" \
  --model "$model" --out "$tmp/x.gguf" --type q4_k
[ ! -e "$tmp/x.gguf" ] || fail "a failed quantize left $tmp/x.gguf"
# A destination that exists is replaced only by a complete file.
before=$(cksum < "$tmp/ts-q4_0.gguf")
expect_error "not a whole number" --model "$model" --out "$tmp/ts-q4_0.gguf" --type q4_k
[ "$(cksum < "$tmp/ts-q4_0.gguf")" = "$before" ] || fail "a failed quantize changed the earlier file"
[ "$(ls "$tmp")" = "ts-q4_0.gguf" ] || fail "files left behind: $(ls "$tmp")"

out=$("$EMBER_BIN" quantize --model "$model" --out "$tmp/ts-q4_k_m.gguf" --type q4_k_m 2>&1) ||
  fail "quantize q4_k_m exited $?: $out"
echo "$out" | grep -q "20 tensors (5 F32, 12 Q5_0, 3 Q8_0)" || fail "q4_k_m summary: $out"
got=$(run "$tmp/ts-q4_k_m.gguf" --device cpu) || fail "run on the q4_k_m file exited $?: $got"
echo "$got" | grep -q "kept quantized for the backend's kernels: 3 Q8_0; dequantized to f32 at load (the backend has no kernels for them): 12 Q5_0" ||
  fail "q4_k_m load line: $got"
if [ -n "${LLAMA_QUANTIZE:-}" ]; then
  compare="$(dirname "$0")/../../scripts/gguf-compare.py"
  "$EMBER_BIN" quantize --model "$model" --out "$tmp/ts-f32.gguf" --type f32 >/dev/null 2>&1 ||
    fail "quantize f32 failed"
  for t in q4_k_m q4_k_s q5_k_m q5_k_s; do
    "$EMBER_BIN" quantize --model "$model" --out "$tmp/$t.gguf" --type $t >/dev/null 2>&1 ||
      fail "quantize $t failed"
    "$LLAMA_QUANTIZE" "$tmp/ts-f32.gguf" "$tmp/$t-llama.gguf" "$(echo $t | tr a-z A-Z)" \
      >"$tmp/llama.log" 2>&1 || fail "llama-quantize $t failed: $(tail -n 3 "$tmp/llama.log")"
    diff=$(python3 "$compare" "$tmp/$t.gguf" "$tmp/$t-llama.gguf" --keys=general.file_type --quiet) ||
      fail "$t differs from llama-quantize's: $diff"
    a=$(run "$tmp/$t.gguf" --device cpu | tail -n 1)
    b=$(run "$tmp/$t-llama.gguf" --device cpu | tail -n 1)
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "$t: greedy ids differ from llama-quantize's file: $a // $b"
  done
fi
echo "ok"
