#!/bin/bash
# run.sh -- boot the vmpeer guest (pppd on its ttyS1) with ttyS1 wired to a host pty.
#           (-P / -V: a virtio-serial port instead of ttyS1, about 20-30x faster under TCG)
#
# usage: run.sh [options]
#   -c DIR     cache dir made by build.sh   (default $VMPEER_CACHE, else /var/cache/pppbridge-vmpeer)
#   -d DIR     run dir (logs, pid, pty link)           (default: new /tmp/vmpeer-run.XXXXXX)
#   -r ROLE    client | server                         (default client)
#              client: pppd 'noipdefault ipcp-accept-local ipcp-accept-remote' (peer assigns)
#              server: pppd proposes LOCAL:REMOTE (see -L/-R)
#   -L IP      guest's own address in server role      (default 10.0.2.15)
#   -R IP      address given to the peer, server role  (default 10.0.2.2)
#   -o OPTS    pppd options, replaces the default
#              "noauth local nodetach debug defaultroute persist maxfail 0 holdoff 1 lcp-echo-interval 0"
#   -x OPTS    extra pppd options appended (e.g. "novj noccp asyncmap 0 mru 1500")
#   -s SPEED   tty speed given to pppd                 (default 115200)
#   -V         fast path: the pty is a virtio console port (virtio-serial-pci + virtconsole)
#              instead of the emulated 16550 ttyS1; the guest runs pppd on /dev/hvc0.
#              No flow control guest->host: QEMU DROPS what the pty cannot take at once
#   -P         fast path with flow control: the pty is a virtserialport (/dev/vportNpM, not a
#              tty); pppd runs with "pty vmpeer-relay DEV" (busybox cat relay in the guest)
#              -V/-P need a cache built by this build.sh (virtio modules in the initramfs)
#   -w CMDS    guest workload (sh snippet, run once the link is up; see README)
#              default "vmpeer-std-servers" = echo:7 sink:9 source(10MB):19 shell:23 httpd:80
#   -p         power the guest off when the workload returns
#   -N         no restart loop: pppd runs once; "vmpeer-pppd start" (via $RUNDIR/ctl.in) runs it again
#   -m MB      guest RAM (default 256)
#   -a ARGS    extra guest kernel command-line arguments (e.g. "mitigations=off")
#   -q ARGS    extra QEMU arguments (word-split; e.g. "-smp 2")
#   -T         force TCG (no KVM)
#   -K         try KVM even if the host's /dev/kvm is PVM (kvm_pvm); on failure falls back to TCG
#              env VMPEER_KVM_CPU (default host), VMPEER_KVM_WAIT (default 15 s boot watchdog)
#   -F         foreground: wait for QEMU to exit (console log is still written to a file)
#   -W SECS    wait at most SECS for the guest to print READY (default 60)
#   -k DIR     kill the VM of run dir DIR (waits up to 5 s for QEMU to exit) and exit
# prints:  RUNDIR=..  PTY=/dev/pts/N  QEMU_PID=..  CONSOLE=..  CTL=..  ACCEL=..  BOOT_S=..
#          (-V/-P: also PPP_TTY=..)
# $RUNDIR/pty is a symlink to the pty, $RUNDIR/console.log the guest console (pppd debug log).
# $RUNDIR/ctl.in (CTL=) is a FIFO to the guest: each line written to it runs in the guest as
# "sh -c LINE", e.g.  echo 'vmpeer-pppd term' > "$RUNDIR/ctl.in"  (see README).
set -euo pipefail

CACHE=${VMPEER_CACHE:-/var/cache/pppbridge-vmpeer} RUNDIR="" ROLE=client LOCAL_IP=10.0.2.15 REMOTE_IP=10.0.2.2
PPP_OPTS="noauth local nodetach debug defaultroute persist maxfail 0 holdoff 1 lcp-echo-interval 0"
PPP_EXTRA="" SPEED=115200 WORKLOAD="vmpeer-std-servers" POWEROFF=0 MEM=256 TCG=0 FG=0 WAITS=60
RESTART=1 FORCEKVM=0 KVMWAIT=${VMPEER_KVM_WAIT:-15} KVMCPU=${VMPEER_KVM_CPU:-host} LINK=uart KAPPEND="" QEXTRA=""

while getopts "c:d:r:L:R:o:x:s:w:pNm:a:q:TKFW:VPk:h" o; do
  case $o in
    c) CACHE=$OPTARG ;; d) RUNDIR=$OPTARG ;; r) ROLE=$OPTARG ;; L) LOCAL_IP=$OPTARG ;;
    R) REMOTE_IP=$OPTARG ;; o) PPP_OPTS=$OPTARG ;; x) PPP_EXTRA=$OPTARG ;; s) SPEED=$OPTARG ;;
    w) WORKLOAD=$OPTARG ;; p) POWEROFF=1 ;; N) RESTART=0 ;; m) MEM=$OPTARG ;; T) TCG=1 ;; K) FORCEKVM=1 ;; F) FG=1 ;;
    W) WAITS=$OPTARG ;; V) LINK=hvc ;; P) LINK=vport ;; a) KAPPEND=$OPTARG ;; q) QEXTRA=$OPTARG ;;
    k) pid=$(cat "$OPTARG/qemu.pid" 2>/dev/null || true)
       if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
         kill "$pid"
         for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
         # A QEMU started with SIGTERM blocked (inherited from its launcher) ignores it.
         if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; sleep 0.2; fi
         echo "killed qemu $pid"
       else echo "no running qemu in $OPTARG"; fi
       exit 0 ;;
    h) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 1 ;;
  esac
done
case $ROLE in client|server) ;; *) echo "bad role $ROLE" >&2; exit 1 ;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
for f in vmlinuz initramfs.cpio.gz; do
  [ -e "$CACHE/$f" ] || { echo "missing $CACHE/$f - run $HERE/build.sh $CACHE first" >&2; exit 1; }
done
# the guest's /init and helpers come from build.sh: refuse a cache made by another version
grep -qx "script_sha256=$(sha256sum "$HERE/build.sh" | cut -d' ' -f1)" "$CACHE/build.info" 2>/dev/null ||
  { echo "$CACHE was not built by $HERE/build.sh (or it changed since): run it again" >&2; exit 1; }
PPP_TTY=/dev/ttyS1 CTL_TTY=/dev/ttyS2   # ttyS0 console, ttyS1 PPP, ttyS2 commands
[ "$LINK" != uart ] && CTL_TTY=/dev/ttyS1             # no PPP UART with -V/-P
[ "$LINK" = hvc ] && PPP_TTY=/dev/hvc0
[ "$LINK" = vport ] && PPP_TTY=vport:vmpeer.ppp   # /init finds /dev/vportNpM by this name
if [ "$LINK" != uart ]; then
  n=$(zcat "$CACHE/initramfs.cpio.gz" | cpio -t --quiet 2>/dev/null | grep -c 'modules/virtio_console\.ko$' || true)
  [ "${n:-0}" -gt 0 ] || { echo "-V/-P: $CACHE/initramfs.cpio.gz has no virtio_console module - rebuild with this build.sh" >&2; exit 1; }
fi
[ -n "$RUNDIR" ] || RUNDIR=$(mktemp -d /tmp/vmpeer-run.XXXXXX)
mkdir -p "$RUNDIR"; RUNDIR=$(cd "$RUNDIR" && pwd)
rm -f "$RUNDIR"/{console.log,qemu.log,qemu.pid,pty,ctl.in,ctl.out}
# host -> guest command line: QEMU's "pipe" chardev reads ctl.in and writes ctl.out (both kept
# open read-write by QEMU, so writing to ctl.in never blocks and nothing needs to read ctl.out)
mkfifo "$RUNDIR/ctl.in" "$RUNDIR/ctl.out"

# ---- per-run config, appended to the initramfs as a second (gzip) cpio member ----------
sq() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
CFG=$RUNDIR/cfgroot
rm -rf "$CFG"; mkdir -p "$CFG/etc"
{
  echo "PPP_TTY=$PPP_TTY"
  echo "PPP_SPEED=$(sq "$SPEED")"
  echo "ROLE=$(sq "$ROLE")"
  echo "LOCAL_IP=$(sq "$LOCAL_IP")"
  echo "REMOTE_IP=$(sq "$REMOTE_IP")"
  echo "PPP_OPTS=$(sq "$PPP_OPTS")"
  echo "PPP_EXTRA=$(sq "$PPP_EXTRA")"
  echo "WORKLOAD=$(sq "$WORKLOAD")"
  echo "POWEROFF_AFTER_WORKLOAD=$POWEROFF"
  echo "RESTART=$RESTART"
  echo "CTL_TTY=$CTL_TTY"
} > "$CFG/etc/vmpeer.conf"
(cd "$CFG" && find . | cpio -o -H newc --owner=0:0 --quiet | gzip -1) > "$RUNDIR/cfg.cpio.gz"
cat "$CACHE/initramfs.cpio.gz" "$RUNDIR/cfg.cpio.gz" > "$RUNDIR/initrd.img"

# ---- boot --------------------------------------------------------------------------------
start_qemu() {  # $1 = accel
  local accel=$1 cpu=max
  [ "$accel" = kvm ] && cpu=$KVMCPU
  # the PPP link: a host pty on the 2nd 16550 (ttyS1), or on a virtio-serial port:
  # -V a virtconsole (guest hvc0), -P a virtserialport (guest vportNp1)
  local link=(-chardev pty,id=ppp -serial chardev:ppp)
  [ "$LINK" = hvc ] && link=(-chardev pty,id=ppp -device virtio-serial-pci,id=vser0,max_ports=2
                             -device virtconsole,bus=vser0.0,nr=0,chardev=ppp,name=vmpeer.ppp)
  [ "$LINK" = vport ] && link=(-chardev pty,id=ppp -device virtio-serial-pci,id=vser0,max_ports=2
                             -device virtserialport,bus=vser0.0,nr=1,chardev=ppp,name=vmpeer.ppp)
  qemu-system-x86_64 -M pc -accel "$accel" -cpu "$cpu" -m "$MEM" -smp 1 \
    -nodefaults -no-user-config -display none -vga none -no-reboot \
    -kernel "$CACHE/vmlinuz" -initrd "$RUNDIR/initrd.img" \
    -append "console=ttyS0,115200 loglevel=4 panic=-1 rdinit=/init${KAPPEND:+ $KAPPEND}" \
    -chardev file,id=con,path="$RUNDIR/console.log" -serial chardev:con \
    "${link[@]}" -chardev pipe,id=ctl,path="$RUNDIR/ctl" -serial chardev:ctl $QEXTRA \
    >"$RUNDIR/qemu.log" 2>&1 </dev/null &
  QPID=$!
  echo "$QPID" > "$RUNDIR/qemu.pid"
}

find_pty() {
  PTY=""
  for i in $(seq 1 200); do
    PTY=$(sed -n 's/.*redirected to \(\/dev\/pts\/[0-9]*\) (label ppp).*/\1/p' "$RUNDIR/qemu.log" 2>/dev/null | head -1)
    [ -n "$PTY" ] && return 0
    kill -0 "$QPID" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
# wait until the guest's /init prints its first line (proves the kernel really boots)
guest_alive() {  # $1 = seconds
  for i in $(seq 1 $(($1 * 20))); do
    grep -q "VMPEER: init start" "$RUNDIR/console.log" 2>/dev/null && return 0
    kill -0 "$QPID" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

ACCEL=tcg
if [ "$TCG" = 0 ] && [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
  if [ -d /sys/module/kvm_pvm ] && [ "$FORCEKVM" = 0 ]; then
    echo "note: host /dev/kvm is PVM (kvm_pvm module): a stock Debian kernel cannot boot on it; using TCG (-K to try anyway)" >&2
  else
    ACCEL=kvm
  fi
fi
T0=$(date +%s.%N)
start_qemu "$ACCEL"
if [ "$ACCEL" = kvm ]; then
  if ! find_pty || ! guest_alive "$KVMWAIT"; then
    echo "KVM boot failed (no guest output within ${KVMWAIT}s or QEMU died); falling back to TCG" >&2
    sed 's/^/  qemu: /' "$RUNDIR/qemu.log" >&2
    kill "$QPID" 2>/dev/null || true; wait "$QPID" 2>/dev/null || true
    rm -f "$RUNDIR/console.log"
    ACCEL=tcg; T0=$(date +%s.%N); start_qemu tcg
  fi
fi
if ! find_pty; then echo "QEMU failed:" >&2; cat "$RUNDIR/qemu.log" >&2; exit 1; fi
ln -sf "$PTY" "$RUNDIR/pty"

# wait for the guest's READY line (pppd started on ttyS1)
BOOT=""
for i in $(seq 1 $((WAITS * 20))); do
  if grep -q "VMPEER: READY" "$RUNDIR/console.log" 2>/dev/null; then
    BOOT=$(awk -v a="$(date +%s.%N)" -v b="$T0" 'BEGIN{printf "%.2f", a-b}')
    break
  fi
  kill -0 "$QPID" 2>/dev/null || break
  sleep 0.05
done
echo "RUNDIR=$RUNDIR"
echo "PTY=$PTY"
echo "QEMU_PID=$QPID"
echo "CONSOLE=$RUNDIR/console.log"
echo "CTL=$RUNDIR/ctl.in"
echo "ACCEL=$ACCEL"
[ "$LINK" != uart ] && echo "PPP_TTY=$PPP_TTY"
echo "BOOT_S=${BOOT:-timeout}"
[ -n "$BOOT" ] || { echo "guest did not report READY; see $RUNDIR/console.log" >&2; }
if [ "$FG" = 1 ]; then wait "$QPID"; fi
