package io.echomq.client.idempotency;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;

/**
 * An in-process store: a bounded seen-set (least recently recorded ids are forgotten first) and an
 * unbounded per-key map of highest ids. Forgets everything on restart. Thread-safe.
 */
public final class InMemoryIdempotencyStore implements IdempotencyStore {
  /** Default number of ids the seen-set keeps. */
  public static final int DEFAULT_SEEN_CAPACITY = 100_000;

  private final Map<String, Boolean> seen;
  private final ConcurrentHashMap<String, String> highest = new ConcurrentHashMap<>();

  /** A store keeping the last {@value #DEFAULT_SEEN_CAPACITY} ids seen. */
  public InMemoryIdempotencyStore() {
    this(DEFAULT_SEEN_CAPACITY);
  }

  /** A store keeping the last {@code seenCapacity} ids seen. */
  public InMemoryIdempotencyStore(int seenCapacity) {
    if (seenCapacity < 1) {
      throw new IllegalArgumentException("seenCapacity must be at least 1");
    }
    this.seen =
        new LinkedHashMap<>() {
          private static final long serialVersionUID = 1L;

          @Override
          protected boolean removeEldestEntry(Map.Entry<String, Boolean> eldest) {
            return size() > seenCapacity;
          }
        };
  }

  @Override
  public synchronized boolean isSeen(String id) {
    return seen.containsKey(id);
  }

  @Override
  public synchronized boolean markSeen(String id) {
    return seen.put(id, Boolean.TRUE) == null;
  }

  @Override
  public Optional<String> highest(String key) {
    return Optional.ofNullable(highest.get(key));
  }

  @Override
  public boolean advance(String key, String id) {
    boolean[] advanced = {false};
    highest.compute(
        key,
        (k, current) -> {
          if (current == null || id.compareTo(current) > 0) {
            advanced[0] = true;
            return id;
          }
          return current;
        });
    return advanced[0];
  }
}
