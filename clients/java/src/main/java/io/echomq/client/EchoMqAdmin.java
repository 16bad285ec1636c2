package io.echomq.client;

import io.echomq.v1.AdminServiceGrpc;
import io.echomq.v1.DescribeGroupRequest;
import io.echomq.v1.DescribeGroupResponse;
import io.echomq.v1.ListDeadLettersRequest;
import io.echomq.v1.ListDeadLettersResponse;
import io.echomq.v1.ReplayDeadLettersRequest;
import io.echomq.v1.ReplayDeadLettersResponse;
import io.grpc.Channel;
import io.grpc.ManagedChannel;
import java.time.Duration;
import java.time.Instant;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Objects;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * The sidecar's AdminService: what a group is doing, and the dead letters it gave up on, listed
 * and moved back. Thread-safe.
 *
 * <pre>{@code
 * try (var admin = EchoMqAdmin.connect("127.0.0.1:50051")) {
 *   GroupDescription billing = admin.describeGroup("orders", "billing");
 *   System.out.println(billing.pending() + " pending, lag " + billing.lag());
 *   admin.deadLetters("orders", null).forEach(d -> System.out.println(d.entry().id() + ": " + d.reason()));
 *   ReplayResult replayed = admin.replayOldestDeadLetters("orders", null, 100); // back to "orders"
 * }
 * }</pre>
 *
 * <p>A {@code deadLetterStream} argument of {@code null} or {@code ""} means the stream's default,
 * {@code <stream>:dlq} (on a Redis Cluster {@code {<stream>}:dlq} when the name has no hash tag);
 * for a sharded stream, name a shard's key, since each shard has its own.
 *
 * <p>Errors are {@link EchoMqException}s: INVALID_ARGUMENT for an empty or bad name or id, or a
 * dead-letter stream equal to the source; NOT_FOUND when the stream or group to describe does not
 * exist; FAILED_PRECONDITION when a key is not a stream, or a replay's source stream has no
 * consumer group (the entries would reach no one); UNAVAILABLE when the sidecar or Redis cannot be
 * reached; DEADLINE_EXCEEDED past the per-call timeout ({@link #withTimeout}, default 30 s).
 */
public final class EchoMqAdmin implements AutoCloseable {
  /** Default deadline of one call. Replays move 100 entries per script run and may take a while. */
  public static final Duration DEFAULT_TIMEOUT = Duration.ofSeconds(30);
  /** The most dead letters one list or replay call takes. */
  public static final int MAX_COUNT = 10_000;

  private final ManagedChannel ownedChannel;
  private final AdminServiceGrpc.AdminServiceBlockingStub stub;
  private final Duration timeout;

  private EchoMqAdmin(Channel channel, ManagedChannel owned, Duration timeout) {
    this.ownedChannel = owned;
    this.stub = AdminServiceGrpc.newBlockingStub(channel);
    this.timeout = timeout;
  }

  /** An admin client on its own channel to {@code host:port} or {@code unix:/path}; {@link #close()} closes it. */
  public static EchoMqAdmin connect(String target) {
    ManagedChannel channel = Targets.open(target);
    return new EchoMqAdmin(channel, channel, DEFAULT_TIMEOUT);
  }

  /** An admin client on a channel the caller owns (and closes). */
  public static EchoMqAdmin create(Channel channel) {
    return new EchoMqAdmin(Objects.requireNonNull(channel, "channel"), null, DEFAULT_TIMEOUT);
  }

  /** This client with another per-call deadline (default 30 s); shares the channel. */
  public EchoMqAdmin withTimeout(Duration timeout) {
    return new EchoMqAdmin(stub.getChannel(), null, Objects.requireNonNull(timeout, "timeout"));
  }

  /**
   * A consumer group's state (XINFO GROUPS, XINFO CONSUMERS, XPENDING, XLEN).
   *
   * @param stream the stream key, or a sharded stream's name (then the answer sums its shards and
   *     lists each in {@link GroupDescription#shards()})
   * @throws EchoMqException NOT_FOUND when the stream or the group does not exist
   */
  public GroupDescription describeGroup(String stream, String group) {
    DescribeGroupRequest request = DescribeGroupRequest.newBuilder().setStream(stream).setGroup(group).build();
    return GroupDescription.of(
        Rpc.call(() -> deadlined().describeGroup(request), "describing group \"" + group + "\" of stream \"" + stream + "\""));
  }

  /** The oldest 100 dead letters of {@code stream}'s default dead-letter stream. */
  public DeadLetterPage listDeadLetters(String stream) {
    return listDeadLetters(stream, null, null, 0);
  }

  /**
   * One page of dead letters, oldest first (XRANGE on the dead-letter stream).
   *
   * @param stream the source stream (may be null when {@code deadLetterStream} is given)
   * @param deadLetterStream null or empty: the stream's default
   * @param startId the first dead-letter stream id to return, inclusive; null or empty: the oldest.
   *     Pass the previous page's {@link DeadLetterPage#nextStartId()} to go on.
   * @param count the most to return, 1 to {@value #MAX_COUNT}; 0: 100
   */
  public DeadLetterPage listDeadLetters(String stream, String deadLetterStream, String startId, int count) {
    checkCount(count);
    ListDeadLettersRequest request =
        ListDeadLettersRequest.newBuilder()
            .setStream(Rpc.orEmpty(stream))
            .setDeadLetterStream(Rpc.orEmpty(deadLetterStream))
            .setStartId(Rpc.orEmpty(startId))
            .setCount(count)
            .build();
    ListDeadLettersResponse response =
        Rpc.call(() -> deadlined().listDeadLetters(request), "listing the dead letters of stream \"" + stream + "\"");
    List<DeadLetter> deadLetters = new ArrayList<>(response.getDeadLettersCount());
    response.getDeadLettersList().forEach(d -> deadLetters.add(DeadLetter.of(d)));
    return new DeadLetterPage(
        Collections.unmodifiableList(deadLetters), response.getNextStartId(), List.copyOf(response.getOversizedIdsList()));
  }

  /**
   * Every dead letter, oldest first, read lazily 1,000 at a time (paging by {@code next_start_id}).
   * A failed page throws {@link EchoMqException} from the stream's terminal operation.
   *
   * @param deadLetterStream null or empty: the stream's default
   */
  public Stream<DeadLetter> deadLetters(String stream, String deadLetterStream) {
    return Rpc.paged(
        "",
        from -> {
          DeadLetterPage read = listDeadLetters(stream, deadLetterStream, from, 1000);
          return new Rpc.Page<>(read.deadLetters(), read.hasMore() ? read.nextStartId() : null);
        });
  }

  /**
   * Moves the named dead letters back to {@code stream}: each is appended there (a new stream id,
   * the same branded id, the original payload) and deleted from the dead-letter stream, in one
   * script, so a crash neither loses nor duplicates one. Every group of the stream reads a
   * replayed entry again, also one that had acknowledged it (the branded id tells it apart).
   *
   * @param deadLetterStream null or empty: the stream's default
   * @param ids dead-letter stream ids ({@link DeadLetter#entry()}{@code .streamId()}), 1 to
   *     {@value #MAX_COUNT}; ids not there are reported in {@link ReplayResult#notFoundIds()}
   * @throws EchoMqException FAILED_PRECONDITION when the stream has no consumer group (an error
   *     after the first batch of 100 says how many moved before it)
   */
  public ReplayResult replayDeadLetters(String stream, String deadLetterStream, List<String> ids) {
    if (ids.isEmpty()) {
      throw new IllegalArgumentException("name at least one dead-letter id, or use replayOldestDeadLetters");
    }
    return replay(ReplayDeadLettersRequest.newBuilder().setStream(stream)
        .setDeadLetterStream(Rpc.orEmpty(deadLetterStream)).addAllIds(ids).build());
  }

  /**
   * Moves the oldest {@code count} dead letters back to {@code stream}, as {@link
   * #replayDeadLetters}. Dead letters of another source sharing the dead-letter stream stay (see
   * {@link ReplayResult#otherSourceIds()}).
   *
   * @param count 1 to {@value #MAX_COUNT}; 0: 100
   */
  public ReplayResult replayOldestDeadLetters(String stream, String deadLetterStream, int count) {
    checkCount(count);
    return replay(ReplayDeadLettersRequest.newBuilder().setStream(stream)
        .setDeadLetterStream(Rpc.orEmpty(deadLetterStream)).setCount(count).build());
  }

  private ReplayResult replay(ReplayDeadLettersRequest request) {
    ReplayDeadLettersResponse response =
        Rpc.call(() -> deadlined().replayDeadLetters(request), "replaying dead letters to stream \"" + request.getStream() + "\"");
    List<ReplayResult.Replayed> replayed = new ArrayList<>(response.getReplayedCount());
    response.getReplayedList().forEach(r -> replayed.add(new ReplayResult.Replayed(r.getId(), r.getDeadLetterId(), r.getStreamId())));
    return new ReplayResult(
        Collections.unmodifiableList(replayed), List.copyOf(response.getNotFoundIdsList()),
        List.copyOf(response.getOtherSourceIdsList()));
  }

  /** Closes the channel if this client opened it. */
  @Override
  public void close() {
    Rpc.close(ownedChannel);
  }

  private AdminServiceGrpc.AdminServiceBlockingStub deadlined() {
    return stub.withDeadlineAfter(timeout.toNanos(), TimeUnit.NANOSECONDS);
  }

  private static void checkCount(int count) {
    if (count < 0 || count > MAX_COUNT) {
      throw new IllegalArgumentException("count must be 0 (the default, 100) to " + MAX_COUNT + ", got " + count);
    }
  }

  /**
   * A consumer group's state.
   *
   * @param stream the stream key
   * @param group the group
   * @param pending entries delivered and not yet acknowledged (the PEL's size)
   * @param lag entries appended that the group has not read yet; empty when Redis cannot say
   *     (after deletions or trimming in some cases, or before Redis 7.0)
   * @param lastDeliveredId the group's last-delivered stream id (empty for a sharded stream's sum)
   * @param consumers the group's consumers
   * @param oldestPendingId the oldest pending entry's stream id; empty when nothing is pending
   * @param oldestPendingAge how long ago the oldest pending entry was appended; empty when nothing
   *     is pending
   * @param maxDeliveryCount the highest delivery count among the oldest 10,000 pending entries
   * @param streamLength entries in the stream (XLEN)
   * @param shards for a sharded stream, each shard's state in shard order (the fields above then
   *     add them up); empty for a plain stream
   * @param keyedEntries per-key limits ({@link EchoMqConsumer.Builder#keyField}): the group's
   *     pending entries that hold or wait for their key; 0 when the group has no key field
   * @param busyKeys the keys with entries held or waiting, the busiest first: at most 100, from
   *     the first 10,000 keyed entries
   */
  public record GroupDescription(
      String stream, String group, long pending, OptionalLong lag, String lastDeliveredId,
      List<ConsumerDescription> consumers, Optional<String> oldestPendingId, Optional<Duration> oldestPendingAge,
      long maxDeliveryCount, long streamLength, List<GroupDescription> shards, long keyedEntries,
      List<BusyKey> busyKeys) {

    /** The description without per-key limits, as it was before {@code keyedEntries} and {@code busyKeys}. */
    public GroupDescription(
        String stream, String group, long pending, OptionalLong lag, String lastDeliveredId,
        List<ConsumerDescription> consumers, Optional<String> oldestPendingId, Optional<Duration> oldestPendingAge,
        long maxDeliveryCount, long streamLength, List<GroupDescription> shards) {
      this(stream, group, pending, lag, lastDeliveredId, consumers, oldestPendingId, oldestPendingAge,
          maxDeliveryCount, streamLength, shards, 0, List.of());
    }

    static GroupDescription of(DescribeGroupResponse r) {
      List<ConsumerDescription> consumers = new ArrayList<>(r.getConsumersCount());
      r.getConsumersList().forEach(c -> consumers.add(new ConsumerDescription(c.getName(), c.getPending(), Rpc.toJava(c.getIdle()))));
      List<GroupDescription> shards = new ArrayList<>(r.getShardsCount());
      r.getShardsList().forEach(s -> shards.add(of(s)));
      List<BusyKey> busyKeys = new ArrayList<>(r.getBusyKeysCount());
      r.getBusyKeysList().forEach(k ->
          busyKeys.add(new BusyKey(k.getKey().toByteArray(), k.getEntries(), k.getHeadId(), k.getHeadConsumer())));
      return new GroupDescription(
          r.getStream(), r.getGroup(), r.getPending(), r.hasLag() ? OptionalLong.of(r.getLag()) : OptionalLong.empty(),
          r.getLastDeliveredId(), Collections.unmodifiableList(consumers),
          r.getOldestPendingId().isEmpty() ? Optional.empty() : Optional.of(r.getOldestPendingId()),
          r.hasOldestPendingAge() ? Optional.of(Rpc.toJava(r.getOldestPendingAge())) : Optional.empty(),
          r.getMaxDeliveryCount(), r.getStreamLength(), Collections.unmodifiableList(shards),
          r.getKeyedEntries(), Collections.unmodifiableList(busyKeys));
    }
  }

  /**
   * A key of a group with per-key limits that has entries pending ({@link
   * GroupDescription#busyKeys}).
   *
   * @param key the key: the value of the group's key field, as stored
   * @param entries its entries pending in the group, held or waiting for the key
   * @param headId the stream id of its oldest pending entry: the one that runs first
   * @param headConsumer the consumer whose PEL holds that entry
   */
  public record BusyKey(byte[] key, long entries, String headId, String headConsumer) {
    public BusyKey {
      key = key.clone();
    }

    /** A copy of the key's bytes. */
    @Override
    public byte[] key() {
      return key.clone();
    }

    /** The key decoded as UTF-8 (keys usually are text: a customer, an account). */
    public String keyUtf8() {
      return new String(key, StandardCharsets.UTF_8);
    }

    @Override
    public boolean equals(Object other) {
      return other instanceof BusyKey k && Arrays.equals(key, k.key) && entries == k.entries
          && headId.equals(k.headId) && headConsumer.equals(k.headConsumer);
    }

    @Override
    public int hashCode() {
      return Objects.hash(Arrays.hashCode(key), entries, headId, headConsumer);
    }

    @Override
    public String toString() {
      return "BusyKey[key=" + keyUtf8() + ", entries=" + entries + ", headId=" + headId + ", headConsumer="
          + headConsumer + "]";
    }
  }

  /**
   * One consumer of a group.
   *
   * @param name the consumer name (a sidecar's {@code --consumer-name})
   * @param pending entries in its PEL
   * @param idle time since it last read or claimed (XINFO CONSUMERS {@code idle})
   */
  public record ConsumerDescription(String name, long pending, Duration idle) {}

  /**
   * One dead letter.
   *
   * @param entry the entry as it sits in the dead-letter stream: {@code id()} is the original
   *     branded id, {@code streamId()} its dead-letter stream id (what {@link #replayDeadLetters}
   *     takes), {@code payload()} the original payload without the {@code echomq.*} metadata
   * @param sourceStream the stream it came from
   * @param sourceId its stream id in the source stream
   * @param group the group that gave up on it
   * @param attempts its delivery count when it was dead-lettered
   * @param reason the last failure reason
   * @param deadLetteredAt when it was dead-lettered
   */
  public record DeadLetter(
      Entry entry, String sourceStream, String sourceId, String group, int attempts, String reason, Instant deadLetteredAt) {

    static DeadLetter of(io.echomq.v1.DeadLetter d) {
      return new DeadLetter(
          Entry.of(d.getEntry()), d.getSourceStream(), d.getSourceId(), d.getGroup(), d.getAttempts(), d.getReason(),
          Rpc.toJava(d.getDeadLetteredAt()));
    }
  }

  /**
   * One page of dead letters.
   *
   * @param deadLetters oldest first; unmodifiable
   * @param nextStartId pass as {@code startId} for the next page; empty at the end
   * @param oversizedIds dead-letter stream ids of dead letters too large for one gRPC message on
   *     their own: left out (replaying them still works)
   */
  public record DeadLetterPage(List<DeadLetter> deadLetters, String nextStartId, List<String> oversizedIds) {
    /** True when more dead letters follow this page. */
    public boolean hasMore() {
      return !nextStartId.isEmpty();
    }
  }

  /**
   * What a replay moved.
   *
   * @param replayed the replayed entries, in order
   * @param notFoundIds requested ids not in the dead-letter stream (already replayed, or never
   *     there): nothing was done for them
   * @param otherSourceIds dead letters whose recorded source is another stream sharing this
   *     dead-letter stream: left in place; replay them by naming that stream
   */
  public record ReplayResult(List<Replayed> replayed, List<String> notFoundIds, List<String> otherSourceIds) {
    /**
     * One replayed entry.
     *
     * @param id the branded id, unchanged
     * @param deadLetterId the id it had in the dead-letter stream
     * @param streamId its new stream id in the source stream
     */
    public record Replayed(String id, String deadLetterId, String streamId) {}
  }
}
