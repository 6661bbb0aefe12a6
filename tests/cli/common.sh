# Sourced by the CLI tests: `model` is the tinystories fixture (the script exits 77, a skip, when
# it is absent) and `fail MESSAGE` ends the test. Env: EMBER_FIXTURES (or EMBER_FIXTURES_DEFAULT).
model="${EMBER_FIXTURES:-${EMBER_FIXTURES_DEFAULT:-}}/models/tinystories-656k"
if [ ! -f "$model/config.json" ]; then
  echo "skipped: no tinystories fixture at $model"
  exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }
