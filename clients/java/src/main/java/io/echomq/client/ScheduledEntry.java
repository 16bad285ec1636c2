package io.echomq.client;

import java.time.Instant;
import java.util.Map;

/**
 * An entry scheduled with a deliver-at instant or a delay that has not entered its stream yet
 * ({@link EchoMqStreams#listScheduled}).
 *
 * @param id its branded id, as the append answered it
 * @param deliverAt when it is due to enter the stream
 * @param fields its fields as appended (with the stored {@code traceparent}, if any); unmodifiable
 */
public record ScheduledEntry(String id, Instant deliverAt, Map<String, byte[]> fields) {}
