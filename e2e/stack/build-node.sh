#!/usr/bin/env bash
# Builds what the node runs besides the kubelet and kube-proxy (build-k8s.sh): CoreDNS,
# the local-path provisioner and kube-router (NetworkPolicy) from their Go modules, crictl from sigs.k8s.io/cri-tools,
# and the pod sandbox's pause program (node/pause.c, static). Cached under
# $NODE_TOOLS/bin, keyed by version.
source "$(dirname "$0")/lib.sh"
need go "install Go (https://go.dev) or the golang-go Debian package"
need gcc "install gcc (Debian: build-essential)"

bin="$NODE_TOOLS/bin"
mkdir -p "$bin"

# go_tool NAME MODULE/PACKAGE VERSION — `go install` into $bin/NAME, once per version.
go_tool() {
  local name=$1 pkg=$2 version=$3 stamp="$bin/.$1.version"
  [[ -x "$bin/$name" && "$(cat "$stamp" 2>/dev/null)" == "$version" ]] && return 0
  log "building $name $version from the Go module proxy (cold: minutes on 2 cores)"
  local tmp
  tmp=$(mktemp -d)
  (cd /tmp && CGO_ENABLED=0 GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "$pkg@$version") \
    || die "building $pkg@$version failed"
  mv "$tmp/$(basename "${pkg%%@*}")" "$bin/$name"
  rm -rf "$tmp"
  echo "$version" >"$stamp"
}

go_tool coredns github.com/coredns/coredns "$COREDNS_VERSION"
go_tool local-path-provisioner github.com/rancher/local-path-provisioner "$LOCAL_PATH_VERSION"
go_tool crictl sigs.k8s.io/cri-tools/cmd/crictl "$CRICTL_VERSION"
go_tool kube-router github.com/cloudnativelabs/kube-router/v2/cmd/kube-router "$KUBE_ROUTER_VERSION"

if [[ ! -x "$bin/pause" || "$STACK_SRC/node/pause.c" -nt "$bin/pause" ]]; then
  log "building the pause program"
  gcc -static -Os -Wall -Werror -o "$bin/pause.tmp" "$STACK_SRC/node/pause.c"
  strip "$bin/pause.tmp"
  mv "$bin/pause.tmp" "$bin/pause"
fi
