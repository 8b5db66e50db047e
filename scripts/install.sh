#!/usr/bin/env bash
# Create .venv and install the project with its dev, federation, trl and lora extras (CI runs their tests).
# torch is pinned to the CPU build first so that pip never fetches a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# .venv takes about 2.2 GiB (torch's CPU build most of it); verl's environment as much again.
# A machine short of disk fails deep inside pip ("No space left on device"): say why up front.
free_mib=$(df -Pm . | awk 'NR == 2 {print $4}')
if [ -n "$free_mib" ] && [ "$free_mib" -lt 5120 ]; then
  echo "install.sh: warning: $free_mib MiB free on $(df -P . | awk 'NR == 2 {print $6}'); the install needs about 5 GiB" >&2
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev,federation,trl,lora]"
