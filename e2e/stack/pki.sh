#!/usr/bin/env bash
# Generates the local cluster's PKI once: a CA, the API server's and the kubelet's
# serving certificates, client certificates (admin, controller-manager, scheduler,
# kubelet, kube-proxy, kube-router), the service-account signing key pair, and a
# kubeconfig per client.
source "$(dirname "$0")/lib.sh"
need openssl "install openssl (Debian: openssl)"

[[ -f "$PKI/.complete" ]] && exit 0
rm -rf "$PKI"
mkdir -p "$PKI"
cd "$PKI"
log "generating the local cluster PKI in $PKI"

openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
  -subj "/CN=oxbow-local-ca" 2>/dev/null


sign_cert apiserver "/CN=kube-apiserver" \
  "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:$BRIDGE_IP,IP:$KUBERNETES_SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"

client_ext="keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
sign_cert admin "/O=system:masters/CN=oxbow-admin" "$client_ext"
sign_cert controller-manager "/CN=system:kube-controller-manager" "$client_ext"
sign_cert scheduler "/CN=system:kube-scheduler" "$client_ext"
# The kubelet: its client identity (the Node authorizer and NodeRestriction hold it to
# its own node's pods) and its serving certificate, which the API server verifies for
# logs, exec and port-forward.
sign_cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "$client_ext"
sign_cert kubelet-serving "/O=system:nodes/CN=system:node:$NODE_NAME" \
  "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:$BRIDGE_IP,IP:127.0.0.1,DNS:$NODE_NAME\n"
# kube-proxy: the built-in binding system:node-proxier names this user.
sign_cert kube-proxy "/CN=system:kube-proxy" "$client_ext"
# kube-router, NetworkPolicy only: read access (node-up.sh binds it).
sign_cert kube-router "/CN=oxbow:kube-router" "$client_ext"
# The API server's client identity towards kubelets (logs, exec) and aggregated APIs.
sign_cert apiserver-client "/O=system:masters/CN=kube-apiserver-client" "$client_ext"

openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null

for who in admin controller-manager scheduler kubelet kube-proxy kube-router; do
  kc="$who.kubeconfig"
  k() { "$K8S_BIN/kubectl" --kubeconfig "$kc" "$@" >/dev/null; }
  k config set-cluster oxbow-local --server="https://127.0.0.1:$APISERVER_PORT" \
    --certificate-authority="$PKI/ca.crt" --embed-certs=true
  k config set-credentials "$who" --client-certificate="$PKI/$who.crt" \
    --client-key="$PKI/$who.key" --embed-certs=true
  k config set-context oxbow-local --cluster=oxbow-local --user="$who" --namespace=default
  k config use-context oxbow-local
done
chmod 600 ./*.key ./*.kubeconfig
touch .complete
