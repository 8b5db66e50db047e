#!/usr/bin/env bash
# Install everything into .venv, then run the test suite (the command CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# Flower (the federation tests) phones home by default; never from CI (docs/FLOWER.md).
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
