#!/usr/bin/env bash
# Sets up what is missing, starts a local sandbox cluster (ZooKeeper and four bookies on
# 127.0.0.1), runs a short append-and-tail against it and stops it. Pass --keep to leave the
# sandbox running until Ctrl-C, --secure to run it with mutual TLS and roles (certificates in
# the sandbox directory's tls/). Data go to a temporary directory removed at the end, or to
# $SANDBOX_DIR (kept) when set.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
args=()
if [ -n "${SANDBOX_DIR:-}" ]; then
  args+=(--data-dir "$SANDBOX_DIR")
fi
keep=""
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    --secure) args+=(--secure) ;;
    *) echo "usage: $0 [--keep] [--secure]" >&2; exit 2 ;;
  esac
done
if [ -n "$keep" ]; then
  exec .venv/bin/streamctl sandbox "${args[@]}"
fi
exec .venv/bin/streamctl sandbox "${args[@]}" --demo
