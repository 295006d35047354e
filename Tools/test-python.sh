#!/usr/bin/env bash
# The Python bindings' suite: a fresh venv, `pip install ./bindings/python` (and pytest), then
# pytest against the built library and `pppbridge simulate` (Tools/test.sh runs it after the
# Swift suites, with both built).
#
#   Tools/test-python.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check ./bindings/python pytest
export PPPBRIDGE_LIB=${PPPBRIDGE_LIB:-$PWD/.build/debug/libPPPBridgeC.so}
export PPPBRIDGE_BINARY=${PPPBRIDGE_BINARY:-$PWD/.build/debug/pppbridge}
# From the package's tests folder, so `pppbridge` is the installed package, not the source tree.
cd bindings/python/tests
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" .
