package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import org.junit.jupiter.api.Test;

class BackoffTest {
  @Test
  void delays_double_with_jitter_up_to_the_cap_and_reset() {
    Backoff backoff = new Backoff(Duration.ofMillis(100), Duration.ofMillis(1000));
    long[] ceilings = {100, 200, 400, 800, 1000, 1000};
    for (long ceiling : ceilings) {
      long ms = backoff.next().toMillis();
      assertTrue(ms >= ceiling / 2 && ms <= ceiling, ms + " not in [" + ceiling / 2 + ", " + ceiling + "]");
    }
    backoff.reset();
    assertTrue(backoff.next().toMillis() <= 100);
  }

  @Test
  void jitter_spreads_the_delays() {
    Backoff backoff = new Backoff(Duration.ofSeconds(1), Duration.ofSeconds(1));
    long first = backoff.next().toNanos();
    boolean differs = false;
    for (int i = 0; i < 20 && !differs; i++) {
      differs = backoff.next().toNanos() != first;
    }
    assertTrue(differs, "twenty equal delays: no jitter");
  }

  @Test
  void bad_bounds_are_refused() {
    assertThrows(IllegalArgumentException.class, () -> new Backoff(Duration.ZERO, Duration.ofSeconds(1)));
    assertThrows(IllegalArgumentException.class, () -> new Backoff(Duration.ofSeconds(2), Duration.ofSeconds(1)));
  }
}
