#!/usr/bin/env bash
# Repeat tests under load and count: scripts/repeat.sh N TEST... [pytest or test.sh options]
# runs each TEST (a node id such as tests/client/test_consumer.py::test_x, or a file: every test
# in it) N times in a row in one pytest process, by default under the harshest load
# (--busy --one-core: BUSY_PROCS hogs, default 2, pinned to the same one CPU as the tests; see
# scripts/test.sh), and prints, per test, how many runs passed and failed (tests/repeat.py).
# REPEAT_LOAD="" runs without load; REPEAT_LOAD="--busy" with hogs on every CPU.
# It stops at nothing: every run is made, failures included (use -x to stop at the first).
# Example: scripts/repeat.sh 20 tests/devserver/test_groups.py
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$#" -ge 2 ] || { sed -n '2,9p' "$0" >&2; exit 2; }
n=$1
shift
export BUSY_PROCS=${BUSY_PROCS:-2} LIFTBRIDGE_TEST_WORKERS=${LIFTBRIDGE_TEST_WORKERS:-0}
echo "repeat.sh: $n run(s) each, load: ${REPEAT_LOAD---busy --one-core} (BUSY_PROCS=$BUSY_PROCS), $(uptime)" >&2
# shellcheck disable=SC2086  # REPEAT_LOAD is a list of options
exec bash scripts/test.sh ${REPEAT_LOAD---busy --one-core} -p tests.repeat --repeat "$n" -rf "$@"
