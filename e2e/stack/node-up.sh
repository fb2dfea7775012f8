#!/usr/bin/env bash
# The node, started by up.sh once the API server answers: containerd with runc and the
# CNI bridge, the kubelet and kube-proxy built from k8s.io/kubernetes, the images
# (images.sh), then cluster DNS and the local-path provisioner as pods. State under
# $NODE_DIR; network.sh made the bridge and its guard rules before the API server and
# Kafka started. Idempotent: what runs and answers is left alone.
source "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
need containerd "install containerd (Debian: containerd)"
need runc "install runc (Debian: runc)"
[[ -x /usr/lib/cni/bridge ]] || die "/usr/lib/cni/bridge not found: install containernetworking-plugins"

# render TEMPLATE OUT — the template with the stack's settings filled in.
render() {
  sed -e "s|@NODE_DIR@|$NODE_DIR|g" -e "s|@PKI@|$PKI|g" -e "s|@BRIDGE@|$BRIDGE|g" \
    -e "s|@BRIDGE_IP@|$BRIDGE_IP|g" -e "s|@POD_CIDR@|$POD_CIDR|g" \
    -e "s|@NETWORK_RANGE@|$NETWORK_RANGE|g" -e "s|@CLUSTER_DNS_IP@|$CLUSTER_DNS_IP|g" \
    -e "s|@PAUSE_IMAGE@|$PAUSE_IMAGE|g" -e "s|@NODE_NAME@|$NODE_NAME|g" \
    -e "s|@COREDNS_VERSION@|$COREDNS_VERSION|g" -e "s|@LOCAL_PATH_VERSION@|$LOCAL_PATH_VERSION|g" \
    -e "s|@KUBE_ROUTER_VERSION@|$KUBE_ROUTER_VERSION|g" \
    "$here/node/$1" >"$2.new"
  if [[ -f "$2" ]] && cmp -s "$2.new" "$2"; then rm -f "$2.new"; return 1; fi
  mv "$2.new" "$2"
}

mkdir -p "$NODE_DIR"/{containerd,cni/net.d,kubelet,volumes,addons}
# Pods resolve through cluster DNS only: no host search domains, no upstream server.
: >"$NODE_DIR/resolv.conf"
changed=()
render containerd.toml.in "$NODE_DIR/containerd/config.toml" && changed+=(containerd)
render cni.conflist.in "$NODE_DIR/cni/net.d/10-oxbow.conflist" || true
render kubelet.yaml.in "$NODE_DIR/kubelet/config.yaml" && changed+=(kubelet)
render kube-proxy.yaml.in "$NODE_DIR/kube-proxy.yaml" && changed+=(kube-proxy)
for name in "${changed[@]}"; do
  running "$name" && { log "$name's configuration changed: restarting it"; stop "$name"; }
done

ctr_ready() { ctr --address "$CONTAINERD_SOCK" version; }
if ! running containerd; then
  start containerd containerd --config "$NODE_DIR/containerd/config.toml"
fi
wait_for "containerd to answer on $CONTAINERD_SOCK (log: $LOGS/containerd.log)" 60 ctr_ready

bash "$here/images.sh"

if ! running kubelet; then
  start kubelet "$K8S_BIN/kubelet" --config "$NODE_DIR/kubelet/config.yaml" \
    --kubeconfig "$PKI/kubelet.kubeconfig" --hostname-override "$NODE_NAME" \
    --node-ip "$BRIDGE_IP" --root-dir "$NODE_DIR/kubelet" --cert-dir "$NODE_DIR/kubelet/pki" --v=1
fi
if ! running kube-proxy; then
  start kube-proxy "$K8S_BIN/kube-proxy" --config "$NODE_DIR/kube-proxy.yaml" --v=1
fi
node_ready() {
  [[ "$(kubectl_admin get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}
wait_for "node $NODE_NAME to register Ready (log: $LOGS/kubelet.log)" 120 node_ready

# Cluster DNS and volumes as pods of the node; kube-router's read access.
for addon in coredns local-path kube-router; do
  render "$addon.yaml.in" "$NODE_DIR/addons/$addon.yaml" || true
  kubectl_admin apply --server-side --force-conflicts --field-manager oxbow-stack \
    -f "$NODE_DIR/addons/$addon.yaml" >/dev/null || die "applying the $addon addon failed"
done
deployment_ready() {
  [[ "$(kubectl_admin get deployment -n "$1" "$2" -o 'jsonpath={.status.readyReplicas}')" == 1 ]]
}
wait_for "CoreDNS to be ready (kubectl -n kube-system logs deploy/coredns)" 120 deployment_ready kube-system coredns
wait_for "the local-path provisioner to be ready (kubectl -n local-path-storage logs deploy/local-path-provisioner)" \
  120 deployment_ready local-path-storage local-path-provisioner

# NetworkPolicy: kube-router's firewall alone (no routing, no service proxy: kube-proxy
# has Services), as a process of the stack, with iptables and ipset on the host. It
# filters traffic to and from pods on the node by their policies.
if ! running kube-router; then
  start kube-router "$NODE_TOOLS/bin/kube-router" --kubeconfig "$PKI/kube-router.kubeconfig" \
    --hostname-override "$NODE_NAME" --run-firewall=true --run-router=false \
    --run-service-proxy=false --enable-cni=false --enable-ipv6=false \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --health-port 20244 --metrics-port 0 --v=1
fi
kube_router_healthy() { curl -fsS "http://127.0.0.1:20244/healthz"; }
wait_for "kube-router to be healthy (log: $LOGS/kube-router.log)" 60 kube_router_healthy
