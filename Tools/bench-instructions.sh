#!/usr/bin/env bash
# Instructions per MB moved through `pppbridge-bench bridge`, counted by valgrind's callgrind.
# Unlike the bench's time and CPU figures, the count hardly moves from one run to the next on a
# busy machine, so two builds compare on one run each.
#
# The bench runs twice, with --mib N and --mib 2N; the difference is divided by the extra bytes
# moved (N MiB each way), so start-up, the round trips and other fixed costs cancel. It counts
# the whole process: both ends of the link, the host clients and the raw pty copy beside them.
#
# Usage: Tools/bench-instructions.sh [N]   (N MiB, default 2; needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2}
command -v valgrind >/dev/null || { echo "bench-instructions: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
if ! built=$(swift build -c release --product pppbridge-bench 2>&1); then echo "$built" | tail -20 >&2; exit 1; fi
bin="$(swift build -c release --show-bin-path)/pppbridge-bench"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Valgrind 3.19 cannot read the toolchain's DWARF 5 debug information; the symbol table is enough.
strip --strip-debug -o "$tmp/bench" "$bin"
count() {
  if ! valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$1" "$tmp/bench" bridge --mib "$1" --rounds 10 >"$tmp/out.$1" 2>&1; then
    tail -20 "$tmp/out.$1" >&2
    exit 1
  fi
  callgrind_annotate "$tmp/cg.$1" | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
}
small=$(count "$n")
large=$(count "$((2 * n))")
awk -v s="$small" -v l="$large" -v n="$n" 'BEGIN {
  mb = 2 * n * 1.048576
  printf "instructions: %.0f at --mib %d, %.0f at --mib %d\n", s, n, l, 2 * n
  printf "RESULT instructions per_mb=%.0f\n", (l - s) / mb
}'
