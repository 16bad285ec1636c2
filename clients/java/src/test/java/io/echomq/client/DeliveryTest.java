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
