// Small helper for scripts/kafka/kafka.sh; compiled by it with javac against
// the Kafka jars (kafka-clients) and cached next to them.
//
//   ports N                      print N free TCP ports on 127.0.0.1 (space separated),
//                                chosen below the kernel's ephemeral range so that a
//                                restarted broker is unlikely to find them taken
//   ready BOOTSTRAP SECONDS PID  wait until the broker answers a metadata request and a
//                                probe topic can be created, written to and deleted;
//                                exit 0 when ready, 2 on timeout, 3 if PID died first
import java.io.IOException;
import java.io.InputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Properties;
import java.util.Random;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class KafkaTestHelper {
    public static void main(String[] args) throws Exception {
        if (args.length == 2 && args[0].equals("ports")) {
            System.out.println(ports(Integer.parseInt(args[1])));
        } else if (args.length == 4 && args[0].equals("ready")) {
            System.exit(ready(args[1], Long.parseLong(args[2]), Long.parseLong(args[3])));
        } else {
            System.err.println("usage: KafkaTestHelper ports N | ready BOOTSTRAP SECONDS PID");
            System.exit(64);
        }
    }

    static String ports(int n) throws IOException {
        int lo = 10000, hi = 32767;
        try {
            String[] range = readProc("/proc/sys/net/ipv4/ip_local_port_range").trim().split("\\s+");
            hi = Integer.parseInt(range[0]) - 1;
        } catch (IOException | RuntimeException e) {
            // keep the defaults
        }
        InetAddress loopback = InetAddress.getByName("127.0.0.1");
        Random rnd = new Random();
        List<Integer> picked = new ArrayList<>();
        for (int attempt = 0; picked.size() < n && attempt < 2000; attempt++) {
            int port = hi > lo + 100 ? lo + rnd.nextInt(hi - lo) : 0; // 0: let the kernel choose
            try (ServerSocket s = new ServerSocket()) {
                s.bind(new InetSocketAddress(loopback, port));
                if (!picked.contains(s.getLocalPort())) picked.add(s.getLocalPort());
            } catch (IOException inUse) {
                // try another
            }
        }
        if (picked.size() < n) throw new IOException("could not find " + n + " free ports on 127.0.0.1");
        StringBuilder out = new StringBuilder();
        for (int p : picked) out.append(out.length() == 0 ? "" : " ").append(p);
        return out.toString();
    }

    static int ready(String bootstrap, long seconds, long pid) throws InterruptedException {
        long start = System.nanoTime();
        long deadline = start + TimeUnit.SECONDS.toNanos(seconds);
        String topic = "__dedupd_ready_probe_" + UUID.randomUUID();
        Properties common = new Properties();
        common.put("bootstrap.servers", bootstrap);
        common.put("request.timeout.ms", "3000");
        common.put("socket.connection.setup.timeout.ms", "1000");
        common.put("socket.connection.setup.timeout.max.ms", "2000");
        common.put("reconnect.backoff.ms", "50");
        common.put("reconnect.backoff.max.ms", "500");
        Properties adminProps = new Properties();
        adminProps.putAll(common);
        adminProps.put("default.api.timeout.ms", "5000");
        Properties producerProps = new Properties();
        producerProps.putAll(common);
        producerProps.put("acks", "all");
        producerProps.put("max.block.ms", "5000");
        producerProps.put("delivery.timeout.ms", "10000");
        producerProps.put("retry.backoff.ms", "50");
        producerProps.put("key.serializer", ByteArraySerializer.class.getName());
        producerProps.put("value.serializer", ByteArraySerializer.class.getName());

        String step = "metadata";
        Exception last = null;
        boolean created = false;
        try (Admin admin = Admin.create(adminProps)) {
            while (System.nanoTime() < deadline) {
                if (!alive(pid)) {
                    System.err.println("kafka: broker process " + pid + " exited before it was ready");
                    return 3;
                }
                try {
                    step = "metadata";
                    Collection<Node> nodes = admin.describeCluster().nodes().get(5, TimeUnit.SECONDS);
                    if (nodes.isEmpty()) throw new IllegalStateException("no brokers in metadata yet");
                    if (!created) {
                        step = "create probe topic";
                        try {
                            admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get(5, TimeUnit.SECONDS);
                        } catch (ExecutionException e) {
                            if (!(e.getCause() instanceof TopicExistsException)) throw e;
                        }
                        created = true;
                    }
                    step = "produce to probe topic";
                    try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps)) {
                        producer.send(new ProducerRecord<>(topic, "ready".getBytes())).get(12, TimeUnit.SECONDS);
                    }
                    step = "delete probe topic";
                    admin.deleteTopics(List.of(topic)).all().get(5, TimeUnit.SECONDS);
                    created = false;
                    return 0;
                } catch (Exception e) {
                    last = e;
                    Thread.sleep(200);
                }
            }
            System.err.println("kafka: broker at " + bootstrap + " not ready after " + seconds + " s (step: "
                    + step + (last == null ? "" : ", last error: " + last) + ")");
            return 2;
        } finally {
            if (created) System.err.println("kafka: probe topic " + topic + " may be left behind");
        }
    }

    // Files.readString gives a short read on /proc/sys files (it returned "3" for
    // "32768\t60999"); reading the stream to its end does not.
    static String readProc(String path) throws IOException {
        try (InputStream in = Files.newInputStream(Path.of(path))) {
            return new String(in.readAllBytes(), StandardCharsets.US_ASCII);
        }
    }

    // A broker started by kafka.sh stays a zombie (not reaped) while kafka.sh waits on us,
    // and ProcessHandle counts zombies as alive, so look at the state in /proc first.
    static boolean alive(long pid) {
        try {
            String stat = readProc("/proc/" + pid + "/stat");
            String state = stat.substring(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
            return !state.equals("Z") && !state.equals("X");
        } catch (IOException | RuntimeException e) {
            if (Files.isDirectory(Path.of("/proc/self"))) return false;
            return ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false);
        }
    }
}
