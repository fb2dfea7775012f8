#!/usr/bin/env bash
# `make images`: packs the release binaries into OCI images and imports them into the
# node's containerd (namespace k8s.io), where pods find them (imagePullPolicy
# IfNotPresent; there is no registry to pull from).
#
# The recipe is the Dockerfile's runtime stage, made here instead of pulled: a root
# filesystem with only the binary (debug info stripped, as the Dockerfile does), the
# shared libraries `ldd` names and the dynamic loader, CA certificates, /tmp, and
# /etc/passwd and /etc/group with distroless' `nonroot` user (65532), which the image
# runs as. Same entrypoint (/usr/local/bin/<binary>) and paths as the Dockerfile; the
# test e2e/tests/it/the_node_runs_real_containers.rs checks them.
#
# One uncompressed layer per image, built reproducibly (sorted, mtime 0, owner 0), so an
# unchanged binary gives the same digest and is not imported again.
source "$(dirname "$0")/lib.sh"
need tar "install tar"
need strip "install binutils"
need ctr "install containerd (Debian: containerd)"

version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' "$STACK_SRC/../../Cargo.toml")
[[ -n "$version" ]] || die "could not read the workspace version from Cargo.toml"
work="$NODE_TOOLS/images"
mkdir -p "$work"
release="$CARGO_TARGET_DIR/release"

ctr_k8s() { ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }

# base_rootfs DIR — the files every image has besides its binaries.
base_rootfs() {
  local root=$1
  mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot" "$root/usr/local/bin"
  chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
  [[ -f /etc/ssl/certs/ca-certificates.crt ]] && cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  return 0
}

# add_binary ROOT SRC DEST — SRC without debug info at DEST, with every shared library
# it loads at the path the loader looks for it.
add_binary() {
  local root=$1 src=$2 dest=$3 lib
  [[ -x "$src" ]] || die "$src is missing: run 'make build'"
  mkdir -p "$root$(dirname "$dest")"
  strip --strip-debug -o "$root$dest" "$src"
  while read -r lib; do
    [[ -n "$lib" ]] || continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done < <(ldd "$src" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

# pack NAME USER ENTRYPOINT TAG... — the OCI archive of $work/NAME/rootfs, imported
# under each tag unless containerd already has that content under that name.
pack() {
  local name=$1 user=$2 entrypoint=$3; shift 3
  local dir="$work/$name" oci="$work/$name/oci"
  rm -rf "$oci"
  mkdir -p "$oci/blobs/sha256"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -cf "$dir/layer.tar" -C "$dir/rootfs" .
  local layer layer_size config config_size manifest manifest_size
  layer=$(sha "$dir/layer.tar"); layer_size=$(stat -c %s "$dir/layer.tar")
  mv "$dir/layer.tar" "$oci/blobs/sha256/$layer"
  printf '{"architecture":"amd64","os":"linux","config":{"User":"%s","Entrypoint":%s,"Env":["PATH=/usr/local/bin:/usr/bin:/bin"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$user" "$entrypoint" "$layer" >"$dir/config.json"
  config=$(sha "$dir/config.json"); config_size=$(stat -c %s "$dir/config.json")
  mv "$dir/config.json" "$oci/blobs/sha256/$config"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" >"$dir/manifest.json"
  manifest=$(sha "$dir/manifest.json"); manifest_size=$(stat -c %s "$dir/manifest.json")
  mv "$dir/manifest.json" "$oci/blobs/sha256/$manifest"
  local entries="" tag ref missing=0
  for tag in "$@"; do
    # Kubernetes names an image without a registry docker.io/library/<name>.
    ref=$tag
    [[ "$tag" == */* && "${tag%%/*}" == *[.:]* ]] || ref="docker.io/library/$tag"
    entries+="${entries:+,}{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$manifest\",\"size\":$manifest_size,\"annotations\":{\"io.containerd.image.name\":\"$ref\",\"org.opencontainers.image.ref.name\":\"$tag\"}}"
    grep -q "sha256:$manifest" <<<"$(ctr_k8s images ls name=="$ref" 2>/dev/null)" || missing=1
  done
  if ((missing == 0)); then
    log "image $name sha256:${manifest:0:12} is current"
    return 0
  fi
  printf '{"schemaVersion":2,"manifests":[%s]}' "$entries" >"$oci/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$oci/oci-layout"
  tar -cf "$dir/$name.oci.tar" -C "$oci" .
  ctr_k8s images import --no-unpack=false "$dir/$name.oci.tar" >/dev/null \
    || die "importing $name into containerd failed"
  rm -f "$dir/$name.oci.tar"
  log "image $name sha256:${manifest:0:12} imported as $*"
}

# image NAME USER TAGS -- BINARY=DEST... — a fresh root filesystem with BINARY at DEST,
# entrypoint the first DEST.
image() {
  local name=$1 user=$2 tags=$3; shift 3
  local root="$work/$name/rootfs" first="" pair
  rm -rf "$root"
  base_rootfs "$root"
  for pair in "$@"; do
    add_binary "$root" "${pair%%=*}" "${pair#*=}"
    [[ -n "$first" ]] || first=${pair#*=}
  done
  # shellcheck disable=SC2086
  pack "$name" "$user" "[\"$first\"]" $tags
}

pgrep -f "containerd --config $NODE_DIR/containerd" >/dev/null || [[ -S "$CONTAINERD_SOCK" ]] \
  || die "the node's containerd is not running: run 'make up'"

image oxbow-worker 65532:65532 "oxbow-worker:$version oxbow-worker:test oxbow-worker:bench ghcr.io/oxbow/oxbow-worker:$version" \
  "$release/oxbow-worker=/usr/local/bin/oxbow-worker"
image oxbow-operator 65532:65532 "oxbow-operator:$version oxbow-operator:test ghcr.io/oxbow/oxbow-operator:$version" \
  "$release/oxbow-operator=/usr/local/bin/oxbow-operator"
image oxbow-standin 65532:65532 "oxbow-standin:test" \
  "$release/oxbow-standin-worker=/usr/local/bin/oxbow-standin-worker"
# The small test image: the test program, kubectl (a pod checks its own identity with
# it), and busybox for `kubectl exec` and the local-path provisioner's helper pods.
root="$work/oxbow-testpod/rootfs"
rm -rf "$root"; base_rootfs "$root"
add_binary "$root" "$release/oxbow-testpod" /usr/local/bin/oxbow-testpod
add_binary "$root" "$K8S_BIN/kubectl" /usr/local/bin/kubectl
mkdir -p "$root/bin"
cp /bin/busybox "$root/bin/busybox"
for applet in sh mkdir rm ls cat sleep chmod; do ln -sf busybox "$root/bin/$applet"; done
pack oxbow-testpod 65532:65532 '["/usr/local/bin/oxbow-testpod"]' oxbow-testpod:e2e oxbow-testpod:demo "oxbow-testpod:$version"
# The wedging worker of the liveness test, an example: only after `cargo build --examples`.
if [[ -x "$release/examples/stuck_step" ]]; then
  image oxbow-stuck 65532:65532 "oxbow-stuck:test" "$release/examples/stuck_step=/usr/local/bin/oxbow-worker"
fi
# The node's own: the pod sandbox, cluster DNS and the volume provisioner.
image oxbow-pause 65535:65535 "$PAUSE_IMAGE" "$NODE_TOOLS/bin/pause=/pause"
image oxbow-coredns 65532:65532 "oxbow-coredns:$COREDNS_VERSION" "$NODE_TOOLS/bin/coredns=/usr/local/bin/coredns"
image oxbow-local-path 65532:65532 "oxbow-local-path:$LOCAL_PATH_VERSION" \
  "$NODE_TOOLS/bin/local-path-provisioner=/usr/local/bin/local-path-provisioner"
