#!/usr/bin/env bash
# The commands of docs/DEPLOY.md ("Step by step"), run in order as a new user would, for two
# organizations simulated in two folders of WORKDIR: WORKDIR/owner and WORKDIR/trainer.
# Only CA certificates are copied between the two folders (the "exchange" steps).
#
#   scripts/deploy_walkthrough.sh WORKDIR                # everything, owner served on loopback
#   scripts/deploy_walkthrough.sh --setup-only WORKDIR   # certificates + configs only (compose demo)
#
# Environment knobs (defaults in brackets), used by docker/prepare-demo.sh:
#   OWNER_HOST [localhost]        name the trainer dials; the server certificate's CN
#   OWNER_SANS [127.0.0.1]        extra names/IPs in the server certificate (space separated)
#   OWNER_LISTEN [127.0.0.1:<free port>]   server.listen_address
#   HEALTH_ADDRESS [127.0.0.1:<free port>] server.health_address (plaintext, health only)
#   METRICS_PORT [<free port>]    [metrics] port
#   METRICS_HOST [127.0.0.1]      [metrics] host; another address sets allow_non_loopback (the compose
#                                 demo binds its owner-only monitoring network, published on the host's loopback)
#   STATE_MARKER [beside config.toml]  storage.state_marker (outside the storage folder; must be writable)
#   TRAINER_TARGET [OWNER_HOST:<listen port>]  what the trainer's [feedback] target says
#   TRAINER_HOME [WORKDIR/trainer]   the trainer's folder as the trainer process sees it (run outputs)
#   TRAIN_STEPS [3]               GRPO steps of step 11's L2RR run
#   TESTBED [small]               testbed whose feedback split becomes the demo held-out data
# tests/deploy/test_walkthrough.py runs this script, so the document stays true.
set -euo pipefail

SETUP_ONLY=0
if [[ "${1:-}" == "--setup-only" ]]; then SETUP_ONLY=1; shift; fi
if [[ $# -ne 1 ]]; then
  echo "usage: $0 [--setup-only] WORKDIR" >&2
  exit 2
fi
mkdir -p "$1"
WORK=$(cd "$1" && pwd)
PY=${PYTHON:-python}

step() { printf '\n== %s\n' "$*"; }

certs() { feedback-protocol certs "$@"; }

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

OWNER_HOST=${OWNER_HOST:-localhost}
OWNER_SANS=${OWNER_SANS:-127.0.0.1}
OWNER_LISTEN=${OWNER_LISTEN:-127.0.0.1:$(free_port)}
HEALTH_ADDRESS=${HEALTH_ADDRESS:-127.0.0.1:$(free_port)}
METRICS_PORT=${METRICS_PORT:-$(free_port)}
METRICS_HOST=${METRICS_HOST:-127.0.0.1}
TRAINER_TARGET=${TRAINER_TARGET:-$OWNER_HOST:${OWNER_LISTEN##*:}}
TRAINER_HOME=${TRAINER_HOME:-$WORK/trainer}
TRAIN_STEPS=${TRAIN_STEPS:-3}
TESTBED=${TESTBED:-small}
TRAINER_CN=trainer

OWNER=$WORK/owner
TRAINER=$WORK/trainer
NODE=$OWNER/node

# ---------------------------------------------------------------------------------------------
step "1. trainer org: create its CA and the trainer's client certificate"
certs init-ca --org trainer-org --out "$TRAINER/ca"
certs issue --ca "$TRAINER/ca" --usage client --name "$TRAINER_CN" --out "$TRAINER/tls"

step "2. owner org: create its CA"
certs init-ca --org owner-org --out "$OWNER/ca"

step "3. owner: create the node folder, use your own data layout, drop init's single-CA files"
target-owner-node init "$NODE" --testbed "$TESTBED" --client-name "$TRAINER_CN"
mkdir -p "$NODE/data"
mv "$NODE/heldout.jsonl" "$NODE/test.jsonl" "$NODE/data/"
rm -r "$NODE/pki"   # init's own CA + a trainer key made by the owner: not used across two orgs

step "4. owner: issue the node's server certificate (SANs = every name the trainer dials)"
san_args=()
for san in $OWNER_SANS; do san_args+=(--san "$san"); done
certs issue --ca "$OWNER/ca" --usage server --name "$OWNER_HOST" "${san_args[@]}" --out "$NODE/tls"

step "5. exchange CA certificates (ONLY ca.pem crosses; keys never do)"
cp "$TRAINER/ca/ca.pem" "$NODE/tls/trainer-ca.pem"    # trainer org -> owner org
cp "$OWNER/ca/ca.pem" "$TRAINER/tls/owner-ca.pem"     # owner org -> trainer org
certs show "$NODE/tls/trainer-ca.pem" "$TRAINER/tls/owner-ca.pem" "$NODE/tls/server.pem" "$TRAINER/tls/client.pem"

step "6. owner: edit config.toml (data paths, TLS files, addresses, allowlist, metrics)"
sed -i \
  -e 's|^heldout_path = .*|heldout_path = "data/heldout.jsonl"|' \
  -e 's|^test_path = .*|test_path = "data/test.jsonl"|' \
  -e 's|^ca_cert = .*|ca_cert = "tls/trainer-ca.pem"|' \
  -e 's|^server_cert = .*|server_cert = "tls/server.pem"|' \
  -e 's|^server_key = .*|server_key = "tls/server.key"|' \
  -e "s|^listen_address = .*|listen_address = \"$OWNER_LISTEN\"|" \
  -e "s|^allowed_clients = .*|allowed_clients = [\"$TRAINER_CN\"]|" \
  -e "/^\\[server\\]/a health_address = \"$HEALTH_ADDRESS\"" \
  "$NODE/config.toml"
if [[ -n "${STATE_MARKER:-}" ]]; then
  sed -i -e "/^\\[storage\\]/a state_marker = \"$STATE_MARKER\"" "$NODE/config.toml"
fi
cat >> "$NODE/config.toml" <<EOF

[metrics]
port = $METRICS_PORT
host = "$METRICS_HOST"
EOF
if [[ $METRICS_HOST != 127.0.0.1 ]]; then echo "allow_non_loopback = true" >> "$NODE/config.toml"; fi
grep -A4 '^\[tls\]' "$NODE/config.toml"

step "7. trainer: the [feedback] section of the run config (paths relative to the file)"
cat > "$TRAINER/feedback.toml" <<EOF
[feedback]
target = "$TRAINER_TARGET"
ca_cert = "tls/owner-ca.pem"
client_cert = "tls/client.pem"
client_key = "tls/client.key"
server_name = "$OWNER_HOST"
EOF
cat "$TRAINER/feedback.toml"
# The run config of step 11: L2RR on the tiny CPU policy, learning from the owner's feedback.
cat > "$TRAINER/train.toml" <<EOF
[model]
tiny = true
cache_dir = "$TRAINER_HOME/runs/cache"
[model.tiny_spec]
hidden_size = 64
num_layers = 2
num_heads = 2
num_kv_heads = 1
intermediate_size = 128
sft_steps = 300

[data]
testbed = "$TESTBED"
eval_size = 16

[policy]
name = "l2rr"
batch_size = 8
rollouts_per_prompt = 4
lookahead_max_clusters = 2

[rollout]
max_new_tokens = 6

[run]
steps = $TRAIN_STEPS
out_dir = "$TRAINER_HOME/runs/walkthrough"
device = "cpu"

EOF
cat "$TRAINER/feedback.toml" >> "$TRAINER/train.toml"

if [[ $SETUP_ONLY == 1 ]]; then
  echo
  echo "setup done in $WORK (not serving: --setup-only)"
  exit 0
fi

# ---------------------------------------------------------------------------------------------
step "8. owner: serve"
target-owner-node serve --config "$NODE/config.toml" >"$OWNER/serve.out" 2>"$OWNER/serve.log" &
SERVE_PID=$!
cleanup() { if kill -0 "$SERVE_PID" 2>/dev/null; then kill -KILL "$SERVE_PID"; fi; }
trap cleanup EXIT
for _ in $(seq 1 900); do
  grep -q '^listening on ' "$OWNER/serve.out" && break
  kill -0 "$SERVE_PID" 2>/dev/null || { cat "$OWNER/serve.log" >&2; echo "serve exited" >&2; exit 1; }
  sleep 0.2
done
cat "$OWNER/serve.out"
grep -q '^listening on ' "$OWNER/serve.out" || { echo "serve did not start in 180 s" >&2; exit 1; }

step "9. owner: health probe (what the container HEALTHCHECK runs)"
"$PY" -m target_owner_node.healthcheck --config "$NODE/config.toml"

step "10. trainer: check the connection with the [feedback] settings (TLS, GetInfo, GetBudget)"
trainer-node check-owner --config "$TRAINER/train.toml"

step "11. trainer: train with L2RR, learning from the owner's feedback"
trainer-node train --config "$TRAINER/train.toml" --no-progress
"$PY" - "$TRAINER/runs/walkthrough/summary.json" <<'EOF'
import json
import sys

summary = json.load(open(sys.argv[1]))
print(f"trained with feedback: {summary['feedback_queries']} queries ({summary['feedback_failures']} failed), "
      f"epsilon spent {summary['epsilon_spent']:.3f}, rendering: {summary['rendering']}")
EOF

step "12. owner: metrics (on the owner's loopback)"
"$PY" - "$METRICS_PORT" <<'EOF'
import sys
import urllib.request

text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
for line in text.splitlines():
    if line.startswith(("target_owner_rpc_requests_total", "target_owner_epsilon_")):
        print(line)
EOF

step "13. owner: stop (SIGTERM drains in-flight calls) and verify the audit log"
kill -TERM "$SERVE_PID"
wait "$SERVE_PID"
echo "serve exited with status $?"
target-owner-node audit verify --config "$NODE/config.toml"
echo
echo "walkthrough complete: $WORK"
