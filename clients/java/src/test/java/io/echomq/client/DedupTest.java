package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.echomq.client.testing.LiveSidecar;
import io.echomq.client.testing.Resp;
import io.grpc.Status;
import java.util.HashSet;
import java.util.List;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/** Dedup keys on appends and batch entries, and {@link AppendResult#isDuplicate()}, against a real sidecar. */
class DedupTest extends LiveSidecar {
  @Override
  protected String consumerName() {
    return "dedup-java";
  }

  private long xlen(String stream) throws Exception {
    try (Resp redis = fixture.redis()) {
      return redis.callLong("XLEN", stream);
    }
  }

  @Test
  void a_retried_append_with_the_same_dedup_key_answers_the_first_one_and_writes_nothing() throws Exception {
    String stream = "java:dedup:" + System.nanoTime();
    AppendResult first = producer.append(stream, Fields.of("n", "1"), 0, null, "order-1");
    AppendResult retried = producer.appendAsync(stream, Fields.of("n", "1, again"), 0, null, "order-1").get();
    assertFalse(first.isDuplicate());
    assertTrue(retried.isDuplicate());
    assertTrue(retried.duplicate());
    assertEquals(new AppendResult(first.id(), first.streamId(), first.stream(), true), retried);
    List<AppendResult> plain =
        List.of(
            producer.append(stream, Fields.of("n", "2")),
            producer.append(stream, Fields.of("n", "2"), 0, null, ""),
            producer.append(stream, Fields.of("n", "2"), 0, null, null));
    assertTrue(plain.stream().noneMatch(AppendResult::isDuplicate));
    assertEquals(3, plain.stream().map(AppendResult::id).distinct().count());
    assertEquals(4, xlen(stream));
  }

  @Test
  void batch_entries_carry_their_own_dedup_keys() throws Exception {
    String stream = "java:dedup-batch:" + System.nanoTime();
    AppendResult single = producer.append(stream, Fields.of("n", "0"), 0, null, "k0");
    List<AppendResult> batch =
        producer.appendBatchEntries(
            stream,
            List.of(
                BatchEntry.of(Fields.of("n", "1"), "k1"),
                BatchEntry.of(Fields.of("n", "1"), "k1"),
                BatchEntry.of(Fields.of("n", "0"), "k0"),
                BatchEntry.of(Fields.of("n", "2")),
                BatchEntry.of(Fields.of("n", "3"), "")));
    assertEquals(
        List.of(false, true, true, false, false), batch.stream().map(AppendResult::isDuplicate).collect(Collectors.toList()));
    assertEquals(batch.get(0).id(), batch.get(1).id());
    assertEquals(batch.get(0).streamId(), batch.get(1).streamId());
    assertEquals(single.id(), batch.get(2).id());
    List<AppendResult> again =
        producer.appendBatchEntriesAsync(stream, List.of(BatchEntry.of(Fields.of("n", "1"), "k1")), 0, null).get();
    assertTrue(again.get(0).isDuplicate());
    assertEquals(batch.get(0).id(), again.get(0).id());
    assertEquals(4, xlen(stream));
    assertEquals(4, new HashSet<>(List.of(single.id(), batch.get(0).id(), batch.get(3).id(), batch.get(4).id())).size());
  }

  @Test
  void a_dedup_key_over_max_name_bytes_is_invalid_argument_and_writes_nothing() throws Exception {
    String stream = "java:dedup-long:" + System.nanoTime();
    String tooLong = "k".repeat(1025);
    EchoMqException one =
        assertThrows(EchoMqException.class, () -> producer.append(stream, Fields.of("n", "1"), 0, null, tooLong));
    assertEquals(Status.Code.INVALID_ARGUMENT, one.code());
    assertTrue(one.isPermanent());
    EchoMqException batch =
        assertThrows(
            EchoMqException.class,
            () -> producer.appendBatchEntries(stream, List.of(BatchEntry.of(Fields.of("n", "1"), tooLong))));
    assertEquals(Status.Code.INVALID_ARGUMENT, batch.code());
    assertEquals(0, xlen(stream));
    assertFalse(producer.append(stream, Fields.of("n", "1"), 0, null, tooLong.substring(1)).isDuplicate());
  }
}
