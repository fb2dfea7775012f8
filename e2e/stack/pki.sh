#!/usr/bin/env bash
# Generates the local cluster's PKI once: a CA, the API server's serving certificate,
# client certificates (admin, controller-manager, scheduler, node agent), the
# service-account signing key pair, and a kubeconfig per client.
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
  "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"

client_ext="keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
sign_cert admin "/O=system:masters/CN=oxbow-admin" "$client_ext"
sign_cert controller-manager "/CN=system:kube-controller-manager" "$client_ext"
sign_cert scheduler "/CN=system:kube-scheduler" "$client_ext"
# The node agent provisions volumes and writes pod status for every pod on its node;
# the Node authorizer's per-node limits don't cover provisioning, so it acts as admin.
sign_cert node "/O=system:masters/CN=system:node:$NODE_NAME" "$client_ext"
# The API server's client identity towards aggregated APIs / kubelets (unused, required).
sign_cert apiserver-client "/O=system:masters/CN=kube-apiserver-client" "$client_ext"

openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null

for who in admin controller-manager scheduler node; do
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
