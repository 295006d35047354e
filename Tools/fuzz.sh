#!/usr/bin/env bash
# Builds the libFuzzer targets with `-sanitize=fuzzer,address` and runs each for a while.
#
#   Tools/fuzz.sh [SECONDS] [TARGET...]     (default: 60 s each, every target)
#
# Targets: stream (the RFC 1662 stream decoder), packets (the parsers behind `pppbridge decode`
# and the SOCKS handshake parser),
# stack (our IPv4/ICMP/UDP/TCP input path: parsers, reassembly, TCP state machine),
# messages (the payment reader protocol's frame decoder, JSON parser and message envelope).
# Seeds come from ../shared/traces. A crash leaves its input in fuzz-artifacts/ and fails the
# script; replay it with the plain build: `swift run pppbridge-fuzz-stream fuzz-artifacts/crash-...`.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(stream packets stack messages)

scratch=.build/fuzz
traces=${PPPBRIDGE_TRACES:-../shared/traces}
mkdir -p fuzz-artifacts

for target in "${targets[@]}"; do
    product=pppbridge-fuzz-$target
    swift build -c release --scratch-path "$scratch" --product "$product" \
        -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING -Xswiftc -g >&2
    seeds=$scratch/seeds-$target
    corpus=$scratch/corpus-$target
    rm -rf "$seeds"
    mkdir -p "$seeds" "$corpus"
    python3 Tools/fuzz_seeds.py "$target" "$traces" "$seeds"
    echo "fuzzing $target for ${seconds}s ($(ls "$seeds" | wc -l) seeds)" >&2
    # The message decoder's budget is a count of executions (at least a million), not a time.
    budget=(-max_total_time="$seconds")
    [ "$target" != messages ] || budget=(-runs="${FUZZ_MESSAGE_RUNS:-1000000}" -max_total_time=300)
    "$scratch/release/$product" "${budget[@]}" -print_final_stats=1 -timeout=10 -max_len=2048 \
        -artifact_prefix=fuzz-artifacts/ "$corpus" "$seeds" 2>&1 | grep -E "stat::number_of_executed_units|stat::peak_rss|Done|ERROR|SUMMARY|crash|deadly" || true
    test "${PIPESTATUS[0]}" -eq 0
done
