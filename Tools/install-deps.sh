#!/usr/bin/env bash
# Installs the Debian packages pppbridge needs, when they are missing.
#
#   Tools/install-deps.sh build     libpcap-dev, libssl-dev (enough to build and run)
#   Tools/install-deps.sh test      the above plus tshark, tcpdump, ppp (pppdump), python3 and
#                                   iproute2 (network namespaces), curl (through the SOCKS proxy) and
#                                   strace (no listening socket in `pppbridge pay`), prometheus
#                                   (promtool checks the service's metrics), gcc (the C API's
#                                   example), ser2net (a serial device server) and python3-venv (the
#                                   Python bindings' suite) for the tests
set -euo pipefail

packages=(libpcap-dev libssl-dev pkg-config)
if [ "${1:-build}" = test ]; then
    packages+=(tshark tcpdump ppp python3 python3-venv iproute2 curl strace prometheus gcc ser2net)
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# tshark asks whether non-root users may capture; the answer does not matter here.
echo "wireshark-common wireshark-common/install-setuid boolean false" | "${sudo[@]}" debconf-set-selections
# Waits for dpkg's lock rather than failing when another install holds it.
"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >&2
