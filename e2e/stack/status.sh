#!/usr/bin/env bash
# `make status`: what runs, where, and where its logs are.
source "$(dirname "$0")/lib.sh"
printf '%-24s %-8s %-8s %-28s %s\n' COMPONENT STATE PID ADDRESS LOG
row() {
  local name=$1 addr=$2 state=stopped pid=-
  if running "$name"; then state=running; pid=$(cat "$(pidfile "$name")"); fi
  printf '%-24s %-8s %-8s %-28s %s\n' "$name" "$state" "$pid" "$addr" "$LOGS/$name.log"
}
row etcd "http://127.0.0.1:$ETCD_PORT"
row kube-apiserver "https://127.0.0.1:$APISERVER_PORT"
row kube-controller-manager "127.0.0.1:10257"
row kube-scheduler "127.0.0.1:10259"
row containerd "unix://$CONTAINERD_SOCK"
row kubelet "https://$BRIDGE_IP:10250 (node/$NODE_NAME)"
row kube-proxy "127.0.0.1:10256"
row kube-router "NetworkPolicy (127.0.0.1:20244)"
row kafka "$KAFKA_BOOTSTRAP"
running oxbow-operator && row oxbow-operator "127.0.0.1:18081 (make demo)"
echo
if [[ -f "$STACK_DIR/env" ]]; then
  echo "env file: $STACK_DIR/env (. it to get KUBECONFIG and KAFKA_BOOTSTRAP)"
  if running kube-apiserver; then
    echo; kubectl_admin get nodes,pods -A -o wide 2>/dev/null || true
  fi
  if running containerd; then
    echo; echo "containers (crictl ps; pod logs: kubectl logs):"
    "$NODE_TOOLS/bin/crictl" --runtime-endpoint "unix://$CONTAINERD_SOCK" ps 2>/dev/null || true
  fi
else
  echo "stack is not up: run 'make up'"
fi
