#!/usr/bin/env bash
# `make down`: stops everything `make up` started, in reverse order, and removes what it
# set up on the host (mounts, the bridge, iptables rules, kernel settings). Data (etcd,
# Kafka, volumes) is kept; `make clean-stack` removes it.
source "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
stop oxbow-operator
bash "$here/node-down.sh"
for name in kube-scheduler kube-controller-manager kube-apiserver etcd kafka; do
  stop "$name"
done
bash "$here/network-down.sh"
rm -f "$STACK_DIR/env"
