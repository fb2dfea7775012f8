# Shared settings for the stack scripts. Sourced, never run.
# Everything downloaded or built lives under $OXBOW_CACHE (default ~/.cache/oxbow),
# keyed by version, never inside the clone.
set -euo pipefail

: "${OXBOW_CACHE:=$HOME/.cache/oxbow}"
: "${K8S_VERSION:=v1.34.4}"
: "${ETCD_VERSION:=v3.6.16}"
: "${KAFKA_VERSION:=4.1.2}"
: "${HELM_VERSION:=v3.19.5}"
STACK_DIR="$OXBOW_CACHE/stack"
export OXBOW_CACHE K8S_VERSION ETCD_VERSION KAFKA_VERSION HELM_VERSION STACK_DIR

# Go and Maven caches stay outside the clone so a fresh clone reuses them.
export GOMODCACHE="$OXBOW_CACHE/go/mod"
export GOCACHE="$OXBOW_CACHE/go/cache"
export GOFLAGS="-modcacherw -buildvcs=false"
export GOTOOLCHAIN=local

# The stack's builds (build-stack.sh) run under this lock, in the background or not.
STACK_BUILD_LOCK="$OXBOW_CACHE/stack-build.lock"
STACK_BUILD_LOG="$OXBOW_CACHE/stack-build.log"

STACK_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { printf '[oxbow-stack] %s\n' "$*" >&2; }
die() { printf '[oxbow-stack] ERROR: %s\n' "$*" >&2; exit 1; }

need() {
  # need CMD "what to install" — fail loudly when a tool is missing.
  command -v "$1" >/dev/null 2>&1 || die "'$1' not found: $2"
}

# wait_for DESCRIPTION TIMEOUT_SECONDS CMD... — poll a condition, never a bare sleep.
wait_for() {
  local what=$1 timeout=$2; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      die "timed out after ${timeout}s waiting for: $what"
    fi
    sleep 0.5
  done
}

# Loopback ports, away from the defaults so a developer's own Kafka or cluster is untouched.
: "${ETCD_PORT:=12379}"
: "${APISERVER_PORT:=16443}"
: "${KAFKA_PORT:=19092}"
: "${KAFKA_CONTROLLER_PORT:=19093}"
# The secured listeners: SASL_SSL (SCRAM-SHA-512/256, PLAIN) and SSL with client
# certificates required (mutual TLS).
: "${KAFKA_SASL_SSL_PORT:=19094}"
: "${KAFKA_MTLS_PORT:=19095}"
# The same three listeners for pods, on the node's bridge address.
: "${KAFKA_POD_PORT:=19096}"
: "${KAFKA_POD_SASL_SSL_PORT:=19097}"
: "${KAFKA_POD_MTLS_PORT:=19098}"
: "${NODE_NAME:=oxbow-node}"
# The node's networks, inside 198.18.0.0/15 (reserved for network tests, never routed):
# pods on a bridge in 198.18.0.0/16 whose gateway is the host (and where the API server
# and Kafka answer pods), Services in 198.19.0.0/16. Nothing is masqueraded or routed out.
BRIDGE=oxbow0
BRIDGE_IP=198.18.0.1
POD_CIDR=198.18.0.0/16
SERVICE_CIDR=198.19.0.0/16
KUBERNETES_SERVICE_IP=198.19.0.1
CLUSTER_DNS_IP=198.19.0.10
NETWORK_RANGE=198.18.0.0/15
NODE_DIR="$STACK_DIR/node"
CONTAINERD_SOCK="$NODE_DIR/containerd/containerd.sock"
# What the node runs with: the pause image and the addons' images, built here.
PAUSE_IMAGE=oxbow-pause:3.10
: "${COREDNS_VERSION:=v1.12.4}"
: "${LOCAL_PATH_VERSION:=v0.0.30}"
: "${CRICTL_VERSION:=v1.34.0}"
: "${KUBE_ROUTER_VERSION:=v2.1.0}"
NODE_TOOLS="$OXBOW_CACHE/node-tools"
# Bumped when the stack's addresses or PKI change shape: `make up` then starts the
# cluster's state (etcd, PKI, node) afresh instead of mixing two layouts.
STACK_LAYOUT=3
KAFKA_BOOTSTRAP="127.0.0.1:$KAFKA_PORT"
K8S_BIN="$OXBOW_CACHE/k8s/$K8S_VERSION/bin"
ETCD_BIN="$OXBOW_CACHE/etcd/$ETCD_VERSION/bin"
HELM_BIN="$OXBOW_CACHE/helm/$HELM_VERSION/bin"
KAFKA_LIBS="$OXBOW_CACHE/kafka/$KAFKA_VERSION/libs"
: "${CARGO_TARGET_DIR:=$OXBOW_CACHE/target}"
export CARGO_TARGET_DIR
PKI="$STACK_DIR/pki"
# Kafka's own CA (not the cluster's): a client certificate the cluster's CA signed is
# one Kafka does not trust.
KAFKA_PKI="$STACK_DIR/kafka-pki"
RUN="$STACK_DIR/run"
LOGS="$STACK_DIR/logs"
ADMIN_KUBECONFIG="$PKI/admin.kubeconfig"

pidfile() { echo "$RUN/$1.pid"; }

# running NAME — the process recorded for NAME is alive and is still NAME (a pid file
# left from before a reboot may name an unrelated process now).
running() {
  local f pid want
  f=$(pidfile "$1")
  [[ -f "$f" ]] || return 1
  pid=$(cat "$f")
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
  case "$1" in
    kafka) want=kafka.Kafka ;;
    *) want=$1 ;;
  esac
  grep -q -- "$want" <<<"$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"
}

# start NAME CMD... — run CMD detached in its own session, logging to $LOGS/NAME.log.
start() {
  local name=$1; shift
  mkdir -p "$RUN" "$LOGS"
  # One previous generation is kept, so a long-lived cache does not fill the disk.
  local size
  size=$(stat -c %s "$LOGS/$name.log" 2>/dev/null || echo 0)
  ((size < 64 * 1024 * 1024)) || mv -f "$LOGS/$name.log" "$LOGS/$name.log.1"
  log "starting $name (log: $LOGS/$name.log)"
  setsid "$@" >>"$LOGS/$name.log" 2>&1 < /dev/null &
  echo $! >"$(pidfile "$name")"
}

# stop NAME — SIGTERM the session of NAME, SIGKILL what is left after 20 s.
stop() {
  local name=$1 pid
  running "$name" || { rm -f "$(pidfile "$name")"; return 0; }
  pid=$(cat "$(pidfile "$name")")
  log "stopping $name (pid $pid)"
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 20))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  rm -f "$(pidfile "$name")"
}

kubectl_admin() { "$K8S_BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }

# kafka_java CLASS ARGS... — run a Kafka command-line tool (small heap, quick start).
kafka_java() {
  java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$STACK_SRC/kafka/tools-log4j2.properties" \
    -cp "$KAFKA_LIBS/*" "$@"
}

# sign_cert NAME SUBJECT EXT — in the current directory, NAME.key and NAME.crt signed by
# ./ca.crt and ./ca.key (the key in PKCS#8, what Kafka's PEM keystore reads too).
sign_cert() {
  local name=$1 subj=$2 ext=$3
  openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" -subj "$subj" 2>/dev/null
  printf '%b' "$ext" >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -out "$name.crt" -days 3650 -extfile "$name.ext" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}
