#!/usr/bin/env bash
# `make up`: builds what is missing (cached), then starts etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and a Kafka broker on loopback, and the node:
# the kubelet with containerd, its pods on a bridge (network.sh, node-up.sh).
# Idempotent: what runs and answers is left alone.
source "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
t0=$SECONDS

# A stack made with other addresses or PKI (an older checkout) starts afresh: its data is
# disposable, and two layouts in one etcd or one PKI would not work together.
if [[ -d "$STACK_DIR" && "$(cat "$STACK_DIR/layout" 2>/dev/null)" != "$STACK_LAYOUT" ]]; then
  log "the stack's layout changed (now $STACK_LAYOUT): stopping it and starting its state afresh"
  bash "$here/down.sh"
  # Layout 1 ran pods as host processes under a node agent of our own; stop any left.
  stop oxbow-node
  for f in "$STACK_DIR/node/pids"/*.pid; do
    [[ -f "$f" ]] && kill -KILL -- "-$(cat "$f")" 2>/dev/null || true
  done
  rm -rf "$STACK_DIR/etcd" "$STACK_DIR/pki" "$STACK_DIR/kafka-pki" "$STACK_DIR/kafka" "$STACK_DIR/node"
fi
mkdir -p "$STACK_DIR"
echo "$STACK_LAYOUT" >"$STACK_DIR/layout"

# Its own process: the build lock it takes is gone before the daemons below start.
bash "$here/build-stack.sh"
bash "$here/pki.sh"
bash "$here/kafka-pki.sh"
mkdir -p "$RUN" "$LOGS"
# The bridge first: Kafka and the API server listen on its address for pods.
bash "$here/network.sh"

apiserver_ready() { kubectl_admin get --raw /readyz; }
kafka_ready() { kafka_java org.apache.kafka.tools.ClusterTool cluster-id --bootstrap-server "$KAFKA_BOOTSTRAP"; }

# --- Kafka: started first because the JVM takes longest; waited for last. A broker
# running with another configuration (an older checkout: no secured listeners) is
# restarted with this one.
mkdir -p "$STACK_DIR/kafka"
props="$STACK_DIR/kafka/server.properties"
(umask 077; sed -e "s|@DATA@|$STACK_DIR/kafka/data|g" -e "s|@PORT@|$KAFKA_PORT|g" \
    -e "s|@CONTROLLER_PORT@|$KAFKA_CONTROLLER_PORT|g" -e "s|@SASL_SSL_PORT@|$KAFKA_SASL_SSL_PORT|g" \
    -e "s|@MTLS_PORT@|$KAFKA_MTLS_PORT|g" -e "s|@KAFKA_PKI@|$KAFKA_PKI|g" -e "s|@BRIDGE_IP@|$BRIDGE_IP|g" \
    -e "s|@POD_PORT@|$KAFKA_POD_PORT|g" -e "s|@POD_SASL_SSL_PORT@|$KAFKA_POD_SASL_SSL_PORT|g" \
    -e "s|@POD_MTLS_PORT@|$KAFKA_POD_MTLS_PORT|g" \
    -e "s|@SASL_PASSWORD@|$(cat "$KAFKA_PKI/sasl-password")|g" \
    "$here/kafka/server.properties.in" >"$props.new")
if running kafka && ! cmp -s "$props.new" "$props"; then
  log "Kafka's configuration changed: restarting it"
  stop kafka
fi
mv "$props.new" "$props"
boot_id=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo unknown)
if ! running kafka; then
  cp "$here/kafka/log4j2.properties" "$STACK_DIR/kafka/log4j2.properties"
  # Everything in this broker is disposable test and demo data. After a machine restart
  # it was stopped uncleanly, and recovering it (thousands of test partitions) took longer
  # than two minutes; a fresh store starts in seconds. A broker a test stopped and starts
  # again (same boot) keeps its data: that is what such a test checks.
  if [[ -d "$STACK_DIR/kafka/data" && -z "${OXBOW_STACK_KEEP_KAFKA_DATA:-}" ]] \
      && [[ "$(cat "$STACK_DIR/kafka/boot_id" 2>/dev/null)" != "$boot_id" ]]; then
    log "the machine restarted since the broker last ran: discarding its data (OXBOW_STACK_KEEP_KAFKA_DATA=1 keeps it)"
    rm -rf "$STACK_DIR/kafka/data"
  fi
  if [[ ! -f "$STACK_DIR/kafka/data/meta.properties" ]]; then
    log "formatting Kafka's KRaft storage"
    kafka_java kafka.tools.StorageTool format --config "$props" \
      --cluster-id "$(kafka_java kafka.tools.StorageTool random-uuid)" --ignore-formatted >>"$LOGS/kafka.log" 2>&1 \
      || die "formatting Kafka storage failed; see $LOGS/kafka.log"
  fi
  start kafka java -Xms256m -Xmx1g -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$STACK_DIR/kafka/log4j2.properties" \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$props"
fi
# The boot this broker's data belongs to (see above).
echo "$boot_id" >"$STACK_DIR/kafka/boot_id"

# --- etcd
if ! running etcd; then
  start etcd "$ETCD_BIN/etcd" --name oxbow --data-dir "$STACK_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "oxbow=http://127.0.0.1:$((ETCD_PORT + 1))" \
    --unsafe-no-fsync --quota-backend-bytes 4294967296 --log-level warn
fi

# --- kube-apiserver
if ! running kube-apiserver; then
  start kube-apiserver "$K8S_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 0.0.0.0 --advertise-address "$BRIDGE_IP" --secure-port "$APISERVER_PORT" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --client-ca-file "$PKI/ca.crt" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --kubelet-client-certificate "$PKI/apiserver-client.crt" --kubelet-client-key "$PKI/apiserver-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --allow-privileged=true --profiling=false --v=1
fi
wait_for "kube-apiserver /readyz on 127.0.0.1:$APISERVER_PORT (log: $LOGS/kube-apiserver.log)" 120 apiserver_ready

# --- kube-controller-manager and kube-scheduler
if ! running kube-controller-manager; then
  start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig "$PKI/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$PKI/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$PKI/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 10257 \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --use-service-account-credentials=true --leader-elect=false \
    --controllers '*' --profiling=false --v=1
fi
if ! running kube-scheduler; then
  start kube-scheduler "$K8S_BIN/kube-scheduler" \
    --kubeconfig "$PKI/scheduler.kubeconfig" \
    --authentication-kubeconfig "$PKI/scheduler.kubeconfig" \
    --authorization-kubeconfig "$PKI/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 10259 --leader-elect=false --profiling=false --v=1
fi

# --- the node: containerd, the kubelet, kube-proxy, the images and the node's addons
bash "$here/node-up.sh"
sa_ready() { kubectl_admin get serviceaccount default -n default; }
wait_for "the default ServiceAccount (controller-manager log: $LOGS/kube-controller-manager.log)" 60 sa_ready

wait_for "Kafka to answer a metadata request on $KAFKA_BOOTSTRAP (log: $LOGS/kafka.log)" 240 kafka_ready
# The SCRAM user of the SASL_SSL listener, with Kafka's own tool (idempotent).
# One mechanism per request: Kafka refuses to alter a user's credentials twice in one.
sasl_password=$(cat "$KAFKA_PKI/sasl-password")
for mechanism in SCRAM-SHA-512 SCRAM-SHA-256; do
  kafka_java kafka.admin.ConfigCommand --bootstrap-server "$KAFKA_BOOTSTRAP" --alter \
    --add-config "$mechanism=[password=$sasl_password]" \
    --entity-type users --entity-name oxbow >>"$LOGS/kafka.log" 2>&1 \
    || die "creating Kafka's $mechanism user failed; see $LOGS/kafka.log"
done
# The broker learns new credentials from the cluster metadata, seconds later.
scram_config="$STACK_DIR/kafka/scram-client.properties"
(umask 077; cat >"$scram_config" <<PROPS
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="oxbow" password="$sasl_password";
ssl.truststore.type=PEM
ssl.truststore.location=$KAFKA_PKI/ca.crt
PROPS
)
scram_ready() {
  kafka_java org.apache.kafka.tools.ClusterTool cluster-id \
    --bootstrap-server "127.0.0.1:$KAFKA_SASL_SSL_PORT" --config "$scram_config"
}
wait_for "Kafka to accept the SCRAM-SHA-512 user over SASL_SSL on 127.0.0.1:$KAFKA_SASL_SSL_PORT" 60 scram_ready

# Everything must still run: a component that died right after starting would otherwise
# hide behind state a previous run left in etcd (a Ready node, a ServiceAccount).
for name in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy kube-router kafka; do
  running "$name" || die "$name exited right after starting; see $LOGS/$name.log"
done

cat >"$STACK_DIR/env" <<ENV
# Written by 'make up'. Source it: . $STACK_DIR/env
export KUBECONFIG="$ADMIN_KUBECONFIG"
export KAFKA_BOOTSTRAP="$KAFKA_BOOTSTRAP"
# Where pods reach the broker: the same listeners on the node's bridge address.
export KAFKA_BOOTSTRAP_IN_CLUSTER="$BRIDGE_IP:$KAFKA_POD_PORT"
export KAFKA_BOOTSTRAP_SASL_SSL_IN_CLUSTER="$BRIDGE_IP:$KAFKA_POD_SASL_SSL_PORT"
export KAFKA_BOOTSTRAP_MTLS_IN_CLUSTER="$BRIDGE_IP:$KAFKA_POD_MTLS_PORT"
# The secured listeners, for any Kafka client: SASL_SSL (SCRAM-SHA-512/256 or PLAIN as
# the user below) and SSL with a client certificate; both verify the broker against
# KAFKA_CA_FILE (PEM).
export KAFKA_BOOTSTRAP_SASL_SSL="127.0.0.1:$KAFKA_SASL_SSL_PORT"
export KAFKA_SASL_USERNAME="oxbow"
export KAFKA_SASL_PASSWORD="$sasl_password"
export KAFKA_CA_FILE="$KAFKA_PKI/ca.crt"
export KAFKA_BOOTSTRAP_MTLS="127.0.0.1:$KAFKA_MTLS_PORT"
export KAFKA_CLIENT_CERT_FILE="$KAFKA_PKI/client.crt"
export KAFKA_CLIENT_KEY_FILE="$KAFKA_PKI/client.key"
export OXBOW_STACK_DIR="$STACK_DIR"
export PATH="$K8S_BIN:$HELM_BIN:\$PATH"
ENV
log "stack up in $((SECONDS - t0))s; run: . $STACK_DIR/env"
