#!/usr/bin/env bash
# Sets up what is missing (scripts/setup.sh) and runs the tests. Extra arguments go to pytest.
#   scripts/test.sh         every test: unit, simulation and integration (real ZooKeeper and
#                           bookie processes). The README's command and CI's.
#   scripts/test.sh --fast  the edit loop (under 2 minutes; no ZooKeeper, no bookie process):
#                           unit and protocol tests, the quick simulator tests, a short sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=""
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy stream spark_connector  # strict (pyproject.toml)
# Byte-compile the project once: every bookie, CLI and Spark process the tests start then reads
# the bytecode instead of compiling every module again (environments that set
# PYTHONDONTWRITEBYTECODE never write it at import).
.venv/bin/python -m compileall -q -j 0 stream spark_connector >/dev/null
if [ -z "$fast" ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q --fast tests/unit tests/sim "$@"
# A short random sweep of the simulator (the full suite's sweeps run thousands of seeds).
exec .venv/bin/streamctl sim --seeds 100 --workers 2
