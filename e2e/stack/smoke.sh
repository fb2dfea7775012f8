#!/usr/bin/env bash
# `make demo` (for now): shows the local stack at work — the API server schedules a
# StatefulSet onto the local node, its pods become Ready, and Kafka takes and returns a
# record. Later issues turn this into the full StreamApp demo.
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

echo
echo "Demo OK. The stack keeps running: . $STACK_DIR/env; kubectl get pods -A; make status; make down"
