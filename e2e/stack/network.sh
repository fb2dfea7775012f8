#!/usr/bin/env bash
# The node's network, made before anything listens on it: the bridge $BRIDGE with the
# host's address $BRIDGE_IP (pods' gateway; the API server and Kafka answer pods there),
# forwarding for Service traffic between pods, bridged traffic through iptables (what
# kube-proxy and NetworkPolicy need), and a guard chain that drops anything crossing the
# bridge to or from outside $NETWORK_RANGE: nothing leaves the machine. The values
# changed are saved so `make down` (network-down.sh) restores them.
source "$(dirname "$0")/lib.sh"
[[ $(id -u) -eq 0 ]] || die "the node (bridge, iptables, containerd, kubelet) needs root: run make up as root"
need ip "install iproute2"
need iptables "install iptables"

saved="$STACK_DIR/network.saved"
if [[ ! -f "$saved" ]]; then
  {
    echo "ip_forward=$(cat /proc/sys/net/ipv4/ip_forward)"
    echo "bridge_nf=$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo)"
  } >"$saved"
fi

if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  log "creating bridge $BRIDGE with $BRIDGE_IP"
  ip link add "$BRIDGE" type bridge
fi
ip addr replace "$BRIDGE_IP/16" dev "$BRIDGE"
ip link set "$BRIDGE" up

[[ -f /proc/sys/net/bridge/bridge-nf-call-iptables ]] || modprobe br_netfilter 2>/dev/null \
  || die "bridged traffic cannot pass iptables (no br_netfilter): kube-proxy would not work"
echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
echo 1 >/proc/sys/net/ipv4/ip_forward

iptables -N OXBOW-GUARD 2>/dev/null || true
iptables -F OXBOW-GUARD
iptables -A OXBOW-GUARD -i "$BRIDGE" ! -d "$NETWORK_RANGE" -j DROP
iptables -A OXBOW-GUARD -o "$BRIDGE" ! -s "$NETWORK_RANGE" -j DROP
iptables -C FORWARD -j OXBOW-GUARD 2>/dev/null || iptables -I FORWARD 1 -j OXBOW-GUARD
