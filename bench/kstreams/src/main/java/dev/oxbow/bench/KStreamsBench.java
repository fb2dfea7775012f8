package dev.oxbow.bench;

import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The Kafka Streams peer of the Oxbow benchmark. One process runs one workload with the same
 * semantics as the Oxbow pipeline the driver (worker/examples/compare) runs on the same topics:
 *
 * <ul>
 *   <li>{@code w1}: JSON payments keyed by user; 10-minute tumbling windows (no grace, like
 *       Oxbow's default), count + sum of {@code amount} per user and window, every update
 *       emitted as {@code {"key","windowStart","windowEnd","count","total"}} keyed by the user
 *       (Oxbow's {@code emit: onUpdate}).
 *   <li>{@code w2}: examples/dedupe.yaml: dedupe on {@code value.txId} within 24 h of event
 *       time, then map to {@code {"txId","account","cents": int(amount * 100.0)}}; records that
 *       cannot be read, or fail the map, go to the dead-letter topic with their original bytes,
 *       without marking the id as seen.
 *   <li>{@code w3}: an unwindowed count + sum per key (a changelog with one record per key),
 *       used to time restores.
 *   <li>{@code w5}: payments keyed by payment id, re-keyed by {@code txId} and repartitioned
 *       ({@code <app>-seen-repartition}), deduped within 24 h, grouped by {@code user}
 *       ({@code <app>-per-user-repartition}) into 10-minute windows with 24 h grace (count +
 *       sum, every update), each update left-joined with the user's row of the {@code table}
 *       topic as a GlobalKTable: {@code {"value": <the aggregate as in w1>, "other": <the row
 *       or null>}}, keyed by the user. The same topology as Oxbow's (two repartitions, a global
 *       table loaded whole before processing).
 * </ul>
 *
 * <p>Arguments are {@code key=value}; {@code prop.<name>=<value>} passes any Streams, consumer
 * or producer property. Everything the driver needs is printed on stdout as one JSON object a
 * line, each with {@code t} (epoch ms): {@code state}, {@code restore_start}, {@code
 * restore_end}, {@code progress} (records seen by the first processor, once a second) and
 * {@code closed}.
 *
 * <p>With {@code queryPort=<port>} a key-value store (W3's {@code per-key}) can be read back
 * on 127.0.0.1 through interactive queries, so the driver can check what a restore rebuilt
 * (see {@link #serveQueries}).
 */
public final class KStreamsBench {
  static final ObjectMapper MAPPER = new ObjectMapper();
  static final AtomicLong PROCESSED = new AtomicLong();

  private KStreamsBench() {}

  static synchronized void emit(String event, Map<String, Object> fields) {
    StringBuilder b = new StringBuilder(128);
    b.append("{\"t\":").append(System.currentTimeMillis()).append(",\"event\":\"").append(event);
    b.append('"');
    for (Map.Entry<String, Object> e : fields.entrySet()) {
      b.append(",\"").append(e.getKey()).append("\":");
      Object v = e.getValue();
      if (v instanceof Number || v instanceof Boolean) {
        b.append(v);
      } else {
        b.append('"').append(String.valueOf(v).replace("\\", "\\\\").replace("\"", "\\\""));
        b.append('"');
      }
    }
    b.append('}');
    System.out.println(b);
    System.out.flush();
  }

  static Map<String, Object> fields(Object... kv) {
    Map<String, Object> m = new LinkedHashMap<>();
    for (int i = 0; i + 1 < kv.length; i += 2) {
      m.put((String) kv[i], kv[i + 1]);
    }
    return m;
  }

  /** The fields of a W1/W3 input record the pipelines read. */
  @JsonIgnoreProperties(ignoreUnknown = true)
  public static final class Payment {
    public String user;
    public long amount;
  }

  /** Count and sum: 16 bytes in the store and its changelog. */
  public static final class Agg {
    final long count;
    final long total;

    Agg(long count, long total) {
      this.count = count;
      this.total = total;
    }

    Agg add(long amount) {
      return new Agg(count + 1, total + amount);
    }
  }

  /** Count and sum as two big-endian longs. */
  static Serde<Agg> aggSerde() {
    Serializer<Agg> ser =
        (topic, a) ->
            a == null ? null : ByteBuffer.allocate(16).putLong(a.count).putLong(a.total).array();
    Deserializer<Agg> de =
        (topic, b) -> {
          if (b == null) {
            return null;
          }
          ByteBuffer buf = ByteBuffer.wrap(b);
          return new Agg(buf.getLong(), buf.getLong());
        };
    return Serdes.serdeFrom(ser, de);
  }

  static long amount(byte[] value) {
    PROCESSED.incrementAndGet();
    try {
      return MAPPER.readValue(value, Payment.class).amount;
    } catch (java.io.IOException e) {
      throw new IllegalArgumentException("unreadable payment: " + e.getMessage(), e);
    }
  }

  static Topology w1(Map<String, String> a) {
    StreamsBuilder b = new StreamsBuilder();
    long size = Duration.ofMinutes(Long.parseLong(a.getOrDefault("windowMinutes", "10"))).toMillis();
    b.stream(java.util.Arrays.asList(a.get("input").split(",")), Consumed.with(Serdes.String(), Serdes.ByteArray()))
        .mapValues(KStreamsBench::amount)
        .groupByKey(Grouped.with(Serdes.String(), Serdes.Long()))
        .windowedBy(TimeWindows.ofSizeWithNoGrace(Duration.ofMillis(size)))
        .aggregate(
            () -> new Agg(0, 0),
            (k, amount, agg) -> agg.add(amount),
            Materialized.<String, Agg, WindowStore<Bytes, byte[]>>as("per-user")
                .withKeySerde(Serdes.String())
                .withValueSerde(aggSerde()))
        .toStream()
        .map((w, agg) -> KeyValue.pair(w.key(), windowJson(w, agg)))
        .to(a.get("output"), Produced.with(Serdes.String(), Serdes.String()));
    return b.build();
  }

  static Topology w3(Map<String, String> a) {
    StreamsBuilder b = new StreamsBuilder();
    b.stream(java.util.Arrays.asList(a.get("input").split(",")), Consumed.with(Serdes.String(), Serdes.ByteArray()))
        .mapValues(KStreamsBench::amount)
        .groupByKey(Grouped.with(Serdes.String(), Serdes.Long()))
        .aggregate(
            () -> new Agg(0, 0),
            (k, amount, agg) -> agg.add(amount),
            Materialized.<String, Agg, KeyValueStore<Bytes, byte[]>>as("per-key")
                .withKeySerde(Serdes.String())
                .withValueSerde(aggSerde()))
        .toStream()
        .map(
            (k, agg) ->
                KeyValue.pair(
                    k,
                    "{\"key\":"
                        + quote(k)
                        + ",\"count\":"
                        + agg.count
                        + ",\"total\":"
                        + agg.total
                        + "}"))
        .to(a.get("output"), Produced.with(Serdes.String(), Serdes.String()));
    return b.build();
  }

  /** The fields of a W5 payment the pipeline reads. */
  @JsonIgnoreProperties(ignoreUnknown = true)
  public static final class Payment5 {
    public String txId;
    public String user;
    public long amount;
  }

  static Payment5 payment5(byte[] value) {
    try {
      return MAPPER.readValue(value, Payment5.class);
    } catch (java.io.IOException e) {
      throw new IllegalArgumentException("unreadable payment: " + e.getMessage(), e);
    }
  }

  /** W5's dedupe: the first payment of a txId within {@code within} of event time passes. */
  static final class Dedupe5 implements Processor<String, byte[], String, byte[]> {
    private final long within;
    private ProcessorContext<String, byte[]> ctx;
    private KeyValueStore<String, Long> seen;

    Dedupe5(long within) {
      this.within = within;
    }

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
      this.ctx = context;
      this.seen = context.getStateStore("seen");
    }

    @Override
    public void process(Record<String, byte[]> r) {
      Long first = seen.get(r.key());
      if (first != null && Math.abs(r.timestamp() - first) <= within) {
        return;
      }
      seen.put(r.key(), r.timestamp());
      ctx.forward(r);
    }
  }

  static Topology w5(Map<String, String> a) {
    StreamsBuilder b = new StreamsBuilder();
    long within = Duration.ofHours(24).toMillis();
    b.addStateStore(
        Stores.keyValueStoreBuilder(
            Stores.persistentKeyValueStore("seen"), Serdes.String(), Serdes.Long()));
    org.apache.kafka.streams.kstream.GlobalKTable<String, String> users =
        b.globalTable(
            a.get("table"),
            Consumed.with(Serdes.String(), Serdes.String()),
            Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("users")
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.String()));
    b.stream(
            java.util.Arrays.asList(a.get("input").split(",")),
            Consumed.with(Serdes.String(), Serdes.ByteArray()))
        .selectKey(
            (k, v) -> {
              PROCESSED.incrementAndGet();
              return payment5(v).txId;
            })
        .repartition(
            org.apache.kafka.streams.kstream.Repartitioned.<String, byte[]>as("seen")
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.ByteArray()))
        .process(() -> new Dedupe5(within), "seen")
        .groupBy(
            (k, v) -> payment5(v).user, Grouped.with("per-user", Serdes.String(), Serdes.ByteArray()))
        .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMinutes(10), Duration.ofHours(24)))
        .aggregate(
            () -> new Agg(0, 0),
            (k, v, agg) -> agg.add(payment5(v).amount),
            Materialized.<String, Agg, WindowStore<Bytes, byte[]>>as("per-user")
                .withKeySerde(Serdes.String())
                .withValueSerde(aggSerde()))
        .toStream()
        .leftJoin(
            users,
            (w, agg) -> w.key(),
            (w, agg, row) ->
                "{\"value\":"
                    + windowJson(w, agg)
                    + ",\"other\":"
                    + (row == null ? "null" : row)
                    + "}")
        .map((w, v) -> KeyValue.pair(w.key(), v))
        .to(a.get("output"), Produced.with(Serdes.String(), Serdes.String()));
    return b.build();
  }

  /** A window's aggregate as Oxbow's aggregate step emits it. */
  static String windowJson(org.apache.kafka.streams.kstream.Windowed<String> w, Agg agg) {
    return "{\"key\":"
        + quote(w.key())
        + ",\"windowStart\":"
        + w.window().start()
        + ",\"windowEnd\":"
        + w.window().end()
        + ",\"count\":"
        + agg.count
        + ",\"total\":"
        + agg.total
        + "}";
  }

  static String quote(String s) {
    try {
      return MAPPER.writeValueAsString(s);
    } catch (java.io.IOException e) {
      throw new IllegalStateException(e);
    }
  }

  /** examples/dedupe.yaml: dedupe (store seen-tx, id value.txId, within 24h), map, sink. */
  static final class DedupeMap implements Processor<String, byte[], String, Object> {
    private final long within;
    private ProcessorContext<String, Object> ctx;
    private KeyValueStore<String, Long> seen;

    DedupeMap(long within) {
      this.within = within;
    }

    @Override
    public void init(ProcessorContext<String, Object> context) {
      this.ctx = context;
      this.seen = context.getStateStore("seen-tx");
    }

    private void deadLetter(Record<String, byte[]> r) {
      ctx.forward(r.withValue((Object) r.value()), "dlq");
    }

    @Override
    public void process(Record<String, byte[]> r) {
      PROCESSED.incrementAndGet();
      JsonNode v;
      try {
        v = r.value() == null ? null : MAPPER.readTree(r.value());
      } catch (java.io.IOException e) {
        deadLetter(r);
        return;
      }
      // CEL's key(): a string, an integer or a bool; anything else is an error.
      JsonNode idNode = v == null ? null : v.get("txId");
      if (idNode == null
          || !(idNode.isTextual() || idNode.isIntegralNumber() || idNode.isBoolean())) {
        deadLetter(r);
        return;
      }
      String id = idNode.asText();
      Long first = seen.get(id);
      if (first != null && Math.abs(r.timestamp() - first) <= within) {
        return; // a duplicate: dropped, like Oxbow's dedupe step
      }
      // map: '{"txId": value.txId, "account": value.account, "cents": int(value.amount * 100.0)}'
      // CEL has no int * double overload: an integer amount is an error, as is a missing field.
      JsonNode account = v.get("account");
      JsonNode amount = v.get("amount");
      if (account == null || amount == null || !amount.isFloatingPointNumber()) {
        deadLetter(r); // the dedupe mark is not kept when a later step fails
        return;
      }
      ObjectNode out = MAPPER.createObjectNode();
      out.set("txId", idNode);
      out.set("account", account);
      out.put("cents", (long) (amount.doubleValue() * 100.0));
      seen.put(id, r.timestamp());
      try {
        ctx.forward(r.withValue((Object) MAPPER.writeValueAsString(out)), "out");
      } catch (java.io.IOException e) {
        throw new IllegalStateException(e);
      }
    }
  }

  static Topology w2(Map<String, String> a) {
    long within = Duration.ofHours(Long.parseLong(a.getOrDefault("withinHours", "24"))).toMillis();
    Topology t = new Topology();
    t.addSource(
        "source",
        Serdes.String().deserializer(),
        Serdes.ByteArray().deserializer(),
        a.get("input").split(","));
    t.addProcessor("dedupe-map", () -> new DedupeMap(within), "source");
    t.addStateStore(
        Stores.keyValueStoreBuilder(
            Stores.persistentKeyValueStore("seen-tx"), Serdes.String(), Serdes.Long()),
        "dedupe-map");
    Serializer<Object> asString =
        (topic, o) -> o == null ? null : Serdes.String().serializer().serialize(topic, (String) o);
    Serializer<Object> asBytes = (topic, o) -> (byte[]) o;
    t.addSink("out", a.get("output"), Serdes.String().serializer(), asString, "dedupe-map");
    t.addSink("dlq", a.get("dlq"), Serdes.String().serializer(), asBytes, "dedupe-map");
    return t;
  }

  /**
   * Read-only access to a key-value store of {@link Agg}s, answered in the shape of Oxbow's
   * query API so the driver reads both engines the same way:
   *
   * <ul>
   *   <li>{@code GET /v1/stores/<store>/keys/<key>}: 200 {@code {"found":true,"parts":[{"value":
   *       {"count","total"}}]}}, or 404 {@code {"found":false}};
   *   <li>{@code GET /v1/stores/<store>/range?from=&to=}: every key in {@code [from, to)}, all
   *       in one page ({@code "next":null}).
   * </ul>
   *
   * <p>503 while the store is not queryable (a rebalance, a restore). The server runs on its
   * own thread and is only asked after the driver has taken its figures.
   */
  static void serveQueries(KafkaStreams streams, int port) throws java.io.IOException {
    com.sun.net.httpserver.HttpServer server =
        com.sun.net.httpserver.HttpServer.create(
            new java.net.InetSocketAddress(java.net.InetAddress.getLoopbackAddress(), port), 16);
    server.createContext(
        "/v1/stores/",
        ex -> {
          int status;
          String body;
          try {
            String path = ex.getRequestURI().getPath();
            String[] parts = path.substring("/v1/stores/".length()).split("/", 3);
            Map<String, String> q = new LinkedHashMap<>();
            String raw = ex.getRequestURI().getRawQuery();
            for (String kv : raw == null ? new String[0] : raw.split("&")) {
              int i = kv.indexOf('=');
              if (i > 0) {
                q.put(
                    kv.substring(0, i),
                    java.net.URLDecoder.decode(
                        kv.substring(i + 1), java.nio.charset.StandardCharsets.UTF_8));
              }
            }
            ReadOnlyKeyValueStore<String, Agg> store =
                streams.store(
                    StoreQueryParameters.fromNameAndType(
                        parts[0], QueryableStoreTypes.<String, Agg>keyValueStore()));
            if (parts.length == 3 && parts[1].equals("keys")) {
              Agg a = store.get(parts[2]);
              status = a == null ? 404 : 200;
              body =
                  a == null
                      ? "{\"found\":false}"
                      : "{\"found\":true,\"parts\":[{\"value\":" + aggJson(a) + "}]}";
            } else if (parts.length == 2 && parts[1].equals("range")) {
              String from = q.getOrDefault("from", "");
              String to = q.get("to");
              StringBuilder b = new StringBuilder("{\"entries\":[");
              boolean first = true;
              // range() includes its upper end; Oxbow's range excludes it.
              try (KeyValueIterator<String, Agg> it =
                  to == null ? store.all() : store.range(from, to)) {
                while (it.hasNext()) {
                  KeyValue<String, Agg> kv = it.next();
                  if (kv.key.compareTo(from) < 0 || (to != null && kv.key.compareTo(to) >= 0)) {
                    continue;
                  }
                  b.append(first ? "" : ",").append("{\"key\":").append(quote(kv.key));
                  b.append(",\"value\":").append(aggJson(kv.value)).append('}');
                  first = false;
                }
              }
              status = 200;
              body = b.append("],\"next\":null}").toString();
            } else {
              status = 404;
              body = "{\"error\":\"unknown path\"}";
            }
          } catch (org.apache.kafka.streams.errors.InvalidStateStoreException e) {
            status = 503;
            body = "{\"error\":" + quote(String.valueOf(e.getMessage())) + "}";
          } catch (RuntimeException e) {
            status = 500;
            body = "{\"error\":" + quote(String.valueOf(e)) + "}";
          }
          byte[] out = body.getBytes(java.nio.charset.StandardCharsets.UTF_8);
          ex.getResponseHeaders().set("content-type", "application/json");
          ex.sendResponseHeaders(status, out.length);
          try (java.io.OutputStream os = ex.getResponseBody()) {
            os.write(out);
          }
        });
    server.start();
  }

  static String aggJson(Agg a) {
    return "{\"count\":" + a.count + ",\"total\":" + a.total + "}";
  }

  public static void main(String[] args) throws Exception {
    Map<String, String> a = new LinkedHashMap<>();
    for (String arg : args) {
      int i = arg.indexOf('=');
      if (i < 0) {
        throw new IllegalArgumentException("arguments are key=value, got " + arg);
      }
      a.put(arg.substring(0, i), arg.substring(i + 1));
    }
    String workload = a.getOrDefault("workload", "w1");
    Topology topology =
        switch (workload) {
          case "w1" -> w1(a);
          case "w2" -> w2(a);
          case "w3" -> w3(a);
          case "w5" -> w5(a);
          default -> throw new IllegalArgumentException("workload is w1, w2, w3 or w5: " + workload);
        };

    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, a.get("app"));
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
    p.put(StreamsConfig.STATE_DIR_CONFIG, a.get("stateDir"));
    p.put(
        StreamsConfig.PROCESSING_GUARANTEE_CONFIG,
        a.getOrDefault("guarantee", StreamsConfig.AT_LEAST_ONCE));
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, a.getOrDefault("threads", "1"));
    p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, a.getOrDefault("commitMs", "100"));
    p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, a.getOrDefault("cacheBytes", "0"));
    // A window store's changelog is compact,delete with retention.ms = the store's retention
    // (size + grace: 10 min in W1) + this margin (1 day by default), and the broker deletes by
    // record timestamp. The driver's event times start a day before the run, so with the default
    // the broker deletes the oldest changelog records while the first windows are still open,
    // and a restore after a crash rebuilds those windows without them (W4 at least once then
    // under-counts). Seven days, the input topics' retention, keeps the whole changelog.
    p.put(
        StreamsConfig.WINDOW_STORE_CHANGE_LOG_ADDITIONAL_RETENTION_MS_CONFIG,
        a.getOrDefault("changelogExtraRetentionMs", String.valueOf(Duration.ofDays(7).toMillis())));
    for (Map.Entry<String, String> e : a.entrySet()) {
      if (e.getKey().startsWith("prop.")) {
        p.put(e.getKey().substring(5), e.getValue());
      }
    }

    KafkaStreams streams = new KafkaStreams(topology, p);
    CountDownLatch done = new CountDownLatch(1);
    streams.setStateListener(
        (now, before) -> {
          emit("state", fields("state", now.name(), "from", before.name()));
          if (now == KafkaStreams.State.NOT_RUNNING || now == KafkaStreams.State.ERROR) {
            done.countDown();
          }
        });
    streams.setUncaughtExceptionHandler(
        e -> {
          emit("error", fields("message", String.valueOf(e)));
          return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    streams.setGlobalStateRestoreListener(
        new StateRestoreListener() {
          @Override
          public void onRestoreStart(TopicPartition tp, String store, long start, long end) {
            emit(
                "restore_start",
                fields(
                    "store", store, "partition", tp.partition(), "startOffset", start,
                    "endOffset", end));
          }

          @Override
          public void onBatchRestored(TopicPartition tp, String store, long end, long n) {}

          @Override
          public void onRestoreEnd(TopicPartition tp, String store, long total) {
            emit(
                "restore_end",
                fields("store", store, "partition", tp.partition(), "restored", total));
          }
        });
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  streams.close(Duration.ofSeconds(60));
                  emit("closed", fields("processed", PROCESSED.get()));
                }));
    emit(
        "start",
        fields(
            "workload", workload, "pid", ProcessHandle.current().pid(), "kafkaStreams",
            org.apache.kafka.common.utils.AppInfoParser.getVersion()));
    if (a.containsKey("queryPort")) {
      serveQueries(streams, Integer.parseInt(a.get("queryPort")));
    }
    streams.start();
    while (!done.await(1, java.util.concurrent.TimeUnit.SECONDS)) {
      emit("progress", fields("processed", PROCESSED.get()));
    }
    if (streams.state() == KafkaStreams.State.ERROR) {
      System.exit(1);
    }
  }
}
