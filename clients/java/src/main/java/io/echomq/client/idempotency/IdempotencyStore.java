package io.echomq.client.idempotency;

import java.util.Optional;

/**
 * Where the idempotency helpers remember what was applied. Implementations must make each method
 * atomic on its own; {@link InMemoryIdempotencyStore} is the default.
 */
public interface IdempotencyStore {
  /** True when {@code id} was recorded by {@link #markSeen}. */
  boolean isSeen(String id);

  /**
   * Records {@code id} as processed.
   *
   * @return true when it was not recorded before
   */
  boolean markSeen(String id);

  /** The highest branded id applied for {@code key}, if any. */
  Optional<String> highest(String key);

  /**
   * Atomically records {@code id} as the highest applied for {@code key} when it is strictly newer
   * than the one recorded (or none is).
   *
   * @return true when {@code id} was recorded; false when an equal or newer one already was
   */
  boolean advance(String key, String id);
}
