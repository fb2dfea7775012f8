#!/usr/bin/env bash
# Stops the node node-up.sh started: kube-proxy and the kubelet, every pod's containers
# (while containerd still answers), containerd and any shim left, then unmounts what
# the kubelet and containerd mounted under $NODE_DIR and removes kube-proxy's rules.
# Volumes' data stays (make clean-stack removes it).
source "$(dirname "$0")/lib.sh"
stop kube-router
stop kube-proxy
stop kubelet
crictl="$NODE_TOOLS/bin/crictl"
if [[ -S "$CONTAINERD_SOCK" && -x "$crictl" ]] && running containerd; then
  "$crictl" --runtime-endpoint "unix://$CONTAINERD_SOCK" --timeout 30s rmp --all --force >/dev/null 2>&1 || true
fi
stop containerd
pkill -KILL -f "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCK" 2>/dev/null || true
if [[ -d "$NODE_DIR" ]]; then
  # Deepest first; lazily, so a mount still busy for a moment does not stop the rest.
  findmnt -rn -o TARGET | awk -v d="$NODE_DIR/" 'index($0, d) == 1' | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
fi
[[ -x "$K8S_BIN/kube-proxy" ]] && "$K8S_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
# drop_chains REGEX — every iptables chain whose name matches, in every table, and the
# rules that jump to them: what kube-router (NetworkPolicy) and the CNI plugins made.
# kube-router's own --cleanup-config needs the API server and panics without it.
drop_chains() {
  local re=$1 table rule chain
  for table in filter nat mangle raw; do
    iptables-save -t "$table" 2>/dev/null | grep -E -- "^-A .* -j ($re)" | sed 's/^-A /-D /' \
      | while read -r rule; do eval "iptables -t $table $rule" 2>/dev/null || true; done || true
    for chain in $(iptables-save -t "$table" 2>/dev/null | sed -n -E "s/^:(($re)[^ ]*).*/\1/p"); do
      iptables -t "$table" -F "$chain" 2>/dev/null || true
    done
    for chain in $(iptables-save -t "$table" 2>/dev/null | sed -n -E "s/^:(($re)[^ ]*).*/\1/p"); do
      iptables -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
}
if command -v iptables-save >/dev/null; then
  drop_chains 'KUBE-ROUTER|KUBE-POD-FW-|KUBE-NWPLCY-|KUBE-SRC-|KUBE-DST-|CNI-'
fi
if command -v ipset >/dev/null; then
  ipset list -n 2>/dev/null | grep -E '^(KUBE-|kube-router)' | while read -r set; do
    ipset destroy "$set" 2>/dev/null || true
  done || true
fi
