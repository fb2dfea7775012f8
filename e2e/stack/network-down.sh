#!/usr/bin/env bash
# Undoes network.sh: the guard chain, the bridge, and the kernel settings as they were.
source "$(dirname "$0")/lib.sh"
if command -v iptables >/dev/null; then
  while iptables -D FORWARD -j OXBOW-GUARD 2>/dev/null; do :; done
  iptables -F OXBOW-GUARD 2>/dev/null || true
  iptables -X OXBOW-GUARD 2>/dev/null || true
fi
if ip link show "$BRIDGE" >/dev/null 2>&1; then
  log "removing bridge $BRIDGE"
  ip link delete "$BRIDGE"
fi
saved="$STACK_DIR/network.saved"
if [[ -f "$saved" ]]; then
  ip_forward=$(sed -n 's/^ip_forward=//p' "$saved")
  bridge_nf=$(sed -n 's/^bridge_nf=//p' "$saved")
  [[ -n "$ip_forward" ]] && echo "$ip_forward" >/proc/sys/net/ipv4/ip_forward
  [[ -n "$bridge_nf" && -f /proc/sys/net/bridge/bridge-nf-call-iptables ]] \
    && echo "$bridge_nf" >/proc/sys/net/bridge/bridge-nf-call-iptables
  rm -f "$saved"
fi
