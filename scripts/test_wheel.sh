#!/usr/bin/env bash
# CI tier for the package as a user installs it (scripts/test_wheel.py): build the sdist and the
# wheel, check them (same files, twine, README), install the wheel into a fresh venv outside the
# checkout, check the missing-extra message of liftbridge-devserver, then run one example DAG with
# `airflow dags test` against liftbridge-devserver started from that venv. Prints a summary line;
# exits non-zero on failure. Extra arguments go to scripts/test_wheel.py (--keep).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python scripts/test_wheel.py "$@"
