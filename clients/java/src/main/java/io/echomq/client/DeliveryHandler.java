package io.echomq.client;

/**
 * Handles one delivery. Returning normally acknowledges it; throwing fails it with the exception's
 * message as the reason (it comes back after the subscription's backoff). The handler may instead
 * settle explicitly ({@link Delivery#ack()}, {@link Delivery#fail(String, java.time.Duration)},
 * {@link Delivery#deadLetter(String)}); a settled delivery is not settled again.
 *
 * <p>Delivery is at-least-once: the same entry can come again (see the idempotency helpers in
 * {@link io.echomq.client.idempotency}).
 */
@FunctionalInterface
public interface DeliveryHandler {
  /**
   * Handles a delivery.
   *
   * @param delivery the entry and its verdicts
   * @throws Exception to fail the delivery with the exception's message as the reason
   */
  void handle(Delivery delivery) throws Exception;
}
