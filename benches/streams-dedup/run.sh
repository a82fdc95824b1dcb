#!/usr/bin/env bash
# Kafka Streams' dedup recipe (StreamsDedup.java) for benches/pipeline.rs.
#
# Usage:
#   run.sh build                         build it (no-op when built from the same sources)
#   run.sh BOOTSTRAP INPUT OUTPUT STATE_DIR GUARANTEE APP_ID TOPOLOGY
#                                        build if needed, then exec the program; GUARANTEE is
#                                        at_least_once or exactly_once_v2; TOPOLOGY is keyed
#                                        (input keyed by the idempotency key: no repartition)
#                                        or repartition; stops on SIGTERM
#
# The first build needs Maven and Maven Central; later runs need neither. Java is the one
# scripts/kafka/kafka.sh runs the broker with: JAVA_HOME, or java on PATH.
# Environment: STREAMS_DEDUP_LOG_LEVEL (Kafka's log level on stderr, default error),
#              STREAMS_DEDUP_JAVA_OPTS (extra JVM flags).
set -euo pipefail

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly DIR
readonly BUILT=$DIR/target/.built
if [[ -n ${JAVA_HOME:-} ]]; then JAVA=$JAVA_HOME/bin/java; else JAVA=java; fi

die() { printf 'streams-dedup: error: %s\n' "$*" >&2; exit 1; }

sources_sha() {
  (cd "$DIR" && find pom.xml src -type f | LC_ALL=C sort | xargs cat) | sha256sum | cut -c1-16
}

build() {
  local want log
  want=$(sources_sha)
  if [[ -f $BUILT && $(<"$BUILT") == "$want" ]]; then
    return 0
  fi
  command -v "$JAVA" >/dev/null 2>&1 || die "java not found (set JAVA_HOME or put Java 17+ on PATH)"
  command -v mvn >/dev/null 2>&1 || die "mvn not found; it is needed to build $DIR once"
  mkdir -p "$DIR/target"
  log=$DIR/target/build.log
  # Maven uses the same JDK when JAVA_HOME is set; otherwise its own lookup finds java on PATH.
  if ! mvn -B -q -Dstyle.color=never -f "$DIR/pom.xml" \
      compile dependency:copy-dependencies >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "the Maven build failed (whole log: $log)"
  fi
  [[ -n $(compgen -G "$DIR/target/lib/kafka-streams-*.jar") ]] || die "the Maven build copied no kafka-streams jar"
  printf '%s\n' "$want" >"$BUILT"
}

if [[ $# -eq 1 && $1 == build ]]; then
  build
  exit 0
fi
[[ $# -eq 7 ]] || { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 64; }
build
# shellcheck disable=SC2086 # STREAMS_DEDUP_JAVA_OPTS holds several flags
exec "$JAVA" ${STREAMS_DEDUP_JAVA_OPTS:-} \
  -Dorg.slf4j.simpleLogger.defaultLogLevel="${STREAMS_DEDUP_LOG_LEVEL:-error}" \
  -Dorg.slf4j.simpleLogger.logFile=System.err \
  -cp "$DIR/target/classes:$DIR/target/lib/*" dedupd.bench.StreamsDedup "$@"
