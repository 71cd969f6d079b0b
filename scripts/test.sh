#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra arguments go to pytest.
# --busy (anywhere among the arguments): run it beside a CPU hog, one busy-looping process per
# core (BUSY_PROCS=N for another count), stopped when the run ends, fails or is interrupted.
# The tests run on LIFTBRIDGE_TEST_WORKERS pytest-xdist workers (default 2; 0 runs them in this
# process), a test file per worker at a time (tests/conftest.py): most of a test's time is spent
# waiting on servers and processes, not on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PWD/.venv/bin/python"
args=() busy=0
for a in "$@"; do
  if [ "$a" = --busy ]; then busy=1; else args+=("$a"); fi
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
    python -c 'import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000): pass' &
    hogs+=("$!")
  done
  echo "test.sh --busy: $n CPU hog process(es) running beside the tests: ${hogs[*]}" >&2
fi
set +e
python -m pytest -q -p no:cacheprovider -n "${LIFTBRIDGE_TEST_WORKERS:-2}" ${args[@]+"${args[@]}"}
rc=$?
set -e
stop_hogs
# pytest exits 5 when nothing was collected (e.g. a -k filter that matches nothing): not a failure.
[ "$rc" = 5 ] && { echo "no tests collected"; exit 0; }
exit "$rc"
