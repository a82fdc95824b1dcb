package dedupd.bench;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Duration;
import java.util.HexFormat;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.LongAdder;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The dedup recipe a Kafka Streams user would write, as the "why not Kafka Streams?" figure
 * of benches/pipeline.rs: commands keyed by their idempotency key, a persistent RocksDB store
 * with its changelog, one result record per input (a replay of the stored result for a repeat),
 * no external effect.
 *
 * <p>Usage: {@code StreamsDedup BOOTSTRAP INPUT OUTPUT STATE_DIR GUARANTEE APP_ID TOPOLOGY},
 * GUARANTEE {@code at_least_once} or {@code exactly_once_v2}; TOPOLOGY {@code keyed} (the input is
 * keyed by the idempotency key and partitioned by it with Kafka's default partitioner, so each
 * input partition's task holds its keys: no repartition) or {@code repartition} (commands are
 * re-keyed through a repartition topic first, as when the input is keyed by anything else).
 * Runs until SIGTERM; exits 1 if Kafka Streams fails.
 */
public final class StreamsDedup {
    static final String STORE = "dedup-results";
    /** The input record's position, "topic/partition/offset", carried through the repartition. */
    static final String SOURCE_HEADER = "dedup-source";
    static final String TYPE_HEADER = "dedup-type";
    static final ObjectMapper JSON = new ObjectMapper();

    static final LongAdder FRESH = new LongAdder();
    static final LongAdder REPLAYED = new LongAdder();
    static final LongAdder CONFLICTS = new LongAdder();
    static final LongAdder INVALID = new LongAdder();

    private StreamsDedup() {}

    public static void main(String[] args) throws InterruptedException {
        if (args.length != 7) {
            System.err.println("usage: StreamsDedup BOOTSTRAP INPUT OUTPUT STATE_DIR GUARANTEE APP_ID TOPOLOGY"
                    + " (GUARANTEE: at_least_once | exactly_once_v2; TOPOLOGY: keyed | repartition)");
            System.exit(64);
        }
        String guarantee = args[4];
        if (!guarantee.equals(StreamsConfig.AT_LEAST_ONCE) && !guarantee.equals(StreamsConfig.EXACTLY_ONCE_V2)) {
            System.err.println("streams-dedup: guarantee must be at_least_once or exactly_once_v2, not " + guarantee);
            System.exit(64);
        }
        String shape = args[6];
        if (!shape.equals("keyed") && !shape.equals("repartition")) {
            System.err.println("streams-dedup: topology must be keyed or repartition, not " + shape);
            System.exit(64);
        }
        Topology topology = topology(args[1], args[2], shape.equals("repartition"));
        // Which topics it reads and writes (a repartition topic or none), for the bench's log.
        System.err.println("streams-dedup: " + topology.describe());
        KafkaStreams streams = new KafkaStreams(topology, config(args[0], args[3], guarantee, args[5]));
        run(streams, guarantee);
    }

    static Properties config(String bootstrap, String stateDir, String guarantee, String appId) {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 2);
        // The test broker is a single node: the repartition and changelog topics get one replica.
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        // A backlog that was produced before the application first started is work to do.
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        // commit.interval.ms stays at its defaults (30 s at_least_once, 100 ms exactly_once_v2):
        // results are produced as records are processed, commits only move offsets (and, for
        // exactly_once_v2, end the transaction that makes the results visible).
        return p;
    }

    static Topology topology(String input, String output, boolean repartition) {
        Serde<String> s = Serdes.String();
        StreamsBuilder b = new StreamsBuilder();
        b.addStateStore(Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(STORE), s, s));
        KStream<String, String> commands = b.stream(input, Consumed.with(s, s)).process(KeyByCommandId::new);
        if (repartition) {
            // Repeats of one command may arrive on different input partitions: they must
            // meet in the same task, so the same store.
            commands = commands.repartition(
                    Repartitioned.<String, String>as("by-command-id").withKeySerde(s).withValueSerde(s));
        }
        // A process() with a store inserts no repartition of its own: keyed input stays put.
        commands.process(Dedup::new, STORE).to(output, Produced.with(s, s));
        return b.build();
    }

    static void run(KafkaStreams streams, String guarantee) throws InterruptedException {
        CountDownLatch stopped = new CountDownLatch(1);
        AtomicBoolean signalled = new AtomicBoolean(false);
        AtomicBoolean announced = new AtomicBoolean(false);
        streams.setUncaughtExceptionHandler(e -> {
            System.err.println("streams-dedup: stream thread failed: " + e);
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.setStateListener((now, before) -> {
            // A rebalance leaves RUNNING and comes back: say it once.
            if (now == KafkaStreams.State.RUNNING && !announced.getAndSet(true)) {
                System.err.println("streams-dedup: running (" + guarantee + ")");
            }
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                stopped.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            signalled.set(true);
            streams.close(Duration.ofSeconds(20));
            System.err.printf("streams-dedup: stopped; %d fresh, %d replayed, %d conflicts, %d invalid%n",
                    FRESH.sum(), REPLAYED.sum(), CONFLICTS.sum(), INVALID.sum());
            stopped.countDown();
        }, "streams-dedup-shutdown"));
        streams.start();
        stopped.await();
        // Only a failure ends the wait without a signal; the shutdown hook handles a signal.
        if (!signalled.get()) {
            streams.close(Duration.ofSeconds(20));
            System.exit(1);
        }
    }

    /** Keys each command by its `id` and notes where it came from, for the result record. */
    static final class KeyByCommandId implements Processor<String, String, String, String> {
        private ProcessorContext<String, String> context;

        @Override
        public void init(ProcessorContext<String, String> context) {
            this.context = context;
        }

        @Override
        public void process(Record<String, String> record) {
            JsonNode command;
            try {
                command = record.value() == null ? null : JSON.readTree(record.value());
            } catch (Exception e) {
                command = null;
            }
            JsonNode id = command == null ? null : command.get("id");
            if (id == null || !id.isTextual()) {
                // A real application would dead-letter it; the bench produces none.
                INVALID.increment();
                return;
            }
            String source = context.recordMetadata()
                    .map(m -> m.topic() + "/" + m.partition() + "/" + m.offset())
                    .orElse("");
            Headers headers = new RecordHeaders(record.headers().toArray());
            headers.add(SOURCE_HEADER, source.getBytes(StandardCharsets.UTF_8));
            JsonNode type = command.get("type");
            if (type != null && type.isTextual()) {
                headers.add(TYPE_HEADER, type.asText().getBytes(StandardCharsets.UTF_8));
            }
            context.forward(new Record<>(id.asText(), record.value(), record.timestamp(), headers));
        }
    }

    /**
     * The store holds each command id's result. A first sighting stores and forwards a fresh
     * result; a repeat with the same fingerprint forwards the stored one (a replay); a repeat
     * with another payload forwards a conflict and leaves the store alone.
     */
    static final class Dedup implements Processor<String, String, String, String> {
        private ProcessorContext<String, String> context;
        private KeyValueStore<String, String> store;
        private MessageDigest sha256;

        @Override
        public void init(ProcessorContext<String, String> context) {
            this.context = context;
            this.store = context.getStateStore(STORE);
            try {
                this.sha256 = MessageDigest.getInstance("SHA-256");
            } catch (NoSuchAlgorithmException e) {
                throw new IllegalStateException("SHA-256 is part of every Java runtime", e);
            }
        }

        @Override
        public void process(Record<String, String> record) {
            String id = record.key();
            String fingerprint = "sha256:" + HexFormat.of().formatHex(
                    sha256.digest(record.value().getBytes(StandardCharsets.UTF_8)));
            long now = System.currentTimeMillis();
            ObjectNode result = JSON.createObjectNode();
            result.put("key", id);
            result.put("type", header(record.headers(), TYPE_HEADER));
            String stored = store.get(id);
            if (stored == null) {
                ObjectNode fresh = JSON.createObjectNode();
                fresh.put("fingerprint", fingerprint);
                fresh.put("first_seen_at_ms", now);
                fresh.putObject("result");
                store.put(id, fresh.toString());
                FRESH.increment();
                result.put("outcome", "succeeded").put("replay", false);
                result.setAll(fresh);
            } else {
                JsonNode first = readStored(stored);
                if (fingerprint.equals(first.path("fingerprint").asText())) {
                    REPLAYED.increment();
                    result.put("outcome", "duplicate").put("replay", true);
                    result.setAll((ObjectNode) first);
                } else {
                    CONFLICTS.increment();
                    result.put("outcome", "conflict").put("replay", false);
                    result.put("error", "another payload was seen first under this key");
                    result.setAll((ObjectNode) first);
                    result.put("fingerprint", fingerprint);
                }
            }
            result.set("source", source(header(record.headers(), SOURCE_HEADER)));
            // The bench measures throughput from result timestamps; Kafka Streams would
            // otherwise copy the input's.
            context.forward(record.withValue(result.toString()).withHeaders(new RecordHeaders()).withTimestamp(now));
        }

        private static JsonNode readStored(String stored) {
            try {
                return JSON.readTree(stored);
            } catch (Exception e) {
                throw new IllegalStateException("unreadable stored result: " + stored, e);
            }
        }

        private static String header(Headers headers, String name) {
            Header h = headers.lastHeader(name);
            return h == null ? null : new String(h.value(), StandardCharsets.UTF_8);
        }

        private static ObjectNode source(String position) {
            ObjectNode s = JSON.createObjectNode();
            String[] parts = position == null ? new String[0] : position.split("/");
            if (parts.length == 3) {
                s.put("topic", parts[0]);
                s.put("partition", Integer.parseInt(parts[1]));
                s.put("offset", Long.parseLong(parts[2]));
            }
            return s;
        }
    }
}
