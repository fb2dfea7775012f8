#!/usr/bin/env bash
# `make demo`: shows the local stack at work (a StatefulSet scheduled onto the local node,
# Kafka taking and returning a record), then installs the StreamApp CRD, runs the
# operator and applies examples/fraud-detection.yaml: topics, workers and a Ready status.
# Until the worker engine lands, the example runs the stand-in worker image.
source "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck disable=SC1091
source "$STACK_DIR/env"
ns=oxbow-demo

echo "== Kubernetes"
kubectl version 2>/dev/null | sed 's/^/   /'
kubectl get nodes -o wide
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply -n "$ns" -f "$here/../../examples/smoke/web.yaml"
kubectl rollout status -n "$ns" statefulset/web --timeout=120s
kubectl get pods,pvc -n "$ns" -o wide
ip=$(kubectl get pod -n "$ns" web-0 -o jsonpath='{.status.podIP}')
echo "   web-0 answers on its pod IP $ip: $(curl -fsS "http://$ip:8080/whoami")"

echo "== Kafka ($KAFKA_BOOTSTRAP)"
topic=oxbow-demo
kafka_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$KAFKA_BOOTSTRAP" \
  --create --if-not-exists --topic "$topic" --partitions 1 --config cleanup.policy=compact
msg="hello-from-oxbow-$(date +%s)"
echo "demo:$msg" | kafka_java org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$KAFKA_BOOTSTRAP" \
  --topic "$topic" --property parse.key=true --property key.separator=:
got=$(kafka_java org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$KAFKA_BOOTSTRAP" \
  --topic "$topic" --from-beginning --timeout-ms 20000 --isolation-level read_committed 2>/dev/null | grep -c "$msg" || true)
[[ "$got" == 1 ]] || die "the record produced to $topic did not come back"
echo "   produced and consumed '$msg' on compacted topic $topic"

echo "== Oxbow operator"
kubectl apply --server-side --force-conflicts -f "$here/../../charts/oxbow/crds/streamapps.oxbow.dev.yaml" >/dev/null
kubectl wait --for=condition=Established crd/streamapps.oxbow.dev --timeout=60s >/dev/null
if ! running oxbow-operator; then
  start oxbow-operator env KUBECONFIG="$KUBECONFIG" "$CARGO_TARGET_DIR/release/oxbow-operator" run \
    --namespace "$ns" --metrics-addr 127.0.0.1:18081 --worker-image oxbow-standin:demo
fi
kafka_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$KAFKA_BOOTSTRAP" \
  --create --if-not-exists --topic payments --partitions 4
sed -e "s|bootstrapServers: .*|bootstrapServers: $KAFKA_BOOTSTRAP|" -e 's|^spec:|spec:\n  image: oxbow-standin:demo|' \
  "$here/../../examples/fraud-detection.yaml" | kubectl apply -n "$ns" -f -
kubectl wait -n "$ns" --for=condition=Ready streamapp/fraud-detection --timeout=180s
kubectl get streamapp -n "$ns"
kubectl get streamapp -n "$ns" fraud-detection \
  -o jsonpath='{range .status.topics[*]}   topic {.name}: {.partitions} partitions, ready={.ready}{"\n"}{end}'
kubectl get statefulset,pods,pvc -n "$ns" -l oxbow.dev/streamapp=fraud-detection

echo
echo "Demo OK. The stack keeps running: . $STACK_DIR/env; kubectl get sapp -A; make status; make down"
echo "Operator log: $LOGS/oxbow-operator.log"
