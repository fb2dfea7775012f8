#!/usr/bin/env bash
# Builds the pod sandbox's pause program (node/pause.c, static) into $NODE_TOOLS/bin. The
# node's Go programs (the kubelet, kube-proxy, CoreDNS, kube-router, the local-path
# provisioner, crictl) come from build-go.sh.
source "$(dirname "$0")/lib.sh"
need gcc "install gcc (Debian: build-essential)"

bin="$NODE_TOOLS/bin"
mkdir -p "$bin"
if [[ ! -x "$bin/pause" || "$STACK_SRC/node/pause.c" -nt "$bin/pause" ]]; then
  log "building the pause program"
  gcc -static -Os -Wall -Werror -o "$bin/pause.tmp" "$STACK_SRC/node/pause.c"
  strip "$bin/pause.tmp"
  mv "$bin/pause.tmp" "$bin/pause"
fi
