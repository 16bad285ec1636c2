package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.Status;
import java.util.EnumSet;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The defaults and permanent codes every client shares (clients/CONTRACT.md). */
class DefaultsTest {
  private static EchoMqConsumer.Builder builder() {
    return EchoMqConsumer.builder().target("127.0.0.1:1").stream("s").group("g").startPosition(StartPosition.beginning());
  }

  @Test
  void concurrency_defaults_to_64_unset_and_to_max_in_flight_set() {
    assertEquals(1024, EchoMqConsumer.DEFAULT_MAX_IN_FLIGHT, "the adaptive window's default cap");
    assertEquals(64, EchoMqConsumer.DEFAULT_CONCURRENCY);
    assertEquals(64, builder().handler(d -> { }).effectiveConcurrency(), "max_in_flight unset: 64, not the cap");
    assertEquals(2000, builder().maxInFlight(2000).handler(d -> { }).effectiveConcurrency());
    assertEquals(10, builder().maxInFlight(10).handler(d -> { }).effectiveConcurrency());
    assertEquals(1, builder().batchHandler(b -> null).effectiveConcurrency(), "1 for a batch handler");
    assertEquals(3, builder().maxInFlight(10).concurrency(3).handler(d -> { }).effectiveConcurrency());
  }

  @Test
  void concurrency_above_max_in_flight_is_refused() {
    assertThrows(IllegalArgumentException.class, () -> builder().maxInFlight(2).concurrency(3).handler(d -> { }).build());
  }

  @Test
  void max_batch_defaults_to_the_smaller_of_256_and_max_in_flight() {
    assertEquals(256, builder().effectiveMaxBatch(), "max_in_flight unset: a quarter of the cap");
    assertEquals(256, builder().maxInFlight(1000).effectiveMaxBatch());
    assertEquals(8, builder().maxInFlight(8).effectiveMaxBatch());
  }

  @Test
  void the_permanent_codes_are_the_contracts_eight() {
    EnumSet<Status.Code> permanent =
        EnumSet.of(
            Status.Code.INVALID_ARGUMENT, Status.Code.OUT_OF_RANGE, Status.Code.NOT_FOUND, Status.Code.ALREADY_EXISTS,
            Status.Code.PERMISSION_DENIED, Status.Code.UNAUTHENTICATED, Status.Code.FAILED_PRECONDITION,
            Status.Code.UNIMPLEMENTED);
    for (Status.Code code : Status.Code.values()) {
      assertEquals(permanent.contains(code), EchoMqException.isPermanent(code), code.name());
    }
    for (Status.Code transientCode :
        List.of(Status.Code.UNAVAILABLE, Status.Code.DEADLINE_EXCEEDED, Status.Code.RESOURCE_EXHAUSTED,
            Status.Code.ABORTED, Status.Code.INTERNAL, Status.Code.UNKNOWN)) {
      assertFalse(new EchoMqException(transientCode, "x", null).isPermanent(), transientCode.name());
    }
    assertTrue(new EchoMqException(Status.Code.NOT_FOUND, "x", null).isPermanent());
  }
}
