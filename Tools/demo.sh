#!/usr/bin/env bash
# The no-hardware demo: builds pppbridge and decodes a recorded PPP session (pppd against
# slirp: LCP, IPCP with VJ, ping, two TCP transfers), then writes it to a pcap.
set -euo pipefail
cd "$(dirname "$0")/.."
Tools/install-deps.sh build
swift build -c release --product pppbridge >&2
out=${TMPDIR:-/tmp}/pppbridge-demo.pcap
.build/release/pppbridge decode Tools/samples/pppd-session.pppd --pcap "$out"
echo "(the frames above are also in $out, for tshark or tcpdump)"
