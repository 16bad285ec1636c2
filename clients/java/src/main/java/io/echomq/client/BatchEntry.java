package io.echomq.client;

import java.util.Map;
import java.util.Objects;

/**
 * One entry of {@link EchoMqStreams#appendBatchEntries(String, java.util.List, long, String)}: its
 * fields and, optionally, its dedup key. A batch may mix entries with and without keys.
 *
 * <pre>{@code
 * producer.appendBatchEntries("orders", List.of(
 *     BatchEntry.of(Fields.of("order", "42"), "order-42"),
 *     BatchEntry.of(Fields.of("note", "no key: never deduplicated"))));
 * }</pre>
 *
 * @param fields the entry's fields (name → bytes)
 * @param dedupKey as {@link EchoMqStreams#append(String, Map, long, String, String)}'s: an entry
 *     whose key is recorded on the stream, or was used by an earlier entry of the same batch, is not
 *     written, and its result is the first one's with {@link AppendResult#isDuplicate()}; {@code
 *     null} or empty: none
 */
public record BatchEntry(Map<String, byte[]> fields, String dedupKey) {
  /** Checks that there are fields. */
  public BatchEntry {
    Objects.requireNonNull(fields, "fields");
  }

  /** An entry without a dedup key. */
  public static BatchEntry of(Map<String, byte[]> fields) {
    return new BatchEntry(fields, null);
  }

  /** An entry with a dedup key ({@code null} or empty: none). */
  public static BatchEntry of(Map<String, byte[]> fields, String dedupKey) {
    return new BatchEntry(fields, dedupKey);
  }
}
