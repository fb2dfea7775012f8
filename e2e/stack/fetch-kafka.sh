#!/usr/bin/env bash
# Resolves Apache Kafka $KAFKA_VERSION (broker + tools + a log4j2 binding) from Maven
# Central into $OXBOW_CACHE/kafka/$KAFKA_VERSION/libs. The Maven repository itself is
# cached in $OXBOW_CACHE/maven.
source "$(dirname "$0")/lib.sh"
need java "install a Java 17 runtime (Debian: openjdk-17-jre-headless)"
need mvn "install Maven (Debian: maven)"

libs="$OXBOW_CACHE/kafka/$KAFKA_VERSION/libs"
if [[ -f "$libs/.complete" ]]; then exit 0; fi
rm -rf "$libs"
mkdir -p "$libs"
log "resolving Apache Kafka $KAFKA_VERSION from Maven Central"
mvn -B -q -Dstyle.color=never -f "$(dirname "$0")/kafka/pom.xml" \
  -Dmaven.repo.local="$OXBOW_CACHE/maven" \
  -Dkafka.version="$KAFKA_VERSION" \
  dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$libs" \
  || die "Maven could not resolve org.apache.kafka:kafka_2.13:$KAFKA_VERSION and its dependencies"
[[ -f "$libs/kafka_2.13-$KAFKA_VERSION.jar" ]] || die "kafka_2.13-$KAFKA_VERSION.jar missing after resolution"
touch "$libs/.complete"
