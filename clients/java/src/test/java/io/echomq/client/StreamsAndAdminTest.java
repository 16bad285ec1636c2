package io.echomq.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.echomq.client.EchoMqAdmin.BusyKey;
import io.echomq.client.EchoMqAdmin.DeadLetter;
import io.echomq.client.EchoMqAdmin.DeadLetterPage;
import io.echomq.client.EchoMqAdmin.GroupDescription;
import io.echomq.client.EchoMqAdmin.ReplayResult;
import io.echomq.client.EchoMqStreams.Range;
import io.echomq.client.EchoMqStreams.ReadPage;
import io.echomq.client.EchoMqStreams.Trim;
import io.echomq.client.EchoMqStreams.TrimResult;
import io.echomq.client.testing.LiveSidecar;
import io.echomq.client.testing.Resp;
import io.grpc.Status;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** StreamService Read and Trim, and the AdminService, against a real sidecar and Redis. */
class StreamsAndAdminTest extends LiveSidecar {
  private EchoMqStreams streams;
  private EchoMqAdmin admin;

  @Override
  protected String consumerName() {
    return "streams-admin-java";
  }

  @BeforeAll
  void clients() {
    streams = EchoMqStreams.connect(fixture.target());
    admin = EchoMqAdmin.connect(fixture.target());
  }

  @AfterAll
  void closeClients() {
    streams.close();
    admin.close();
  }

  private List<AppendResult> appendN(String stream, int n) {
    List<Map<String, byte[]>> entries = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      entries.add(Fields.of("n", String.valueOf(i)));
    }
    return producer.appendBatch(stream, entries);
  }

  @Test
  void read_pages_by_next_start_id_and_read_all_streams_every_entry_in_order() {
    String stream = "read:paging";
    List<AppendResult> written = appendN(stream, 250);

    ReadPage first = streams.read(stream, Range.all(), 100);
    assertEquals(100, first.entries().size());
    assertTrue(first.hasMore());
    assertEquals(written.get(100).streamId(), first.nextStartId());
    assertEquals(written.get(0).id(), first.entries().get(0).id());
    assertEquals("0", first.entries().get(0).payloadText("n"));
    assertFalse(first.entries().get(0).payload().containsKey("id"), "the reserved field is not payload");

    ReadPage last = streams.read(stream, Range.all().fromId(written.get(200).streamId()), 100);
    assertEquals(50, last.entries().size());
    assertFalse(last.hasMore());

    List<String> all = streams.readAll(stream, Range.all(), 40).map(Entry::id).collect(Collectors.toList());
    assertEquals(written.stream().map(AppendResult::id).collect(Collectors.toList()), all, "7 pages of 40, nothing lost or doubled");

    ReadPage middle =
        streams.read(stream, Range.all().fromId(written.get(10).streamId()).toId(written.get(19).streamId()), 0);
    assertEquals(10, middle.entries().size(), "both bounds inclusive");
    assertEquals(written.get(19).streamId(), middle.entries().get(9).streamId());
  }

  @Test
  void read_by_instant_bounds_by_append_time() throws Exception {
    String stream = "read:instant";
    AppendResult before = producer.append(stream, Fields.of("n", "before"));
    Thread.sleep(20);
    Instant cut = Instant.now();
    Thread.sleep(20);
    AppendResult after = producer.append(stream, Fields.of("n", "after"));

    List<Entry> since = streams.readAll(stream, Range.all().from(cut)).collect(Collectors.toList());
    assertEquals(List.of(after.id()), since.stream().map(Entry::id).toList());
    List<Entry> until = streams.readAll(stream, Range.all().to(cut)).collect(Collectors.toList());
    assertEquals(List.of(before.id()), until.stream().map(Entry::id).toList());
    assertTrue(!since.get(0).mintedAt().isBefore(cut), "minted at " + since.get(0).mintedAt());
  }

  @Test
  void read_of_a_key_that_is_not_a_stream_is_a_permanent_error() throws Exception {
    try (Resp redis = fixture.redis()) {
      redis.call("SET", "read:not-a-stream", "x");
    }
    EchoMqException e = assertThrows(EchoMqException.class, () -> streams.read("read:not-a-stream", Range.all(), 10));
    assertEquals(Status.Code.FAILED_PRECONDITION, e.code());
    assertTrue(e.isPermanent());
  }

  @Test
  void trim_is_safe_by_default_and_ignoring_groups_trims_as_asked() throws Exception {
    String stream = "trim:safe";
    List<AppendResult> written = appendN(stream, 5);
    try (Resp redis = fixture.redis()) {
      // A group that has read nothing yet: every entry is still to be delivered to it.
      redis.call("XGROUP", "CREATE", stream, "g", "0");
    }
    TrimResult safe = streams.trim(stream, Trim.maxLen(2));
    assertEquals(0, safe.trimmed());
    assertTrue(safe.heldBackByGroups());

    TrimResult forced = streams.trim(stream, Trim.maxLen(2).ignoringGroups());
    assertEquals(3, forced.trimmed());
    assertEquals(written.get(3).streamId(), forced.appliedMinId());
    assertEquals(List.of(written.get(3).id(), written.get(4).id()),
        streams.readAll(stream, Range.all()).map(Entry::id).toList());
  }

  @Test
  void trim_by_min_id_and_before_an_instant_without_groups() throws Exception {
    String stream = "trim:bounds";
    List<AppendResult> written = appendN(stream, 4);
    assertEquals(1, streams.trim(stream, Trim.minId(written.get(1).streamId())).trimmed());
    Thread.sleep(20);
    Instant cut = Instant.now();
    TrimResult before = streams.trim(stream, Trim.before(cut));
    assertEquals(3, before.trimmed());
    assertFalse(before.heldBackByGroups());
    assertEquals(List.of(), streams.readAll(stream, Range.all()).toList());
  }

  @Test
  void describe_group_reports_pending_lag_consumers_and_length() throws Exception {
    String stream = "admin:describe";
    List<AppendResult> written = appendN(stream, 3);
    try (Resp redis = fixture.redis()) {
      redis.call("XGROUP", "CREATE", stream, "g", "0");
      redis.call("XREADGROUP", "GROUP", "g", "reader-1", "COUNT", "2", "STREAMS", stream, ">");
    }
    GroupDescription g = admin.describeGroup(stream, "g");
    assertEquals(stream, g.stream());
    assertEquals("g", g.group());
    assertEquals(2, g.pending());
    assertEquals(1, g.lag().orElseThrow());
    assertEquals(written.get(1).streamId(), g.lastDeliveredId());
    assertEquals(1, g.consumers().size());
    assertEquals("reader-1", g.consumers().get(0).name());
    assertEquals(2, g.consumers().get(0).pending());
    assertEquals(written.get(0).streamId(), g.oldestPendingId().orElseThrow());
    assertTrue(g.oldestPendingAge().isPresent());
    assertEquals(1, g.maxDeliveryCount());
    assertEquals(3, g.streamLength());
    assertEquals(List.of(), g.shards());

    EchoMqException missing = assertThrows(EchoMqException.class, () -> admin.describeGroup(stream, "no-such-group"));
    assertEquals(Status.Code.NOT_FOUND, missing.code());
    assertTrue(missing.isPermanent());
  }

  @Test
  void describe_group_reports_busy_keys_with_per_key_limits() throws Exception {
    String stream = "admin:busy-keys";
    List<AppendResult> written = new ArrayList<>();
    for (String key : List.of("c0", "c0", "c1", "c0")) {
      written.add(producer.append(stream, Fields.of("customer", key)));
    }
    CountDownLatch release = new CountDownLatch(1);
    try (EchoMqConsumer consumer =
        EchoMqConsumer.builder().target(fixture.target()).stream(stream).group("g")
            .startPosition(StartPosition.beginning())
            .flowControl(FlowControl.builder().maxInFlight(8).build())
            .keyField("customer")
            .maxInFlightPerKey(1)
            .handler(d -> release.await())
            .build()) {
      try {
        consumer.start().get(10, TimeUnit.SECONDS);
        waitUntil(() -> {
          GroupDescription g = admin.describeGroup(stream, "g");
          return g.keyedEntries() == 4 && g.busyKeys().size() == 2;
        }, "4 keyed entries over 2 busy keys");
        GroupDescription g = admin.describeGroup(stream, "g");
        BusyKey c0 = g.busyKeys().get(0);
        BusyKey c1 = g.busyKeys().get(1);
        assertEquals("c0", c0.keyUtf8());
        assertEquals(3, c0.entries());
        assertEquals(written.get(0).streamId(), c0.headId());
        assertFalse(c0.headConsumer().isEmpty());
        assertEquals("c1", c1.keyUtf8());
        assertEquals(1, c1.entries());
        assertEquals(written.get(2).streamId(), c1.headId());
        assertEquals(c0.headConsumer(), c1.headConsumer());
      } finally {
        release.countDown(); // else closing waits for the held handlers
      }
    }
  }

  @Test
  void dead_letters_are_listed_in_pages_and_replayed_to_their_stream() throws Exception {
    String stream = "admin:dead-letters";
    List<AppendResult> written = appendN(stream, 3);
    try (EchoMqConsumer consumer =
        EchoMqConsumer.builder().target(fixture.target()).stream(stream).group("g")
            .startPosition(StartPosition.beginning())
            .handler(d -> d.deadLetter("poison " + d.payloadText("n")))
            .build()) {
      consumer.start().get(10, TimeUnit.SECONDS);
      waitUntil(() -> admin.listDeadLetters(stream).deadLetters().size() == 3, "three dead letters");
    }

    DeadLetterPage page = admin.listDeadLetters(stream, null, null, 2);
    assertEquals(2, page.deadLetters().size());
    assertTrue(page.hasMore());
    DeadLetterPage rest = admin.listDeadLetters(stream, null, page.nextStartId(), 2);
    assertEquals(1, rest.deadLetters().size());
    assertFalse(rest.hasMore());

    List<DeadLetter> all = admin.deadLetters(stream, "").toList();
    assertEquals(written.stream().map(AppendResult::id).sorted().toList(), all.stream().map(d -> d.entry().id()).sorted().toList(),
        "each keeps its branded id");
    DeadLetter first = all.get(0);
    assertEquals(stream, first.sourceStream());
    assertEquals("g", first.group());
    assertEquals(1, first.attempts());
    assertEquals("poison " + first.entry().payloadText("n"), first.reason());
    assertTrue(written.stream().anyMatch(w -> w.streamId().equals(first.sourceId())));
    assertFalse(first.entry().payload().keySet().stream().anyMatch(k -> k.startsWith("echomq.")), "metadata is not payload");

    ReplayResult one = admin.replayDeadLetters(stream, null, List.of(first.entry().streamId(), "1-1"));
    assertEquals(1, one.replayed().size());
    assertEquals(first.entry().id(), one.replayed().get(0).id());
    assertEquals(first.entry().streamId(), one.replayed().get(0).deadLetterId());
    assertEquals(List.of("1-1"), one.notFoundIds());

    ReplayResult others = admin.replayOldestDeadLetters(stream, null, 10);
    assertEquals(2, others.replayed().size());
    assertEquals(0, admin.deadLetters(stream, null).count());
    List<Entry> back = streams.readAll(stream, Range.all().fromId(one.replayed().get(0).streamId())).toList();
    assertEquals(3, back.size(), "all three are entries of the stream again");
    assertEquals(first.entry().id(), back.get(0).id());
  }
}
