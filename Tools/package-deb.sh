#!/usr/bin/env bash
# Builds dist/pppbridge_VERSION_ARCH.deb: `pppbridge` with the Swift standard library,
# Foundation and Dispatch linked in statically, and libPPPBridgeC.so with the Swift runtime's
# shared libraries it loads shipped beside it (no Swift toolchain on the target), the header
# and a pkg-config file, the systemd unit, the udev rules, an example
# configuration directory and the manual pages. Then runs lintian on it.
#
#   Tools/package-deb.sh [--no-lintian]
set -euo pipefail
cd "$(dirname "$0")/.."
Tools/install-deps.sh build
# What packaging needs beyond the build: patchelf (RUNPATHs), lintian, dpkg-dev
# (dpkg-architecture), binutils (readelf, strip).
missing=()
for p in patchelf lintian dpkg-dev binutils; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
    "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
version=0.1.0
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
scratch=.build/deb
flags=(-c release --static-swift-stdlib --scratch-path "$scratch")
swift build "${flags[@]}" --product pppbridge >&2
# The library's SONAME carries its ABI version (0: the C API of pppbridge.h as it is).
swift build "${flags[@]}" --product PPPBridgeC -Xlinker -soname=libPPPBridgeC.so.0 -Xlinker -L"$(dirname "$(readlink -f "$(command -v swift)")")/../lib/swift_static/linux" >&2
built=$scratch/release

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/pppbridge_${version}_${arch}
doc=$root/usr/share/doc/pppbridge

install -D -m 0755 "$built/pppbridge" "$root/usr/bin/pppbridge"
install -D -m 0644 "$built/libPPPBridgeC.so" "$root/usr/lib/$multiarch/libPPPBridgeC.so.0.1.0"
ln -s libPPPBridgeC.so.0.1.0 "$root/usr/lib/$multiarch/libPPPBridgeC.so.0"
ln -s libPPPBridgeC.so.0 "$root/usr/lib/$multiarch/libPPPBridgeC.so"
# The library is a shared object, and so links the Swift runtime's shared libraries (the
# executable has them built in): those it loads are shipped beside it, privately, found through
# its RUNPATH ($ORIGIN/pppbridge), never on the system's search path.
private_source=$(dirname "$(readlink -f "$(command -v swift)")")/../lib/swift/linux
private_source=$(readlink -f "$private_source")
private=$root/usr/lib/$multiarch/pppbridge
install -d "$private"
runtime=$(ldd "$built/libPPPBridgeC.so" | awk '$3 ~ /^\// { print $3 }' | while read -r lib; do
    case "$(readlink -f "$lib")" in "$private_source"/*) echo "$lib" ;; esac
done)
[ -n "$runtime" ] || { echo "package-deb: no Swift runtime library found for libPPPBridgeC.so under $private_source" >&2; exit 1; }
for lib in $runtime; do
    install -m 0644 "$(readlink -f "$lib")" "$private/$(basename "$lib")"
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$private/$(basename "$lib")"
    patchelf --set-rpath '$ORIGIN' "$private/$(basename "$lib")"
done
patchelf --set-rpath '$ORIGIN/pppbridge' "$root/usr/lib/$multiarch/libPPPBridgeC.so.0.1.0"
# The executable has the runtime built in: no search path of its own.
patchelf --remove-rpath "$root/usr/bin/pppbridge"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$root/usr/bin/pppbridge" "$root/usr/lib/$multiarch/libPPPBridgeC.so.0.1.0"
install -D -m 0644 Sources/PPPBridgeC/include/pppbridge.h "$root/usr/include/pppbridge.h"
install -d "$root/usr/lib/$multiarch/pkgconfig"
cat > "$root/usr/lib/$multiarch/pkgconfig/pppbridge.pc" <<PC
prefix=/usr
libdir=\${prefix}/lib/$multiarch
includedir=\${prefix}/include

Name: pppbridge
Description: PPP links to payment terminals with ICPPP's channel (libPPPBridgeC)
Version: $version
Libs: -L\${libdir} -lPPPBridgeC
Libs.private: -lpthread
Cflags: -I\${includedir}
PC
chmod 0644 "$root/usr/lib/$multiarch/pkgconfig/pppbridge.pc"

# The unit and the udev rules, with the packaged paths.
install -d "$root/lib/systemd/system" "$root/lib/udev/rules.d"
sed -e 's|/usr/local/bin/pppbridge|/usr/bin/pppbridge|' -e '/^#   install /d' -e '/^#   systemctl /s|^|#   (installed by the package) |' \
    Tools/systemd/pppbridge.service > "$root/lib/systemd/system/pppbridge.service"
install -m 0644 Tools/udev/90-pppbridge-terminals.rules "$root/lib/udev/rules.d/90-pppbridge-terminals.rules"
chmod 0644 "$root/lib/systemd/system/pppbridge.service"
install -D -m 0644 Tools/package/README.terminals.d "$root/etc/pppbridge/terminals.d/README"

install -D -m 0644 Tools/package/example-lane1.conf "$doc/examples/lane1.conf"
install -m 0644 Tools/package/copyright "$doc/copyright"
sed "s/@VERSION@/$version/" Tools/package/changelog | gzip -9n > "$doc/changelog.gz"
chmod 0644 "$doc/changelog.gz"
install -d "$root/usr/share/man/man1" "$root/usr/share/man/man5"
gzip -9n < docs/man/pppbridge.1 > "$root/usr/share/man/man1/pppbridge.1.gz"
gzip -9n < docs/man/pppbridge.conf.5 > "$root/usr/share/man/man5/pppbridge.conf.5.gz"
chmod 0644 "$root/usr/share/man/man1/pppbridge.1.gz" "$root/usr/share/man/man5/pppbridge.conf.5.gz"
install -D -m 0644 Tools/package/lintian-overrides "$root/usr/share/lintian/overrides/pppbridge"

# What the binaries need of the system: the packages of the libraries they name (NEEDED),
# found where the dynamic linker finds them; the Swift runtime's are the package's own.
# Every ELF file shipped, the private runtime's included, and each library it names must be
# the package's own or belong to a Debian package: one that belongs to none fails the build.
needed() {
    local file=$1
    readelf -d "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | while read -r name; do
        [ -e "$private/$name" ] && continue
        # "name => path (address)", or for the dynamic linker "path (address)".
        path=$(LD_LIBRARY_PATH="$private" ldd "$file" | awk -v n="$name" '$1 == n { print $3; exit } $1 ~ ("/" n "$") { print $1; exit }')
        case "$path" in
            /*) echo "$path" ;;
            *) echo "package-deb: $file needs $name, found nowhere" >&2; echo "MISSING" ;;
        esac
    done
}
libraries=$(for f in "$root/usr/bin/pppbridge" "$root/usr/lib/$multiarch/libPPPBridgeC.so.0.1.0" "$private"/*.so; do needed "$f"; done | sort -u)
if grep -q MISSING <<< "$libraries"; then exit 1; fi
packages=$(for lib in $libraries; do
    owner=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true)
    [ -n "$owner" ] || { echo "package-deb: $lib belongs to no package" >&2; echo MISSING; continue; }
    echo "${owner%%:*}"
done | sort -u)
if grep -q MISSING <<< "$packages"; then exit 1; fi
depends=$(for pkg in $packages; do
    v=$(dpkg-query -W -f='${Version}\n' "$pkg" | head -1 | sed 's/-[^-]*$//; s/^[0-9]*://')
    printf '%s (>= %s), ' "$pkg" "$v"
done)
depends="${depends}adduser"

install -d -m 0755 "$root/DEBIAN"
install -m 0755 Tools/package/postinst Tools/package/prerm Tools/package/postrm "$root/DEBIAN/"
echo "/etc/pppbridge/terminals.d/README" > "$root/DEBIAN/conffiles"
echo "libPPPBridgeC 0 pppbridge (>= $version)" > "$root/DEBIAN/shlibs"
echo "activate-noawait ldconfig" > "$root/DEBIAN/triggers"
chmod 0644 "$root/DEBIAN/conffiles" "$root/DEBIAN/shlibs" "$root/DEBIAN/triggers"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" -e "s/@DEPENDS@/$depends/" Tools/package/control.in > "$root/DEBIAN/control"
(cd "$root" && find . -type f ! -path './DEBIAN/*' -printf '%P\0' | sort -z | xargs -0 md5sum > DEBIAN/md5sums)
chmod 0644 "$root/DEBIAN/md5sums" "$root/DEBIAN/control"
find "$root" -type d -exec chmod 0755 {} +

mkdir -p dist
deb=dist/pppbridge_${version}_${arch}.deb
dpkg-deb --root-owner-group --build "$root" "$deb" >&2
echo "$deb"
if [ "${1:-}" != --no-lintian ]; then
    # Errors and warnings fail the build; what lintian only notes is shown.
    lintian --info --display-info --fail-on error,warning "$deb" >&2
fi
