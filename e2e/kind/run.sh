#!/usr/bin/env bash
# The end-to-end suite (crate oxbow-e2e) on a kind cluster, with the real images and the
# Helm chart: builds ghcr.io/oxbow/oxbow-{operator,worker}:<workspace version> from the
# root Dockerfile, creates the kind cluster (or reuses it), loads the images, starts
# Kafka (kafka.yaml), installs charts/oxbow, then runs `cargo test -p oxbow-e2e --tests`
# against it. Linux only (the host routes the pod network to the kind node).
#
#   e2e/kind/run.sh                      # everything
#   e2e/kind/run.sh examples_            # only tests whose names contain examples_
#   OXBOW_KIND_BUILD=0 e2e/kind/run.sh   # reuse the images already in the local engine
#
# The cluster stays up afterwards for inspection (e2e/kind/dump.sh collects its state);
# `kind delete cluster --name oxbow` removes it. See e2e/kind/README.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

cluster="${KIND_CLUSTER_NAME:-oxbow}"
registry="${OXBOW_IMAGE_REGISTRY:-ghcr.io/oxbow}"
version="${OXBOW_VERSION:-$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' "$root/Cargo.toml")}"
kubeconfig="${KIND_KUBECONFIG:-$HOME/.cache/oxbow/kind/kubeconfig}"
# These must agree with cluster.yaml and kafka.yaml; the test
# e2e/tests/it/kind_manifests_are_accepted_by_the_api_server.rs checks that they do.
kafka_host_port=30092
kafka_in_cluster=kafka.kafka.svc.cluster.local:9092
pod_subnet=10.244.0.0/16
chart_namespace=oxbow-system

operator_image="$registry/oxbow-operator:$version"
worker_image="$registry/oxbow-worker:$version"
# The StreamApps the tests write name the worker image oxbow-worker:test, as on the
# local stack; on kind it is the worker image under test, tagged once more.
test_worker_image="oxbow-worker:test"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'e2e/kind/run.sh: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null || die "$1 is required: $2"; }

# wait_until <what> <seconds> <command...>: polls the command every 2 s.
wait_until() {
  local what="$1" timeout="$2"
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${timeout}s waiting for $what"
    sleep 2
  done
}

[[ "$(uname -s)" == Linux ]] || die "Linux only: the host must reach kind's pod network (see e2e/kind/README.md)"
[[ -n "$version" ]] || die "could not read the workspace version from $root/Cargo.toml"
need docker "https://docs.docker.com/engine/install/"
need kind "https://kind.sigs.k8s.io/docs/user/quick-start/#installation (v0.30.0)"
need helm "https://helm.sh/docs/intro/install/ (v3.19.5)"
need kubectl "https://kubernetes.io/docs/tasks/tools/"
need cargo "https://rustup.rs"
docker info >/dev/null 2>&1 || die "docker cannot reach its engine (docker info failed)"

# --- 1. Images
if [[ "${OXBOW_KIND_BUILD:-1}" != 0 ]]; then
  log "building $operator_image and $worker_image"
  export DOCKER_BUILDKIT=1
  docker build --target operator --build-arg "VERSION=$version" -t "$operator_image" "$root"
  docker build --target worker --build-arg "VERSION=$version" -t "$worker_image" "$root"
fi
for image in "$operator_image" "$worker_image"; do
  docker image inspect "$image" >/dev/null 2>&1 || die "image $image is missing (run without OXBOW_KIND_BUILD=0)"
done
docker tag "$worker_image" "$test_worker_image"

# --- 2. Cluster (idempotent)
mkdir -p "$(dirname "$kubeconfig")"
if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  log "kind cluster $cluster exists; reusing it"
  kind export kubeconfig --name "$cluster" --kubeconfig "$kubeconfig"
else
  log "creating kind cluster $cluster"
  kind create cluster --name "$cluster" --config "$here/cluster.yaml" --kubeconfig "$kubeconfig" --wait 180s
fi
export KUBECONFIG="$kubeconfig"
kubectl wait --for=condition=Ready node --all --timeout=180s >/dev/null

log "loading the images into $cluster"
kind load docker-image --name "$cluster" "$operator_image" "$worker_image" "$test_worker_image"

# --- 3. Pod network from the host: the tests query workers at their pod IPs, as on the
# local stack. The node container forwards to its pods; the host needs only the route.
node_ip="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$cluster-control-plane")"
[[ -n "$node_ip" ]] || die "no IP address for the kind node container $cluster-control-plane"
sudo=()
[[ "$(id -u)" -eq 0 ]] || sudo=(sudo)
log "routing $pod_subnet via the kind node $node_ip"
"${sudo[@]}" ip route replace "$pod_subnet" via "$node_ip"

# --- 4. Kafka
log "starting Kafka (e2e/kind/kafka.yaml)"
kubectl apply -f "$here/kafka.yaml"
kubectl -n kafka rollout status statefulset/kafka --timeout=300s
# Ready means the port is open; wait until the broker serves requests, in the cluster
# (bootstrap through the Service, then the advertised pod name) and from the host.
wait_until "Kafka to answer at $kafka_in_cluster" 180 \
  kubectl -n kafka exec kafka-0 -- /opt/kafka/bin/kafka-broker-api-versions.sh --bootstrap-server "$kafka_in_cluster"
wait_until "Kafka's node port at 127.0.0.1:$kafka_host_port" 60 \
  bash -c "exec 3<>/dev/tcp/127.0.0.1/$kafka_host_port"

# --- 5. The chart: CRD, operator (all namespaces), RBAC. The operator gets the flags the
# per-test operator of the local stack runs with (harness::OperatorProcess checks them).
log "installing charts/oxbow into $chart_namespace"
helm upgrade --install oxbow "$root/charts/oxbow" -n "$chart_namespace" --create-namespace \
  --set "image.repository=$registry/oxbow-operator,image.tag=$version" \
  --set "workerImage.repository=$registry/oxbow-worker,workerImage.tag=$version" \
  --set "operator.resyncInterval=3s,operator.cleanupTimeout=20s,operator.failoverTimeout=15s" \
  --set "operator.logFormat=text" \
  --wait --timeout 5m
mapfile -t deployments < <(kubectl -n "$chart_namespace" get deployments -o name)
((${#deployments[@]} == 1)) || die "expected one operator Deployment in $chart_namespace, found: ${deployments[*]:-none}"
kubectl -n "$chart_namespace" rollout status "${deployments[0]}" --timeout=180s
kubectl wait --for=condition=Established crd/streamapps.oxbow.dev --timeout=60s

# --- 6. The suite. Tests that need the local stack's node agent print
# "skipped on kind: <reason>" and pass (see e2e/kind/README.md for the list).
export OXBOW_E2E_TARGET=kind
export KAFKA_BOOTSTRAP="127.0.0.1:$kafka_host_port"
export KAFKA_BOOTSTRAP_IN_CLUSTER="$kafka_in_cluster"
export OXBOW_E2E_OPERATOR_NAMESPACE="$chart_namespace"
export OXBOW_E2E_OPERATOR="${deployments[0]}"
log "running the e2e suite (KAFKA_BOOTSTRAP=$KAFKA_BOOTSTRAP, in cluster $KAFKA_BOOTSTRAP_IN_CLUSTER)"
cd "$root"
cargo test --release -p oxbow-e2e --tests --no-fail-fast -- "$@"
