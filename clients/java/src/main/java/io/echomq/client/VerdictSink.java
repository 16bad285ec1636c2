package io.echomq.client;

import io.echomq.v1.Ack;
import io.echomq.v1.ConsumeRequest;
import java.util.List;
import java.util.concurrent.CompletableFuture;

/**
 * Where a delivery's verdict goes: the one call that delivered it. A sink whose call has ended
 * drops what it is given, because the ids are not held by any other call (the sidecar delivers
 * them again).
 */
interface VerdictSink {
  /**
   * Sends {@code request} on the call, after any acks it holds back; false when the call has ended
   * and it was dropped.
   */
  boolean send(ConsumeRequest request);

  /**
   * Acknowledges {@code delivery}; a call coalesces acks into one {@code Ack} message per short window.
   * False when the call has ended and the ack was dropped.
   */
  default boolean ack(Delivery delivery) {
    return send(ConsumeRequest.newBuilder().setAck(Ack.newBuilder().addIds(delivery.id())).build());
  }

  /**
   * Sends the Fail {@code request} of {@code delivery}; false when it was dropped: the call has
   * ended, or the delivery's lease was lost (the entry belongs to a peer now).
   */
  default boolean fail(Delivery delivery, ConsumeRequest request) {
    return send(request);
  }

  /**
   * Sends the AckEmit {@code request} of {@code delivery} (never coalesced with acks) and returns
   * the future of its answer: an {@link io.echomq.v1.Emitted}, a {@link VerdictError}, or null when
   * the call ended first. Null (nothing sent) when the call has ended or refuses verdicts. The
   * default sends it and answers nothing (null).
   */
  default CompletableFuture<Object> ackEmit(Delivery delivery, ConsumeRequest request) {
    return send(request) ? CompletableFuture.completedFuture(null) : null;
  }

  /** A refused AckEmit left {@code delivery} held (a bad emit): the call holds it again. */
  default void rehold(Delivery delivery) {}

  /**
   * Gives {@code deliveries} (of this call, never handed to a handler) back to the group: the
   * sidecar returns them at once with their delivery count restored. Nothing is sent by a sink that
   * cannot (the default).
   */
  default void release(List<Delivery> deliveries) {}

  /** False once verdicts given to this sink can no longer reach the sidecar. */
  default boolean isOpen() {
    return true;
  }
}
