package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.echomq.client.testing.LiveSidecar;
import io.echomq.client.testing.Resp;
import io.echomq.client.testing.SentRequests;
import io.echomq.client.testing.SidecarFixture;
import io.grpc.ClientInterceptor;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * AckEmit (consume → produce, exactly once) beyond the shared scenarios, against a real sidecar
 * that allows only {@code java:emit:*} streams and keeps the default lease timings (a refresh every
 * 10 s: slower than these tests).
 */
class AckEmitTest {
  private static SidecarFixture fixture;
  private static EchoMqStreams streams;

  @BeforeAll
  static void start() throws Exception {
    fixture = SidecarFixture.start("java-emit", List.of("--allow-streams", "java:emit:*"));
    streams = EchoMqStreams.connect(fixture.target());
  }

  @AfterAll
  static void stop() throws Exception {
    if (streams != null) {
      streams.close();
    }
    if (fixture != null) {
      fixture.close();
    }
  }

  /** The verdicts a consumer sends, as text: "ack ID", "fail ID", "ackEmit ID". */
  private static ClientInterceptor recording(List<String> sent) {
    return SentRequests.to(r -> {
      r.getAck().getIdsList().forEach(id -> sent.add("ack " + id));
      if (r.hasFail()) {
        sent.add("fail " + r.getFail().getId());
      }
      if (r.hasAckEmit()) {
        sent.add("ackEmit " + r.getAckEmit().getId());
      }
    });
  }

  /** A consumer of {@code source} from its beginning, group "g". */
  private static EchoMqConsumer.Builder consumer(String source) {
    return EchoMqConsumer.builder().target(fixture.target()).stream(source).group("g").startPosition(StartPosition.beginning());
  }

  @Test
  void an_emit_outside_the_allow_list_is_refused_and_the_held_delivery_is_answered_again() throws Exception {
    String source = "java:emit:denied";
    String sink = source + ":sink";
    AppendResult appended = streams.append(source, Fields.of("n", "1"));
    List<AckEmitException> refusals = Collections.synchronizedList(new ArrayList<>());
    List<EmittedEntry> emitted = Collections.synchronizedList(new ArrayList<>());
    List<VerdictError> hooked = Collections.synchronizedList(new ArrayList<>());
    try (EchoMqConsumer consumer =
        consumer(source)
            .onVerdictError(hooked::add)
            .handler(d -> {
              try {
                d.ackEmit(List.of(Emit.of("other:sink", Fields.of("source", d.id()))));
              } catch (AckEmitException refused) {
                refusals.add(refused);
                assertFalse(d.isSettled(), "a bad emit leaves the delivery unsettled");
              }
              emitted.addAll(d.ackEmit(List.of(Emit.of(sink, Fields.of("source", d.id())))));
            })
            .build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
      LiveSidecar.waitUntil(() -> emitted.size() == 1, "the second ackEmit");
    }
    assertEquals(1, refusals.size());
    assertEquals(VerdictError.Code.PERMISSION_DENIED, refusals.get(0).code());
    assertTrue(refusals.get(0).isHeld());
    assertEquals(List.of(VerdictError.Code.PERMISSION_DENIED), hooked.stream().map(VerdictError::code).toList());
    try (Resp redis = fixture.redis()) {
      assertEquals(0L, redis.callLong("XLEN", "other:sink"), "nothing written by the refused AckEmit");
      List<?> entries = (List<?>) redis.call("XRANGE", sink, "-", "+");
      assertEquals(1, entries.size());
      List<?> entry = (List<?>) entries.get(0);
      List<?> fields = (List<?>) entry.get(1);
      String streamId = new String((byte[]) entry.get(0), StandardCharsets.UTF_8);
      String id = null;
      String sourceId = null;
      for (int i = 0; i + 1 < fields.size(); i += 2) {
        String name = new String((byte[]) fields.get(i), StandardCharsets.UTF_8);
        String value = new String((byte[]) fields.get(i + 1), StandardCharsets.UTF_8);
        if (name.equals("id")) {
          id = value;
        } else if (name.equals("source")) {
          sourceId = value;
        }
      }
      assertNotNull(id);
      assertEquals(List.of(new EmittedEntry(id, streamId, sink)), List.copyOf(emitted));
      assertEquals(appended.id(), sourceId);
      assertEquals(0L, ((List<?>) redis.call("XPENDING", source, "g")).get(0));
    }
  }

  @Test
  void an_entry_a_peer_took_is_lease_lost_writes_nothing_and_gets_no_verdict() throws Exception {
    String source = "java:emit:stolen";
    String sink = source + ":sink";
    AppendResult appended = streams.append(source, Fields.of("n", "1"));
    List<String> sent = Collections.synchronizedList(new ArrayList<>());
    CountDownLatch running = new CountDownLatch(1);
    CountDownLatch stolen = new CountDownLatch(1);
    CompletableFuture<Object> outcome = new CompletableFuture<>();
    List<Delivery> started = Collections.synchronizedList(new ArrayList<>());
    try (EchoMqConsumer consumer =
        consumer(source)
            .intercept(recording(sent))
            .handler(d -> {
              started.add(d);
              running.countDown();
              stolen.await(30, TimeUnit.SECONDS);
              try {
                outcome.complete(d.ackEmit(List.of(Emit.of(sink, Fields.of("source", d.id())))));
              } catch (AckEmitException refused) {
                outcome.complete(refused);
                throw refused;
              }
            })
            .build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
      assertTrue(running.await(10, TimeUnit.SECONDS));
      try (Resp redis = fixture.redis()) {
        redis.call("XCLAIM", source, "g", "thief", "0", appended.streamId());
      }
      stolen.countDown();
      Object result = outcome.get(30, TimeUnit.SECONDS);
      assertTrue(result instanceof AckEmitException, "ackEmit of a stolen entry: " + result);
      AckEmitException refused = (AckEmitException) result;
      // The sidecar's lease refresh may notice the steal before the handler answers: then the
      // call was told LEASE_LOST first and the AckEmit is never sent.
      boolean toldFirst = refused.code() == null;
      if (toldFirst) {
        assertTrue(refused.getMessage().contains("not sent: the lease was lost"), refused.getMessage());
      } else {
        assertEquals(VerdictError.Code.LEASE_LOST, refused.code());
      }
      assertFalse(refused.isHeld());
      assertTrue(started.get(0).isSettled(), "a refusal other than a bad emit settles the delivery");
      assertEquals(
          toldFirst ? List.of() : List.of("ackEmit " + appended.id()),
          List.copyOf(sent),
          "at most one AckEmit, no Ack or Fail");
    }
    try (Resp redis = fixture.redis()) {
      assertEquals(0L, redis.callLong("XLEN", sink), "a call that lost its entry never writes its emits");
      List<?> pending = (List<?>) redis.call("XPENDING", source, "g", "-", "+", "10");
      assertEquals(1, pending.size());
      assertEquals("thief", new String((byte[]) ((List<?>) pending.get(0)).get(1), StandardCharsets.UTF_8));
    }
  }
}
