#!/usr/bin/env bash
# Runs a real Apache Kafka 4.x broker (single combined broker+controller KRaft node)
# on 127.0.0.1 for tests. Jars come from Maven Central through `mvn`; no Docker.
#
# Usage:
#   kafka.sh fetch                      resolve the Kafka jars into the cache (no-op when present)
#   kafka.sh start DIR                  start a broker with its state in DIR; prints the
#                                       bootstrap address on stdout once it is ready
#   kafka.sh stop DIR                   stop it (TERM, then KILL) and delete DIR/data
#   kafka.sh restart-broker DIR [--kill]
#                                       stop the broker process (keeping its data; --kill
#                                       sends KILL instead of a clean shutdown) and start it
#                                       again on the same ports, waiting until it is ready
#   kafka.sh with CMD [ARGS...]         start a broker in a fresh temp dir, run CMD with
#                                       DEDUPD_TEST_KAFKA_BOOTSTRAP, DEDUPD_TEST_KAFKA_DIR and
#                                       DEDUPD_TEST_KAFKA_SCRIPT exported, stop the broker on
#                                       any exit, and exit with CMD's status
#   kafka.sh classpath                  print the classpath (for running Kafka's tools by hand)
#
# Environment:
#   DEDUPD_KAFKA_VERSION        Kafka version (default 4.3.1; 4.0.0 and 4.4.0 also work)
#   DEDUPD_KAFKA_HOME           cache root (default $HOME/.cache/dedupd-kafka);
#                               jars go to $DEDUPD_KAFKA_HOME/<version>/libs
#   DEDUPD_KAFKA_READY_TIMEOUT  seconds to wait for readiness (default 120)
#   DEDUPD_KAFKA_HEAP           broker heap flags (default "-Xms256m -Xmx1g")
#   DEDUPD_KAFKA_JVM_OPTS       extra broker JVM flags
#   DEDUPD_KAFKA_BROKER_PROPS   extra server.properties lines, appended (later keys win)
#   DEDUPD_KAFKA_EXTRA_LISTENERS
#                               extra broker listeners as NAME:PROTOCOL words, e.g.
#                               "SECURE:SASL_SSL MTLS:SSL"; each gets its own free port on
#                               127.0.0.1 and a line "NAME 127.0.0.1:PORT" in DIR/listeners.
#                               PLAINTEXT stays the inter-broker listener and is probed
#   DEDUPD_KAFKA_FORMAT_ARGS    extra arguments to `kafka-storage format`, split on
#                               whitespace, e.g. "--add-scram SCRAM-SHA-512=[name=u,password=p]"
#   JAVA_HOME                   Java 17+ to use (default: java on PATH)
set -euo pipefail

readonly DEFAULT_KAFKA_VERSION=4.3.1 # keep the header comment and pom.xml in step
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPT_PATH=$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")
readonly SCRIPT_DIR SCRIPT_PATH
readonly KAFKA_VERSION=${DEDUPD_KAFKA_VERSION:-$DEFAULT_KAFKA_VERSION}
readonly CACHE_DIR=${DEDUPD_KAFKA_HOME:-${HOME:?HOME is not set}/.cache/dedupd-kafka}/$KAFKA_VERSION
readonly LIBS=$CACHE_DIR/libs
readonly HELPER_DIR=$CACHE_DIR/helper
readonly READY_TIMEOUT=${DEDUPD_KAFKA_READY_TIMEOUT:-120}
readonly STOP_TIMEOUT=30
if [[ -n ${JAVA_HOME:-} ]]; then JAVA=$JAVA_HOME/bin/java; JAVAC=$JAVA_HOME/bin/javac; else JAVA=java; JAVAC=javac; fi

log() { printf 'kafka: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$SCRIPT_PATH" | sed '$d; s/^# \{0,1\}//' >&2; exit "${1:-64}"; }
now_ms() { date +%s%3N; }

check_java() {
  command -v "$JAVA" >/dev/null 2>&1 || die "java not found (set JAVA_HOME or put Java 17+ on PATH)"
  local v major
  v=$("$JAVA" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n1)
  major=${v%%.*}
  [[ $major =~ ^[0-9]+$ && $major -ge 17 ]] || die "Kafka $KAFKA_VERSION needs Java 17+, $JAVA is '${v:-unknown}'"
}

sha_of() { cat "$@" | sha256sum | cut -c1-16; }

# Copy the runtime jars of scripts/kafka/pom.xml into $LIBS, once per (version, pom).
fetch() {
  local want stamp tmp mvnlog t0
  want="$KAFKA_VERSION $(sha_of "$SCRIPT_DIR/pom.xml")"
  stamp=$LIBS/.fetched
  if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found; it is needed to fetch Kafka from Maven Central"
  t0=$(now_ms)
  log "fetching Kafka $KAFKA_VERSION jars with Maven into $LIBS"
  mkdir -p "$CACHE_DIR"
  # Leftovers of an interrupted fetch or helper build.
  find "$CACHE_DIR" -maxdepth 1 -name '*.tmp.*' -mmin +60 -exec rm -rf {} + 2>/dev/null || true
  tmp=$(mktemp -d "$CACHE_DIR/libs.tmp.XXXXXX")
  mvnlog=$tmp.mvn.log
  if ! mvn -B -q -Dstyle.color=never -f "$SCRIPT_DIR/pom.xml" -Dkafka.version="$KAFKA_VERSION" \
      dependency:copy-dependencies -DoutputDirectory="$tmp" -DincludeScope=runtime >"$mvnlog" 2>&1; then
    tail -n 40 "$mvnlog" >&2
    rm -rf "$tmp" "$mvnlog"
    die "mvn could not resolve Kafka $KAFKA_VERSION"
  fi
  rm -f "$mvnlog"
  [[ -n $(compgen -G "$tmp/kafka_2.13-*.jar") ]] || { rm -rf "$tmp"; die "mvn copied no kafka_2.13 jar"; }
  printf '%s\n' "$want" >"$tmp/.fetched"
  rm -rf "$LIBS"
  mv "$tmp" "$LIBS" 2>/dev/null || { rm -rf "$tmp"; [[ -f $stamp ]] || die "could not move jars into $LIBS"; }
  log "fetched $(find "$LIBS" -name '*.jar' | wc -l) jars in $(( ($(now_ms) - t0) / 1000 )) s"
}

# Compile KafkaTestHelper.java against the jars, once per (version, source).
build_helper() {
  local src=$SCRIPT_DIR/KafkaTestHelper.java want tmp
  want=$(sha_of "$src")
  if [[ -f $HELPER_DIR/.built && $(cat "$HELPER_DIR/.built") == "$want" ]]; then
    return 0
  fi
  command -v "$JAVAC" >/dev/null 2>&1 || die "javac not found (a JDK 17+ is needed, not just a JRE)"
  tmp=$(mktemp -d "$CACHE_DIR/helper.tmp.XXXXXX")
  "$JAVAC" -nowarn -d "$tmp" -cp "$LIBS/*" "$src" >&2 || { rm -rf "$tmp"; die "could not compile $src"; }
  printf '%s\n' "$want" >"$tmp/.built"
  rm -rf "$HELPER_DIR"
  mv "$tmp" "$HELPER_DIR" 2>/dev/null || rm -rf "$tmp"
}

prepare() { check_java; fetch; build_helper; }

helper() {
  "$JAVA" -XX:TieredStopAtLevel=1 -Xmx256m \
    -Dlog4j2.configurationFile="$TOOLS_LOG4J" -cp "$HELPER_DIR:$LIBS/*" KafkaTestHelper "$@"
}

# A Kafka Uuid as `kafka-storage random-uuid` prints it (16 random bytes, URL-safe
# base64 without padding, never starting with '-'), without starting a JVM.
random_uuid() {
  local id
  while :; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | cut -c1-22)
    [[ $id != -* ]] && break
  done
  printf '%s\n' "$id"
}

abs_dir() { mkdir -p "$1" && (cd "$1" && pwd); }

# Set DIR-derived paths (DIR must exist).
set_paths() {
  DIR=$1
  PIDFILE=$DIR/kafka.pid
  PROPS=$DIR/server.properties
  LOG4J=$DIR/log4j2.properties
  TOOLS_LOG4J=$DIR/tools-log4j2.properties
  BROKER_LOG=$DIR/broker.log
  BROKER_OUT=$DIR/broker.out
  DATA=$DIR/data
}

write_log4j() { # FILE LOGFILE LEVEL
  cat >"$1" <<EOF
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $2
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = $3
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
EOF
}

# Check DEDUPD_KAFKA_EXTRA_LISTENERS and set EXTRA_NAMES and EXTRA_PROTOCOLS from it.
parse_extra_listeners() {
  local word name proto
  EXTRA_NAMES=(); EXTRA_PROTOCOLS=()
  for word in ${DEDUPD_KAFKA_EXTRA_LISTENERS:-}; do
    name=${word%%:*}; proto=${word#*:}
    [[ $word == *:* && $name =~ ^[A-Z][A-Z0-9_]*$ ]] \
      || die "DEDUPD_KAFKA_EXTRA_LISTENERS: '$word' is not NAME:PROTOCOL with an upper-case NAME"
    [[ $proto =~ ^(PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL)$ ]] \
      || die "DEDUPD_KAFKA_EXTRA_LISTENERS: '$proto' is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
    [[ $name != PLAINTEXT && $name != CONTROLLER && " ${EXTRA_NAMES[*]} " != *" $name "* ]] \
      || die "DEDUPD_KAFKA_EXTRA_LISTENERS: listener name '$name' is reserved or repeated"
    EXTRA_NAMES+=("$name"); EXTRA_PROTOCOLS+=("$proto")
  done
}

write_config() { # PORT CPORT [EXTRA_PORT...], one extra port per EXTRA_NAMES entry
  local port=$1 cport=$2 listeners protocol_map i
  shift 2
  listeners="PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport"
  protocol_map="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
  printf 'PLAINTEXT 127.0.0.1:%s\n' "$port" >"$DIR/listeners"
  for i in "${!EXTRA_NAMES[@]}"; do
    listeners+=",${EXTRA_NAMES[$i]}://127.0.0.1:$1"
    protocol_map+=",${EXTRA_NAMES[$i]}:${EXTRA_PROTOCOLS[$i]}"
    printf '%s 127.0.0.1:%s\n' "${EXTRA_NAMES[$i]}" "$1" >>"$DIR/listeners"
    shift
  done
  cat >"$PROPS" <<EOF
# Written by scripts/kafka/kafka.sh: single combined broker+controller for tests.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=$listeners
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protocol_map
log.dirs=$DATA
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
# After a KILL the restarted broker cannot register until the old registration's
# session expires (default 9 s); keep it short but clear of scheduling hiccups.
broker.session.timeout.ms=4000
broker.heartbeat.interval.ms=500
EOF
  if [[ -n ${DEDUPD_KAFKA_BROKER_PROPS:-} ]]; then
    printf '# From DEDUPD_KAFKA_BROKER_PROPS:\n%s\n' "$DEDUPD_KAFKA_BROKER_PROPS" >>"$PROPS"
  fi
  printf '127.0.0.1:%s\n' "$port" >"$DIR/bootstrap"
}

# Is PID our broker (running kafka.Kafka with this DIR's config) and not a zombie?
is_our_broker() {
  local pid=$1 state
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  state=$(sed 's/.*) \(.\).*/\1/' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $state != Z && $state != X ]] || return 1
  grep -qxF -- "$PROPS" < <(tr '\0' '\n' <"/proc/$pid/cmdline")
}

running_pid() { # prints the broker PID if it is running
  local pid
  [[ -f $PIDFILE ]] || return 1
  pid=$(<"$PIDFILE")
  is_our_broker "$pid" && printf '%s\n' "$pid"
}

launch() {
  local pid
  : >"$BROKER_OUT"
  # shellcheck disable=SC2086 # DEDUPD_KAFKA_HEAP holds several flags
  nohup "$JAVA" ${DEDUPD_KAFKA_HEAP:--Xms256m -Xmx1g} -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    ${DEDUPD_KAFKA_JVM_OPTS:-} -Djava.awt.headless=true -Dlog4j2.configurationFile="$LOG4J" \
    -cp "$LIBS/*" kafka.Kafka "$PROPS" </dev/null >>"$BROKER_OUT" 2>&1 &
  pid=$!
  disown "$pid" 2>/dev/null || true # no "Killed" job notice when it is stopped later
  LAUNCH_T0=$(now_ms)
  printf '%s\n' "$pid" >"$PIDFILE"
  BROKER_PID=$pid
}

# Wait for readiness. Returns 0 ready, 2 timeout, 3 broker died.
wait_ready() {
  local boot rc=0
  boot=$(<"$DIR/bootstrap")
  helper ready "$boot" "$READY_TIMEOUT" "$BROKER_PID" || rc=$?
  if [[ $rc -eq 0 ]]; then
    log "broker ready at $boot (pid $BROKER_PID, $(( $(now_ms) - LAUNCH_T0 )) ms after launch)"
  fi
  return "$rc"
}

show_logs() {
  if [[ -s $BROKER_OUT ]]; then
    log "---- tail of $BROKER_OUT ----"; tail -n 20 "$BROKER_OUT" >&2
  fi
  if [[ -s $BROKER_LOG ]]; then
    log "---- tail of $BROKER_LOG ----"; tail -n 60 "$BROKER_LOG" >&2
  fi
}

kill_broker() { # [--kill]: skip the clean shutdown
  local pid deadline
  pid=$(running_pid) || { rm -f "$PIDFILE"; return 0; }
  if [[ ${1:-} != --kill ]]; then
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$(( $(date +%s) + STOP_TIMEOUT ))
    while is_our_broker "$pid" && (( $(date +%s) < deadline )); do sleep 0.1; done
    if is_our_broker "$pid"; then log "broker pid $pid still running after ${STOP_TIMEOUT} s; sending KILL"; fi
  fi
  if is_our_broker "$pid"; then
    kill -KILL "$pid" 2>/dev/null || true
    deadline=$(( $(date +%s) + 10 ))
    while is_our_broker "$pid" && (( $(date +%s) < deadline )); do sleep 0.1; done
  fi
  is_our_broker "$pid" && die "could not stop broker pid $pid"
  rm -f "$PIDFILE"
}

# Launch the broker for the already written config and wait; on failure kill it and
# return the wait_ready status.
launch_and_wait() {
  local rc=0 saved_traps
  saved_traps=$(trap -p INT TERM)
  launch
  # If we are interrupted while waiting, do not leave the broker behind.
  trap 'kill_broker --kill; exit 130' INT
  trap 'kill_broker --kill; exit 143' TERM
  wait_ready || rc=$?
  trap - INT TERM
  eval "$saved_traps"
  if [[ $rc -ne 0 ]]; then
    kill_broker --kill
  fi
  return "$rc"
}

cmd_start() {
  [[ $# -eq 1 ]] || usage
  local d ports port cport cluster_id attempt rc extra_ports format_args
  d=$(abs_dir "$1")
  set_paths "$d"
  if pid=$(running_pid); then die "a broker is already running for $DIR (pid $pid)"; fi
  parse_extra_listeners
  read -ra format_args <<<"${DEDUPD_KAFKA_FORMAT_ARGS:-}"
  prepare
  write_log4j "$LOG4J" "$BROKER_LOG" INFO
  write_log4j "$TOOLS_LOG4J" "$DIR/tools.log" WARN
  : >"$BROKER_LOG"; : >"$DIR/tools.log"
  for attempt in 1 2 3; do
    rm -rf "$DATA"; mkdir -p "$DATA"
    ports=$(helper ports $(( 2 + ${#EXTRA_NAMES[@]} ))) || die "could not pick free ports"
    read -r port cport extra_ports <<<"$ports"
    # shellcheck disable=SC2086 # one word per extra listener's port
    write_config "$port" "$cport" $extra_ports
    cluster_id=$(random_uuid)
    if ! "$JAVA" -cp "$LIBS/*" -Dlog4j2.configurationFile="$TOOLS_LOG4J" kafka.tools.StorageTool \
        format -t "$cluster_id" -c "$PROPS" ${format_args[@]+"${format_args[@]}"} >"$DIR/format.out" 2>&1; then
      cat "$DIR/format.out" >&2
      die "formatting storage in $DATA failed"
    fi
    log "starting Kafka $KAFKA_VERSION in $DIR (broker 127.0.0.1:$port, controller 127.0.0.1:$cport${extra_ports:+, extra listeners on $extra_ports})"
    rc=0
    launch_and_wait || rc=$?
    if [[ $rc -eq 0 ]]; then
      cat "$DIR/bootstrap"
      return 0
    fi
    # Someone else took a port between picking and binding: pick new ones.
    if [[ $rc -eq 3 ]] && grep -q 'Address already in use\|BindException' "$BROKER_LOG" "$BROKER_OUT" 2>/dev/null; then
      log "a port was taken meanwhile; retrying with new ports (attempt $attempt)"
      continue
    fi
    break
  done
  show_logs
  die "broker in $DIR did not become ready"
}

cmd_stop() {
  [[ $# -eq 1 ]] || usage
  [[ -d $1 ]] || die "no such directory: $1"
  set_paths "$(cd "$1" && pwd)"
  local pid
  if pid=$(running_pid); then
    log "stopping broker pid $pid"
  fi
  kill_broker
  rm -rf "$DATA"
}

cmd_restart_broker() {
  [[ $# -ge 1 && $# -le 2 ]] || usage
  [[ $# -eq 1 || $2 == --kill ]] || usage
  [[ -d $1 ]] || die "no such directory: $1"
  set_paths "$(cd "$1" && pwd)"
  [[ -f $PROPS && -d $DATA ]] || die "$DIR holds no broker started by '$0 start'"
  prepare
  local pid rc=0
  if pid=$(running_pid); then
    log "stopping broker pid $pid${2:+ with KILL} (keeping data)"
  fi
  kill_broker "${2:-}"
  log "restarting broker in $DIR on $(<"$DIR/bootstrap")"
  launch_and_wait || rc=$?
  if [[ $rc -ne 0 ]]; then
    show_logs
    die "restarted broker in $DIR did not become ready"
  fi
}

cmd_with() {
  [[ $# -ge 1 ]] || usage
  local dir rc=0
  dir=$(mktemp -d "${TMPDIR:-/tmp}/dedupd-kafka.XXXXXX")
  WITH_DIR=$dir
  trap with_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  cmd_start "$dir" >/dev/null
  export DEDUPD_TEST_KAFKA_BOOTSTRAP DEDUPD_TEST_KAFKA_DIR=$dir DEDUPD_TEST_KAFKA_SCRIPT=$SCRIPT_PATH
  DEDUPD_TEST_KAFKA_BOOTSTRAP=$(<"$dir/bootstrap")
  "$@" || rc=$?
  WITH_RC=$rc
  exit "$rc"
}

with_cleanup() {
  local rc=$? dir=$WITH_DIR
  trap - EXIT INT TERM
  set +e
  (cmd_stop "$dir")
  if [[ ${WITH_RC:-$rc} -eq 0 ]]; then
    rm -rf "$dir"
  else
    log "kept broker logs in $dir (exit status ${WITH_RC:-$rc})"
  fi
  exit "$rc"
}

cmd_classpath() { prepare; printf '%s\n' "$LIBS/*"; }

main() {
  [[ $# -ge 1 ]] || usage
  local cmd=$1; shift
  case $cmd in
    fetch) [[ $# -eq 0 ]] || usage; check_java; fetch ;;
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    restart-broker) cmd_restart_broker "$@" ;;
    with) cmd_with "$@" ;;
    classpath) [[ $# -eq 0 ]] || usage; cmd_classpath ;;
    -h|--help|help) usage 0 ;;
    *) log "unknown command: $cmd"; usage ;;
  esac
}

main "$@"
