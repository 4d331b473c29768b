#!/usr/bin/env bash
# Sets up what is missing (scripts/setup.sh) and runs every test: unit, simulation and
# integration (real ZooKeeper and bookie processes). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q "$@"
