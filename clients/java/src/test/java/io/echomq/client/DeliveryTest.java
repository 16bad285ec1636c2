package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.echomq.v1.ConsumeRequest;
import io.echomq.v1.RawField;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

class DeliveryTest {
  private static final String ID = "0000000003e80000000000000005";

  private final List<ConsumeRequest> sent = new ArrayList<>();

  private Delivery delivery(boolean callOpen) {
    io.echomq.v1.Delivery proto =
        io.echomq.v1.Delivery.newBuilder()
            .setId(ID)
            .setStreamId("1000-5")
            .setStream("orders")
            .setGroup("billing")
            .setAttempts(2)
            .putPayload("n", ByteString.copyFromUtf8("1"))
            .addRawFields(RawField.newBuilder().setName(ByteString.copyFrom(new byte[] {(byte) 0xff})).setValue(ByteString.copyFromUtf8("v")))
            .build();
    return new Delivery(proto, request -> callOpen && sent.add(request));
  }

  @Test
  void a_delivery_is_settled_once() {
    Delivery d = delivery(true);
    assertTrue(d.fail("nope", Duration.ofMillis(300)));
    assertFalse(d.ack());
    assertFalse(d.deadLetter("again"));
    assertEquals(1, sent.size());
    assertEquals(ID, sent.get(0).getFail().getId());
    assertEquals(300_000_000, sent.get(0).getFail().getRetryAfter().getNanos());
    assertTrue(d.isSettled());
  }

  @Test
  void dead_letter_is_a_fail_with_the_flag() {
    Delivery d = delivery(true);
    assertTrue(d.deadLetter("cannot parse"));
    assertTrue(sent.get(0).getFail().getDeadLetter());
    assertEquals("cannot parse", sent.get(0).getFail().getReason());
    assertFalse(sent.get(0).getFail().hasRetryAfter());
  }

  @Test
  void dead_letter_is_a_poison_fail_that_keeps_the_old_flag() {
    assertTrue(delivery(true).deadLetter("cannot parse"));
    assertEquals(io.echomq.v1.FailKind.FAIL_KIND_POISON, sent.get(0).getFail().getKind());
    assertTrue(sent.get(0).getFail().getDeadLetter());
  }

  @Test
  void every_explicit_fail_sends_the_kind_it_means() {
    delivery(true).fail("bad row");
    delivery(true).fail("later", Duration.ofSeconds(1));
    delivery(true).fail("the database is down", FailKind.TRANSIENT);
    delivery(true).fail("rate limited", Duration.ofSeconds(2), FailKind.TRANSIENT);
    delivery(true).fail("cannot parse", FailKind.POISON);
    assertEquals(
        List.of(
            io.echomq.v1.FailKind.FAIL_KIND_MESSAGE,
            io.echomq.v1.FailKind.FAIL_KIND_MESSAGE,
            io.echomq.v1.FailKind.FAIL_KIND_TRANSIENT,
            io.echomq.v1.FailKind.FAIL_KIND_TRANSIENT,
            io.echomq.v1.FailKind.FAIL_KIND_POISON),
        sent.stream().map(r -> r.getFail().getKind()).toList());
    assertTrue(sent.stream().noneMatch(r -> r.getFail().getDeadLetter()), "a poison fail is sent by its kind alone");
    assertEquals(2, sent.get(3).getFail().getRetryAfter().getSeconds());
  }

  @Test
  void a_batch_verdict_sends_its_kind() {
    Verdict.fail("down", FailKind.TRANSIENT).applyTo(delivery(true));
    Verdict.fail("down", Duration.ofMillis(100), FailKind.TRANSIENT).applyTo(delivery(true));
    Verdict.fail("bad").applyTo(delivery(true));
    Verdict.deadLetter("poison").applyTo(delivery(true));
    assertEquals(
        List.of(
            io.echomq.v1.FailKind.FAIL_KIND_TRANSIENT,
            io.echomq.v1.FailKind.FAIL_KIND_TRANSIENT,
            io.echomq.v1.FailKind.FAIL_KIND_MESSAGE,
            io.echomq.v1.FailKind.FAIL_KIND_POISON),
        sent.stream().map(r -> r.getFail().getKind()).toList());
  }

  @Test
  void a_thrown_exceptions_class_says_the_kind() {
    assertEquals(FailKind.TRANSIENT, FailKind.of(new TransientException("the database is down", new RuntimeException())));
    assertEquals(FailKind.POISON, FailKind.of(new PoisonException("cannot parse")));
    assertEquals(FailKind.MESSAGE, FailKind.of(new IllegalStateException("bad row")));
  }

  @Test
  void a_verdict_for_an_ended_call_is_dropped() {
    Delivery d = delivery(false);
    assertFalse(d.ack());
    assertTrue(d.isSettled());
    assertTrue(sent.isEmpty());
  }

  @Test
  void fields_are_exposed_as_bytes_and_raw_names_kept() {
    Delivery d = delivery(true);
    assertEquals("1", d.payloadText("n"));
    assertEquals(2, d.attempts());
    assertEquals("orders", d.stream());
    assertEquals("billing", d.group());
    assertArrayEquals(new byte[] {(byte) 0xff}, d.rawFields().get(0).name());
  }

  @Test
  void a_lost_lease_completes_the_future_and_stops_every_verdict() throws Exception {
    Delivery d = delivery(true);
    var early = d.leaseLost();
    assertFalse(early.isDone());
    assertFalse(d.isLeaseLost());
    d.loseLease();
    d.signalLeaseLost();
    assertTrue(early.isDone(), "a future asked for before the loss completes");
    assertTrue(d.leaseLost().isDone(), "one asked for after it is complete already");
    assertTrue(d.isLeaseLost());
    assertTrue(d.isSettled());
    assertFalse(d.ack());
    assertFalse(d.fail("late"));
    assertFalse(d.deadLetter("late"));
    assertFalse(d.extend(Duration.ofSeconds(1)));
    assertTrue(sent.isEmpty(), "nothing is sent for a delivery whose lease was lost");
  }

  @Test
  void completing_the_returned_future_signals_nothing() {
    Delivery d = delivery(true);
    d.leaseLost().complete(null);
    assertFalse(d.leaseLost().isDone());
    assertFalse(d.isLeaseLost());
    assertTrue(d.ack());
  }
}
