#!/usr/bin/env bash
# End-to-end check of scripts/kafka/kafka.sh with Kafka's own console tools:
# start a broker (via `kafka.sh with`), create a topic, produce and consume two
# records with a consumer group, restart the broker (clean, then with KILL) and
# check that records and committed offsets survived, then stop.
#   scripts/kafka/smoke-test.sh
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KAFKA_SH=$SCRIPT_DIR/kafka.sh

if [[ -z ${DEDUPD_TEST_KAFKA_BOOTSTRAP:-} ]]; then
  exec "$KAFKA_SH" with "${BASH_SOURCE[0]}"
fi

B=$DEDUPD_TEST_KAFKA_BOOTSTRAP
D=$DEDUPD_TEST_KAFKA_DIR
CP=$("$KAFKA_SH" classpath)
passed=0 failed=0

tool() { java -Dlog4j2.configurationFile="$D/tools-log4j2.properties" -cp "$CP" "$@"; }
consume() { # GROUP -> prints key<TAB>value lines
  tool org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$B" --topic smoke \
    --group "$1" --from-beginning --max-messages 2 --timeout-ms 30000 \
    --property print.key=true 2>/dev/null | grep $'\t' | sort
}
lag_of_g1() { # total committed offset of group g1 on topic smoke
  tool org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$B" \
    --describe --group g1 2>/dev/null | awk '$1 == "g1" && $2 == "smoke" { s += $4 } END { print s + 0 }'
}
check() { # NAME EXPECTED ACTUAL
  if [[ $2 == "$3" ]]; then
    passed=$((passed + 1)); echo "ok: $1"
  else
    failed=$((failed + 1)); printf 'FAILED: %s\n  expected: %q\n  actual:   %q\n' "$1" "$2" "$3"
  fi
}

expected=$'k1\thello\nk2\tworld'
tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$B" --create --topic smoke \
  --partitions 2 --replication-factor 1 >/dev/null
# --property works on every 4.x (newer ones also name it --reader-/--formatter-property
# and warn about the old name, on stdout for the consumer: hence the grep above).
printf 'k1:hello\nk2:world\n' | tool org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$B" \
  --topic smoke --property parse.key=true --property key.separator=: >"$D/producer.err" 2>&1 ||
  { cat "$D/producer.err" >&2; exit 1; }
check "consume after produce" "$expected" "$(consume g1)"
check "g1 committed offsets" 2 "$(lag_of_g1)"

"$KAFKA_SH" restart-broker "$D"
check "same bootstrap after restart" "$B" "$(<"$D/bootstrap")"
check "records kept after clean restart" "$expected" "$(consume g2)"
check "g1 offsets kept after clean restart" 2 "$(lag_of_g1)"

"$KAFKA_SH" restart-broker "$D" --kill
check "records kept after KILL restart" "$expected" "$(consume g3)"
check "g1 offsets kept after KILL restart" 2 "$(lag_of_g1)"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
