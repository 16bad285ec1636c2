package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.echomq.client.testing.LiveSidecar;
import io.grpc.Status;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * Scheduled entries against a real sidecar: a deliver-at instant and a delay on append and on
 * batch entries, {@link AppendResult#isScheduled()}, {@link EchoMqStreams#listScheduled} and
 * {@link EchoMqStreams#scheduled} paging, and {@link EchoMqStreams#cancelScheduled} with its
 * {@link NotScheduledException}. The deliveries themselves are the conformance scenarios
 * scheduled_delivery and scheduled_cancel.
 */
class ScheduledTest extends LiveSidecar {
  @Override
  protected String consumerName() {
    return "scheduled-java";
  }

  private List<String> readIds(String stream) {
    return producer.read(stream, EchoMqStreams.Range.all(), 0).entries().stream().map(Entry::id).toList();
  }

  @Test
  void a_scheduled_append_is_listed_not_read_then_enters_the_stream_with_its_id() throws Exception {
    String stream = "java:scheduled:enters:" + System.nanoTime();
    Instant due = Instant.now().plusSeconds(1).truncatedTo(ChronoUnit.MILLIS);
    AppendResult later = producer.append(stream, Fields.of("n", "1"), due);
    assertTrue(later.isScheduled());
    assertEquals("", later.streamId());
    AppendResult now = producer.append(stream, Fields.of("n", "0"));
    assertFalse(now.isScheduled());
    assertNotEquals("", now.streamId());

    EchoMqStreams.ScheduledPage page = producer.listScheduled(stream, null, 0);
    assertEquals(1, page.total());
    assertFalse(page.hasMore());
    ScheduledEntry entry = page.entries().get(0);
    assertEquals(later.id(), entry.id());
    assertEquals(due, entry.deliverAt());
    assertEquals("1", new String(entry.fields().get("n"), StandardCharsets.UTF_8));
    assertEquals(List.of(now.id()), readIds(stream));

    long deadline = System.nanoTime() + Duration.ofSeconds(10).toNanos();
    while (readIds(stream).size() < 2) {
      assertTrue(System.nanoTime() < deadline, "the scheduled entry never entered the stream");
      Thread.sleep(50);
    }
    assertFalse(Instant.now().isBefore(due.minusMillis(5)), "entered the stream before it was due");
    assertEquals(List.of(now.id(), later.id()), readIds(stream));
    assertEquals(0, producer.listScheduled(stream, "", 0).total());
  }

  @Test
  void list_scheduled_pages_by_due_time_and_cancel_answers_the_due_time() {
    String stream = "java:scheduled:pages:" + System.nanoTime();
    List<AppendResult> results =
        producer.appendBatchEntries(
            stream,
            List.of(
                BatchEntry.of(Fields.of("n", "3")).withDelay(Duration.ofMinutes(3)),
                BatchEntry.of(Fields.of("n", "now")),
                BatchEntry.of(Fields.of("n", "1")).withDelay(Duration.ofMinutes(1)),
                BatchEntry.of(Fields.of("n", "2")).withDeliverAt(Instant.now().plus(Duration.ofMinutes(2)))));
    assertEquals(List.of(true, false, true, true), results.stream().map(AppendResult::isScheduled).toList());
    EchoMqStreams.ScheduledPage first = producer.listScheduled(stream, null, 2);
    assertEquals(3, first.total());
    assertTrue(first.hasMore());
    assertEquals(List.of(results.get(2).id(), results.get(3).id()), first.entries().stream().map(ScheduledEntry::id).toList());
    List<ScheduledEntry> all;
    try (Stream<ScheduledEntry> entries = producer.scheduled(stream, 1)) {
      all = entries.toList();
    }
    assertEquals(
        List.of(results.get(2).id(), results.get(3).id(), results.get(0).id()), all.stream().map(ScheduledEntry::id).toList());

    assertEquals(all.get(2).deliverAt(), producer.cancelScheduled(stream, results.get(0).id()));
    for (String id : List.of(results.get(0).id(), results.get(1).id())) { // cancelled; appended at once
      NotScheduledException e = assertThrows(NotScheduledException.class, () -> producer.cancelScheduled(stream, id));
      assertEquals(Status.Code.NOT_FOUND, e.code());
      assertTrue(e.isPermanent());
    }
    assertEquals(2, producer.listScheduled(stream, null, 0).total());
  }

  @Test
  void the_sidecars_refusals_are_echomq_exceptions() {
    String stream = "java:scheduled:refused:" + System.nanoTime();
    EchoMqException both =
        assertThrows(
            EchoMqException.class,
            () -> producer.append(stream, Fields.of("n", "1"), 0, null, null, Instant.now().plusSeconds(60), Duration.ofMinutes(1)));
    assertEquals(Status.Code.INVALID_ARGUMENT, both.code());
    EchoMqException negative =
        assertThrows(
            EchoMqException.class,
            () -> producer.appendBatchEntries(stream, List.of(BatchEntry.of(Fields.of("n", "1")).withDelay(Duration.ofMillis(-1500)))));
    assertEquals(Status.Code.INVALID_ARGUMENT, negative.code());
    EchoMqException badId = assertThrows(EchoMqException.class, () -> producer.cancelScheduled(stream, "not-a-branded-id"));
    assertEquals(Status.Code.INVALID_ARGUMENT, badId.code());
    assertFalse(badId instanceof NotScheduledException);
    assertInstanceOf(EchoMqException.class, badId);
    assertEquals(0, producer.listScheduled(stream, null, 0).total());
  }
}
