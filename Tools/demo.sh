#!/usr/bin/env bash
# The no-hardware demo: builds pppbridge and runs `pppbridge demo`: the channel against a
# simulated terminal on a pty pair (PPP link, a bridge each way, a connection through the SOCKS
# proxy), with every frame written to a pcap.
set -euo pipefail
cd "$(dirname "$0")/.."
Tools/install-deps.sh build
swift build -c release --product pppbridge >&2
out=${TMPDIR:-/tmp}/pppbridge-demo.pcap
.build/release/pppbridge demo --pcap "$out"
