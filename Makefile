# Oxbow — one entry point for building, the local stack, the demo and the tests.
# Everything downloaded or built is cached under ~/.cache/oxbow (outside the clone).

SHELL := /bin/bash
OXBOW_CACHE ?= $(HOME)/.cache/oxbow
export OXBOW_CACHE
export CARGO_TARGET_DIR ?= $(OXBOW_CACHE)/target
CARGO ?= cargo
# One cargo profile for binaries, tests and benchmarks: RocksDB and librdkafka build once.
CARGO_PROFILE := --release
STACK := e2e/stack

.PHONY: help prereqs stack-build build images up down status demo test test-unit test-e2e lint fmt clean-stack bench-worker bench bench-operator bench-reports bench-restore

help:
	@echo "make demo    bring up the local stack and run the example end to end"
	@echo "make test    lint, unit tests and the end-to-end suite against the real stack"
	@echo "make test-unit    the pure unit tests alone (no stack)"
	@echo "make test-e2e    the integration and end-to-end tests alone (brings the stack up)"
	@echo "make lint    rustfmt --check and clippy -D warnings on every target"
	@echo "make fmt    format the workspace with rustfmt"
	@echo "make build    the release binaries and examples (one build for demo, test and bench)"
	@echo "make stack-build    start the stack's Go builds and Kafka's download in the background"
	@echo "make prereqs    install the missing system packages (apt-get)"
	@echo "make up | down | status    manage the local stack (Kafka + Kubernetes + the node)"
	@echo "make images    pack the release binaries into OCI images on the node (make up does it)"
	@echo "make clean-stack    stop the stack and delete its data (downloads and builds stay)"
	@echo "make bench-worker    worker throughput (ALOS, EOS), RSS and full-restore rate on the local Kafka"
	@echo "make bench    Oxbow side by side with Kafka Streams and a raw pipe; writes docs/benchmarks.md"
	@echo "make bench-operator    operator RSS with N StreamApps (default 50) and apply-to-Ready times"
	@echo "make bench-reports    API writes/s and operator CPU, 10 apps x 10 real worker pods, steady state"
	@echo "make bench-restore    running tasks' latency while another task of the pod restores"

prereqs:
	@bash $(STACK)/prereqs.sh

# --examples: a build that includes examples resolves features with the dev-dependencies,
# as clippy --all-targets and cargo test do. With --bins alone the host features of
# bindgen differ (mlua's vendored Lua pulls `which`), so RocksDB's C++ built twice.
build: prereqs
	$(CARGO) build $(CARGO_PROFILE) --workspace --bins --examples

# The stack's Go builds and Kafka's download start in the background first and run beside
# cargo (e2e/stack/build-stack.sh); up.sh waits for them.
stack-build: prereqs
	@bash $(STACK)/build-stack.sh --background

up: stack-build build
	@bash $(STACK)/up.sh

# The node's images from the release binaries; `make up` runs it, `make test` again once
# the examples (the stuck-worker fixture) are built.
images: build
	@bash $(STACK)/images.sh

down:
	@bash $(STACK)/down.sh

status:
	@bash $(STACK)/status.sh

# Removes the stack's data (etcd, Kafka logs, volumes, PKI); downloads and builds stay.
clean-stack: down
	rm -rf $(OXBOW_CACHE)/stack

demo: up
	@bash $(STACK)/demo.sh

fmt:
	$(CARGO) fmt --all

lint: prereqs
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy $(CARGO_PROFILE) --workspace --all-targets -- -D warnings

test-unit: prereqs
	$(CARGO) test $(CARGO_PROFILE) --workspace --lib --bins

test-e2e: up
	source $(OXBOW_CACHE)/stack/env && $(CARGO) test $(CARGO_PROFILE) --workspace --tests

test: stack-build lint up
	# `make up` built the examples too (the custom-processor test runs one, and the
	# stuck-worker fixture goes into an image); the same feature set as clippy's and this.
	@bash $(STACK)/images.sh
	source $(OXBOW_CACHE)/stack/env && $(CARGO) test $(CARGO_PROFILE) --workspace --all-targets --no-fail-fast

# Worker figures alone (no peer): W1 at both guarantees and W3 restores, from the same
# driver as `make bench`; BENCH_RECORDS/BENCH_KEYS/BENCH_PARTITIONS/BENCH_RUNS override.
bench-worker: up
	source $(OXBOW_CACHE)/stack/env && BENCH_ENGINES=oxbow BENCH_WORKLOADS=w1,w3 $(CARGO_TARGET_DIR)/release/examples/compare

# Oxbow side by side with Kafka Streams 4.1.2 and a raw pipe on the local Kafka (issue 7):
# W1-W4 and latency, outputs checked before figures count, medians and ratios written to
# docs/benchmarks.md. Not part of `make test`. BENCH_RECORDS, BENCH_KEYS, BENCH_RUNS,
# BENCH_WORKLOADS, BENCH_ENGINES … shrink or select it (bench/README.md).
bench: up
	@bash bench/build-kstreams.sh
	source $(OXBOW_CACHE)/stack/env && BENCH_REPORT=$${BENCH_REPORT:-$(CURDIR)/docs/benchmarks.md} $(CARGO_TARGET_DIR)/release/examples/compare
	$(MAKE) --no-print-directory bench-operator
	$(MAKE) --no-print-directory bench-restore

# Operator figures (issue 7, item 5): RSS of one operator managing BENCH_OPERATOR_APPS
# (50) StreamApps with stand-in workers, and apply -> StatefulSet / Ready times.
# BENCH_OPERATOR_MODE=burst|sequential|both, BENCH_OPERATOR_IDLE_SECS (20). Prints a
# table; the figures in docs/benchmarks.md (section Operator) are copied by hand.
bench-operator: up
	source $(OXBOW_CACHE)/stack/env && $(CARGO_TARGET_DIR)/release/examples/operator_bench

# API writes per second and the operator's CPU in steady state (issue 17, item 7): 10
# StreamApps x 10 real worker pods, idle and Ready. BENCH_REPORT_APPS/PODS/WINDOW_SECS.
bench-reports: up
	source $(OXBOW_CACHE)/stack/env && $(CARGO_TARGET_DIR)/release/examples/report_bench

# Running tasks' p50/p99 latency before and during another task's full restore on the
# same pod (issue 19, item 3). BENCH_RESTORE_KEYS/RATE/BASELINE_SECS/GUARANTEE and
# OXBOW_WORKER_BIN (an older worker) override; the figures are copied by hand.
bench-restore: up
	source $(OXBOW_CACHE)/stack/env && $(CARGO_TARGET_DIR)/release/examples/restore_latency_bench
