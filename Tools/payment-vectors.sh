#!/usr/bin/env bash
# Cross-checks the payment layer's published test vectors with the independent Python oracle
# that ships with the specification (../shared/payment/vectors_check.py: psec, dukpt,
# cryptography). Our own tests pin the same vectors (Tests/PaymentTests/VectorTests.swift);
# this confirms the oracle still agrees with them. It needs PyPI (pip), so it is not part of CI.
#
#   Tools/payment-vectors.sh [SPEC_DIR]     (default ../shared/payment)
set -euo pipefail
cd "$(dirname "$0")/.."
spec=${1:-../shared/payment}
[ -f "$spec/vectors_check.py" ] || { echo "no $spec/vectors_check.py" >&2; exit 2; }
Tools/install-deps.sh test
if ! python3 -c 'import ensurepip' 2>/dev/null; then
    if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends python3-venv >&2
fi
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q psec==1.3.0 dukpt==1.0.1 cryptography pycryptodome
"$venv/bin/python" "$spec/vectors_check.py"
