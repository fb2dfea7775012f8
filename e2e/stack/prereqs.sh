#!/usr/bin/env bash
# Installs (Debian, as root) or checks the system packages the build and the stack need.
# Fails loudly, naming what is missing, when it cannot install.
source "$(dirname "$0")/lib.sh"

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v openssl >/dev/null || missing+=(openssl)
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
command -v go >/dev/null || missing+=(golang-go)
command -v setsid >/dev/null || missing+=(util-linux)
command -v curl >/dev/null || missing+=(curl)
[[ -e /usr/include/zlib.h ]] || missing+=(zlib1g-dev)
# librdkafka's TLS and SASL (SCRAM needs OpenSSL too).
[[ -e /usr/include/openssl/ssl.h ]] || missing+=(libssl-dev)
# bindgen (rocksdb's sys crate) loads libclang at build time; RocksDB's C++ compiles with
# clang++ (.cargo/config.toml).
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 || missing+=(libclang-dev)
command -v clang >/dev/null && command -v clang++ >/dev/null || missing+=(clang)
# The node: containerd with runc, the CNI plugins, iptables for kube-proxy and the guard
# chain, ipset for kube-router, iproute2 for the bridge, busybox for the test image's shell.
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
command -v iptables >/dev/null || missing+=(iptables)
command -v ipset >/dev/null || missing+=(ipset)
command -v ip >/dev/null || missing+=(iproute2)
[[ -x /bin/busybox ]] || missing+=(busybox-static)
command -v strip >/dev/null || missing+=(binutils)
[[ -e /usr/lib/x86_64-linux-gnu/libc.a ]] || missing+=(libc6-dev)

if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
      || die "apt-get could not install: ${missing[*]}"
  else
    die "missing system packages: ${missing[*]} (install them, e.g. sudo apt-get install ${missing[*]})"
  fi
fi
need cargo "install Rust with rustup (https://rustup.rs)"
need go "install Go 1.26 or newer"
# etcd v3.6.16's module asks for Go 1.26, and the stack builds with the local Go only.
go_minor=$(go env GOVERSION | sed -n 's/^go1\.\([0-9]*\).*/\1/p')
[[ -n "$go_minor" && "$go_minor" -ge 26 ]] || die "Go 1.26 or newer is required (found: $(go env GOVERSION))"
grep -qE 'version "(1[7-9]|2[0-9])' <<<"$(java -version 2>&1)" || die "Java 17 or newer is required (found: $(java -version 2>&1 | head -1))"
