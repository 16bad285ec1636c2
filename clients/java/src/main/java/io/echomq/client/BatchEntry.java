package io.echomq.client;

import java.time.Duration;
import java.time.Instant;
import java.util.Map;
import java.util.Objects;

/**
 * One entry of {@link EchoMqStreams#appendBatchEntries(String, java.util.List, long, String)}: its
 * fields and, optionally, its dedup key and its schedule. A batch may mix entries with and without
 * keys, appended at once and scheduled.
 *
 * <pre>{@code
 * producer.appendBatchEntries("orders", List.of(
 *     BatchEntry.of(Fields.of("order", "42"), "order-42"),
 *     BatchEntry.of(Fields.of("remind", "42")).withDelay(Duration.ofHours(1)),
 *     BatchEntry.of(Fields.of("note", "no key: never deduplicated"))));
 * }</pre>
 *
 * @param fields the entry's fields (name → bytes)
 * @param dedupKey as {@link EchoMqStreams#append(String, Map, long, String, String)}'s: an entry
 *     whose key is recorded on the stream, or was used by an earlier entry of the same batch, is not
 *     written, and its result is the first one's with {@link AppendResult#isDuplicate()}; {@code
 *     null} or empty: none
 * @param deliverAt schedules the entry for this instant, as {@link EchoMqStreams#append(String,
 *     Map, Instant)}; {@code null}: at once
 * @param delay schedules the entry this long after the append, as {@link
 *     EchoMqStreams#append(String, Map, Duration)}; {@code null} or zero: at once
 */
public record BatchEntry(Map<String, byte[]> fields, String dedupKey, Instant deliverAt, Duration delay) {
  /** Checks that there are fields. */
  public BatchEntry {
    Objects.requireNonNull(fields, "fields");
  }

  /** An entry appended at once, with a dedup key or none ({@code null}). */
  public BatchEntry(Map<String, byte[]> fields, String dedupKey) {
    this(fields, dedupKey, null, null);
  }

  /** An entry without a dedup key. */
  public static BatchEntry of(Map<String, byte[]> fields) {
    return new BatchEntry(fields, null);
  }

  /** An entry with a dedup key ({@code null} or empty: none). */
  public static BatchEntry of(Map<String, byte[]> fields, String dedupKey) {
    return new BatchEntry(fields, dedupKey);
  }

  /** This entry, scheduled for {@code deliverAt} ({@code null}: at once). */
  public BatchEntry withDeliverAt(Instant deliverAt) {
    return new BatchEntry(fields, dedupKey, deliverAt, delay);
  }

  /** This entry, scheduled {@code delay} after the append ({@code null} or zero: at once). */
  public BatchEntry withDelay(Duration delay) {
    return new BatchEntry(fields, dedupKey, deliverAt, delay);
  }
}
