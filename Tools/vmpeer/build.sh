#!/bin/bash
# build.sh [-f] [CACHE_DIR] -- build the vmpeer guest (kernel + initramfs) from Debian packages.
#
# The guest is a Debian kernel, busybox and Debian's pppd; nothing is compiled.  Downloads
# (apt-get download + dpkg -x, nothing is installed for the guest):
#   linux-image-amd64 (resolved to the concrete linux-image-X.Y.Z-amd64), ppp, busybox-static,
#   and the shared libraries pppd needs.  Produces in CACHE_DIR:
#     vmlinuz            the Debian kernel
#     initramfs.cpio.gz  busybox + pppd + libs + ppp kernel modules + /init + helper scripts
#     build.info         versions used, and the sha256 of this script (run.sh checks it)
#   CACHE_DIR defaults to $VMPEER_CACHE, else /var/cache/pppbridge-vmpeer.  Downloaded .debs are
#   kept in CACHE_DIR/debs.  When build.info matches this script, the build is skipped ("up to
#   date"), so callers can run build.sh unconditionally; -f rebuilds anyway.
# Host packages: cpio and qemu-system-x86 (installed with apt-get when missing; needs root or sudo).
set -euo pipefail

FORCE=0
[ "${1:-}" = -f ] && { FORCE=1; shift; }
CACHE=${1:-${VMPEER_CACHE:-/var/cache/pppbridge-vmpeer}}
HERE=$(cd "$(dirname "$0")" && pwd)
SELF_SHA=$(sha256sum "$HERE/build.sh" | cut -d' ' -f1)
mkdir -p "$CACHE/debs"
CACHE=$(cd "$CACHE" && pwd)
DEBS=$CACHE/debs
X=$CACHE/extract
ROOT=$CACHE/root

log() { echo "[build] $*" >&2; }

# One build at a time on a cache: a second one waits, then finds the cache current.
exec 9>"$CACHE/.build.lock"
flock 9

missing=()
command -v cpio >/dev/null || missing+=(cpio)
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing host packages: ${missing[*]}"
  if [ "$(id -u)" = 0 ]; then sudo=(); elif command -v sudo >/dev/null; then sudo=(sudo)
  else log "need ${missing[*]} installed (run as root or with sudo)"; exit 1; fi
  # Waits for dpkg's lock rather than failing when another install holds it.
  "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq || true
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "$FORCE" = 0 ] && [ -s "$CACHE/vmlinuz" ] && [ -s "$CACHE/initramfs.cpio.gz" ] &&
   grep -qx "script_sha256=$SELF_SHA" "$CACHE/build.info" 2>/dev/null; then
  log "up to date: $CACHE ($(sed -n 's/^kernel=//p' "$CACHE/build.info"))"
  exit 0
fi

# ---- 1. download -------------------------------------------------------------------------
KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [ -z "$KPKG" ]; then
  log "apt-cache knows no linux-image-amd64; running apt-get update"
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
fi
KVER=${KPKG#linux-image-}
log "kernel package: $KPKG"

PKGS="$KPKG ppp busybox-static libc6 libssl3 libcrypt1 libpam0g libsystemd0 libpcap0.8 \
      libaudit1 libcap2 libgcrypt20 liblzma5 libzstd1 liblz4-1 libdbus-1-3 libcap-ng0 libgpg-error0"
need=""
for p in $PKGS; do
  ls "$DEBS/${p}_"*.deb >/dev/null 2>&1 || need="$need $p"
done
if [ -n "$need" ]; then
  log "downloading:$need"
  # _apt cannot write into root-owned dirs: let it, to avoid the 'unsandboxed' warning
  chmod 777 "$DEBS" 2>/dev/null || true
  (cd "$DEBS" && apt-get download $need 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2)
fi

# ---- 2. extract --------------------------------------------------------------------------
rm -rf "$X" "$ROOT"
mkdir -p "$X/pkgs" "$X/kernel" "$ROOT"
for p in $PKGS; do
  deb=$(ls "$DEBS/${p}_"*.deb | sort | tail -1)
  if [ "$p" = "$KPKG" ]; then dpkg -x "$deb" "$X/kernel"; else dpkg -x "$deb" "$X/pkgs"; fi
done
cp "$X/kernel/boot/vmlinuz-$KVER" "$CACHE/vmlinuz"
MODSRC=$(find "$X/kernel" -maxdepth 4 -type d -path '*/lib/modules/*' -name "$KVER" | head -1)

# ---- 3. assemble root --------------------------------------------------------------------
cd "$ROOT"
mkdir -p bin sbin usr/bin usr/sbin lib lib64 etc/ppp/peers dev proc sys run tmp var/run var/log \
         var/lock root www modules
chmod 1777 tmp
cp "$X/pkgs/bin/busybox" bin/busybox
for a in $(bin/busybox --list); do
  [ "$a" = busybox ] && continue
  [ -e "bin/$a" ] || ln -s busybox "bin/$a"
done
cp "$X/pkgs/usr/sbin/pppd" usr/sbin/pppd
cp "$X/pkgs/usr/sbin/chat" usr/sbin/chat 2>/dev/null || true

# shared libraries: resolve pppd's closure with the *downloaded* loader, copy only what's needed
LDSO=$X/pkgs/lib64/ld-linux-x86-64.so.2
[ -e "$LDSO" ] || LDSO=$X/pkgs/usr/lib64/ld-linux-x86-64.so.2
LIBPATH=$X/pkgs/lib/x86_64-linux-gnu:$X/pkgs/usr/lib/x86_64-linux-gnu
mkdir -p lib/x86_64-linux-gnu
"$LDSO" --library-path "$LIBPATH" --list "$X/pkgs/usr/sbin/pppd" | awk '/=>/{print $3}' |
while read -r so; do
  case "$so" in
    "$X"/*) cp -L "$so" lib/x86_64-linux-gnu/ ;;
    *) log "ERROR: $so not resolved from downloaded packages"; exit 1 ;;
  esac
done
cp -L "$LDSO" lib64/ld-linux-x86-64.so.2
ln -s lib usr/lib 2>/dev/null || true
# make sure the result actually loads with only these libs
"$ROOT/lib64/ld-linux-x86-64.so.2" --library-path "$ROOT/lib/x86_64-linux-gnu" --list "$ROOT/usr/sbin/pppd" >/dev/null

# kernel modules (dependency order); crc-ccitt / zlib are built into Debian's kernel
for m in drivers/net/slip/slhc drivers/net/ppp/ppp_generic drivers/net/ppp/ppp_async \
         drivers/net/ppp/ppp_synctty drivers/net/ppp/bsd_comp drivers/net/ppp/ppp_deflate lib/crc-ccitt; do
  f=$(ls "$MODSRC/kernel/$m.ko"* 2>/dev/null | head -1 || true)
  [ -n "$f" ] && cp "$f" modules/
done
# virtio-serial (run.sh -V: pppd on /dev/hvc0, a virtconsole port; run.sh -P: a virtserialport
# /dev/vportNpM relayed to pppd's "pty"); all are =m in Debian's kernel.  Load order: see /init.
for m in drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_legacy_dev \
         drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci drivers/char/virtio_console; do
  f=$(ls "$MODSRC/kernel/$m.ko"* 2>/dev/null | head -1 || true)
  [ -n "$f" ] && cp "$f" modules/
done
ls modules >&2

cat > etc/passwd <<'EOF'
root:x:0:0:root:/root:/bin/sh
EOF
echo 'root:x:0:' > etc/group
echo 'hosts: files' > etc/nsswitch.conf
echo '127.0.0.1 localhost' > etc/hosts
: > etc/ppp/options
: > etc/ppp/pap-secrets
: > etc/ppp/chap-secrets
chmod 600 etc/ppp/pap-secrets etc/ppp/chap-secrets
echo '<html><body>vmpeer httpd ok</body></html>' > www/index.html

# default config (overridden by the per-run config appended by run.sh)
cat > etc/vmpeer.conf <<'EOF'
# sourced by /init (sh syntax).  run.sh appends a cpio that overwrites /etc/vmpeer.conf.
PPP_TTY=/dev/ttyS1
PPP_SPEED=115200
ROLE=client          # client: accept addresses from peer; server: propose LOCAL_IP:REMOTE_IP
LOCAL_IP=10.0.2.15
REMOTE_IP=10.0.2.2
PPP_OPTS="noauth local nodetach debug defaultroute persist maxfail 0 holdoff 1 lcp-echo-interval 0"
WORKLOAD="vmpeer-std-servers"
POWEROFF_AFTER_WORKLOAD=0
RESTART=1            # 1: start pppd again whenever it exits; 0: once per "vmpeer-pppd start"
CTL_TTY=/dev/ttyS2   # host -> guest command line (run.sh: $RUNDIR/ctl.in); empty: none
EOF

# pppd hook scripts
cat > etc/ppp/ip-up <<'EOF'
#!/bin/sh
# args: interface tty speed local remote ipparam
echo "$1 $2 $3 $4 $5" > /run/vmpeer.link
echo "VMPEER: LINK UP if=$1 tty=$2 speed=$3 local=$4 remote=$5 t=$(cut -d' ' -f1 /proc/uptime)" > /dev/console
EOF
cat > etc/ppp/ip-down <<'EOF'
#!/bin/sh
rm -f /run/vmpeer.link
echo "VMPEER: LINK DOWN if=$1 t=$(cut -d' ' -f1 /proc/uptime)" > /dev/console
EOF
chmod 755 etc/ppp/ip-up etc/ppp/ip-down

# ---- helper workloads -------------------------------------------------------------------
cat > bin/vmpeer-helpers <<'EOF'
#!/bin/sh
# Multi-call helper; invoked through symlinks vmpeer-<name>.
# All servers are persistent (busybox nc -ll) and log to the console.
n=$(basename "$0"); n=${n#vmpeer-}
say() { echo "VMPEER[$n]: $*" > /dev/console; }
peer() { cut -d' ' -f5 /run/vmpeer.link 2>/dev/null; }
case "$n" in
  echo)    # echo PORT : echo server
    say "echo server on :$1"; exec nc -ll -p "$1" -e cat ;;
  sink)    # sink PORT : read everything, then reply with the byte count (proves full receipt)
    say "sink server on :$1"; exec nc -ll -p "$1" -e wc -c ;;
  source)  # source PORT BYTES : send BYTES pseudo-random bytes to every client, then close
    head -c "$2" /dev/urandom > /tmp/source.$1
    say "source server on :$1 ($2 bytes)"; exec nc -ll -p "$1" -e cat /tmp/source.$1 ;;
  shell)   # shell PORT : remote /bin/sh (test driver; only reachable through the PPP peer)
    say "shell server on :$1"; exec nc -ll -p "$1" -e /bin/sh ;;
  httpd)   # httpd PORT : busybox httpd serving /www
    say "httpd on :$1"; exec httpd -f -p "$1" -h /www ;;
  send)    # send HOST PORT BYTES : connect out, send BYTES random bytes, print what the server answers
    h=${1:-$(peer)}; t0=$(cut -d' ' -f1 /proc/uptime)
    r=$(head -c "$3" /dev/urandom | nc "$h" "$2"); rc=$?
    say "send $3 to $h:$2 rc=$rc t0=$t0 t1=$(cut -d' ' -f1 /proc/uptime) reply=$r" ;;
  recv)    # recv HOST PORT : connect out, count received bytes
    h=${1:-$(peer)}; t0=$(cut -d' ' -f1 /proc/uptime)
    c=$(nc "$h" "$2" </dev/null | wc -c)
    say "recv from $h:$2 bytes=$c t0=$t0 t1=$(cut -d' ' -f1 /proc/uptime)" ;;
  ping)    # ping HOST COUNT
    h=${1:-$(peer)}; say "ping $h x${2:-10}"
    ping -c "${2:-10}" "$h" > /dev/console 2>&1 ;;
  pppd)    # pppd ACTION : control the pppd that /init supervises (restart loop, see /init)
    p=$(pidof pppd || true)
    case "$1" in
      term|stop)  # SIGTERM: pppd sends LCP TermReq, runs ip-down and exits; not restarted
        touch /run/vmpeer.hold; say "term pid=${p:-none}"; [ -z "$p" ] || kill -TERM $p ;;
      kill)       # SIGKILL: the line just goes silent (no TermReq, no ip-down); not restarted
        touch /run/vmpeer.hold; say "kill pid=${p:-none}"; [ -z "$p" ] || kill -KILL $p ;;
      hup)        # SIGHUP: pppd sends LCP TermReq and, with "persist", reopens the line itself
        say "hup pid=${p:-none}"; [ -z "$p" ] || kill -HUP $p ;;
      restart)    # SIGTERM, then the loop starts a new pppd
        rm -f /run/vmpeer.hold; say "restart pid=${p:-none}"; [ -z "$p" ] || kill -TERM $p ;;
      start)      # let the loop start pppd (again)
        rm -f /run/vmpeer.hold; say "start (running: ${p:-none})" ;;
      status)
        say "pid=${p:-none} hold=$([ -e /run/vmpeer.hold ] && echo 1 || echo 0) link=$(cat /run/vmpeer.link 2>/dev/null)" ;;
      *) echo "usage: vmpeer-pppd term|kill|hup|restart|start|status" >&2; exit 2 ;;
    esac ;;
  std-servers)
    vmpeer-echo 7 & vmpeer-sink 9 & vmpeer-source 19 10485760 & vmpeer-shell 23 & vmpeer-httpd 80 &
    wait ;;
  *) echo "unknown helper $n" >&2; exit 2 ;;
esac
EOF
chmod 755 bin/vmpeer-helpers

# pppd "pty" helper for run.sh -P: stdin/stdout is pppd's pty master, $1 a virtio-serial port.
# The port allows one open at a time, so it is opened once here and shared by both directions.
# Reads give EOF while no host program holds the QEMU pty open, hence the retry loop; writes
# block while the host is absent or does not read (QEMU throttles a virtserialport).
# When pppd closes its end, the writer cat gets EIO and everything (incl. the reader) exits,
# freeing the port for the next pppd attempt.
cat > bin/vmpeer-relay <<'EOF'
#!/bin/sh
exec 3<>"$1" || exit 1
( trap 'kill $C 2>/dev/null; exit 0' TERM
  while :; do cat <&3 & C=$!; wait $C || exit 0; sleep 0.2; done ) &   # port -> pppd
R=$!
exec 4<&0                  # an async list's stdin would be /dev/null: keep the pty master on fd 4
cat <&4 >&3 & W=$!                                                      # pppd -> port
trap 'kill $R $W 2>/dev/null; exit 0' TERM HUP INT
wait $W
kill $R 2>/dev/null
EOF
chmod 755 bin/vmpeer-relay
for h in echo sink source shell httpd send recv ping pppd std-servers; do ln -s vmpeer-helpers bin/vmpeer-$h; done

# ---- /init ------------------------------------------------------------------------------
cat > init <<'EOF'
#!/bin/sh
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null || mdev -s
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
mount -t tmpfs tmp /run
exec </dev/console >/dev/console 2>&1
echo "VMPEER: init start t=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r)"
. /etc/vmpeer.conf
# kernel command line overrides: vmpeer.KEY=VALUE (no spaces; use , for spaces in PPP_OPTS)
for kv in $(cat /proc/cmdline); do
  case "$kv" in vmpeer.*=*) k=${kv%%=*}; k=${k#vmpeer.}; v=${kv#*=}
    [ "$k" = PPP_OPTS ] || [ "$k" = PPP_EXTRA ] && v=$(echo "$v" | tr , ' ')
    eval "$k=\"\$v\"" ;; esac
done
for m in slhc ppp_generic ppp_async ppp_synctty bsd_comp ppp_deflate; do
  [ -e /modules/$m.ko ] && insmod /modules/$m.ko
done
PPP_DEV="$PPP_TTY $PPP_SPEED"
case "$PPP_TTY" in
  /dev/hvc*|vport:*)  # virtio-serial (run.sh -V / -P): load the virtio stack, wait for the device
    for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_console; do
      [ -e /modules/$m.ko ] && insmod /modules/$m.ko
    done
    i=0; dev=""
    while [ $i -lt 100 ]; do
      case "$PPP_TTY" in
        vport:*) for p in /sys/class/virtio-ports/*; do   # find the port by its QEMU name=
                   [ "$(cat $p/name 2>/dev/null)" = "${PPP_TTY#vport:}" ] && dev=/dev/${p##*/}
                 done ;;
        *) dev=$PPP_TTY ;;
      esac
      [ -n "$dev" ] && [ -c "$dev" ] && break
      dev=""; sleep 0.05; i=$((i+1))
    done
    echo "VMPEER: virtio-serial $PPP_TTY -> ${dev:-MISSING} t=$(cut -d' ' -f1 /proc/uptime)"
    # a virtserialport is not a tty: pppd gets a pty whose master vmpeer-relay copies to/from it
    case "$PPP_TTY" in vport:*) PPP_DEV="pty 'vmpeer-relay $dev'" ;; esac ;;
esac
[ -e /dev/ppp ] || mknod /dev/ppp c 108 0
ip link set lo up
hostname vmpeer
if [ "$ROLE" = server ]; then
  ADDR="$LOCAL_IP:$REMOTE_IP"
else
  # accept whatever the peer assigns; if the peer asks US for its address (slirp does: it
  # sends <addr 0.0.0.0>), Nak it with REMOTE_IP (set REMOTE_IP= empty to disable the hint)
  ADDR="noipdefault ipcp-accept-local ipcp-accept-remote${REMOTE_IP:+ :$REMOTE_IP}"
fi
echo "VMPEER: role=$ROLE pppd $PPP_DEV $ADDR $PPP_OPTS $PPP_EXTRA"
# Host -> guest commands: each line arriving on CTL_TTY runs as "sh -c LINE" (one at a time;
# end a line with & for long commands); output goes to the console.  Used to stop or kill pppd
# without stopping the VM, e.g. "vmpeer-pppd term".
if [ -n "$CTL_TTY" ] && [ -c "$CTL_TTY" ]; then
  (
    exec 0<"$CTL_TTY"
    stty raw -echo icrnl clocal
    while :; do
      IFS= read -r line || { sleep 0.2; continue; }
      [ -n "$line" ] || continue
      echo "VMPEER: ctl: $line t=$(cut -d' ' -f1 /proc/uptime)"
      sh -c "$line" </dev/null
      echo "VMPEER: ctl rc=$? t=$(cut -d' ' -f1 /proc/uptime)"
    done
  ) &
fi
# pppd supervisor.  /run/vmpeer.hold (set by vmpeer-pppd term|kill, or after every start when
# RESTART=0) keeps pppd from being started until "vmpeer-pppd start" removes it.
(
  n=0
  while true; do
    if [ -e /run/vmpeer.hold ]; then sleep 0.1; continue; fi
    [ "$RESTART" = 1 ] || touch /run/vmpeer.hold
    n=$((n+1))
    case "$PPP_TTY" in
      vport:*) pppd pty "vmpeer-relay $dev" $ADDR $PPP_OPTS $PPP_EXTRA & ;;
      *) pppd "$PPP_TTY" "$PPP_SPEED" $ADDR $PPP_OPTS $PPP_EXTRA & ;;
    esac
    P=$!
    echo "VMPEER: pppd start n=$n pid=$P t=$(cut -d' ' -f1 /proc/uptime)"
    wait $P
    echo "VMPEER: pppd exited rc=$? t=$(cut -d' ' -f1 /proc/uptime)"
    if [ -e /run/vmpeer.link ]; then   # killed before ip-down could run
      echo "VMPEER: LINK DOWN if=$(cut -d' ' -f1 /run/vmpeer.link) t=$(cut -d' ' -f1 /proc/uptime) (pppd gone)"
      rm -f /run/vmpeer.link
    fi
    sleep 1
  done
) &
echo "VMPEER: READY t=$(cut -d' ' -f1 /proc/uptime)"
# wait for link, then run the workload
while [ ! -e /run/vmpeer.link ]; do sleep 0.1; done
echo "VMPEER: workload start: $WORKLOAD"
sh -c "$WORKLOAD"
echo "VMPEER: workload done rc=$? t=$(cut -d' ' -f1 /proc/uptime)"
if [ "$POWEROFF_AFTER_WORKLOAD" = 1 ]; then sleep 1; poweroff -f; fi
while true; do sleep 3600; done
EOF
chmod 755 init

# ---- 4. pack -----------------------------------------------------------------------------
find . -print0 | sort -z | cpio --null -o -H newc --owner=0:0 --quiet | gzip -1 > "$CACHE/initramfs.cpio.gz"
{
  echo "kernel=$KPKG"
  for p in ppp busybox-static libc6; do echo "$p=$(ls "$DEBS/${p}_"*.deb | sort | tail -1 | xargs basename)"; done
  echo "built=$(date -u +%FT%TZ)"
  echo "script_sha256=$SELF_SHA"
} > "$CACHE/build.info"
rm -rf "$X"   # 400+ MB of unpacked packages; the .debs stay in $DEBS, the guest tree in $ROOT
log "done: $CACHE/vmlinuz $(du -h "$CACHE/initramfs.cpio.gz" | cut -f1) $CACHE/initramfs.cpio.gz"
