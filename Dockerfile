# syntax=docker/dockerfile:1.7
#
# The two Oxbow images, built from one build stage (both binaries in one cargo build):
#
#   docker build --target operator -t ghcr.io/oxbow/oxbow-operator:0.1.0 .
#   docker build --target worker   -t ghcr.io/oxbow/oxbow-worker:0.1.0 .
#
# The tag is the workspace version (Cargo.toml `[workspace.package] version`), which is
# what the Helm chart (charts/oxbow, values image.* and workerImage.*) expects.
# BuildKit is required (cache mounts); it is the default builder since Docker 23.

# The toolchain the repository is developed with (rustc 1.95); Cargo.toml's
# rust-version (1.85) is the minimum. Bookworm, so the binaries link against the same
# glibc and libstdc++ as the runtime image (distroless cc-debian12).
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS builder
# cmake and libclang: RocksDB's sys crate (bindgen); librdkafka builds with make and the
# C toolchain the image already has, against zlib1g-dev (also already there).
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake clang libclang-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The cargo registry, git checkouts and the target directory live in cache mounts, so a
# rebuild after a source change recompiles only the workspace crates (RocksDB and
# librdkafka stay built). Binaries are copied out of the mount in the same step, without
# their debug info (the release profile's line tables and RocksDB's -g: the worker
# shrinks from about 560 MB to 40 MB; symbols stay, so backtraces keep function names).
# Both binaries load libz.so.1, libssl.so.3 and libcrypto.so.3 (librdkafka with TLS and
# SASL), the worker also libstdc++ (RocksDB): see `ldd`. distroless/cc has libstdc++,
# libgcc_s and glibc; the others are copied from this stage (bookworm's libssl-dev is
# in the rust image) to their multiarch path, so the image does not depend on whether
# the base ships them.
RUN --mount=type=cache,id=oxbow-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=oxbow-cargo-git,target=/usr/local/cargo/git \
    --mount=type=cache,id=oxbow-target,target=/src/target \
    cargo build --release --locked -p oxbow-operator -p oxbow-worker \
 && mkdir -p /out/bin \
 && cp target/release/oxbow-operator target/release/oxbow-worker /out/bin/ \
 && strip --strip-debug /out/bin/oxbow-operator /out/bin/oxbow-worker \
 && multiarch="$(gcc -dumpmachine)" \
 && mkdir -p "/out/root/usr/lib/${multiarch}" \
 && cp -L "/usr/lib/${multiarch}/libz.so.1" "/usr/lib/${multiarch}/libssl.so.3" \
          "/usr/lib/${multiarch}/libcrypto.so.3" "/out/root/usr/lib/${multiarch}/"

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.source="https://github.com/oxbow/oxbow" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=builder /out/root/ /
# distroless "nonroot": uid/gid 65532, the user the operator's worker pods run as.
USER 65532:65532

FROM runtime AS operator
LABEL org.opencontainers.image.title="oxbow-operator" \
      org.opencontainers.image.description="Reconciles StreamApps into StatefulSets, Services, RBAC and Kafka topics"
COPY --from=builder /out/bin/oxbow-operator /usr/local/bin/oxbow-operator
ENTRYPOINT ["/usr/local/bin/oxbow-operator"]

FROM runtime AS worker
LABEL org.opencontainers.image.title="oxbow-worker" \
      org.opencontainers.image.description="Oxbow stream-processing worker (Kafka in and out, RocksDB state)"
COPY --from=builder /out/bin/oxbow-worker /usr/local/bin/oxbow-worker
ENTRYPOINT ["/usr/local/bin/oxbow-worker"]
