#!/usr/bin/env bash
# The device check (issue 30, item 7): on a GPU or Ascend host, in about ten minutes, install
# autotune and what the backend needs, then check the device the way the first real run uses it
# (benchmarks/device_check.py says what runs, in order; docs/accelerators.md, "The device check",
# what each printed line should read).
#
#   bash benchmarks/device_check.sh gpu|ascend [--devices N] [--dry-run]
#
# --dry-run prints what it would install and run, in order, and runs nothing.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
DRY=""
for arg in "$@"; do
  if [[ "$arg" == "--dry-run" ]]; then DRY=1; fi
done
if [[ -n "$DRY" ]]; then
  echo "[0 autotune] make -C $ROOT install"
else
  make -C "$ROOT" install
fi
PYTHON="$ROOT/.venv/bin/python"
if [[ ! -x "$PYTHON" ]]; then
  PYTHON=python3  # a dry run on a host without the venv yet
fi
exec "$PYTHON" "$HERE/device_check.py" "$@"
