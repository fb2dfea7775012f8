#!/usr/bin/env bash
# `make demo`: shows the local stack at work (a StatefulSet scheduled onto the local node,
# Kafka taking and returning a record), then installs the Helm chart (the operator runs as
# a pod) and applies examples/fraud-detection.yaml: topics, workers and a Ready status.
# The workers are the real oxbow-worker: payments go in, alerts come out, a query answers.
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

echo "== Oxbow operator (Helm chart charts/oxbow, running as a pod)"
# CRDs go first and on every run: helm installs crds/ only on a first install.
kubectl apply --server-side --force-conflicts -f "$here/../../charts/oxbow/crds/streamapps.oxbow.dev.yaml" >/dev/null
kubectl wait --for=condition=Established crd/streamapps.oxbow.dev --timeout=60s >/dev/null
# Earlier demos ran the operator as a host process; one operator per namespace.
stop oxbow-operator
# It watches the demo namespace only, so it never meets the test suite's operators.
helm upgrade --install oxbow "$here/../../charts/oxbow" --namespace oxbow-system --create-namespace \
  --skip-crds --set watchNamespace="$ns" --wait --timeout 180s
# The image maps to the binary just built; a restart makes the pod run it.
kubectl rollout restart deployment/oxbow -n oxbow-system >/dev/null
kubectl rollout status deployment/oxbow -n oxbow-system --timeout=180s
kubectl get deployment,pods -n oxbow-system -o wide
op_pod=$(kubectl get pods -n oxbow-system -l app.kubernetes.io/component=operator \
  --field-selector=status.phase=Running -o jsonpath='{.items[0].metadata.name}')
# A previous run's app (maybe an older image) goes first; its topics and volumes are kept.
kubectl delete streamapp -n "$ns" fraud-detection --ignore-not-found --wait=true --timeout=120s >/dev/null
for t in payments risk-alerts users; do
  kafka_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$KAFKA_BOOTSTRAP" \
    --create --if-not-exists --topic "$t" --partitions 4
done
# Pods reach the broker on the node's bridge address.
sed -e "s|bootstrapServers: .*|bootstrapServers: $KAFKA_BOOTSTRAP_IN_CLUSTER|" \
  "$here/../../examples/fraud-detection.yaml" | kubectl apply -n "$ns" -f -
kubectl wait -n "$ns" --for=condition=Ready streamapp/fraud-detection --timeout=180s \
  || { kubectl logs -n oxbow-system "$op_pod" --tail 40; die "fraud-detection did not become Ready (operator log above)"; }
kubectl get streamapp -n "$ns"
kubectl get streamapp -n "$ns" fraud-detection \
  -o jsonpath='{range .status.topics[*]}   topic {.name}: {.partitions} partitions, ready={.ready}{"\n"}{end}'
kubectl get streamapp -n "$ns" fraud-detection \
  -o jsonpath='{range .status.instances[*]}   pod {.pod} ({.address}): {.state}, active tasks {.activeTasks}, standby tasks {.standbyTasks}{"\n"}{end}'
kubectl get statefulset,pods,pvc -n "$ns" -l oxbow.dev/streamapp=fraud-detection -o wide
echo "   the operator and the workers are containers on the node (crictl ps):"
"$NODE_TOOLS/bin/crictl" --runtime-endpoint "unix://$CONTAINERD_SOCK" ps --name 'operator|worker' 2>/dev/null | sed 's/^/     /'


echo "== Payments through the real workers"
# A fresh user each run (state outlives runs) with a limit of 150000 in the users table;
# 7 payments of 300.00, one of them sent twice (dedupe drops the copy), so alerts say
# count 6 and 7, never 8; u-7 pays twice. Payments are keyed by their txId, as most
# producers key them: the app repartitions by txId and by userId itself.
now=$(date +%s%3N)
user="u-$(date +%s)"
echo "$user|{\"limit\":150000}" | kafka_java org.apache.kafka.tools.ConsoleProducer \
  --bootstrap-server "$KAFKA_BOOTSTRAP" --topic users --property parse.key=true --property key.separator='|'
{
  for i in 1 2 3 4 5 6 7; do
    echo "$user-$i|{\"txId\":\"$user-$i\",\"userId\":\"$user\",\"amount\":30000,\"ts\":$now}"
  done
  echo "$user-3|{\"txId\":\"$user-3\",\"userId\":\"$user\",\"amount\":30000,\"ts\":$now}"
  for i in 1 2; do
    echo "$user-u7-$i|{\"txId\":\"$user-u7-$i\",\"userId\":\"u-7\",\"amount\":1500,\"ts\":$now}"
  done
} | kafka_java org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$KAFKA_BOOTSTRAP" \
  --topic payments --property parse.key=true --property key.separator='|'
echo "   produced 10 payments (one duplicate) for $user and u-7"
alerts=""
for _ in $(seq 30); do
  alerts=$(kafka_java org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$KAFKA_BOOTSTRAP" \
    --topic risk-alerts --from-beginning --timeout-ms 5000 --isolation-level read_committed \
    --property print.key=true 2>/dev/null | grep "^$user" || true)
  grep -q '"count":7' <<<"$alerts" && break
done
grep -q '"count":7' <<<"$alerts" \
  || die "no alert with count 7 for $user reached risk-alerts (worker logs: kubectl logs -n $ns fraud-detection-0)"
grep -q '"count":8' <<<"$alerts" && die "the duplicate payment was counted: $alerts"
grep '"count":7' <<<"$alerts" | grep -q '"limit":150000' || die "the alert does not carry the user's own limit from the users table: $alerts"
echo "   alerts on risk-alerts (read_committed; the duplicate was not counted):"
sed 's/^/     /' <<<"$alerts"
ip=$(kubectl get streamapp -n "$ns" fraud-detection -o jsonpath='{.status.instances[0].address}')
# Queries need a token whose identity may get streamapps/query (docs/queries.md#access).
kubectl apply -n "$ns" -f - >/dev/null <<'RBAC'
apiVersion: v1
kind: ServiceAccount
metadata: {name: dashboard}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: query-fraud-detection}
rules:
- {apiGroups: [oxbow.dev], resources: [streamapps/query], resourceNames: [fraud-detection], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: query-fraud-detection}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: query-fraud-detection}
subjects:
- {kind: ServiceAccount, name: dashboard}
RBAC
code=$(curl -s -o /dev/null -w '%{http_code}' "http://$ip/v1/stores/per-user/keys/$user")
[[ "$code" == 401 ]] || die "a query without a token was answered $code, not 401"
echo "   without a token: $code; with the token of ServiceAccount dashboard (Role query-fraud-detection):"
token=$(kubectl create token dashboard -n "$ns" --duration=10m)
echo "   query any worker: curl -H \"Authorization: Bearer \$(kubectl create token dashboard -n $ns)\" http://$ip/v1/stores/per-user/keys/$user"
curl -fsS -H "Authorization: Bearer $token" "http://$ip/v1/stores/per-user/keys/$user" \
  | python3 -m json.tool | sed 's/^/     /' | head -40

echo
echo "Demo OK. The stack keeps running: . $STACK_DIR/env; kubectl get sapp -A; make status; make down"
echo "Operator log: kubectl logs -n oxbow-system deploy/oxbow (helm uninstall oxbow -n oxbow-system removes it)"
