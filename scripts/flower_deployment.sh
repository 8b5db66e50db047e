#!/usr/bin/env bash
# A real Flower deployment on this machine (docs/FLOWER.md, "A deployment"): one
# `target-owner-node serve` and one `flower-supernode` per owner, a `flower-superlink` with TLS and
# SuperNode authentication, and the trainer's ServerApp started with `flwr run`.
#
#   scripts/flower_deployment.sh up WORKDIR [--owners 2] [--testbed default]   start it all
#   scripts/flower_deployment.sh run WORKDIR [--train-config F] [--steps N]    train (flwr run)
#   scripts/flower_deployment.sh stop-supernode WORKDIR owner1                 an owner's outage
#   scripts/flower_deployment.sh down WORKDIR                                  stop it all
#   scripts/flower_deployment.sh demo WORKDIR [run options]                    up, run, down
#
# Logs (one per process) and deployment.json (the process ids `down` stops) are in WORKDIR.
# tests/federation/test_deployment_script.py runs it end to end, killing one SuperNode mid-run.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
[[ -x $PY ]] || PY=python
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
deployment() { "$PY" -m trainer_node.federation.local_deployment "$@"; }

if [[ ${1:-} == demo ]]; then
  [[ $# -ge 2 ]] || { echo "usage: $0 demo WORKDIR [run options]" >&2; exit 2; }
  WORK=$2
  shift 2
  deployment up "$WORK"
  trap 'deployment down "$WORK"' EXIT
  deployment run "$WORK" "$@"
else
  deployment "$@"
fi
