package io.echomq.client;

import java.time.Duration;
import java.util.concurrent.ThreadLocalRandom;

/**
 * Jittered exponential backoff for reconnects: the n-th delay is drawn uniformly from
 * [d/2, d] where d = min(max, initial × 2^n). The jitter keeps many clients of one restarted
 * sidecar from reconnecting in lock step; the lower half-bound keeps the delay from collapsing to
 * nothing.
 */
final class Backoff {
  private final long initialNanos;
  private final long maxNanos;
  private int attempt;

  Backoff(Duration initial, Duration max) {
    if (initial.isNegative() || initial.isZero() || max.compareTo(initial) < 0) {
      throw new IllegalArgumentException(
          "reconnect backoff needs 0 < initial <= max, got " + initial + " and " + max);
    }
    this.initialNanos = initial.toNanos();
    this.maxNanos = max.toNanos();
  }

  /** The delay before the next attempt; each call doubles the ceiling up to the maximum. */
  synchronized Duration next() {
    long ceiling = initialNanos;
    for (int i = 0; i < attempt && ceiling < maxNanos; i++) {
      ceiling = ceiling * 2;
    }
    ceiling = Math.min(ceiling, maxNanos);
    attempt++;
    long half = ceiling / 2;
    return Duration.ofNanos(half + ThreadLocalRandom.current().nextLong(ceiling - half + 1));
  }

  /** Starts over from the initial delay (after a successful subscribe). */
  synchronized void reset() {
    attempt = 0;
  }
}
