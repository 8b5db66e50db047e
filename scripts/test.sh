#!/usr/bin/env bash
# Install everything into .venv, then run the test suite (the command CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
