#!/usr/bin/env bash
# Installs what the tests need, builds, and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
Tools/install-deps.sh test
swift build --build-tests
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
swift test --skip-build "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One plain closing line: XCTest's "Executed 0 tests" (we use Swift Testing) must not be the last word.
echo "tests: $(grep -cE '^✔ Test .* passed' "$log") passed, $(grep -cE '^✘ Test .* failed' "$log") failed"
exit "$status"
