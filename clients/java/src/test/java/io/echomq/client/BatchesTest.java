package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.echomq.client.testing.Resp;
import io.echomq.client.testing.LiveSidecar;
import io.echomq.v1.ConsumeRequest;
import io.echomq.v1.ConsumeResponse;
import io.echomq.v1.Subscribe;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.ForwardingClientCallListener;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

/** Batched frames, coalesced acks and the batch handler, against a real sidecar and Redis. */
class BatchesTest extends LiveSidecar {
  @Override
  protected String consumerName() {
    return "batches-java";
  }

  /** Records what the Consume calls put on the wire: the Subscribe, the Ack messages, the frames received. */
  static final class Wire implements ClientInterceptor {
    final List<Subscribe> subscribes = Collections.synchronizedList(new ArrayList<>());
    /** The ids of each Ack message, in send order. */
    final List<List<String>> acks = Collections.synchronizedList(new ArrayList<>());
    /** Per frame received: its deliveries' ids, with -1 in front for a single {@code Delivery} frame. */
    final List<List<String>> batches = Collections.synchronizedList(new ArrayList<>());
    final List<String> singles = Collections.synchronizedList(new ArrayList<>());

    @Override
    public <ReqT, RespT> ClientCall<ReqT, RespT> interceptCall(MethodDescriptor<ReqT, RespT> method, CallOptions options, Channel next) {
      return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
        @Override
        public void start(Listener<RespT> listener, Metadata headers) {
          super.start(new ForwardingClientCallListener.SimpleForwardingClientCallListener<>(listener) {
            @Override
            public void onMessage(RespT message) {
              if (message instanceof ConsumeResponse r) {
                if (r.hasBatch()) {
                  batches.add(r.getBatch().getDeliveriesList().stream().map(io.echomq.v1.Delivery::getId).toList());
                } else if (r.hasDelivery()) {
                  singles.add(r.getDelivery().getId());
                }
              }
              super.onMessage(message);
            }
          }, headers);
        }

        @Override
        public void sendMessage(ReqT message) {
          if (message instanceof ConsumeRequest r) {
            if (r.hasSubscribe()) {
              subscribes.add(r.getSubscribe());
            } else if (r.hasAck()) {
              acks.add(List.copyOf(r.getAck().getIdsList()));
            }
          }
          super.sendMessage(message);
        }
      };
    }

    /** Deliveries received, in either kind of frame. */
    int received() {
      synchronized (batches) {
        return singles.size() + batches.stream().mapToInt(List::size).sum();
      }
    }

    int ackIds() {
      synchronized (acks) {
        return acks.stream().mapToInt(List::size).sum();
      }
    }

    Map<String, Integer> ackedTimes() {
      Map<String, Integer> times = new HashMap<>();
      synchronized (acks) {
        acks.forEach(ids -> ids.forEach(id -> times.merge(id, 1, Integer::sum)));
      }
      return times;
    }
  }

  private List<AppendResult> appendN(String stream, int count) {
    List<Map<String, byte[]>> entries = new ArrayList<>();
    for (int i = 1; i <= count; i++) {
      entries.add(Fields.of("n", String.valueOf(i)));
    }
    List<AppendResult> all = new ArrayList<>();
    for (int from = 0; from < entries.size(); from += 200) {
      all.addAll(producer.appendBatch(stream, entries.subList(from, Math.min(entries.size(), from + 200))));
    }
    return all;
  }

  private EchoMqConsumer.Builder consumer(String stream, Wire wire) {
    return EchoMqConsumer.builder()
        .target(fixture.target()).stream(stream).group("g")
        .startPosition(StartPosition.beginning())
        .intercept(wire)
        .reconnectBackoff(Duration.ofMillis(50), Duration.ofMillis(500));
  }

  @Test
  void only_batch_frames_of_at_most_max_batch_arrive_and_each_entry_is_acked_once() throws Exception {
    String stream = "batches:frames";
    List<AppendResult> written = appendN(stream, 600);
    Wire wire = new Wire();
    Set<String> handled = Collections.synchronizedSet(new HashSet<>());
    try (EchoMqConsumer consumer =
        consumer(stream, wire).maxInFlight(512).maxBatch(64).concurrency(4).handler(d -> handled.add(d.id())).build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
      waitUntil(() -> wire.ackIds() >= 600, "600 ids acked");
    }
    assertEquals(64, wire.subscribes.get(0).getMaxBatch(), "Subscribe.max_batch");
    assertEquals(List.of(), wire.singles, "no single Delivery frame when batches were asked for");
    int most = wire.batches.stream().mapToInt(List::size).max().orElse(0);
    assertTrue(most <= 64, "a frame of " + most + " deliveries > max_batch 64");
    assertTrue(most > 1, "frames carried several deliveries (largest " + most + ")");
    Map<String, Integer> expected = new HashMap<>();
    written.forEach(r -> expected.put(r.id(), 1));
    assertEquals(expected, wire.ackedTimes(), "each entry acked exactly once");
    assertEquals(600, handled.size());
    assertPending(stream, 0);
  }

  @Test
  void max_batch_defaults_to_256_or_max_in_flight_and_1_gets_single_deliveries() throws Exception {
    String stream = "batches:single";
    appendN(stream, 20);
    Wire wire = new Wire();
    try (EchoMqConsumer consumer = consumer(stream, wire).maxInFlight(16).maxBatch(1).handler(d -> { }).build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
      waitUntil(() -> wire.ackIds() >= 20, "20 ids acked");
    }
    assertEquals(1, wire.subscribes.get(0).getMaxBatch());
    assertEquals(List.of(), wire.batches, "max_batch 1: no DeliveryBatch frame");
    assertEquals(20, wire.singles.size());
    assertPending(stream, 0);

    assertEquals(256, EchoMqConsumer.builder().maxInFlight(1000).effectiveMaxBatch());
    assertEquals(256, EchoMqConsumer.builder().maxInFlight(0).effectiveMaxBatch(), "unset: 256, a quarter of the cap");
    assertEquals(16, EchoMqConsumer.builder().maxInFlight(16).effectiveMaxBatch(), "capped by max_in_flight");
    assertEquals(256, EchoMqConsumer.builder().concurrency(4).effectiveMaxBatch(), "max_in_flight unset: 256");
    assertEquals(1, ConsumerCall.ackBatchFor(256, 2), "at least 1");
    assertEquals(128, ConsumerCall.ackBatchFor(256, 512), "a quarter of max_in_flight");
    assertEquals(256, ConsumerCall.ackBatchFor(256, 10_000));
    assertEquals(256, ConsumerCall.ackBatchFor(256, 0), "the default cap, 1024, until Subscribed says");
  }

  @Test
  void one_ack_message_carries_many_ids() throws Exception {
    String stream = "batches:coalesced";
    appendN(stream, 400);
    Wire wire = new Wire();
    try (EchoMqConsumer consumer =
        consumer(stream, wire).maxInFlight(512).concurrency(4).handler(d -> { }).build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
      waitUntil(() -> wire.ackIds() >= 400, "400 ids acked");
    }
    assertEquals(256, wire.subscribes.get(0).getMaxBatch(), "the default max_batch");
    List<Integer> sizes;
    synchronized (wire.acks) {
      sizes = wire.acks.stream().map(List::size).toList();
    }
    int most = sizes.stream().mapToInt(Integer::intValue).max().orElse(0);
    assertTrue(most >= 8, "the largest Ack message had " + most + " ids in " + sizes.size() + " messages: acks are not coalesced");
    assertTrue(most <= 128, "an Ack of " + most + " ids: more than a quarter of max_in_flight 512");
    assertTrue(sizes.size() <= 100, sizes.size() + " Ack messages for 400 ids: " + sizes);
    assertPending(stream, 0);
  }

  /**
   * Acks wait in the window (an hour-long linger; 20 held, 10 acked) until a graceful stop sends
   * them. The stop starts no new handler, so the 10 entries that arrived but never started stay
   * pending: the flush is only observable with such entries held, since once every held delivery
   * has its ack waiting the window goes out on its own.
   */
  @Test
  void graceful_stop_flushes_the_coalesced_acks() throws Exception {
    String stream = "batches:stop-flush";
    int n = 20;
    int handledBeforeStop = 10;
    List<AppendResult> written = appendN(stream, n);
    Wire wire = new Wire();
    List<String> handled = Collections.synchronizedList(new ArrayList<>());
    AtomicReference<EchoMqConsumer> self = new AtomicReference<>();
    AtomicReference<java.util.concurrent.CompletableFuture<Boolean>> stopped = new AtomicReference<>();
    AtomicInteger acksBeforeStop = new AtomicInteger(-1);
    AtomicLong pendingBeforeStop = new AtomicLong(-1);
    EchoMqConsumer consumer =
        consumer(stream, wire).maxInFlight(400).concurrency(1).ackLinger(Duration.ofHours(1))
            .handler(d -> {
              waitUntil(() -> wire.received() >= n, "every entry received");
              handled.add(d.id());
              if (handled.size() == handledBeforeStop) {
                Thread.sleep(100); // Time for anything that would go out early.
                acksBeforeStop.set(wire.ackIds());
                pendingBeforeStop.set(pending(stream));
                stopped.set(self.get().stop(Duration.ofSeconds(10)));
                Thread.sleep(100); // The stop has begun: no new handler starts.
              }
            })
            .build();
    self.set(consumer);
    try {
      consumer.start().get(10, TimeUnit.SECONDS);
      waitUntil(() -> stopped.get() != null, "the stop called from the 10th handler");
      assertTrue(stopped.get().get(15, TimeUnit.SECONDS), "stopped in time");
      assertEquals(0, acksBeforeStop.get(), "no ack sent before the stop: they wait for the linger");
      assertEquals(n, pendingBeforeStop.get(), "all pending before the stop");
      assertEquals(handledBeforeStop, handled.size(), "the stop started no new handler");
      Map<String, String> byStreamId = new HashMap<>();
      written.forEach(r -> byStreamId.put(r.streamId(), r.id()));
      Set<String> stillPending = new HashSet<>();
      try (Resp redis = fixture.redis()) {
        for (Object row : (List<?>) redis.call("XPENDING", stream, "g", "-", "+", 100)) {
          stillPending.add(byStreamId.get(new String((byte[]) ((List<?>) row).get(0), java.nio.charset.StandardCharsets.UTF_8)));
        }
      }
      Set<String> unhandled = new HashSet<>(byStreamId.values());
      handled.forEach(unhandled::remove);
      assertEquals(unhandled, stillPending, "after the stop exactly the never-started entries are pending");
      Map<String, Integer> expected = new HashMap<>();
      handled.forEach(id -> expected.put(id, 1));
      assertEquals(expected, wire.ackedTimes(), "each handled entry acked once, by the stop's flush");
    } finally {
      consumer.abort();
    }
  }

  /**
   * A stop past its deadline: only the handler still running loses its verdict. The acks already
   * given wait in the coalescing window (100 in flight, a 30 s linger, so an Ack carries at most 25
   * ids: of the 49 acks, 24 still wait when the stop begins); they still go out on the call before
   * it closes, and the sidecar has applied them when the stop's future completes. The stuck
   * handler, interrupted, returns normally: that acks nothing, and its entry stays pending.
   */
  @Test
  void a_stop_past_its_deadline_still_sends_the_acks_already_given() throws Exception {
    String stream = "batches:stop-deadline-flush";
    int n = 50;
    List<Map<String, byte[]>> entries = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      entries.add(Fields.of("n", String.valueOf(i)));
    }
    List<AppendResult> written = producer.appendBatch(stream, entries);
    Wire wire = new Wire();
    AtomicInteger returned = new AtomicInteger();
    AtomicReference<Delivery> stuck = new AtomicReference<>();
    CountDownLatch interrupted = new CountDownLatch(1);
    EchoMqConsumer consumer =
        consumer(stream, wire).maxInFlight(100).ackLinger(Duration.ofSeconds(30))
            .handler(d -> {
              if ("0".equals(d.payloadText("n"))) {
                stuck.set(d);
                try {
                  new CountDownLatch(1).await(); // Until the stop's deadline interrupts it.
                } catch (InterruptedException e) {
                  interrupted.countDown();
                }
                return; // Gave up on the interrupt: this must not ack it.
              }
              returned.incrementAndGet();
            })
            .build();
    try {
      consumer.start().get(10, TimeUnit.SECONDS);
      waitUntil(() -> returned.get() == n - 1 && stuck.get() != null, (n - 1) + " handlers returned and the stuck one started");
      Thread.sleep(1500);
      long before = pending(stream);
      assertTrue(before > 1, "XPENDING " + before + " before the stop: the test needs acks waiting in the window");
      long begin = System.nanoTime();
      boolean clean = consumer.stop(Duration.ofSeconds(2)).get(10, TimeUnit.SECONDS);
      long tookMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - begin);
      assertFalse(clean, "a handler was still running at the deadline");
      assertTrue(tookMs < 4000, "the stop took " + tookMs + " ms with a 2 s deadline");
      assertTrue(interrupted.await(5, TimeUnit.SECONDS), "the stuck handler was interrupted");
      // The stop has completed: what the sidecar applied is in Redis already.
      assertEquals(1, pending(stream), "XPENDING after the stop (" + before + " before): the acks already given were dropped");
      String stuckId = stuck.get().id();
      Map<String, String> byStreamId = new HashMap<>();
      written.forEach(r -> byStreamId.put(r.streamId(), r.id()));
      try (Resp redis = fixture.redis()) {
        List<?> rows = (List<?>) redis.call("XPENDING", stream, "g", "-", "+", 100);
        String pendingId =
            byStreamId.get(new String((byte[]) ((List<?>) rows.get(0)).get(0), java.nio.charset.StandardCharsets.UTF_8));
        assertEquals(stuckId, pendingId, "the stuck entry is the one pending");
      }
      Map<String, Integer> expected = new HashMap<>();
      written.forEach(r -> {
        if (!r.id().equals(stuckId)) {
          expected.put(r.id(), 1);
        }
      });
      assertEquals(expected, wire.ackedTimes(), "every other entry acked once, the stuck one never");
      assertFalse(stuck.get().ack(), "the stuck delivery can no longer be acked");
    } finally {
      consumer.abort();
    }
  }

  @Test
  void a_disconnect_with_a_partly_acked_batch_redelivers_exactly_the_unacked_entries() throws Exception {
    String stream = "batches:partial";
    List<AppendResult> written = appendN(stream, 10);
    Wire wire = new Wire();
    CountDownLatch fifthStarted = new CountDownLatch(1);
    CountDownLatch release = new CountDownLatch(1);
    EchoMqConsumer first =
        consumer(stream, wire).maxInFlight(512).maxBatch(10).concurrency(1)
            .handler(d -> {
              if (Integer.parseInt(d.payloadText("n")) >= 5) {
                fifthStarted.countDown();
                release.await();
              }
            })
            .build();
    Set<String> unacked = new HashSet<>();
    written.subList(4, 10).forEach(r -> unacked.add(r.id()));
    List<Delivery> again = Collections.synchronizedList(new ArrayList<>());
    Wire secondWire = new Wire();
    try {
      first.start().get(10, TimeUnit.SECONDS);
      assertTrue(fifthStarted.await(10, TimeUnit.SECONDS));
      waitUntil(() -> pending(stream) == 6, "the acks of entries 1-4 applied");
      assertEquals(List.of(10), wire.batches.stream().map(List::size).toList(), "the 10 entries came in one frame");
      first.abort(); // A disconnect: no more verdicts from this call.
      release.countDown();
      try (EchoMqConsumer second = consumer(stream, secondWire).maxInFlight(512).handler(again::add).build()) {
        second.start().get(10, TimeUnit.SECONDS);
        waitUntil(() -> again.size() >= 6, "6 redeliveries");
        Thread.sleep(300); // Nothing more comes.
      }
    } finally {
      release.countDown();
      first.abort();
    }
    Set<String> redelivered = new HashSet<>();
    again.forEach(d -> redelivered.add(d.id()));
    assertEquals(6, again.size(), "each unacked entry once");
    assertEquals(unacked, redelivered, "exactly the unacked entries came back");
    assertTrue(again.stream().allMatch(d -> d.attempts() == 2), "as redeliveries");
    assertEquals(4, wire.ackIds(), "the first call acked 1-4 only");
    assertPending(stream, 0);
  }

  @Test
  void the_batch_handler_gets_frames_and_its_verdicts_apply() throws Exception {
    String stream = "batches:handler";
    appendN(stream, 50);
    Wire wire = new Wire();
    List<Integer> sizes = Collections.synchronizedList(new ArrayList<>());
    Set<String> seen = Collections.synchronizedSet(new HashSet<>());
    try (EchoMqConsumer consumer =
        consumer(stream, wire).maxInFlight(64).maxBatch(16)
            .batchHandler(batch -> {
              sizes.add(batch.size());
              List<Verdict> verdicts = new ArrayList<>();
              for (Delivery d : batch) {
                seen.add(d.id());
                int n = Integer.parseInt(d.payloadText("n"));
                verdicts.add(n % 10 == 0 ? Verdict.deadLetter("tens go to the dead letters") : Verdict.ack());
              }
              return verdicts;
            })
            .build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
      waitUntil(() -> seen.size() >= 50 && pending(stream) == 0, "50 entries handled and settled");
    }
    assertEquals(50, sizes.stream().mapToInt(Integer::intValue).sum(), "each delivery in one batch: " + sizes);
    assertTrue(sizes.stream().allMatch(n -> n >= 1 && n <= 16), "batches of 1 to max_batch 16: " + sizes);
    assertTrue(sizes.stream().anyMatch(n -> n > 1), "some batch held several deliveries: " + sizes);
    assertEquals(45, wire.ackIds(), "45 acked");
    try (Resp redis = fixture.redis()) {
      assertEquals(5L, redis.callLong("XLEN", stream + ":dlq"), "5 dead letters");
    }
  }

  @Test
  void a_builder_takes_one_handler_kind() {
    assertThrows(() -> EchoMqConsumer.builder().target("127.0.0.1:1").stream("s").group("g")
        .startPosition(StartPosition.newEntries()).handler(d -> { }).batchHandler(b -> null).build());
    assertThrows(() -> EchoMqConsumer.builder().target("127.0.0.1:1").stream("s").group("g")
        .startPosition(StartPosition.newEntries()).handler(d -> { }).maxBatch(0).build());
  }

  private static void assertThrows(Runnable r) {
    boolean threw = false;
    try {
      r.run();
    } catch (IllegalStateException | IllegalArgumentException e) {
      threw = true;
    }
    assertTrue(threw, "refused");
  }

  private long pending(String stream) {
    try (Resp redis = fixture.redis()) {
      return (Long) ((List<?>) redis.call("XPENDING", stream, "g")).get(0);
    } catch (java.io.IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
  }

  private void assertPending(String stream, long want) {
    assertEquals(want, pending(stream), "XPENDING " + stream);
  }
}
