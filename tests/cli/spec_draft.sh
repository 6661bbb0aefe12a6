#!/bin/sh
# `ember run --spec-method draft`: the tinystories fixture drafting for itself prints exactly the
# output without speculation (greedy and seeded) and reports its drafts; a draft whose tokenizer
# differs at one id (a copy with one added token renamed) is refused naming the id; a draft of
# another vocabulary size (the llama3 fixture, 512 tokens) is refused naming both sizes; draft
# without --draft-model is refused. Skips (77) when the fixture is absent. Env: EMBER_BIN,
# EMBER_FIXTURES (or EMBER_FIXTURES_DEFAULT).
set -u
. "$(dirname "$0")/common.sh"

run() { "$EMBER_BIN" run --model "$model" --prompt "Once upon a time" --max-tokens 48 --device cpu \
  --output ids "$@"; }
for sampling in "--temperature 0" "--temperature 0.8 --seed 7"; do
  # shellcheck disable=SC2086
  plain=$(run $sampling 2>/dev/null) || fail "plain run ($sampling) exited $?"
  # shellcheck disable=SC2086
  spec=$(run $sampling --spec-method draft --draft-model "$model" 2>/tmp/ember_spec_draft.$$) ||
    fail "draft run ($sampling) exited $?: $(cat /tmp/ember_spec_draft.$$)"
  [ "$plain" = "$spec" ] || fail "outputs differ ($sampling): $plain / $spec"
  grep -q "speculation: [1-9][0-9]* drafted" /tmp/ember_spec_draft.$$ ||
    fail "no drafts reported ($sampling): $(cat /tmp/ember_spec_draft.$$)"
done
rm -f /tmp/ember_spec_draft.$$

other=$(mktemp -d)
for f in "$model"/*; do ln -s "$f" "$other/$(basename "$f")"; done
rm "$other/tokenizer.json"
sed 's/<|end_story|>/<|fin_story|>/g' "$model/tokenizer.json" > "$other/tokenizer.json"
out=$(run --spec-method draft --draft-model "$other" 2>&1)
code=$?
rm -rf "$other"
[ $code != 0 ] || fail "a draft with another tokenizer was accepted: $out"
echo "$out" | grep -q "token 2 is" || fail "the tokenizer refusal does not name the id: $out"

llama="$(dirname "$model")/llama3"
if [ -f "$llama/config.json" ]; then
  out=$(run --spec-method draft --draft-model "$llama" 2>&1) && fail "a 512-token draft was accepted"
  echo "$out" | grep -q "512 tokens, the target's 2048" || fail "no sizes in: $out"
fi

out=$(run --spec-method draft 2>&1) && fail "draft without --draft-model was accepted"
echo "$out" | grep -q "needs --draft-model" || fail "no --draft-model in: $out"
exit 0
