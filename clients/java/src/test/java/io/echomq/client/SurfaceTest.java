package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.echomq.client.EchoMqStreams.Range;
import io.echomq.client.EchoMqStreams.ReadPage;
import io.echomq.client.EchoMqStreams.Trim;
import io.echomq.client.testing.LiveSidecar;
import io.echomq.client.testing.Resp;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * The client surface of clients/CONTRACT.md ("Surface"): one {@link EchoMqStreams} that appends,
 * reads and trims; the consumer's flow settings grouped in {@link FlowControl}; and the deprecated
 * old names ({@code EchoMqProducer}, {@code EchoMqException.detail()}, the builder's own
 * maxInFlight, concurrency and maxBatch) still working for a release.
 */
class SurfaceTest extends LiveSidecar {
  @Override
  protected String consumerName() {
    return "surface-java";
  }

  private long pending(String stream) throws Exception {
    try (Resp redis = fixture.redis()) {
      return (Long) ((List<?>) redis.call("XPENDING", stream, "g")).get(0);
    }
  }

  @Test
  void one_streams_type_appends_reads_and_trims() throws Exception {
    String stream = "java:surface:" + System.nanoTime();
    try (EchoMqStreams streams = EchoMqStreams.connect(fixture.target())) {
      AppendResult one = streams.append(stream, Fields.of("n", "0"), 0, null, "k0");
      List<AppendResult> batch =
          streams.appendBatchEntries(
              stream, List.of(BatchEntry.of(Fields.of("n", "1"), "k1"), BatchEntry.of(Fields.of("n", "2"))));
      ReadPage page = streams.read(stream, Range.all(), 0);
      List<String> ids = new ArrayList<>();
      page.entries().forEach(e -> ids.add(e.id()));
      assertEquals(List.of(one.id(), batch.get(0).id(), batch.get(1).id()), ids);
      assertEquals(2, streams.trim(stream, Trim.maxLen(1).ignoringGroups()).trimmed());
      assertEquals(1, streams.withTimeout(Duration.ofSeconds(5)).read(stream, Range.all(), 0).entries().size());
    }
  }

  @Test
  void flow_control_bounds_what_the_call_holds_and_how_many_handlers_run() throws Exception {
    String stream = "java:surface-flow:" + System.nanoTime();
    for (int i = 0; i < 6; i++) {
      producer.append(stream, Fields.of("n", Integer.toString(i)));
    }
    AtomicInteger running = new AtomicInteger();
    AtomicInteger most = new AtomicInteger();
    AtomicInteger handled = new AtomicInteger();
    CountDownLatch release = new CountDownLatch(1);
    FlowControl flow = FlowControl.builder().maxInFlight(3).concurrency(2).maxBatch(2).build();
    assertEquals(new FlowControl(3, 2, 2), flow);
    EchoMqConsumer consumer =
        EchoMqConsumer.builder()
            .target(fixture.target())
            .stream(stream)
            .group("g")
            .startPosition(StartPosition.beginning())
            .flowControl(flow)
            .handler(
                d -> {
                  most.accumulateAndGet(running.incrementAndGet(), Math::max);
                  release.await();
                  running.decrementAndGet();
                  handled.incrementAndGet();
                })
            .build();
    try {
      consumer.start().join();
      waitUntil(() -> running.get() == 2, "two handlers");
      Thread.sleep(300);
      assertEquals(2, most.get());
      assertEquals(3, pending(stream));
      release.countDown();
      waitUntil(() -> handled.get() == 6, "every entry handled");
    } finally {
      release.countDown();
      consumer.stop(Duration.ofSeconds(5)).join();
    }
    assertEquals(0, pending(stream));
    assertThrows(IllegalArgumentException.class, () -> new FlowControl(-1, 0, 0));
  }

  @Test
  @SuppressWarnings({"deprecation", "removal"})
  void the_deprecated_names_still_work() throws Exception {
    String stream = "java:surface-deprecated:" + System.nanoTime();
    try (EchoMqProducer old = EchoMqProducer.connect(fixture.target())) {
      EchoMqProducer slower = old.withTimeout(Duration.ofSeconds(5));
      assertInstanceOf(EchoMqStreams.class, slower);
      AppendResult written = slower.append(stream, Fields.of("n", "0"));
      slower.append(stream, Fields.of("n", "1"));
      assertEquals(written.id(), old.read(stream, Range.all(), 1).entries().get(0).id());
      EchoMqException refused = assertThrows(EchoMqException.class, () -> old.append(stream, Fields.of("id", "x")));
      assertTrue(refused.isPermanent());
      assertEquals(refused.details(), refused.detail());
      assertTrue(refused.details().contains("id"), refused.details());
    }
    CountDownLatch release = new CountDownLatch(1);
    AtomicInteger handled = new AtomicInteger();
    EchoMqConsumer consumer =
        EchoMqConsumer.builder()
            .target(fixture.target())
            .stream(stream)
            .group("g")
            .startPosition(StartPosition.beginning())
            .maxInFlight(1)
            .concurrency(1)
            .maxBatch(1)
            .handler(
                d -> {
                  release.await();
                  handled.incrementAndGet();
                })
            .build();
    try {
      consumer.start().join();
      waitUntil(() -> {
        try {
          return pending(stream) == 1;
        } catch (Exception e) {
          throw new AssertionError(e);
        }
      }, "one pending");
      Thread.sleep(200);
      assertEquals(1, pending(stream), "maxInFlight(1) holds one");
      release.countDown();
      waitUntil(() -> handled.get() == 2, "both handled");
    } finally {
      release.countDown();
      consumer.stop(Duration.ofSeconds(5)).join();
    }
    assertTrue(handled.get() == 2);
  }
}
