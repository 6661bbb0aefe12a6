#!/bin/sh
# `ember --version`, `ember version`, `ember help` / `--help`: exit 0 and print the version or the
# command list; no command at all and an unknown command exit 2 with the list. Needs no model.
# Env: EMBER_BIN.
set -u
fail() { echo "FAIL: $*"; exit 1; }

for v in --version version -V; do
  out=$("$EMBER_BIN" $v 2>&1) || fail "ember $v exited $?: $out"
  echo "$out" | grep -Eq '^ember [0-9]+\.[0-9]+\.[0-9]+$' || fail "ember $v printed: $out"
done
for h in help --help -h; do
  out=$("$EMBER_BIN" $h 2>&1) || fail "ember $h exited $?: $out"
  echo "$out" | grep -q 'serve' || fail "ember $h lists no serve command: $out"
done
"$EMBER_BIN" >/dev/null 2>&1; rc=$?
[ "$rc" = 2 ] || fail "ember with no command exited $rc, expected 2"
out=$("$EMBER_BIN" frobnicate 2>&1); rc=$?
[ "$rc" = 2 ] || fail "ember frobnicate exited $rc, expected 2"
echo "$out" | grep -q "unknown command 'frobnicate'" || fail "unknown command message: $out"
echo "version_help: ok"
