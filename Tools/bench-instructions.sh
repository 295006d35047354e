#!/usr/bin/env bash
# Instructions per MB moved and per round trip through `pppbridge-bench bridge`, counted by
# valgrind's callgrind. Unlike the bench's time and CPU figures, the count does not follow the
# machine's load; it still moves by a few percent between runs of one binary (under valgrind's
# pace a bulk phase may overflow the line queue, and the packets dropped there bring SACK and
# retransmission work), so compare builds on two runs each.
#
# The bench runs three times: --mib N --rounds R, --mib 2N --rounds R and --mib N --rounds 2R.
# The second's extra count is divided by the extra bytes moved (N MiB each way), the third's by
# the extra round trips, so start-up and other fixed costs cancel. It counts the whole process:
# both ends of the link, the host clients, and the raw copy, echo and relay the bench runs
# beside ours (their user-space work is counted against us). It also prints the same figures
# for the event loops' turns alone (`loops_per_mb`, `loops_per_round_trip`): the channel and the
# simulated terminal, without the bench's own threads.
#
# Usage: Tools/bench-instructions.sh [N [R]]   (N MiB, default 2; R round trips, default 600;
#        needs valgrind). PPPBRIDGE_BENCH=path counts that binary instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2}
rounds=${2:-600}
command -v valgrind >/dev/null || { echo "bench-instructions: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
if [ -n "${PPPBRIDGE_BENCH:-}" ]; then
  bin=$PPPBRIDGE_BENCH
else
  if ! built=$(swift build -c release --product pppbridge-bench 2>&1); then echo "$built" | tail -20 >&2; exit 1; fi
  bin="$(swift build -c release --show-bin-path)/pppbridge-bench"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Valgrind 3.19 cannot read the toolchain's DWARF 5 debug information; the symbol table is enough.
strip --strip-debug -o "$tmp/bench" "$bin"
# Prints the run's total, then what the event loops' turns took (inclusive): the bridge's own
# work at both ends, without the bench's clients, references and payload arrays.
count() {
  local name=$1; shift
  if ! valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$name" "$tmp/bench" bridge "$@" --blocks 6 >"$tmp/out.$name" 2>&1; then
    tail -20 "$tmp/out.$name" >&2
    exit 1
  fi
  callgrind_annotate "$tmp/cg.$name" | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
  callgrind_annotate --inclusive=yes "$tmp/cg.$name" | awk '/9EventLoopC4turn/ { gsub(",", "", $1); s += $1 } END { print s + 0 }'
}
read -r base base_loops < <(count base --mib "$n" --rounds "$rounds" | paste -sd' ')
read -r bytes bytes_loops < <(count bytes --mib "$((2 * n))" --rounds "$rounds" | paste -sd' ')
read -r trips trips_loops < <(count trips --mib "$n" --rounds "$((2 * rounds))" | paste -sd' ')
if [ -n "${CALLGRIND_KEEP:-}" ]; then cp "$tmp"/cg.* "$CALLGRIND_KEEP"/; fi
awk -v b="$base" -v m="$bytes" -v t="$trips" -v bl="$base_loops" -v ml="$bytes_loops" -v tl="$trips_loops" -v n="$n" -v r="$rounds" 'BEGIN {
  mb = 2 * n * 1.048576
  printf "instructions: %.0f at --mib %d --rounds %d, %.0f at --mib %d, %.0f at --rounds %d\n", b, n, r, m, 2 * n, t, 2 * r
  printf "in the event loops: %.0f, %.0f, %.0f\n", bl, ml, tl
  printf "RESULT instructions per_mb=%.0f per_round_trip=%.0f loops_per_mb=%.0f loops_per_round_trip=%.0f\n", (m - b) / mb, (t - b) / r, (ml - bl) / mb, (tl - bl) / r
}'
