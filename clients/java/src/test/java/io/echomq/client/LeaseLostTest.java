package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.echomq.client.testing.LiveSidecar;
import io.echomq.client.testing.Resp;
import io.echomq.client.testing.SidecarFixture;
import io.echomq.v1.ConsumeRequest;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.MethodDescriptor;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * LEASE_LOST as a handler signal (clients/CONTRACT.md): a peer steals the entry while its handler
 * runs; the delivery's future completes, the handler is not interrupted, and nothing the handler
 * then does puts a verdict for it on the wire.
 */
class LeaseLostTest {
  @Test
  void a_stolen_delivery_is_signalled_and_sends_no_verdict() throws Exception {
    // Leases refreshed every ~330 ms, reclaim after 1 s idle: the theft is noticed quickly, and the
    // entry comes back from the idle thief soon after.
    try (SidecarFixture fixture =
            SidecarFixture.start("lease-java", List.of(
                "--reclaim-min-idle-ms", "1000", "--reclaim-interval-ms", "300", "--retry-backoff-initial-ms", "100"));
        EchoMqProducer producer = EchoMqProducer.connect(fixture.target())) {
      String stream = "lease:stolen";
      AppendResult entry = producer.append(stream, Fields.of("n", "1"));
      List<String> verdictsOnWire = Collections.synchronizedList(new ArrayList<>());
      List<VerdictError> errors = Collections.synchronizedList(new ArrayList<>());
      List<Integer> attempts = Collections.synchronizedList(new ArrayList<>());
      CountDownLatch running = new CountDownLatch(1);
      CompletableFuture<String> firstHandler = new CompletableFuture<>();
      ClientInterceptor wire = new ClientInterceptor() {
        @Override
        public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
          return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
            @Override
            public void sendMessage(Q message) {
              if (message instanceof ConsumeRequest r && (r.hasAck() || r.hasFail())) {
                verdictsOnWire.add((r.hasAck() ? "ack " + r.getAck().getIdsList() : "fail " + r.getFail().getId()));
              }
              super.sendMessage(message);
            }
          };
        }
      };
      try (EchoMqConsumer consumer =
          EchoMqConsumer.builder()
              .target(fixture.target()).stream(stream).group("g")
              .startPosition(StartPosition.beginning())
              .maxInFlight(4).concurrency(2)
              .intercept(wire)
              .onVerdictError(errors::add)
              .handler(d -> {
                attempts.add(d.attempts());
                if (d.attempts() > 1) {
                  return;
                }
                CompletableFuture<Void> lost = d.leaseLost();
                assertFalse(lost.isDone());
                running.countDown();
                lost.get(30, TimeUnit.SECONDS);
                firstHandler.complete(
                    "leaseLost=" + d.isLeaseLost() + " settled=" + d.isSettled()
                        + " interrupted=" + Thread.currentThread().isInterrupted()
                        + " ack()=" + d.ack() + " fail()=" + d.fail("too late"));
              })
              .build()) {
        consumer.start().get(10, TimeUnit.SECONDS);
        assertTrue(running.await(10, TimeUnit.SECONDS));
        try (Resp redis = fixture.redis()) {
          assertEquals(1, ((List<?>) redis.call("XCLAIM", stream, "g", "thief", "0", entry.streamId())).size());
        }
        assertEquals(
            "leaseLost=true settled=true interrupted=false ack()=false fail()=false",
            firstHandler.get(30, TimeUnit.SECONDS));
        assertEquals(List.of(), verdictsOnWire, "nothing sent for the stolen delivery");
        LiveSidecar.waitUntil(() -> attempts.size() == 2, "the entry back from the idle thief");
        LiveSidecar.waitUntil(() -> !verdictsOnWire.isEmpty(), "the redelivery's ack");
      }
      assertEquals(List.of("ack [" + entry.id() + "]"), verdictsOnWire, "one ack, the redelivery's");
      assertEquals(1, errors.size(), "only LEASE_LOST, no NOT_PENDING: " + errors);
      assertEquals(VerdictError.Code.LEASE_LOST, errors.get(0).code());
      assertEquals(entry.id(), errors.get(0).id());
      try (Resp redis = fixture.redis()) {
        assertEquals(0L, ((List<?>) redis.call("XPENDING", stream, "g")).get(0));
      }
    }
  }
}
