package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.echomq.client.testing.Resp;
import io.echomq.client.testing.LiveSidecar;
import io.echomq.client.testing.SidecarFixture;
import io.echomq.v1.ConsumeRequest;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/** Client behaviours beyond the shared conformance scenarios, against a real sidecar. */
class ConsumerBehaviourTest extends LiveSidecar {
  @Override
  protected String consumerName() {
    return "behaviour-java";
  }

  /** Records every Consume call opened and the ack ids sent on each, by call number. */
  static final class Wire implements ClientInterceptor {
    final AtomicInteger calls = new AtomicInteger();
    final List<String> acks = Collections.synchronizedList(new ArrayList<>());

    @Override
    public <ReqT, RespT> ClientCall<ReqT, RespT> interceptCall(MethodDescriptor<ReqT, RespT> method, CallOptions options, Channel next) {
      int call = calls.incrementAndGet();
      return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
        @Override
        public void sendMessage(ReqT message) {
          if (message instanceof ConsumeRequest r && r.hasAck()) {
            r.getAck().getIdsList().forEach(id -> acks.add(call + ":" + id));
          }
          super.sendMessage(message);
        }
      };
    }
  }

  @Test
  void a_bad_subscribe_is_raised_and_not_retried() throws Exception {
    Wire wire = new Wire();
    EchoMqConsumer consumer =
        EchoMqConsumer.builder()
            .target(fixture.target()).stream("behaviour:bad-start").group("g")
            .startPosition(StartPosition.afterId("not-a-stream-id"))
            .handler(d -> { })
            .intercept(wire)
            .reconnectBackoff(Duration.ofMillis(10), Duration.ofMillis(50))
            .build();
    CompletionException e = assertThrows(CompletionException.class, () -> consumer.start().join());
    EchoMqException error = assertInstanceOf(EchoMqException.class, e.getCause());
    assertEquals(Status.Code.INVALID_ARGUMENT, error.code());
    assertTrue(error.isPermanent());
    assertTrue(error.getMessage().contains("start_id"), error.getMessage());
    assertThrows(CompletionException.class, () -> consumer.terminated().join());
    Thread.sleep(300);
    assertEquals(1, wire.calls.get(), "a permanent error must not be retried");
    consumer.close();
  }

  @Test
  void a_builder_without_a_start_position_is_refused() {
    IllegalStateException e =
        assertThrows(IllegalStateException.class,
            () -> EchoMqConsumer.builder().target("127.0.0.1:1").stream("s").group("g").handler(d -> { }).build());
    assertTrue(e.getMessage().contains("startPosition"));
  }

  @Test
  void verdicts_of_a_broken_call_are_dropped_after_reconnect() throws Exception {
    String stream = "behaviour:stale-verdicts";
    AppendResult entry = producer.append(stream, Fields.of("n", "1"));
    CountDownLatch firstCallStarted = new CountDownLatch(1);
    CountDownLatch releaseFirstCall = new CountDownLatch(1);
    List<Integer> attempts = Collections.synchronizedList(new ArrayList<>());
    List<VerdictError> errors = Collections.synchronizedList(new ArrayList<>());
    Wire wire = new Wire();
    EchoMqConsumer consumer =
        EchoMqConsumer.builder()
            .target(fixture.target()).stream(stream).group("g")
            .startPosition(StartPosition.beginning())
            .concurrency(2)
            .handler(d -> {
              attempts.add(d.attempts());
              if (d.attempts() == 1) {
                firstCallStarted.countDown();
                releaseFirstCall.await();
              }
            })
            .onVerdictError(errors::add)
            .intercept(wire)
            .reconnectBackoff(Duration.ofMillis(50), Duration.ofMillis(500))
            .build();
    try {
      consumer.start().get(10, TimeUnit.SECONDS);
      assertTrue(firstCallStarted.await(10, TimeUnit.SECONDS));
      fixture.killSidecar();
      fixture.restartSidecar();
      // The restarted sidecar recovers its own pending entry and hands it to the new call.
      waitUntil(() -> attempts.contains(2), "redelivery with attempts 2 on the new call");
      waitUntil(() -> wire.acks.size() == 1, "the ack of the redelivery");
      releaseFirstCall.countDown(); // The old handler returns now: its ack must go nowhere.
      Thread.sleep(500);
      assertTrue(wire.calls.get() >= 2, "reconnected");
      assertEquals(List.of(wire.calls.get() + ":" + entry.id()), wire.acks, "only the new call acked, once");
      assertEquals(List.of(), errors, "no UNKNOWN_ID: nothing was sent for the old call's delivery");
      assertTrue(consumer.stop(Duration.ofSeconds(5)).get(10, TimeUnit.SECONDS));
      try (Resp redis = fixture.redis()) {
        assertEquals(0L, ((List<?>) redis.call("XPENDING", stream, "g")).get(0));
      }
    } finally {
      releaseFirstCall.countDown();
      consumer.abort();
    }
  }

  @Test
  void the_producer_refuses_the_reserved_id_field() {
    EchoMqException e = assertThrows(EchoMqException.class, () -> producer.append("behaviour:reserved", Fields.of("id", "x")));
    assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
    assertTrue(e.isPermanent());
  }

  @Test
  void a_batch_gets_consecutive_ordered_ids() {
    List<AppendResult> results =
        producer.appendBatch("behaviour:batch", List.of(Fields.of("n", "1"), Fields.of("n", "2"), Fields.of("n", "3")));
    assertEquals(3, results.size());
    for (int i = 1; i < results.size(); i++) {
      assertTrue(BrandedIds.compare(results.get(i - 1).id(), results.get(i).id()) < 0);
    }
    assertEquals(results.get(0).streamId(), BrandedIds.toStreamId(results.get(0).id()));
  }

  @Test
  void a_consumer_and_producer_work_over_a_unix_socket() throws Exception {
    try (SidecarFixture unix = SidecarFixture.startOnUnixSocket("unix-java", SIDECAR_ARGS);
        EchoMqProducer unixProducer = EchoMqProducer.connect(unix.target())) {
      assertTrue(unix.target().startsWith("unix:/"));
      AppendResult written = unixProducer.append("behaviour:unix", Fields.of("hello", "socket"));
      List<String> seen = Collections.synchronizedList(new ArrayList<>());
      try (EchoMqConsumer consumer =
          EchoMqConsumer.builder()
              .target(unix.target()).stream("behaviour:unix").group("g")
              .startPosition(StartPosition.beginning())
              .handler(d -> seen.add(d.id() + "=" + d.payloadText("hello")))
              .build()) {
        consumer.start().get(10, TimeUnit.SECONDS);
        waitUntil(() -> !seen.isEmpty(), "a delivery over the unix socket");
      }
      assertEquals(List.of(written.id() + "=socket"), seen);
      try (Resp redis = unix.redis()) {
        assertEquals(0L, ((List<?>) redis.call("XPENDING", "behaviour:unix", "g")).get(0));
      }
    }
  }

  /**
   * A sharded stream ({@code --sharded-streams <stream>=3}): each partition key's entries land on
   * one shard and, consumed through the logical stream by one handler thread (concurrency 1, so
   * handlers run in arrival order), arrive in append order and are all acked.
   */
  @Test
  void a_partition_key_keeps_its_entries_on_one_shard_in_order() throws Exception {
    String stream = "behaviour:sharded";
    List<String> shards = List.of(0, 1, 2).stream().map(k -> stream + ":{" + stream + ":" + k + "}").toList();
    List<String> args = new ArrayList<>(SIDECAR_ARGS);
    args.addAll(List.of("--sharded-streams", stream + "=3"));
    try (SidecarFixture sharded = SidecarFixture.start("sharded-java", args);
        EchoMqProducer shardedProducer = EchoMqProducer.connect(sharded.target())) {
      Map<String, List<AppendResult>> byKey = new java.util.LinkedHashMap<>();
      byKey.put("a", new ArrayList<>());
      byKey.put("b", new ArrayList<>());
      for (int n = 0; n < 4; n++) {
        for (var e : byKey.entrySet()) {
          e.getValue().add(shardedProducer.append(stream, Fields.of("key", e.getKey(), "n", String.valueOf(n)), 0, e.getKey()));
        }
      }
      for (var e : byKey.entrySet()) {
        e.getValue().addAll(shardedProducer.appendBatch(
            stream, List.of(Fields.of("key", e.getKey(), "n", "4"), Fields.of("key", e.getKey(), "n", "5")), 0, e.getKey()));
      }
      for (var e : byKey.entrySet()) {
        String shard = e.getValue().get(0).stream();
        assertTrue(shards.contains(shard), shard);
        assertTrue(e.getValue().stream().allMatch(r -> r.stream().equals(shard)), "key " + e.getKey() + ": " + e.getValue());
      }

      List<Delivery> got = Collections.synchronizedList(new ArrayList<>());
      try (EchoMqConsumer consumer =
          EchoMqConsumer.builder()
              .target(sharded.target()).stream(stream).group("g")
              .startPosition(StartPosition.beginning())
              .concurrency(1)
              .handler(got::add)
              .build()) {
        consumer.start().get(10, TimeUnit.SECONDS);
        waitUntil(() -> got.size() >= 12, "12 deliveries from the shards");
        try (Resp redis = sharded.redis()) {
          waitUntil(() -> {
            long pending = 0;
            for (String shard : shards) {
              try {
                pending += (Long) ((List<?>) redis.call("XPENDING", shard, "g")).get(0);
              } catch (java.io.IOException e) {
                throw new java.io.UncheckedIOException(e);
              }
            }
            return pending == 0;
          }, "every delivery acked on its shard");
        }
      }
      assertEquals(12, got.size());
      for (var e : byKey.entrySet()) {
        List<Delivery> delivered = got.stream().filter(d -> e.getKey().equals(d.payloadText("key"))).toList();
        assertEquals(e.getValue().stream().map(AppendResult::id).toList(), delivered.stream().map(Delivery::id).toList(),
            "key " + e.getKey() + " in append order");
        assertTrue(delivered.stream().allMatch(d -> d.stream().equals(e.getValue().get(0).stream()) && d.attempts() == 1));
      }
    }
  }

  /**
   * stop() sends Drain before waiting for the running handler: the credit its ack frees must not
   * pull the next entry of the backlog into the call. Without Drain the sidecar reads entry 2 right
   * after the ack and hands it to the closing call, leaving it pending (and delivered) in the group.
   */
  @Test
  void stop_drains_so_the_last_ack_pulls_nothing_more() throws Exception {
    String stream = "behaviour:drain-on-stop";
    List<AppendResult> backlog = new ArrayList<>();
    for (int i = 1; i <= 3; i++) {
      backlog.add(producer.append(stream, Fields.of("n", String.valueOf(i))));
    }
    AtomicInteger handled = new AtomicInteger();
    CountDownLatch firstStarted = new CountDownLatch(1);
    EchoMqConsumer consumer =
        EchoMqConsumer.builder()
            .target(fixture.target()).stream(stream).group("g")
            .startPosition(StartPosition.beginning())
            .concurrency(1).maxInFlight(1)
            .handler(d -> {
              handled.incrementAndGet();
              firstStarted.countDown();
              Thread.sleep(300);
            })
            .build();
    try {
      consumer.start().get(10, TimeUnit.SECONDS);
      assertTrue(firstStarted.await(10, TimeUnit.SECONDS), "the first handler started");
      assertTrue(consumer.stop(Duration.ofSeconds(5)).get(10, TimeUnit.SECONDS), "stopped in time");
      assertEquals(1, handled.get(), "exactly one handler call");
      try (Resp redis = fixture.redis()) {
        assertEquals(0L, ((List<?>) redis.call("XPENDING", stream, "g")).get(0), "nothing left pending");
        assertEquals(backlog.get(0).streamId(), lastDeliveredId(redis, stream, "g"),
            "entries 2 and 3 were never delivered: the group did not read past the first entry");
      }
    } finally {
      consumer.abort();
    }
  }

  /** The group's {@code last-delivered-id}, from XINFO GROUPS (a flat field/value list per group). */
  private static String lastDeliveredId(Resp redis, String stream, String group) throws Exception {
    for (Object info : (List<?>) redis.call("XINFO", "GROUPS", stream)) {
      List<?> fields = (List<?>) info;
      Map<String, Object> byName = new HashMap<>();
      for (int i = 0; i + 1 < fields.size(); i += 2) {
        byName.put(text(fields.get(i)), fields.get(i + 1));
      }
      if (group.equals(text(byName.get("name")))) {
        return text(byName.get("last-delivered-id"));
      }
    }
    throw new AssertionError("no group " + group + " on " + stream);
  }

  private static String text(Object reply) {
    return reply instanceof byte[] b ? new String(b, StandardCharsets.UTF_8) : String.valueOf(reply);
  }

  @Test
  void stop_before_start_and_twice_is_harmless() throws Exception {
    EchoMqConsumer consumer =
        EchoMqConsumer.builder().target(fixture.target()).stream("s").group("g")
            .startPosition(StartPosition.newEntries()).handler(d -> { }).build();
    assertTrue(consumer.stop(Duration.ofSeconds(1)).get(5, TimeUnit.SECONDS));
    assertTrue(consumer.stop(Duration.ofSeconds(1)).get(5, TimeUnit.SECONDS));
    assertFalse(consumer.isConnected());
    assertThrows(IllegalStateException.class, consumer::start);
  }
}
