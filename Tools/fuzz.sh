#!/usr/bin/env bash
# Builds the libFuzzer targets with `-sanitize=fuzzer,address` and runs each for a while, as
# many side by side as there are cores (FUZZ_JOBS=N to choose).
#
#   Tools/fuzz.sh [SECONDS] [TARGET...]     (default: 60 s each, every target)
#   FUZZ_RUNS=10000000 Tools/fuzz.sh 7200 stack   (a campaign: stops at that many executions,
#                                                  or at the time limit, whichever comes first)
#   FUZZ_SANITIZE=fuzzer FUZZ_JOBS=1 ...           (without AddressSanitizer; one run at a time)
#
# Targets: stream (the RFC 1662 stream decoder), packets (the parsers behind `pppbridge decode`
# and the SOCKS handshake parser),
# stack (our IPv4/ICMP/UDP/TCP input path: parsers, reassembly, TCP state machine),
# link (line bytes through the decoder, LCP, PAP/CHAP, IPCP, VJ into the stack: a whole link),
# channel (the proxy's SOCKS negotiation and destination policy, the DNS relay's book of queries),
# messages (the payment reader protocol's frame decoder, JSON parser and message envelope),
# session (the host's reader session driven by a hostile reader: answers, events, calls, time),
# remote (a device server against our RFC 2217 client: telnet commands, options,
# subnegotiations, the line's bytes, cut into reads anywhere; and network line names),
# replay (a recorded session played against our link and stack: pppd record files as they are,
# and sessions of frames framed and checksummed by the target).
# Seeds come from ../shared/traces, made-up sessions (Tools/fuzz_seeds.py) and the committed
# regression inputs (Tools/Fuzz/regressions/TARGET, replayed by the tests). The stack and link
# targets fix up checksums, so mutations reach the state machines; each run ends with a
# `depth:` line (datagrams reassembled, TCP connections established, links opened, ...). A crash
# leaves its input in fuzz-artifacts/ and fails the script; replay it with the plain build
# (`swift run pppbridge-fuzz-stream fuzz-artifacts/crash-...`) and commit it as a regression input.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(stream packets stack link channel messages session remote replay)

# FUZZ_SANITIZE=fuzzer leaves AddressSanitizer out: two to three times the executions a second
# for a campaign, and Swift's own checks (bounds, overflow, unwraps) still trap. Each set of
# sanitizers has its own build directory.
sanitize=${FUZZ_SANITIZE:-fuzzer,address}
scratch=.build/fuzz
[ "$sanitize" = fuzzer,address ] || scratch=.build/fuzz-${sanitize//,/-}
traces=${PPPBRIDGE_TRACES:-../shared/traces}
mkdir -p fuzz-artifacts

# Every target is built first (one build after another: they share the modules), then run
# side by side, as many at a time as the machine has cores (FUZZ_JOBS), each into its own log.
# The C targets (the FCS fold reads line bytes) get the same: coverage for the fuzzer, and
# AddressSanitizer when the Swift code has it.
csanitize=fuzzer-no-link${sanitize#fuzzer}
for target in "${targets[@]}"; do
    swift build -c release --scratch-path "$scratch" --product "pppbridge-fuzz-$target" \
        -Xswiftc -sanitize="$sanitize" -Xswiftc -DFUZZING -Xswiftc -g -Xcc -fsanitize="$csanitize" >&2
done

run_target() {
    local target=$1 product=pppbridge-fuzz-$1
    local seeds=$scratch/seeds-$target corpus=$scratch/corpus-$target log=$scratch/fuzz-$target.log
    rm -rf "$seeds"
    mkdir -p "$seeds" "$corpus"
    python3 Tools/fuzz_seeds.py "$target" "$traces" "$seeds"
    [ ! -d "Tools/Fuzz/regressions/$target" ] || cp Tools/Fuzz/regressions/"$target"/* "$seeds"/
    local budget=(-max_total_time="$seconds")
    [ -z "${FUZZ_RUNS:-}" ] || budget+=(-runs="$FUZZ_RUNS")
    # A replayed session is many frames: its inputs may be longer than one packet's.
    local max_len=2048
    [ "$target" != replay ] || max_len=16384
    local status=0
    "$scratch/release/$product" "${budget[@]}" -print_final_stats=1 -timeout=10 -max_len="$max_len" \
        -artifact_prefix=fuzz-artifacts/ "$corpus" "$seeds" > "$log" 2>&1 || status=$?
    {
        echo "fuzzing $target for ${seconds}s ($(ls "$seeds" | wc -l) seeds): exit $status"
        grep -E "stat::number_of_executed_units|stat::peak_rss|Done|ERROR|SUMMARY|crash|deadly|^depth:" "$log" || true
        [ "$status" = 0 ] || tail -n 60 "$log"
    } >&2
    return "$status"
}

jobs=${FUZZ_JOBS:-$(nproc)}
rm -f "$scratch"/fuzz-*.status
for target in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    (status=0; run_target "$target" || status=$?; echo "$status" > "$scratch/fuzz-$target.status") &
done
wait
failed=0
for target in "${targets[@]}"; do
    [ "$(cat "$scratch/fuzz-$target.status" 2>/dev/null)" = 0 ] || { echo "fuzzing $target failed" >&2; failed=1; }
done
exit "$failed"
