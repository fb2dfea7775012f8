#!/usr/bin/env bash
# `make down`: stops everything `make up` started, in reverse order. Data (etcd, Kafka,
# volumes) is kept; `make clean-stack` removes it.
source "$(dirname "$0")/lib.sh"
for name in oxbow-operator oxbow-node kube-scheduler kube-controller-manager kube-apiserver etcd kafka; do
  stop "$name"
done
# Pod processes live in their own sessions; the agent records them so none outlive it.
if [[ -d "$STACK_DIR/node/pids" ]]; then
  for f in "$STACK_DIR/node/pids"/*.pid; do
    [[ -f "$f" ]] || continue
    kill -KILL -- "-$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
fi
rm -f "$STACK_DIR/env"
