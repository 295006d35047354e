#!/usr/bin/env bash
# Installs what the tests need, builds, and runs the whole suite.
#
# Four rounds: first every target but InteropTests, then InteropTests (the VM, the kernel
# through TUN, the commands as processes), then the fault soak against `serve` on its own, then
# the Python bindings in a fresh venv (Tools/test-python.sh). The interop suites keep a QEMU vCPU busy for
# minutes; beside them, on a 2-core machine, the in-process link suites' loops were starved
# long enough for their timing (echoes, pty buffers) to fail. Arguments, when given, are passed
# to one `swift test` as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
Tools/install-deps.sh test
swift build --build-tests
# The C API's library, for the test that compiles the C example against it.
swift build --product PPPBridgeC
log=$(mktemp)
pylog=$(mktemp)
trap 'rm -f "$log" "$pylog"' EXIT
set +e
if [ $# -gt 0 ]; then
    swift test --skip-build "$@" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
else
    swift test --skip-build --skip '^InteropTests\.' 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    swift test --skip-build --filter '^InteropTests\.' --skip '^InteropTests\.ServeSoakTests' 2>&1 | tee -a "$log"
    second=${PIPESTATUS[0]}
    [ "$status" -ne 0 ] || status=$second
    # The fault soak alone: its deadlines (a terminal open again within its holdoff plus 5 s)
    # are the service's, not those of a machine running a VM beside it.
    swift test --skip-build --filter '^InteropTests\.ServeSoakTests' 2>&1 | tee -a "$log"
    third=${PIPESTATUS[0]}
    [ "$status" -ne 0 ] || status=$third
    # The Python bindings, installed into a fresh venv, against the library built above.
    timeout 900 Tools/test-python.sh 2>&1 | tee "$pylog"
    python=${PIPESTATUS[0]}
    [ "$status" -ne 0 ] || status=$python
fi
set -e
# Counted from swift-testing's own totals ("Test run with N tests"), not its per-test lines:
# with suites printing in parallel, some of those lines go missing from the log.
total=$(awk '$2 == "Test" && $3 == "run" && $4 == "with" && $5 ~ /^[0-9]+$/ { n += $5 } END { print n + 0 }' "$log")
# A failed test's own last line ("✘ Test name() failed after …"); not its recorded issues'
# lines, which say "Expectation failed", nor the run's total.
failed=$(grep -E '^✘ Test .* failed after' "$log" | grep -vc '^✘ Test run with' || true)
# pytest's own summary ("7 passed", "1 failed, 6 passed", "2 errors").
# (Each grep may find nothing: `|| true`, or pipefail would end the script here.)
pysummary=$( (grep -E '^[0-9]+ (passed|failed|errors?)|^=+ .*(passed|failed|error)' "$pylog" || true) | tail -1)
pypassed=$( (grep -oE '[0-9]+ passed' <<< "$pysummary" || true) | awk '{ n += $1 } END { print n + 0 }')
pyfailed=$( (grep -oE '[0-9]+ (failed|errors?)' <<< "$pysummary" || true) | awk '{ n += $1 } END { print n + 0 }')
# The Python round failed with no failure counted (the venv, pip or pytest itself broke, or it
# hung): one failure, so the total never reads as green.
if [ "${python:-0}" -ne 0 ] && [ "$pyfailed" -eq 0 ]; then pyfailed=1; fi
total=$((total + pypassed + pyfailed))
failed=$((failed + pyfailed))
echo "tests: $((total - failed)) passed, $failed failed"

exit "$status"
