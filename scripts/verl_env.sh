#!/usr/bin/env bash
# Build .venv-verl: the environment of the verl adapter's tests (docs/SCALE.md, "verl").
# verl 0.9.1 needs transformers<5.11 and pulls in ray, so it cannot share .venv. Order matters:
# torch is pinned to the CPU build FIRST so pip never fetches a CUDA build, then verl with the few
# modules its trainer module imports but does not declare, then this project against verl's
# transformers (the `verl` extra; one resolve, so nothing verl needs is moved). Never install verl's
# own extras ([vllm], [fsdp], [cpu]): they pin torch 2.11. Idempotent: reruns only check.
# VERL_VENV=DIR builds elsewhere; VERL_VERSION=X installs verl X instead of the extra's 0.9.1.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VERL_VENV:-.venv-verl}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
if [ -n "${VERL_VERSION:-}" ]; then
  # Another verl release, e.g. VERL_VERSION=0.7.1 (the last with data.sampler.class_path, route 3 in
  # trainer_node/integrations/verl.py). 0.7.1 needs numpy<2, and pyarrow 23+ refuses numpy<2.
  "$VENV/bin/python" -m pip install -q -e . "verl==$VERL_VERSION" cachetools uvicorn fastapi "pyarrow>=15,<23" \
    "pytest>=8" "pytest-timeout>=2.3"
else
  "$VENV/bin/python" -m pip install -q -e ".[verl]" "pytest>=8" "pytest-timeout>=2.3"
fi
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch
versions = {name: md.version(name) for name in ("verl", "transformers", "tensordict", "torch")}
assert versions["torch"].startswith("2.13.0") and "+cpu" in torch.__version__, versions  # never a CUDA build
print("verl env:", ", ".join(f"{k} {v}" for k, v in versions.items()))
PY
