#!/bin/sh
# `ember quantize` end to end on the tinystories fixture: the Q4_0 file it writes is a GGUF that
# `ember run` loads (its Q4_0 projections kept quantized) with the greedy ids of the folder run
# with `--quantize q4_0`, and `ember tokenize` gives the folder's ids from the file's vocabulary.
# Bad options are clear errors naming the thing (no --type, an unknown type, an --out not ending
# in .gguf, a missing folder, an unwritable destination, a q4_k of rows of 128 values) and leave
# no file behind; an existing destination survives a failed write. Skips (77) without the fixture. Env: EMBER_BIN,
# EMBER_FIXTURES (or EMBER_FIXTURES_DEFAULT).
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
expect_error "--type: unsupported type 'q3_k' (supported: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k)" \
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
echo "ok"
