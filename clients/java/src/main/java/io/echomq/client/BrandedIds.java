package io.echomq.client;

import java.time.Instant;

/**
 * The branded id in its text form: 28 lowercase hex characters, 6 bytes of unix milliseconds then
 * 8 bytes of sequence, big-endian. Fixed width, so comparing the text compares the bytes, which
 * orders entries like the stream they were first appended to.
 */
public final class BrandedIds {
  /** Length of the text form. */
  public static final int LENGTH = 28;

  private BrandedIds() {}

  /** True when {@code id} is 28 lowercase hex characters. */
  public static boolean isValid(String id) {
    if (id == null || id.length() != LENGTH) {
      return false;
    }
    for (int i = 0; i < LENGTH; i++) {
      char c = id.charAt(i);
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
        return false;
      }
    }
    return true;
  }

  /**
   * Orders two branded ids like their entries in the stream (negative: {@code a} is older).
   *
   * @throws IllegalArgumentException when either is not a branded id
   */
  public static int compare(String a, String b) {
    return check(a).compareTo(check(b));
  }

  /** The instant the id was minted (its first 6 bytes, unix milliseconds). */
  public static Instant mintedAt(String id) {
    return Instant.ofEpochMilli(Long.parseLong(check(id).substring(0, 12), 16));
  }

  /** The stream id {@code <ms>-<seq>} the entry got when it was first appended. */
  public static String toStreamId(String id) {
    check(id);
    return Long.parseLong(id.substring(0, 12), 16) + "-" + Long.toUnsignedString(Long.parseUnsignedLong(id.substring(12), 16));
  }

  static String check(String id) {
    if (!isValid(id)) {
      throw new IllegalArgumentException(
          "not a branded id (28 lowercase hex characters): " + (id == null ? "null" : '"' + id + '"'));
    }
    return id;
  }
}
