package io.echomq.client;

import java.util.Map;
import java.util.Objects;

/**
 * One entry {@link Delivery#ackEmit(java.util.List)} appends.
 *
 * @param stream the stream key to append to
 * @param fields the entry's fields (not the reserved branded-id field {@code id}); see {@link
 *     Fields#of(String...)}
 */
public record Emit(String stream, Map<String, byte[]> fields) {
  /** Checks that both parts are given. */
  public Emit {
    Objects.requireNonNull(stream, "stream");
    Objects.requireNonNull(fields, "fields");
  }

  /**
   * An emit of {@code fields} to {@code stream}.
   *
   * @param stream the stream key
   * @param fields the entry's fields
   * @return the emit
   */
  public static Emit of(String stream, Map<String, byte[]> fields) {
    return new Emit(stream, fields);
  }
}
