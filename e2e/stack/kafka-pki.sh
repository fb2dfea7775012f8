#!/usr/bin/env bash
# Generates Kafka's PKI and credentials once, for the secured listeners: a CA of its
# own, the broker's certificate (PEM keystore, SANs 127.0.0.1, the bridge's address and localhost, so clients
# verify the hostname), a client certificate for mutual TLS, and the password of the
# SCRAM and PLAIN user `oxbow` (the user itself is created with Kafka's own tool by
# up.sh once the broker runs).
source "$(dirname "$0")/lib.sh"
need openssl "install openssl (Debian: openssl)"

[[ -f "$KAFKA_PKI/.complete" ]] && exit 0
rm -rf "$KAFKA_PKI"
mkdir -p "$KAFKA_PKI"
cd "$KAFKA_PKI"
log "generating Kafka's PKI in $KAFKA_PKI"

openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
  -subj "/CN=oxbow-kafka-ca" 2>/dev/null

sign_cert broker "/CN=localhost" \
  "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1,IP:$BRIDGE_IP,DNS:localhost\n"
sign_cert client "/CN=oxbow-client" \
  "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
# Kafka's PEM keystore: the private key (PKCS#8) followed by the certificate chain.
cat broker.key broker.crt >broker-keystore.pem
openssl rand -hex 16 >sasl-password
chmod 600 ./*.key ./*.pem sasl-password
touch .complete
