#!/usr/bin/env bash
# Sets up what is missing, starts a local sandbox cluster (ZooKeeper and four bookies on
# 127.0.0.1), runs a short append-and-tail against it and stops it. Pass --keep to leave the
# sandbox running until Ctrl-C. Data go to a temporary directory removed at the end, or to
# $SANDBOX_DIR (kept) when set.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
args=()
if [ -n "${SANDBOX_DIR:-}" ]; then
  args+=(--data-dir "$SANDBOX_DIR")
fi
if [ "${1:-}" = "--keep" ]; then
  exec .venv/bin/streamctl sandbox "${args[@]}"
fi
exec .venv/bin/streamctl sandbox "${args[@]}" --demo
