#!/usr/bin/env bash
# Sets up what is missing, starts a local sandbox cluster (ZooKeeper and bookies on 127.0.0.1),
# runs a short smoke against it and stops it. Pass --keep to leave the sandbox running.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
data_dir=${SANDBOX_DIR:-$(mktemp -d /tmp/streamkeeper-sandbox.XXXXXX)}
if [ "${1:-}" = "--keep" ]; then
  exec .venv/bin/streamctl sandbox --bookies 3 --data-dir "$data_dir"
fi
exec .venv/bin/streamctl sandbox --bookies 3 --data-dir "$data_dir" --demo
