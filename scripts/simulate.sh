#!/usr/bin/env bash
# Install everything into .venv, then run the main job: `trainer-node simulate` on its
# embedded defaults (L2RR + a local target-owner process over mTLS). Extra arguments are
# passed to simulate, e.g. `bash scripts/simulate.sh --method uniform --seed 1`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/trainer-node simulate "$@"
