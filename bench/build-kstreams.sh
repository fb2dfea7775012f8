#!/usr/bin/env bash
# Builds the Kafka Streams peer (bench/kstreams) with Maven: compiles it and writes its
# runtime classpath to bench/kstreams/target/classpath.txt. Kafka Streams and its
# dependencies come from Maven Central into the stack's Maven repository
# ($OXBOW_CACHE/maven, shared with e2e/stack/fetch-kafka.sh), never into the clone.
set -euo pipefail
OXBOW_CACHE="${OXBOW_CACHE:-$HOME/.cache/oxbow}"
command -v java >/dev/null || { echo "bench: install a Java 17 JDK (Debian: openjdk-17-jdk-headless)" >&2; exit 1; }
command -v mvn >/dev/null || { echo "bench: install Maven (Debian: maven)" >&2; exit 1; }
cd "$(dirname "$0")/kstreams"
mvn -B -q -Dstyle.color=never -Dmaven.repo.local="$OXBOW_CACHE/maven" \
  compile dependency:build-classpath -Dmdep.outputFile=target/classpath.txt
test -s target/classpath.txt && test -f target/classes/dev/oxbow/bench/KStreamsBench.class
