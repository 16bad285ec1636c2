package io.echomq.client.idempotency;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import org.junit.jupiter.api.Test;

class IdempotencyTest {
  private static final String OLD = "0000000003e80000000000000005";
  private static final String NEW = "0000000003e80000000000000010";

  @Test
  void once_skips_an_id_processed_before() throws Exception {
    Idempotency dedup = new Idempotency();
    List<String> applied = new ArrayList<>();
    assertTrue(dedup.once(OLD, () -> applied.add("first")));
    assertFalse(dedup.once(OLD, () -> applied.add("duplicate")));
    assertEquals(List.of("first"), applied);
    assertTrue(dedup.seen(OLD));
  }

  @Test
  void a_failed_action_records_nothing_so_the_retry_runs() throws Exception {
    Idempotency dedup = new Idempotency();
    assertThrows(IllegalStateException.class, () -> dedup.once(OLD, () -> { throw new IllegalStateException("boom"); }));
    assertFalse(dedup.seen(OLD));
    assertTrue(dedup.once(OLD, () -> { }));
  }

  @Test
  void newer_wins_skips_older_and_equal_ids_per_key() throws Exception {
    Idempotency dedup = new Idempotency();
    List<String> applied = new ArrayList<>();
    assertTrue(dedup.applyIfNewer("order-1", NEW, () -> applied.add("new")));
    assertFalse(dedup.applyIfNewer("order-1", OLD, () -> applied.add("stale replay")));
    assertFalse(dedup.applyIfNewer("order-1", NEW, () -> applied.add("duplicate")));
    assertTrue(dedup.applyIfNewer("order-2", OLD, () -> applied.add("other key")));
    assertEquals(List.of("new", "other key"), applied);
    assertEquals(Optional.of(NEW), dedup.store().highest("order-1"));
  }

  @Test
  void the_in_memory_seen_set_is_bounded() {
    InMemoryIdempotencyStore store = new InMemoryIdempotencyStore(2);
    store.markSeen("a");
    store.markSeen("b");
    store.markSeen("c");
    assertFalse(store.isSeen("a"));
    assertTrue(store.isSeen("c"));
  }

  @Test
  void advance_is_strictly_monotonic() {
    InMemoryIdempotencyStore store = new InMemoryIdempotencyStore();
    assertTrue(store.advance("k", OLD));
    assertTrue(store.advance("k", NEW));
    assertFalse(store.advance("k", OLD));
    assertFalse(store.advance("k", NEW));
  }

  @Test
  void ids_must_be_branded() {
    Idempotency dedup = new Idempotency();
    assertThrows(IllegalArgumentException.class, () -> dedup.seen("1000-5"));
  }
}
