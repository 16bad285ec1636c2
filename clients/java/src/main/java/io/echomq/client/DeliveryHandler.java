package io.echomq.client;

/**
 * Handles one delivery. Returning normally acknowledges it; throwing fails it with the exception's
 * message as the reason (it comes back after the subscription's backoff, an attempt spent). A
 * {@link TransientException} fails it without spending an attempt (the database is down), a {@link
 * PoisonException} dead-letters it now ({@link FailKind}). The handler may instead
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
   * @throws Exception to fail the delivery with the exception's message as the reason, of the kind
   *     its class says ({@link TransientException}, {@link PoisonException}; else {@link
   *     FailKind#MESSAGE})
   */
  void handle(Delivery delivery) throws Exception;
}
