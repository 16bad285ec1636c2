package io.echomq.client;

import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;

/** Builds entry fields (name → bytes) from text, for the common case of UTF-8 values. */
public final class Fields {
  private Fields() {}

  /**
   * Fields from alternating names and UTF-8 values: {@code Fields.of("order", "42", "state", "paid")}.
   *
   * @throws IllegalArgumentException for an odd number of arguments
   */
  public static Map<String, byte[]> of(String... namesAndValues) {
    if (namesAndValues.length % 2 != 0) {
      throw new IllegalArgumentException("Fields.of takes name, value pairs; got an odd number of arguments");
    }
    Map<String, byte[]> fields = new LinkedHashMap<>();
    for (int i = 0; i < namesAndValues.length; i += 2) {
      fields.put(namesAndValues[i], namesAndValues[i + 1].getBytes(StandardCharsets.UTF_8));
    }
    return fields;
  }
}
