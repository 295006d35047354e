#!/usr/bin/env bash
# Installs what the tests need, builds, and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
Tools/install-deps.sh test
swift build --build-tests
swift test --skip-build "$@"
