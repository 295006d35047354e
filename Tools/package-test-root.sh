#!/usr/bin/env bash
# Installs dist/pppbridge_*.deb into a clean Debian root (debootstrap, minbase: no Swift
# toolchain, no compiler) and runs `pppbridge demo` there, as root in a chroot with its own
# /proc and pty devices. Shows that the package carries all it needs beyond Debian's own.
#
#   Tools/package-test-root.sh [DEB]        (needs root; uses this machine's Debian mirror)
set -euo pipefail
cd "$(dirname "$0")/.."
deb=${1:-$(ls dist/pppbridge_*.deb | sort -V | tail -1)}
suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
# The mirror apt already uses here.
mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null ||
         awk '/^deb / { print $2; exit }' /etc/apt/sources.list)
command -v debootstrap > /dev/null || apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends debootstrap >&2
root=$(mktemp -d /var/tmp/pppbridge-root.XXXXXX)
# The mount points at or under the root (ours, and any debootstrap left), innermost first.
mounts() { awk -v r="$root" '$5 == r || index($5, r "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r; }
cleanup() {
    # Unmounted lazily if busy; the root is removed only when no mount is left, and never
    # across a file system.
    for m in $(mounts); do umount -l "$m" 2> /dev/null || true; done
    if [ -n "$(mounts)" ]; then
        echo "package-test-root: $root still has mounts; left in place" >&2
    else
        rm -rf --one-file-system "$root" "$root.log"
    fi
}
trap cleanup EXIT
debootstrap --variant=minbase "$suite" "$root" "$mirror" > "$root.log" 2>&1 || { tail -20 "$root.log"; exit 1; }
rm -f "$root.log"
mount -t proc proc "$root/proc"
mount -t devpts devpts "$root/dev/pts" -o newinstance,ptmxmode=0666,mode=0620
ln -sf pts/ptmx "$root/dev/ptmx"
cp "$deb" "$root/tmp/"
echo "root: $(. "$root/etc/os-release" && echo "$PRETTY_NAME"); swift: $(chroot "$root" sh -c 'command -v swift || echo none'); cc: $(chroot "$root" sh -c 'command -v cc gcc || echo none')"
chroot "$root" apt-get install -y -qq "/tmp/$(basename "$deb")" > /dev/null
chroot "$root" dpkg -s pppbridge | grep -E '^(Status|Version|Depends):'
missing=$(chroot "$root" sh -c 'ldd /usr/lib/*/libPPPBridgeC.so.0' | grep -c "not found" || true)
echo "libPPPBridgeC.so.0 in the root: $(chroot "$root" sh -c 'ldd /usr/lib/*/libPPPBridgeC.so.0' | wc -l) libraries, $missing not found"
[ "$missing" = 0 ]
chroot "$root" pppbridge demo
