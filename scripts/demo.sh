#!/usr/bin/env bash
# Set up (if needed), then run the stream-lifecycle example DAG end to end against an
# embedded dev server that this command starts and stops itself.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PWD/.venv/bin/python"
exec python scripts/demo.py "$@"
