/**
 * The Java client of the EchoMQ sidecar. Logging goes through {@link java.lang.System.Logger}
 * (loggers named after the classes), so it follows whatever backend the application routes the
 * JDK's platform logging to (java.util.logging by default; SLF4J or Log4j through their bridges).
 *
 * <h2>Layout</h2>
 * <ul>
 *   <li>{@link io.echomq.client.EchoMqConsumer}: one subscription (stream + group) served by a
 *       handler on a bounded pool; reconnects by itself, stops gracefully.</li>
 *   <li>{@link io.echomq.client.Delivery}: one hand-over of an entry, with its explicit verdicts.</li>
 *   <li>{@link io.echomq.client.EchoMqStreams}: the StreamService: {@code Append} and {@code
 *       AppendBatch}, idempotent with a dedup key ({@link io.echomq.client.BatchEntry} in a batch),
 *       {@code Read} (a page, or a lazy stream of a whole range) and {@code Trim} (safe by
 *       default); {@link io.echomq.client.Entry} is what a read returns. {@code EchoMqProducer}
 *       is its deprecated old name.</li>
 *   <li>{@link io.echomq.client.FlowControl}: how much a consumer takes on at once (max in
 *       flight, concurrency, max batch).</li>
 *   <li>{@link io.echomq.client.EchoMqAdmin}: describe a group; list and replay dead letters.</li>
 *   <li>{@link io.echomq.client.EchoMqException}: every sidecar error, with its gRPC code and
 *       whether retrying can help.</li>
 *   <li>{@link io.echomq.client.StartPosition}: where a new consumer group starts (no default).</li>
 *   <li>{@link io.echomq.client.BrandedIds}: the 28-hex branded id: check, compare, mint time.</li>
 *   <li>{@link io.echomq.client.idempotency}: seen-set and newer-wins helpers keyed by branded id.</li>
 *   <li>{@code io.echomq.v1}: the stubs, generated at build time from {@code proto/echomq/v1}.</li>
 * </ul>
 */
package io.echomq.client;
