#!/usr/bin/env bash
# Create .venv (if missing) and install the project with every extra the demo and tests use, and
# Java (Spark needs it) with apt if missing. --browser: also Debian's chromium, which only the UI
# tests need (scripts/test.sh passes it; the demo does not). Each step says what it installs and
# about how long it takes, then how long it took.
# Re-running is cheap: the install is skipped while pyproject.toml is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
browser=0
for a in "$@"; do
  case "$a" in
    --browser) browser=1 ;;
    *) echo "setup.sh: unknown argument $a (the only one is --browser)" >&2; exit 2 ;;
  esac
done
step_start=0
step() {  # step "what" "about how long": announce a step
  step_start=$(date +%s)
  echo "setup: $1 (about $2) ..." >&2
}
done_step() {
  echo "setup:   done in $(( $(date +%s) - step_start )) s" >&2
}
apt_install() {
  local sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  "${sudo[@]+"${sudo[@]}"}" apt-get update -q
  "${sudo[@]+"${sudo[@]}"}" apt-get install -y -q "$@"
}
if ! command -v java >/dev/null 2>&1; then
  step "Java is needed by Spark: installing openjdk-17-jre-headless with apt" "1-2 minutes"
  apt_install openjdk-17-jre-headless
  done_step
fi
if [ "$browser" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  step "the UI tests (tests/system/test_ui*.py) need a browser: installing Debian's chromium with apt (by hand: sudo apt-get install chromium)" "1-3 minutes"
  apt_install chromium
  done_step
fi
if [ ! -x .venv/bin/python ]; then
  step "creating .venv with $PY" "10 seconds"
  "$PY" -m venv .venv
  done_step
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
  step "installing the project and its extras into .venv with pip: Airflow, PySpark, grpcio, nats-py, pytest, playwright and more, about 1 GB" "2-4 minutes"
  .venv/bin/pip install -q -U pip
  # Without -q, pip names each package as it collects and installs it.
  .venv/bin/pip install --progress-bar off -e '.[spark,devserver,files,openlineage,zstd,dev]'
  rm -f .venv/.installed-* && touch "$stamp"
  done_step
fi
# Bytecode for the pyspark.zip Spark's Python workers import from (the script says why); a quick
# look when it is there already.
.venv/bin/python scripts/compile_pyspark_zip.py
# The editable install keeps its metadata in .venv; the *.egg-info setuptools leaves in the checkout
# would be a second copy of the distribution to any process with the checkout on sys.path (the
# system tier's Airflow processes), whose entry point then registers the Liftbridge view twice.
rm -rf airflow_provider_liftbridge.egg-info
