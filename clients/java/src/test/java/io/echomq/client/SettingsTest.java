package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.echomq.client.testing.LiveSidecar;
import io.echomq.client.testing.Resp;
import io.echomq.client.testing.SentRequests;
import io.echomq.v1.Subscribe;
import io.grpc.ClientInterceptor;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * Every subscription setting reaches the sidecar with an effect one can see in Redis (the sidecar
 * runs with a 100 ms retry backoff, no max_deliveries and no ack deadline, so each effect below
 * comes from the setting).
 */
class SettingsTest extends LiveSidecar {
  @Override
  protected String consumerName() {
    return "settings-java";
  }

  private EchoMqConsumer.Builder consumer(String stream) {
    return EchoMqConsumer.builder()
        .target(fixture.target()).stream(stream).group("g")
        .startPosition(StartPosition.beginning());
  }

  private long pending(String stream) throws Exception {
    try (Resp redis = fixture.redis()) {
      return (Long) ((List<?>) redis.call("XPENDING", stream, "g")).get(0);
    }
  }

  private long length(String stream) throws Exception {
    try (Resp redis = fixture.redis()) {
      return redis.callLong("XLEN", stream);
    }
  }

  /** Keeps the Subscribe messages the consumer sends. */
  private static ClientInterceptor subscribes(List<Subscribe> into) {
    return SentRequests.to(r -> {
      if (r.hasSubscribe()) {
        into.add(r.getSubscribe());
      }
    });
  }

  @Test
  void unset_settings_leave_the_sidecar_its_defaults_and_64_handlers_run() throws Exception {
    String stream = "settings:defaults";
    List<Subscribe> sent = Collections.synchronizedList(new ArrayList<>());
    try (EchoMqConsumer consumer = consumer(stream).handler(d -> { }).intercept(subscribes(sent)).build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
      long handlerThreads =
          Thread.getAllStackTraces().keySet().stream().filter(t -> t.getName().startsWith("echomq-handler-" + stream + "-")).count();
      assertEquals(64, handlerThreads, "max_in_flight unset: 64 handler threads, not the cap (1024)");
    }
    Subscribe subscribe = sent.get(0);
    assertEquals(0, subscribe.getMaxInFlight(), "0: the sidecar's adaptive window");
    assertEquals(256, subscribe.getMaxBatch(), "max_in_flight unset: a quarter of the cap");
    assertEquals(0, subscribe.getMaxDeliveries());
    assertEquals("", subscribe.getDeadLetterStream());
    assertTrue(!subscribe.getNoAck() && !subscribe.hasAckDeadline() && !subscribe.hasRetryBackoffInitial()
        && !subscribe.hasRetryBackoffMax(), subscribe.toString());
  }

  @Test
  void every_setting_travels_in_the_subscribe() throws Exception {
    String stream = "settings:all";
    List<Subscribe> sent = Collections.synchronizedList(new ArrayList<>());
    try (EchoMqConsumer consumer =
        consumer(stream).maxInFlight(32).maxDeliveries(7).deadLetterStream(stream + ":graveyard")
            .retryBackoff(Duration.ofMillis(250), Duration.ofSeconds(30)).ackDeadline(Duration.ofSeconds(45))
            .handler(d -> { }).intercept(subscribes(sent)).build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
    }
    Subscribe subscribe = sent.get(0);
    assertEquals(32, subscribe.getMaxInFlight());
    assertEquals(32, subscribe.getMaxBatch());
    assertEquals(7, subscribe.getMaxDeliveries());
    assertEquals(stream + ":graveyard", subscribe.getDeadLetterStream());
    assertEquals(250_000_000, subscribe.getRetryBackoffInitial().getNanos());
    assertEquals(30, subscribe.getRetryBackoffMax().getSeconds());
    assertEquals(45, subscribe.getAckDeadline().getSeconds());
  }

  @Test
  void max_deliveries_dead_letters_an_entry_after_that_many_deliveries() throws Exception {
    String stream = "settings:max-deliveries";
    producer.append(stream, Fields.of("n", "1"));
    List<Integer> attempts = Collections.synchronizedList(new ArrayList<>());
    try (EchoMqConsumer consumer =
        consumer(stream).maxDeliveries(2)
            .handler(d -> {
              attempts.add(d.attempts());
              throw new IllegalStateException("always fails");
            })
            .build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
      waitUntil(() -> lengthQuietly(stream + ":dlq") == 1, "the poison entry in the dead-letter stream");
      Thread.sleep(300); // Time for a (wrong) third delivery.
    }
    assertEquals(List.of(1, 2), attempts, "handed out twice, then dead-lettered");
    assertEquals(0, pending(stream));
  }

  @Test
  void dead_letter_stream_names_where_dead_letters_go() throws Exception {
    String stream = "settings:dead-letter-stream";
    String custom = "settings:dead-letter-stream:custom";
    producer.append(stream, Fields.of("n", "1"));
    try (EchoMqConsumer consumer =
        consumer(stream).deadLetterStream(custom).handler(d -> d.deadLetter("bad")).build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
      waitUntil(() -> lengthQuietly(custom) == 1, "the dead letter in " + custom);
    }
    assertEquals(0, length(stream + ":dlq"), "not the default dead-letter stream");
  }

  @Test
  void no_ack_keeps_nothing_pending_and_a_failed_entry_is_not_retried() throws Exception {
    String stream = "settings:no-ack";
    producer.append(stream, Fields.of("n", "1"));
    CountDownLatch running = new CountDownLatch(1);
    CountDownLatch release = new CountDownLatch(1);
    List<Integer> attempts = Collections.synchronizedList(new ArrayList<>());
    List<VerdictError> errors = Collections.synchronizedList(new ArrayList<>());
    try (EchoMqConsumer consumer =
        consumer(stream).noAck(true)
            .onVerdictError(errors::add)
            .handler(d -> {
              attempts.add(d.attempts());
              running.countDown();
              release.await();
              throw new IllegalStateException("lost on purpose");
            })
            .build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
      assertTrue(running.await(10, TimeUnit.SECONDS));
      assertEquals(0, pending(stream), "at-most-once: a delivery in a handler is not pending");
      release.countDown();
      producer.append(stream, Fields.of("n", "2"));
      waitUntil(() -> attempts.size() == 2, "the next entry still flows (the failed one freed its slot)");
      Thread.sleep(400); // Time for a (wrong) redelivery after the 100 ms backoff.
    } finally {
      release.countDown();
    }
    assertEquals(List.of(1, 1), attempts, "no redelivery in at-most-once mode");
    assertEquals(List.of(), errors, "the client acked instead of sending a Fail the sidecar refuses");
    assertEquals(0, pending(stream));
  }

  @Test
  void retry_backoff_sets_the_delay_before_a_redelivery() throws Exception {
    String stream = "settings:retry-backoff";
    producer.append(stream, Fields.of("n", "1"));
    List<Long> started = Collections.synchronizedList(new ArrayList<>());
    try (EchoMqConsumer consumer =
        consumer(stream).retryBackoff(Duration.ofMillis(1500), Duration.ofMillis(1500))
            .handler(d -> {
              started.add(System.nanoTime());
              if (d.attempts() == 1) {
                throw new IllegalStateException("first attempt fails");
              }
            })
            .build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
      waitUntil(() -> started.size() == 2, "the redelivery");
    }
    long gapMs = TimeUnit.NANOSECONDS.toMillis(started.get(1) - started.get(0));
    // Jittered into the upper half of 1.5 s; the sidecar's own 100 ms would come back far sooner.
    assertTrue(gapMs >= 700, "redelivered after " + gapMs + " ms");
    assertEquals(0, pending(stream));
  }

  @Test
  void ack_deadline_hands_out_again_what_stays_unsettled_too_long() throws Exception {
    String stream = "settings:ack-deadline";
    AppendResult entry = producer.append(stream, Fields.of("n", "1"));
    CountDownLatch release = new CountDownLatch(1);
    List<Integer> attempts = Collections.synchronizedList(new ArrayList<>());
    List<VerdictError> errors = Collections.synchronizedList(new ArrayList<>());
    try (EchoMqConsumer consumer =
        consumer(stream).ackDeadline(Duration.ofMillis(300)).maxInFlight(2).concurrency(2)
            .onVerdictError(errors::add)
            .handler(d -> {
              attempts.add(d.attempts());
              if (d.attempts() == 1) {
                release.await(); // Never settles in time.
              }
            })
            .build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
      waitUntil(() -> attempts.size() == 2, "a redelivery while the first handler still runs");
      release.countDown();
      waitUntil(() -> !errors.isEmpty(), "the late ack refused");
    } finally {
      release.countDown();
    }
    assertEquals(List.of(1, 2), attempts);
    assertEquals(entry.id(), errors.get(0).id());
    assertEquals(VerdictError.Code.UNKNOWN_ID, errors.get(0).code(), "a verdict after the deadline is not applied");
    assertEquals(0, pending(stream));
  }

  private long lengthQuietly(String stream) {
    try {
      return length(stream);
    } catch (Exception e) {
      throw new IllegalStateException(e);
    }
  }
}
