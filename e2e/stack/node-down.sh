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
# kube-router's NetworkPolicy chains and ipsets.
[[ -x "$NODE_TOOLS/bin/kube-router" ]] && "$NODE_TOOLS/bin/kube-router" --cleanup-config >/dev/null 2>&1 || true
# The CNI plugins' own chains (portmap, bridge), if any were made.
if command -v iptables-save >/dev/null; then
  for table in nat filter; do
    for chain in $(iptables-save -t "$table" 2>/dev/null | sed -n 's/^:\(CNI-[^ ]*\).*/\1/p'); do
      iptables -t "$table" -F "$chain" 2>/dev/null || true
    done
    for rule in $(iptables-save -t "$table" 2>/dev/null | grep -- '-j CNI-' | sed 's/^-A /-D /;s/ /@/g'); do
      iptables -t "$table" ${rule//@/ } 2>/dev/null || true
    done
    for chain in $(iptables-save -t "$table" 2>/dev/null | sed -n 's/^:\(CNI-[^ ]*\).*/\1/p'); do
      iptables -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
fi
