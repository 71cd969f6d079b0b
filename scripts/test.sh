#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PWD/.venv/bin/python"
set +e
python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
# pytest exits 5 when nothing was collected (e.g. a -k filter that matches nothing): not a failure.
[ "$rc" = 5 ] && { echo "no tests collected"; exit 0; }
exit "$rc"
