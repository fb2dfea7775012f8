#!/usr/bin/env bash
# `make down`: stops everything `make up` started, in reverse order, and removes what it
# set up on the host (mounts, the bridge, iptables rules, kernel settings). Data (etcd,
# Kafka, volumes) is kept; `make clean-stack` removes it.
source "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
stop oxbow-operator
bash "$here/node-down.sh"
stop oxbow-node
for name in kube-scheduler kube-controller-manager kube-apiserver etcd kafka; do
  stop "$name"
done
# The emulated agent's pod processes live in their own sessions; it records them so none
# outlive it.
if [[ -d "$STACK_DIR/node/pids" ]]; then
  for f in "$STACK_DIR/node/pids"/*.pid; do
    [[ -f "$f" ]] || continue
    kill -KILL -- "-$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
fi
bash "$here/network-down.sh"
rm -f "$STACK_DIR/env"
