#!/usr/bin/env bash
# Installs what Streamkeeper needs and is missing, idempotently: Debian's zookeeper package and a
# JRE (ZooKeeper runs from its jars), python3-venv, iproute2 and nftables (the chaos tests' hosts
# and partitions), gcc and the Python headers (the compiled walker), and a virtualenv .venv with
# the package (editable, with dev tools; the build generates stream/wire/ from proto/ and
# compiles stream/framing/_native.c in place).
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then as_root apt-get update -q >/dev/null; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends "$@" >/dev/null
}

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c \
        'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      PY=$candidate; break
    fi
  done
fi
[ -n "$PY" ] || { echo "setup: Python 3.11 or newer is needed" >&2; exit 1; }

missing=()
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
command -v java >/dev/null || missing+=(default-jre-headless)
"$PY" -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
command -v ip >/dev/null || missing+=(iproute2)
command -v nft >/dev/null || missing+=(nftables)
# The compiled walker (stream/framing/_native.c): a C compiler and the Python headers.
command -v gcc >/dev/null || missing+=(gcc)
"$PY" -c 'import os, sysconfig, sys
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || missing+=(python3-dev)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} (apt)" >&2
  apt_install "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PY" -m venv .venv
fi

# Reinstall only when the packaging inputs changed (or the generated code or the compiled
# walker is missing). The editable install builds stream/framing/_native.c in place (gcc and
# the Python headers), so a changed C source reinstalls.
stamp=$(cat pyproject.toml setup.py proto/streamkeeper/v1/*.proto stream/framing/_native.c \
  | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.setup-stamp 2>/dev/null)" != "$stamp" ] || [ ! -f stream/wire/bookie_pb2.py ] \
    || ! compgen -G 'stream/framing/_native.*.so' >/dev/null; then
  echo "setup: installing the package into .venv" >&2
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # grpc-stubs, replaced by types-grpcio, installs the same grpc-stubs/ folder: remove both
  # before installing, or removing one later would take files of the other.
  if .venv/bin/python -m pip show grpc-stubs >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall -q -y grpc-stubs types-grpcio
  fi
  .venv/bin/python -m pip install -q -e '.[dev,spark]'
  echo "$stamp" > .venv/.setup-stamp
fi
