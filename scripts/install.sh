#!/usr/bin/env bash
# Create .venv and install the project with its dev, federation, trl and lora extras (CI runs their tests).
# torch is pinned to the CPU build first so that pip never fetches a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev,federation,trl,lora]"
