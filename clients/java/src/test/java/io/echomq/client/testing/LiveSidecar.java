package io.echomq.client.testing;

import io.echomq.client.EchoMqStreams;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.TestInstance;

/**
 * A test class against one real sidecar and Redis for all its tests ({@link SidecarFixture}),
 * started with brisk retries, with a producer on it.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
public abstract class LiveSidecar {
  /** Quick redeliveries (100 ms doubling to 1 s) and a 1 s shutdown grace. */
  protected static final List<String> SIDECAR_ARGS =
      List.of("--retry-backoff-initial-ms", "100", "--retry-backoff-max-ms", "1000", "--shutdown-grace-ms", "1000");

  protected SidecarFixture fixture;
  protected EchoMqStreams producer;

  /** The sidecar's consumer name in the groups. */
  protected abstract String consumerName();

  @BeforeAll
  void startSidecar() throws Exception {
    fixture = SidecarFixture.start(consumerName(), SIDECAR_ARGS);
    producer = EchoMqStreams.connect(fixture.target());
  }

  @AfterAll
  void stopSidecar() {
    if (producer != null) {
      producer.close();
    }
    if (fixture != null) {
      fixture.close();
    }
  }

  /** Polls {@code condition} every 10 ms; fails after 30 s, naming {@code what}. */
  public static void waitUntil(BooleanSupplier condition, String what) throws InterruptedException {
    long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (!condition.getAsBoolean()) {
      if (System.nanoTime() > until) {
        throw new AssertionError("not within 30 s: " + what);
      }
      Thread.sleep(10);
    }
  }
}
