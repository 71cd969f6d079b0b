#!/usr/bin/env bash
# Create .venv (if missing) and install the project with every extra the demo and tests use.
# Re-running is cheap: the install is skipped while pyproject.toml is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v java >/dev/null 2>&1; then
  echo "setup: Java is needed by Spark; installing openjdk-17-jre-headless" >&2
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq openjdk-17-jre-headless >/dev/null; fi
fi
if ! command -v chromium >/dev/null 2>&1; then
  echo "setup: the UI test (tests/system/test_ui.py) needs a browser; installing Debian's chromium" >&2
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q -U pip
  .venv/bin/pip install -q -e '.[spark,devserver,files,openlineage,zstd,dev]'
  rm -f .venv/.installed-* && touch "$stamp"
fi
# The editable install keeps its metadata in .venv; the *.egg-info setuptools leaves in the checkout
# would be a second copy of the distribution to any process with the checkout on sys.path (the
# system tier's Airflow processes), whose entry point then registers the Liftbridge view twice.
rm -rf airflow_provider_liftbridge.egg-info
