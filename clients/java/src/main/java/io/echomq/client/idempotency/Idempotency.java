package io.echomq.client.idempotency;

import io.echomq.client.BrandedIds;
import java.util.Objects;

/**
 * Seen-set and newer-wins deduplication by branded id (see the package documentation for the
 * at-least-once reasoning).
 *
 * <pre>{@code
 * Idempotency dedup = new Idempotency();          // in memory; or new Idempotency(myStore)
 * handler(d -> dedup.once(d.id(), () -> charge(d)));
 * handler(d -> dedup.applyIfNewer(d.payloadText("account"), d.id(), () -> saveBalance(d)));
 * }</pre>
 */
public final class Idempotency {
  /** An action that may throw; a throw leaves nothing recorded, so the entry is retried. */
  @FunctionalInterface
  public interface Action {
    /** Applies the effect. */
    void run() throws Exception;
  }

  private final IdempotencyStore store;

  /** Helpers over an {@link InMemoryIdempotencyStore}. */
  public Idempotency() {
    this(new InMemoryIdempotencyStore());
  }

  /** Helpers over {@code store}. */
  public Idempotency(IdempotencyStore store) {
    this.store = Objects.requireNonNull(store, "store");
  }

  /** The store behind these helpers. */
  public IdempotencyStore store() {
    return store;
  }

  /** True when {@code id} was processed (recorded) before. */
  public boolean seen(String id) {
    return store.isSeen(check(id));
  }

  /**
   * Runs {@code action} unless {@code id} was processed before, then records it. If the action
   * throws, nothing is recorded and the exception propagates (the delivery fails and comes again).
   * Two copies of one id handled at the very same time may both run: serialize per id, or use a
   * store that records in the effect's own transaction, when that matters.
   *
   * @return true when the action ran; false when the id was a duplicate
   */
  public boolean once(String id, Action action) throws Exception {
    if (store.isSeen(check(id))) {
      return false;
    }
    action.run();
    store.markSeen(id);
    return true;
  }

  /** True when {@code id} is newer than the highest applied for {@code key} (or none was). */
  public boolean isNewer(String key, String id) {
    check(id);
    return store.highest(Objects.requireNonNull(key, "key")).map(h -> id.compareTo(h) > 0).orElse(true);
  }

  /**
   * Newer-wins: runs {@code action} only when {@code id} is newer than the highest branded id
   * applied for {@code key}, then records it. An older or equal id (a replay, a duplicate) is
   * skipped. If the action throws, nothing is recorded. Concurrent calls for one key should be
   * serialized by the caller (for example by partitioning work by key).
   *
   * @return true when the action ran
   */
  public boolean applyIfNewer(String key, String id, Action action) throws Exception {
    if (!isNewer(key, id)) {
      return false;
    }
    action.run();
    store.advance(key, id);
    return true;
  }

  private static String check(String id) {
    if (!BrandedIds.isValid(id)) {
      throw new IllegalArgumentException("not a branded id (28 lowercase hex characters): " + id);
    }
    return id;
  }
}
