#!/usr/bin/env bash
# Collects the state of the kind cluster of e2e/kind/run.sh into a directory, for a
# failed run: objects, descriptions, events, every container's log (current and
# previous) and `kind export logs` (node, kubelet, containerd).
#
#   e2e/kind/dump.sh [out-dir]     # default: ./kind-logs
#
# Best effort: a command that fails is noted in its output file and the dump goes on.
set -uo pipefail

out="${1:-kind-logs}"
cluster="${KIND_CLUSTER_NAME:-oxbow}"
export KUBECONFIG="${KIND_KUBECONFIG:-$HOME/.cache/oxbow/kind/kubeconfig}"

mkdir -p "$out/logs"
run() { # run <file> <command...>
  local file="$1"
  shift
  { echo "\$ $*"; "$@" 2>&1 || echo "(exit $?)"; } >"$out/$file"
}

run nodes.txt kubectl get nodes -o wide
run objects.txt kubectl get all,pvc,pv,configmaps,leases -A -o wide
run streamapps.yaml kubectl get streamapps.oxbow.dev -A -o yaml
run streamapps.txt kubectl get streamapps.oxbow.dev -A -o wide
run events.txt kubectl get events -A --sort-by=.lastTimestamp
run describe-pods.txt kubectl describe pods -A
run describe-statefulsets.txt kubectl describe statefulsets -A
run describe-deployments.txt kubectl describe deployments -A
run helm.txt helm list -A

kubectl get pods -A -o jsonpath='{range .items[*]}{.metadata.namespace}{" "}{.metadata.name}{"\n"}{end}' 2>/dev/null |
  while read -r ns pod; do
    [[ -n "$pod" ]] || continue
    run "logs/${ns}_${pod}.log" kubectl logs -n "$ns" "$pod" --all-containers --prefix --timestamps
    run "logs/${ns}_${pod}.previous.log" kubectl logs -n "$ns" "$pod" --all-containers --prefix --timestamps --previous
  done

run kind-export.txt kind export logs "$out/kind" --name "$cluster"
echo "cluster state written to $out" >&2
