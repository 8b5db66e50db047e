#!/usr/bin/env bash
# Install everything into .venv, then run the test suite (the command CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# Flower (the federation tests) phones home by default; never from CI (docs/FLOWER.md).
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
# The verl adapter's tests run in verl's own environment (verl 0.9.1 needs transformers<5.11 and
# brings ray; docs/SCALE.md, "verl"). Only on a full run (no pytest arguments); SKIP_VERL_TESTS=1 skips.
if [ "$#" -eq 0 ] && [ "${SKIP_VERL_TESTS:-0}" != 1 ]; then
  bash scripts/verl_env.sh
  .venv-verl/bin/python -m pytest -q -p no:cacheprovider tests/integrations/verl
fi
