package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Instant;
import org.junit.jupiter.api.Test;

class BrandedIdsTest {
  @Test
  void text_order_is_stream_order() {
    // 1000-5 < 1000-16 < 1001-0: the hex text compares like the (ms, seq) pair.
    String a = "0000000003e80000000000000005";
    String b = "0000000003e80000000000000010";
    String c = "0000000003e90000000000000000";
    assertTrue(BrandedIds.compare(a, b) < 0);
    assertTrue(BrandedIds.compare(b, c) < 0);
    assertEquals(0, BrandedIds.compare(c, c));
    assertEquals("1000-16", BrandedIds.toStreamId(b));
    assertEquals(Instant.ofEpochMilli(1001), BrandedIds.mintedAt(c));
  }

  @Test
  void only_28_lowercase_hex_characters_are_branded_ids() {
    assertTrue(BrandedIds.isValid("0000000000010000000000000001"));
    assertFalse(BrandedIds.isValid("0000000000010000000000000001a"));
    assertFalse(BrandedIds.isValid("000000000001000000000000000A"));
    assertFalse(BrandedIds.isValid("1000-1"));
    assertFalse(BrandedIds.isValid(null));
    assertThrows(IllegalArgumentException.class, () -> BrandedIds.compare("x", "0000000000010000000000000001"));
  }
}
