#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra arguments go to pytest.
# --busy (anywhere among the arguments): run it beside a CPU hog, one busy-looping process per
# core (BUSY_PROCS=N for another count, e.g. BUSY_PROCS=4 on 2 cores: more hogs than cores),
# stopped when the run ends, fails or is interrupted. It also has every test process write down
# when its Python stood still for over a second, and in which test (tests/stall_watch.py), to
# LIFTBRIDGE_STALL_LOG (default: a new file in /tmp); the lines are printed at the end.
# --one-core: pin the tests (pytest, its workers and every server they start) to one CPU with
# taskset, ONE_CORE_CPU (default: the last one); with --busy the hogs are pinned there too, so the
# tests share that one CPU with all of them while the other CPUs stay free for the machine's other
# work. The harshest load for the least CPU taken from others (docs/testing.md, "Flakes").
# The tests run on LIFTBRIDGE_TEST_WORKERS pytest-xdist workers (default 2; 0 runs them in this
# process), a test file per worker at a time, the longest first (tests/conftest.py,
# tests/unit_durations.tsv): most of a test's time is spent waiting on servers and processes, not
# on the CPU. LIFTBRIDGE_UNIT_TIMES=FILE writes each file's seconds (tests/unit_times.py).
# Every run writes the margin report (tests/margins.py) to LIFTBRIDGE_MARGIN_LOG (default: a new
# file in /tmp) and prints the ten waits that used the largest share of their deadline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --browser  # the UI tests need chromium; the demo does not
export PATH="$PWD/.venv/bin:$PATH" SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PWD/.venv/bin/python"
args=() busy=0 pin=()
for a in "$@"; do
  case "$a" in
    --busy) busy=1 ;;
    --one-core) pin=(taskset -c "${ONE_CORE_CPU:-$(($(nproc) - 1))}") ;;
    *) args+=("$a") ;;
  esac
done
hogs=()
stop_hogs() {
  [ "${#hogs[@]}" = 0 ] && return 0
  kill "${hogs[@]}" 2>/dev/null || true
  wait "${hogs[@]}" 2>/dev/null || true
  hogs=()
}
if [ "$busy" = 1 ]; then
  trap stop_hogs EXIT
  trap 'stop_hogs; exit 130' INT
  trap 'stop_hogs; exit 143' TERM
  n=${BUSY_PROCS:-$(nproc)}
  for _ in $(seq "$n"); do
    # Spins until this script is gone, even if it was killed without running its traps.
    ${pin[@]+"${pin[@]}"} python -c 'import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000): pass' &
    hogs+=("$!")
  done
  echo "test.sh --busy: $n CPU hog process(es) running beside the tests${pin[*]:+ (${pin[*]})}: ${hogs[*]}" >&2
  export LIFTBRIDGE_STALL_LOG=${LIFTBRIDGE_STALL_LOG:-$(mktemp -t liftbridge-stalls.XXXXXX.log)}
  : >> "$LIFTBRIDGE_STALL_LOG"  # exists even if nothing stalls: the count and cat below read it
  echo "test.sh --busy: stalls of the test processes go to $LIFTBRIDGE_STALL_LOG" >&2
fi
[ "${#pin[@]}" != 0 ] && echo "test.sh --one-core: the tests run under ${pin[*]}" >&2
# The margin report (tests/margins.py, docs/testing.md): every wait with a deadline writes down
# how much of it it used; the file is sorted, tightest first, and the worst ten printed at the end.
export LIFTBRIDGE_MARGIN_LOG=${LIFTBRIDGE_MARGIN_LOG:-$(mktemp -t liftbridge-margins.XXXXXX.tsv)}
: > "$LIFTBRIDGE_MARGIN_LOG"
set +e
${pin[@]+"${pin[@]}"} python -m pytest -q -p no:cacheprovider -n "${LIFTBRIDGE_TEST_WORKERS:-2}" ${args[@]+"${args[@]}"}
rc=$?
set -e
stop_hogs
LC_ALL=C sort -t "$(printf '\t')" -k1,1gr -o "$LIFTBRIDGE_MARGIN_LOG" "$LIFTBRIDGE_MARGIN_LOG"
echo "test.sh: the tightest waits (share of the deadline used, seconds used / deadline; all of them in $LIFTBRIDGE_MARGIN_LOG):"
LC_ALL=C awk -F '\t' '$4 == "ok" && n < 10 { n++; printf "  %5.1f %%  %6.2f / %6.2f s  %s  %s\n", 100 * $1, $2, $3, $5, $6 }' "$LIFTBRIDGE_MARGIN_LOG"
if [ -s "${LIFTBRIDGE_UNIT_TIMES:-}" ]; then
  # Its last two columns: the descriptors a unit's test process held at its first and last result.
  echo "test.sh: units whose test process kept over ${LIFTBRIDGE_FD_GROWTH:-20} more descriptors (first -> last; all in $LIFTBRIDGE_UNIT_TIMES):"
  LC_ALL=C awk -F '\t' -v limit="${LIFTBRIDGE_FD_GROWTH:-20}" \
    '$7 ~ /^[0-9]+$/ && $8 - $7 > limit { printf "  %+5d  %4d -> %4d  %s  %s\n", $8 - $7, $7, $8, $4, $2 }' "$LIFTBRIDGE_UNIT_TIMES"
fi
if [ "$busy" = 1 ]; then
  echo "test.sh --busy: $(wc -l < "$LIFTBRIDGE_STALL_LOG") stall(s) of over a second written down in $LIFTBRIDGE_STALL_LOG:"
  cat "$LIFTBRIDGE_STALL_LOG"
fi
# pytest exits 5 when nothing was collected (e.g. a -k filter that matches nothing): not a failure.
[ "$rc" = 5 ] && { echo "no tests collected"; exit 0; }
exit "$rc"
