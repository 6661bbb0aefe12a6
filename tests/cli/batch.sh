#!/bin/sh
# `ember batch` end to end: on the tinystories fixture, greedy lines by text and by ids give the
# same tokens, refused lines (unknown field, JSON mode on a vocabulary without "{") become error
# lines in place while the rest run; with qwen3's tokenizer on an `ember synth` body, a JSON-mode
# line's text is a JSON object (or its start, when max_tokens cuts it), and one nudged toward "}"
# by logit_bias finishes with a whole object; logprobs and prompt logprobs; the engine limits'
# flags (0: the device's default; negative: refused naming the flag). Skips (77) when the
# fixture is absent; the qwen3 part is skipped when its tokenizer is. Env: EMBER_BIN,
# EMBER_FIXTURES (or EMBER_FIXTURES_DEFAULT), EMBER_TOKENIZERS (or EMBER_TOKENIZERS_DEFAULT).
set -u
. "$(dirname "$0")/common.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# One JSON field of output line N (1-based), via node (installed by scripts/setup.sh).
field() {
  node -e 'const l = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n");
           const v = JSON.parse(l[Number(process.argv[2]) - 1])[process.argv[3]];
           console.log(typeof v === "string" ? v : JSON.stringify(v));' "$1" "$2" "$3"
}

cat >"$dir/in.jsonl" <<'JSONL'
{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "colour": "red"}
{"prompt_ids": [1, 80, 147, 201, 282, 57], "max_tokens": 12, "temperature": 0}
{"prompt": "Once upon a time", "max_tokens": 12, "response_format": {"type": "json_object"}}
JSONL
"$EMBER_BIN" batch --model "$model" --input "$dir/in.jsonl" --output "$dir/out.jsonl" \
  --device cpu 2>"$dir/err" || true
[ "$(wc -l <"$dir/out.jsonl")" = 4 ] || fail "want 4 output lines: $(cat "$dir/out.jsonl")"
[ "$(field "$dir/out.jsonl" 1 ids)" = "$(field "$dir/out.jsonl" 3 ids)" ] ||
  fail "text and id prompts differ: $(cat "$dir/out.jsonl")"
field "$dir/out.jsonl" 2 error | grep -q "argument supplied: colour" ||
  fail "no error for the unknown field: $(cat "$dir/out.jsonl")"
field "$dir/out.jsonl" 4 error | grep -q "response_format: no token of this model.s vocabulary can start" ||
  fail "JSON mode on tinystories was not refused: $(cat "$dir/out.jsonl")"

# The engine limits: 0 is the device's default (the flags' default), a negative one is refused
# naming its flag, before any line runs.
head -1 "$dir/in.jsonl" >"$dir/one.jsonl"
"$EMBER_BIN" batch --model "$model" --input "$dir/one.jsonl" --output "$dir/limits.jsonl" \
  --device cpu --max-batch 0 --max-step-tokens 0 2>"$dir/err" ||
  fail "limits of 0 were refused: $(cat "$dir/err")"
[ "$(field "$dir/limits.jsonl" 1 ids)" = "$(field "$dir/out.jsonl" 1 ids)" ] ||
  fail "limits of 0 changed the tokens"
for flag in --max-batch --max-step-tokens; do
  if "$EMBER_BIN" batch --model "$model" --input "$dir/one.jsonl" --output "$dir/bad.jsonl" \
    --device cpu $flag -1 2>"$dir/err"; then
    fail "$flag -1 was accepted"
  fi
  grep -q -- "$flag" "$dir/err" || fail "$flag -1: the error does not name the flag: $(cat "$dir/err")"
done

# Logprobs: a scored prompt (max_tokens 0) and a greedy line. The prompt entries are one per
# token, the first null; a greedy token is its own top 1; the prompt's last entry, scored with the
# greedy line's first token appended, is that token's logprob (the same logits row).
cat >"$dir/lp.jsonl" <<'JSONL'
{"prompt_ids": [1, 80, 147, 201, 282, 57, 313], "max_tokens": 0, "prompt_logprobs": 2}
{"prompt_ids": [1, 80, 147, 201, 282, 57], "max_tokens": 4, "temperature": 0, "logprobs": 1}
{"prompt_ids": [1, 80], "max_tokens": 0}
JSONL
"$EMBER_BIN" batch --model "$model" --input "$dir/lp.jsonl" --output "$dir/lp.out" \
  --device cpu 2>"$dir/err" || true
node -e 'const l = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n")
           .map(JSON.parse);
         const fail = (m) => { console.error(m); process.exit(1); };
         const p = l[0].prompt_logprobs, g = l[1].logprobs;
         if (!p || p.length !== 7 || p[0] !== null) fail("prompt_logprobs shape");
         for (const e of p.slice(1))
           if (!(e.logprob <= 0) || e.top_logprobs.length !== 2 || e.rank < 1) fail("prompt entry");
         if (l[0].ids.length !== 0) fail("max_tokens 0 generated tokens");
         if (!g || g.length !== 4) fail("logprobs shape");
         for (const e of g)
           if (e.top_logprobs[0].id !== e.id || e.top_logprobs[0].logprob !== e.logprob)
             fail("a greedy token is not its own top 1");
         if (Math.abs(p[6].logprob - g[0].logprob) > 1e-6) fail("scored != generated logprob");
         if (!/needs prompt_logprobs/.test(l[2].error)) fail("max_tokens 0 without scoring");' \
  "$dir/lp.out" || fail "logprobs: $(cat "$dir/lp.out")"

qwen3="${EMBER_TOKENIZERS:-${EMBER_TOKENIZERS_DEFAULT:-}}/qwen3"
if [ -f "$qwen3/tokenizer.json" ]; then
  "$EMBER_BIN" synth --like tiny-qwen3 --tokenizer "$qwen3" --out "$dir/tq" >/dev/null 2>&1 ||
    fail "ember synth tiny-qwen3 failed"
  cat >"$dir/json.jsonl" <<'JSONL'
{"prompt": "JSON:", "max_tokens": 40, "temperature": 1, "seed": 3, "response_format": {"type": "json_object"}}
{"prompt": "JSON:", "max_tokens": 40, "temperature": 1, "seed": 4, "response_format": {"type": "json_object"}, "logit_bias": {"92": 12}}
{"prompt": "JSON:", "max_tokens": 200, "temperature": 1, "seed": 5, "logit_bias": {"92": 30, "11": 30}, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"ok": {"type": "boolean"}, "none": {"type": "null"}}, "required": ["ok", "none"]}}}}
{"prompt": "JSON:", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"s": {"type": "array", "contains": {"const": "x"}}}}}}}
JSONL
  # (Exits non-zero: line 4 is refused, in place.)
  "$EMBER_BIN" batch --model "$dir/tq" --input "$dir/json.jsonl" --output "$dir/json.out" \
    --device cpu 2>"$dir/err" || true
  [ "$(wc -l <"$dir/json.out")" = 4 ] || fail "batch on the qwen3 synth: $(cat "$dir/err")"
  # (Line 2 nudges "}", qwen3 id 92, so the random model closes its object: it must finish.)
  [ "$(field "$dir/json.out" 2 finish_reason)" = stop ] ||
    fail "the nudged JSON line did not finish: $(cat "$dir/json.out")"
  for n in 1 2; do
    text=$(field "$dir/json.out" $n text)
    finish=$(field "$dir/json.out" $n finish_reason)
    case "$text" in "{"*) ;; *) fail "line $n text does not start an object: $text" ;; esac
    if [ "$finish" = stop ]; then
      node -e 'const v = JSON.parse(process.argv[1]);
               if (typeof v !== "object" || v === null || Array.isArray(v)) process.exit(1);' \
        "$text" || fail "line $n finished but is not a JSON object: $text"
    else
      [ "$finish" = length ] || fail "line $n finish_reason $finish"
    fi
  done
  # Line 3: a JSON schema (nudged to close); line 4: a keyword outside the subset.
  [ "$(field "$dir/json.out" 3 finish_reason)" = stop ] ||
    fail "the JSON-schema line did not finish: $(cat "$dir/json.out")"
  node -e 'const v = JSON.parse(process.argv[1]);
           if (typeof v.ok !== "boolean" || v.none !== null ||
               Object.keys(v).join() !== "ok,none") process.exit(1);' \
    "$(field "$dir/json.out" 3 text)" || fail "line 3 is not valid against its schema: $(field "$dir/json.out" 3 text)"
  field "$dir/json.out" 4 error | grep -q "properties.s.contains" ||
    fail "the unsupported keyword was not named: $(cat "$dir/json.out")"
  # A first line that asks for structured output through vLLM's guided_choice.
  printf '%s\n' '{"prompt": "Answer:", "max_tokens": 8, "temperature": 1, "seed": 6, "guided_choice": ["yes", "no"]}' \
    >"$dir/choice.jsonl"
  "$EMBER_BIN" batch --model "$dir/tq" --input "$dir/choice.jsonl" --output "$dir/choice.out" \
    --device cpu 2>"$dir/err" || fail "guided_choice batch: $(cat "$dir/err")"
  case "$(field "$dir/choice.out" 1 text)" in
    yes | no) ;;
    *) fail "the guided_choice line is not one of its choices: $(cat "$dir/choice.out")" ;;
  esac
  # A first line with a GBNF grammar (llama.cpp's `grammar`), and a bad grammar refused in place.
  printf '%s\n' '{"prompt": "Answer:", "max_tokens": 20, "temperature": 1, "seed": 7, "grammar": "root ::= (\"yes\" | \"no\") \" \" [0-9]{1,2}"}' \
    '{"prompt": "Answer:", "guided_grammar": "root ::= answer"}' >"$dir/grammar.jsonl"
  "$EMBER_BIN" batch --model "$dir/tq" --input "$dir/grammar.jsonl" --output "$dir/grammar.out" \
    --device cpu 2>"$dir/err" || true  # line 2 is refused
  field "$dir/grammar.out" 1 text | grep -Eqx '(yes|no) [0-9]{1,2}' ||
    fail "the grammar line is not a sentence of its grammar: $(cat "$dir/grammar.out")"
  field "$dir/grammar.out" 2 error | grep -q "guided_grammar: line 1, column 10 (rule 'root'): undefined rule 'answer'" ||
    fail "the bad grammar was not named: $(cat "$dir/grammar.out")"
else
  echo "note: no qwen3 tokenizer at $qwen3; JSON-mode part skipped"
fi
# LoRA adapters (the llama3 fixture and its llama3-a / llama3-b adapters): the `adapter` field of a
# line, --adapter as the default, "none" the base model, an unknown name refused on its line; the
# adapters' outputs are the transformers goldens of the merged adapters.
fixtures="${EMBER_FIXTURES:-${EMBER_FIXTURES_DEFAULT:-}}"
if [ -f "$fixtures/adapters/llama3-b/golden.json" ]; then
  p='"prompt": [1, 17, 300, 42, 42, 8, 511, 99, 250, 3, 77, 128], "max_tokens": 24, "temperature": 0, "ignore_eos": true'
  printf '%s\n' "{$p, \"adapter\": \"a\"}" "{$p}" "{$p, \"adapter\": \"none\"}" \
    "{$p, \"adapter\": \"zz\"}" >"$dir/lora.jsonl"
  "$EMBER_BIN" batch --model "$fixtures/models/llama3" --input "$dir/lora.jsonl" \
    --output "$dir/lora.out" --device cpu --lora "a=$fixtures/adapters/llama3-a" \
    --lora "b=$fixtures/adapters/llama3-b" --adapter b 2>"$dir/err" || true  # line 4 is refused
  [ "$(wc -l <"$dir/lora.out")" = 4 ] || fail "lora batch: $(cat "$dir/err")"
  golden() { node -e 'const g = require(process.argv[1]); console.log(JSON.stringify(g.greedy.short));' "$1"; }
  [ "$(field "$dir/lora.out" 1 ids)" = "$(golden "$fixtures/adapters/llama3-a/golden.json")" ] ||
    fail "adapter a's line is not its golden: $(sed -n 1p "$dir/lora.out")"
  [ "$(field "$dir/lora.out" 2 ids)" = "$(golden "$fixtures/adapters/llama3-b/golden.json")" ] ||
    fail "the --adapter b default line is not b's golden: $(sed -n 2p "$dir/lora.out")"
  [ "$(field "$dir/lora.out" 3 ids)" != "$(field "$dir/lora.out" 2 ids)" ] ||
    fail "adapter none ran an adapter: $(sed -n 3p "$dir/lora.out")"
  field "$dir/lora.out" 4 error | grep -q "adapter 'zz'" ||
    fail "the unknown adapter was not named: $(sed -n 4p "$dir/lora.out")"
else
  echo "note: no adapter fixtures under $fixtures/adapters; LoRA part skipped"
fi
echo "ok"
