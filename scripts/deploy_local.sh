#!/usr/bin/env bash
# A local deployment: one flower-superlink and N flower-supernode processes on loopback, then
# `flwr run` against them; every process is stopped by PID on exit or Ctrl-C.
#   scripts/deploy_local.sh 3 [--tls] [--node-dir 'nodes/{i}'] -- --run-config "num-server-rounds=5"
# (ovalp_flwr/ops/deploy.py does the work; see README, "Deploy".)
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:?usage: scripts/deploy_local.sh N [options] [-- flwr run args]}"
shift
exec .venv/bin/python -m ovalp_flwr.ops.deploy --num-supernodes "$n" "$@"
