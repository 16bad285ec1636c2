package io.echomq.client;

import java.util.List;

/**
 * Handles the deliveries of one frame together (opt-in, for work done in bulk such as one database
 * write per batch): 1 to {@code maxBatch} deliveries, in delivery order. Set it with
 * {@link EchoMqConsumer.Builder#batchHandler} instead of a {@link DeliveryHandler}.
 *
 * <p>The answer is one {@link Verdict} per delivery, in the same order; {@code null} (for the list
 * or an entry) acknowledges. Throwing fails every delivery the handler did not settle itself, with
 * the exception's message as the reason; a list of the wrong length fails them too. A delivery the
 * handler settled itself ({@link Delivery#ack()}, …) keeps that verdict, and one whose lease was
 * lost while the batch ran ({@link Delivery#isLeaseLost()}) gets none, whatever the list says.
 *
 * <pre>{@code
 * .batchHandler(batch -> {
 *   List<Verdict> verdicts = new ArrayList<>();
 *   for (boolean stored : db.insertAll(batch)) {
 *     verdicts.add(stored ? Verdict.ack() : Verdict.fail("insert failed"));
 *   }
 *   return verdicts;
 * })
 * }</pre>
 */
@FunctionalInterface
public interface BatchHandler {
  /**
   * Handles a batch.
   *
   * @param deliveries the deliveries of one frame, in delivery order (never empty)
   * @return one verdict per delivery, in the same order, or null to acknowledge them all
   * @throws Exception to fail every delivery not settled yet, with the exception's message
   */
  List<Verdict> handle(List<Delivery> deliveries) throws Exception;
}
