package io.echomq.client;

import com.google.common.util.concurrent.ListenableFuture;
import com.google.protobuf.ByteString;
import io.echomq.v1.AppendBatchRequest;
import io.echomq.v1.AppendBatchResponse;
import io.echomq.v1.AppendRequest;
import io.echomq.v1.AppendResponse;
import io.echomq.v1.CancelScheduledRequest;
import io.echomq.v1.CancelScheduledResponse;
import io.echomq.v1.ListScheduledRequest;
import io.echomq.v1.ListScheduledResponse;
import io.echomq.v1.ReadRequest;
import io.echomq.v1.ReadResponse;
import io.echomq.v1.StreamServiceGrpc;
import io.echomq.v1.TrimRequest;
import io.echomq.v1.TrimResponse;
import io.grpc.Channel;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * The sidecar's StreamService: appends entries (each entry's branded id minted atomically with the
 * XADD), reads them and trims streams. Reading needs no consumer group and changes nothing:
 * nothing is acknowledged or counted. Thread-safe; one per process is enough.
 *
 * <pre>{@code
 * try (var streams = EchoMqStreams.connect("127.0.0.1:50051")) {
 *   AppendResult written = streams.append("orders", Fields.of("order", "42"));
 *   // Everything appended in the last hour, oldest first, fetched a page at a time.
 *   try (Stream<Entry> entries = streams.readAll("orders", Range.all().from(Instant.now().minus(Duration.ofHours(1))))) {
 *     entries.forEach(e -> System.out.println(e.streamId() + " " + e.payloadText("order")));
 *   }
 *   // Drop what is older than a day, but nothing a group still needs (the safe mode).
 *   TrimResult trimmed = streams.trim("orders", Trim.before(Instant.now().minus(Duration.ofDays(1))));
 * }
 * }</pre>
 *
 * <p>Errors are {@link EchoMqException}s: INVALID_ARGUMENT for a bad stream name or id, a field
 * named like the reserved id field, a dedup key over the sidecar's {@code --max-name-bytes}, both
 * an id and an instant for one bound, a page size over 10,000, or a trim without exactly one
 * bound; FAILED_PRECONDITION when the key is not a stream; UNAVAILABLE when the sidecar or Redis
 * cannot be reached (or a failover, or the sidecar's {@code --wait-replicas} not confirmed in
 * time); DEADLINE_EXCEEDED past the per-call timeout ({@link #withTimeout}, default 10 s).
 *
 * <p>Reads and trims are safe to retry. Appends are not retried: an append that failed with
 * UNAVAILABLE or DEADLINE_EXCEEDED may or may not have been written, and a plain retry could write
 * it twice. Give it a dedup key ({@link #append(String, Map, long, String, String)}, or {@link
 * BatchEntry#dedupKey()} in a batch) and retry with the same key: if the first attempt was
 * written, the retry writes nothing and answers its ids with {@link AppendResult#isDuplicate()}
 * true.
 *
 * <pre>{@code
 * AppendResult written = null;
 * for (int attempt = 0; written == null; attempt++) {
 *   try {
 *     written = streams.append("orders", fields, 0, null, "order-1001");
 *   } catch (EchoMqException e) {
 *     if (e.isPermanent() || attempt == 4) throw e;
 *     Thread.sleep(500L << attempt); // same call, same key
 *   }
 * }
 * }</pre>
 *
 * <p>An append with a deliver-at instant or a delay is scheduled ({@link #append(String, Map,
 * Instant)}): listed by {@link #listScheduled} and {@link #scheduled}, cancelled by {@link
 * #cancelScheduled} until it enters the stream.
 *
 * <p>{@link EchoMqProducer} is its deprecated old name. Groups and dead letters are {@link
 * EchoMqAdmin}'s.
 */
@SuppressWarnings({"deprecation", "removal"}) // permits the deprecated EchoMqProducer, its old name
public sealed class EchoMqStreams implements AutoCloseable permits EchoMqProducer {
  /** Default deadline of one call (one page of a read, or a trim). */
  public static final Duration DEFAULT_TIMEOUT = Duration.ofSeconds(10);
  /** Entries per page of {@link #readAll(String, Range)}: the most the sidecar returns at once. */
  public static final int DEFAULT_PAGE_SIZE = 1000;
  /** The most entries the sidecar returns in one page. */
  public static final int MAX_PAGE_SIZE = 10_000;

  private final ManagedChannel ownedChannel;
  private final StreamServiceGrpc.StreamServiceBlockingStub stub;
  private final StreamServiceGrpc.StreamServiceFutureStub futureStub;
  private final Duration timeout;

  EchoMqStreams(Channel channel, ManagedChannel owned, Duration timeout) {
    this.ownedChannel = owned;
    this.stub = StreamServiceGrpc.newBlockingStub(channel);
    this.futureStub = StreamServiceGrpc.newFutureStub(channel);
    this.timeout = timeout;
  }

  /** The channel, for a client that shares it ({@link #withTimeout}). */
  final Channel channel() {
    return stub.getChannel();
  }

  /** The per-call deadline. */
  final Duration timeout() {
    return timeout;
  }

  /** A client on its own channel to {@code host:port} or {@code unix:/path}; {@link #close()} closes it. */
  public static EchoMqStreams connect(String target) {
    ManagedChannel channel = Targets.open(target);
    return new EchoMqStreams(channel, channel, DEFAULT_TIMEOUT);
  }

  /** A client on a channel the caller owns (and closes). */
  public static EchoMqStreams create(Channel channel) {
    return new EchoMqStreams(Objects.requireNonNull(channel, "channel"), null, DEFAULT_TIMEOUT);
  }

  /** This client with another per-call deadline (default 10 s); shares the channel. */
  public EchoMqStreams withTimeout(Duration timeout) {
    return new EchoMqStreams(stub.getChannel(), null, Objects.requireNonNull(timeout, "timeout"));
  }

  /** Appends one entry; see {@link #append(String, Map, long)}. */
  public AppendResult append(String stream, Map<String, byte[]> fields) {
    return append(stream, fields, 0);
  }

  /**
   * Appends one entry.
   *
   * @param maxLen when above 0, trims the stream to about this many entries ({@code MAXLEN ~})
   * @return the branded id, stream id and stream key written
   * @throws EchoMqException when the sidecar refuses or cannot be reached
   */
  public AppendResult append(String stream, Map<String, byte[]> fields, long maxLen) {
    return append(stream, fields, maxLen, null);
  }

  /**
   * Appends one entry to a sharded stream's shard chosen by {@code partitionKey}.
   *
   * @param maxLen when above 0, trims the stream (the shard written) to about this many entries
   * @param partitionKey for a sharded stream (the sidecar's {@code --sharded-streams}): entries with
   *     the same key go to the same shard, so they are consumed in the order they were appended;
   *     {@code null} or empty takes the shards in turn. A stream that is not sharded ignores it.
   * @return the branded id, stream id and stream key written (the shard's key)
   * @throws EchoMqException when the sidecar refuses or cannot be reached
   */
  public AppendResult append(String stream, Map<String, byte[]> fields, long maxLen, String partitionKey) {
    return join(appendAsync(stream, fields, maxLen, partitionKey));
  }

  /** Appends one entry without blocking; the future fails with {@link EchoMqException}. */
  public CompletableFuture<AppendResult> appendAsync(String stream, Map<String, byte[]> fields, long maxLen) {
    return appendAsync(stream, fields, maxLen, null);
  }

  /**
   * Appends one entry without blocking, to the shard of {@code partitionKey} (see {@link
   * #append(String, Map, long, String)}); the future fails with {@link EchoMqException}.
   */
  public CompletableFuture<AppendResult> appendAsync(
      String stream, Map<String, byte[]> fields, long maxLen, String partitionKey) {
    return appendAsync(stream, fields, maxLen, partitionKey, null);
  }

  /**
   * Appends one entry idempotently: if an append to {@code stream} with the same {@code dedupKey}
   * was recorded within the sidecar's {@code --dedup-window-ms} (2 minutes by default), nothing is
   * written and the result is that append's, with {@link AppendResult#isDuplicate()} true. So an
   * append whose outcome is unknown (UNAVAILABLE, DEADLINE_EXCEEDED, a lost connection) can be
   * retried with the same key without a second copy.
   *
   * @param maxLen when above 0, trims the stream to about this many entries
   * @param partitionKey the shard of a sharded stream (see {@link #append(String, Map, long,
   *     String)}); {@code null} or empty: none. Retry with the same one.
   * @param dedupKey the entry's key in your domain (an order id, a message id, a hash of the
   *     payload); {@code null} or empty: no deduplication. Longer than the sidecar's {@code
   *     --max-name-bytes} (1024): INVALID_ARGUMENT, nothing written.
   * @return the branded id, stream id and stream key written, or the first append's for a duplicate
   * @throws EchoMqException when the sidecar refuses or cannot be reached
   */
  public AppendResult append(
      String stream, Map<String, byte[]> fields, long maxLen, String partitionKey, String dedupKey) {
    return join(appendAsync(stream, fields, maxLen, partitionKey, dedupKey));
  }

  /**
   * Appends one entry idempotently without blocking (see {@link #append(String, Map, long, String,
   * String)}); the future fails with {@link EchoMqException}.
   */
  public CompletableFuture<AppendResult> appendAsync(
      String stream, Map<String, byte[]> fields, long maxLen, String partitionKey, String dedupKey) {
    return appendAsync(stream, fields, maxLen, partitionKey, dedupKey, null, null);
  }

  /**
   * Schedules one entry for {@code deliverAt}: it gets its branded id now ({@link
   * AppendResult#isScheduled()} is true, its stream id {@code ""}) and enters the stream at that
   * instant (within the sidecar's {@code --schedule-poll-ms}), exactly once; until then no consumer
   * or {@link #read} sees it, {@link #listScheduled} does and {@link #cancelScheduled} removes it.
   * An instant already past appends at once.
   *
   * <pre>{@code
   * AppendResult reminder = streams.append("reminders", Fields.of("order", "42"), Instant.parse("2027-01-01T09:00:00Z"));
   * }</pre>
   *
   * @param deliverAt when the entry enters the stream; more than 365 days ahead: INVALID_ARGUMENT
   * @return the branded id and the stream key written, {@link AppendResult#isScheduled()} true
   * @throws EchoMqException when the sidecar refuses or cannot be reached
   */
  public AppendResult append(String stream, Map<String, byte[]> fields, Instant deliverAt) {
    return join(appendAsync(stream, fields, 0, null, null, deliverAt, null));
  }

  /**
   * Schedules one entry {@code delay} after the append (measured on the Redis server's clock), as
   * {@link #append(String, Map, Instant)}.
   *
   * @param delay how long after the append the entry enters the stream; zero: at once; negative or
   *     over 365 days: INVALID_ARGUMENT
   * @return the branded id and the stream key written, {@link AppendResult#isScheduled()} true
   * @throws EchoMqException when the sidecar refuses or cannot be reached
   */
  public AppendResult append(String stream, Map<String, byte[]> fields, Duration delay) {
    return join(appendAsync(stream, fields, 0, null, null, null, delay));
  }

  /**
   * Appends one entry with every option: see {@link #append(String, Map, long, String, String)}
   * for {@code maxLen}, {@code partitionKey} and {@code dedupKey}, {@link #append(String, Map,
   * Instant)} and {@link #append(String, Map, Duration)} for the schedule. Both {@code deliverAt}
   * and {@code delay}, or either with {@code maxLen} above 0, is the sidecar's INVALID_ARGUMENT.
   *
   * @param deliverAt when the entry enters the stream; {@code null}: at once (or after {@code delay})
   * @param delay how long after the append it enters the stream; {@code null} or zero: at once
   * @return the branded id, stream id and stream key written, or the first append's for a duplicate
   * @throws EchoMqException when the sidecar refuses or cannot be reached
   */
  public AppendResult append(
      String stream,
      Map<String, byte[]> fields,
      long maxLen,
      String partitionKey,
      String dedupKey,
      Instant deliverAt,
      Duration delay) {
    return join(appendAsync(stream, fields, maxLen, partitionKey, dedupKey, deliverAt, delay));
  }

  /**
   * Appends one entry with every option without blocking (see {@link #append(String, Map, long,
   * String, String, Instant, Duration)}); the future fails with {@link EchoMqException}.
   */
  public CompletableFuture<AppendResult> appendAsync(
      String stream,
      Map<String, byte[]> fields,
      long maxLen,
      String partitionKey,
      String dedupKey,
      Instant deliverAt,
      Duration delay) {
    AppendRequest.Builder request =
        AppendRequest.newBuilder()
            .setStream(stream)
            .putAllFields(toProto(fields))
            .setMaxLen(maxLen)
            .setPartitionKey(partitionKey == null ? "" : partitionKey)
            .setDedupKey(dedupKey == null ? "" : dedupKey);
    // Sent as given (both, a negative delay): the sidecar refuses those and says why.
    if (deliverAt != null) {
      request.setDeliverAt(Rpc.toProto(deliverAt));
    }
    if (delay != null && !delay.isZero()) {
      request.setDelay(signed(delay));
    }
    return toCompletable(appending().append(request.build()), "appending to stream \"" + stream + "\"")
        .thenApply(EchoMqStreams::result);
  }

  /** Appends several entries atomically, in order; see {@link #appendBatch(String, List, long)}. */
  public List<AppendResult> appendBatch(String stream, List<Map<String, byte[]>> entries) {
    return appendBatch(stream, entries, 0);
  }

  /**
   * Appends 1 to 10,000 entries to one stream in one server-side script: all or none. Ids are
   * consecutive and in the order given. For entries with dedup keys, see {@link
   * #appendBatchEntries(String, List, long, String)}.
   *
   * @return one result per entry, in order
   * @throws EchoMqException when the sidecar refuses or cannot be reached
   */
  public List<AppendResult> appendBatch(String stream, List<Map<String, byte[]>> entries, long maxLen) {
    return appendBatch(stream, entries, maxLen, null);
  }

  /**
   * Appends a batch atomically, in order, to a sharded stream's shard chosen by {@code
   * partitionKey}: the whole batch goes to one shard (see {@link #append(String, Map, long, String)}).
   *
   * @param partitionKey same key, same shard, order kept; {@code null} or empty: the next shard in
   *     turn. Ignored by a stream that is not sharded.
   * @return one result per entry, in order
   * @throws EchoMqException when the sidecar refuses or cannot be reached
   */
  public List<AppendResult> appendBatch(
      String stream, List<Map<String, byte[]>> entries, long maxLen, String partitionKey) {
    return join(appendBatchAsync(stream, entries, maxLen, partitionKey));
  }

  /** Appends a batch without blocking; the future fails with {@link EchoMqException}. */
  public CompletableFuture<List<AppendResult>> appendBatchAsync(
      String stream, List<Map<String, byte[]>> entries, long maxLen) {
    return appendBatchAsync(stream, entries, maxLen, null);
  }

  /**
   * Appends a batch without blocking, to the shard of {@code partitionKey} (see {@link
   * #appendBatch(String, List, long, String)}); the future fails with {@link EchoMqException}.
   */
  public CompletableFuture<List<AppendResult>> appendBatchAsync(
      String stream, List<Map<String, byte[]>> entries, long maxLen, String partitionKey) {
    List<BatchEntry> plain = new ArrayList<>(entries.size());
    entries.forEach(fields -> plain.add(BatchEntry.of(fields)));
    return appendBatchEntriesAsync(stream, plain, maxLen, partitionKey);
  }

  /**
   * Appends entries that may carry a dedup key each, atomically and in order; see {@link
   * #appendBatchEntries(String, List, long, String)}.
   */
  public List<AppendResult> appendBatchEntries(String stream, List<BatchEntry> entries) {
    return appendBatchEntries(stream, entries, 0, null);
  }

  /**
   * Appends 1 to 10,000 entries, each with its own dedup key or none, to one stream in one
   * server-side script: all or none, in order. An entry whose key is recorded on the stream (within
   * the sidecar's {@code --dedup-window-ms}), or was used by an earlier entry of the same batch, is
   * not written: its result is the first one's, with {@link AppendResult#isDuplicate()} true (it
   * takes no id of its own). On a sharded stream, a batch without {@code partitionKey} goes to the
   * shard of its first dedup key. An entry with {@link BatchEntry#deliverAt()} or {@link
   * BatchEntry#delay()} is scheduled (see {@link #append(String, Map, Instant)}): its result has
   * {@link AppendResult#isScheduled()} true.
   *
   * @param maxLen when above 0, trims the stream to about this many entries
   * @param partitionKey the shard of a sharded stream; {@code null} or empty: none
   * @return one result per entry, in order
   * @throws EchoMqException when the sidecar refuses or cannot be reached
   */
  public List<AppendResult> appendBatchEntries(
      String stream, List<BatchEntry> entries, long maxLen, String partitionKey) {
    return join(appendBatchEntriesAsync(stream, entries, maxLen, partitionKey));
  }

  /**
   * Appends entries with dedup keys without blocking (see {@link #appendBatchEntries(String, List,
   * long, String)}); the future fails with {@link EchoMqException}.
   */
  public CompletableFuture<List<AppendResult>> appendBatchEntriesAsync(
      String stream, List<BatchEntry> entries, long maxLen, String partitionKey) {
    AppendBatchRequest.Builder request =
        AppendBatchRequest.newBuilder()
            .setStream(stream)
            .setMaxLen(maxLen)
            .setPartitionKey(partitionKey == null ? "" : partitionKey);
    for (BatchEntry entry : entries) {
      io.echomq.v1.BatchEntry.Builder message =
          io.echomq.v1.BatchEntry.newBuilder()
              .putAllFields(toProto(entry.fields()))
              .setDedupKey(entry.dedupKey() == null ? "" : entry.dedupKey());
      if (entry.deliverAt() != null) {
        message.setDeliverAt(Rpc.toProto(entry.deliverAt()));
      }
      if (entry.delay() != null && !entry.delay().isZero()) {
        message.setDelay(signed(entry.delay()));
      }
      request.addEntries(message);
    }
    return toCompletable(appending().appendBatch(request.build()), "appending a batch to stream \"" + stream + "\"")
        .thenApply(EchoMqStreams::results);
  }

  /**
   * Reads one page of a range, oldest first ({@code XRANGE}).
   *
   * @param stream the stream key (for a sharded stream, one shard's key)
   * @param range the bounds, inclusive; {@link Range#all()} for the whole stream
   * @param count the most entries to return, 1 to {@value #MAX_PAGE_SIZE}; 0 for the sidecar's
   *     default, 100. A page holds fewer when more would not fit in one gRPC message.
   * @return the entries and where the next page starts ({@link ReadPage#nextStartId()}, empty at
   *     the end of the range)
   * @throws EchoMqException when the sidecar refuses or cannot be reached
   */
  public ReadPage read(String stream, Range range, int count) {
    Objects.requireNonNull(range, "range");
    if (count < 0 || count > MAX_PAGE_SIZE) {
      throw new IllegalArgumentException("count must be 0 (the default, 100) to " + MAX_PAGE_SIZE + ", got " + count);
    }
    ReadRequest.Builder request = ReadRequest.newBuilder().setStream(stream).setCount(count);
    range.applyTo(request);
    ReadResponse response = Rpc.call(() -> deadlined().read(request.build()), "reading stream \"" + stream + "\"");
    List<Entry> entries = new ArrayList<>(response.getEntriesCount());
    response.getEntriesList().forEach(e -> entries.add(Entry.of(e)));
    return new ReadPage(
        Collections.unmodifiableList(entries), response.getNextStartId(), List.copyOf(response.getOversizedIdsList()));
  }

  /** Every entry of a range, a page of {@value #DEFAULT_PAGE_SIZE} at a time; see {@link #readAll(String, Range, int)}. */
  public Stream<Entry> readAll(String stream, Range range) {
    return readAll(stream, range, DEFAULT_PAGE_SIZE);
  }

  /**
   * Every entry of a range, oldest first, read lazily a page at a time (each page one call, paging
   * by {@code next_start_id}). The range is read as it is when each page is fetched: entries
   * appended meanwhile below the end bound are included. Entries too large for one gRPC message
   * are skipped (see {@link ReadPage#oversizedIds()}).
   *
   * @param pageSize entries per call, 1 to {@value #MAX_PAGE_SIZE}
   * @return a sequential, ordered stream; a failed page throws {@link EchoMqException} from the
   *     stream's terminal operation
   */
  public Stream<Entry> readAll(String stream, Range range, int pageSize) {
    Objects.requireNonNull(range, "range");
    if (pageSize < 1 || pageSize > MAX_PAGE_SIZE) {
      throw new IllegalArgumentException("pageSize must be 1 to " + MAX_PAGE_SIZE + ", got " + pageSize);
    }
    return Rpc.paged(
        range,
        from -> {
          ReadPage read = read(stream, from, pageSize);
          return new Rpc.Page<>(read.entries(), read.hasMore() ? from.fromId(read.nextStartId()) : null);
        });
  }

  /**
   * Removes the oldest entries of a stream ({@code XTRIM MINID}). Safe by default: the bound is
   * raised so that no entry any group of the stream still has pending, or has not yet been
   * delivered, is removed ({@link TrimResult#heldBackByGroups()} says when that happened), computed
   * and applied atomically on the Redis host.
   *
   * @param how the bound: {@link Trim#maxLen}, {@link Trim#minId} or {@link Trim#before}
   * @return how many entries went and the bound applied
   * @throws EchoMqException when the sidecar refuses or cannot be reached
   */
  public TrimResult trim(String stream, Trim how) {
    Objects.requireNonNull(how, "how");
    TrimRequest.Builder request = TrimRequest.newBuilder().setStream(stream);
    how.applyTo(request);
    TrimResponse response = Rpc.call(() -> deadlined().trim(request.build()), "trimming stream \"" + stream + "\"");
    return new TrimResult(response.getTrimmed(), response.getAppliedMinId(), response.getHeldBackByGroups());
  }

  /**
   * Cancels a scheduled entry before it enters the stream: it is then never delivered.
   *
   * <pre>{@code
   * try {
   *   Instant due = streams.cancelScheduled(reminder.stream(), reminder.id());
   * } catch (NotScheduledException tooLate) {
   *   // it is in the stream already (or was cancelled)
   * }
   * }</pre>
   *
   * @param stream the stream key the append answered ({@link AppendResult#stream()}: a sharded
   *     stream's shard key)
   * @param id the entry's branded id ({@link AppendResult#id()})
   * @return when the entry was due
   * @throws NotScheduledException (NOT_FOUND) when no such entry is scheduled there: it entered the
   *     stream already, was cancelled, or was never scheduled there
   * @throws EchoMqException INVALID_ARGUMENT for a bad stream name or an id that is not a branded
   *     id; UNAVAILABLE when the sidecar or Redis cannot be reached
   */
  public Instant cancelScheduled(String stream, String id) {
    CancelScheduledRequest request = CancelScheduledRequest.newBuilder().setStream(stream).setId(id).build();
    String doing = "cancelling scheduled entry " + id + " of stream \"" + stream + "\"";
    CancelScheduledResponse response;
    try {
      response = deadlined().cancelScheduled(request);
    } catch (StatusRuntimeException e) {
      if (e.getStatus().getCode() == Status.Code.NOT_FOUND) {
        String description = e.getStatus().getDescription();
        throw new NotScheduledException(doing + (description == null ? "" : ": " + description), e);
      }
      throw EchoMqException.from(e, doing);
    }
    return Rpc.toJava(response.getDeliverAt());
  }

  /**
   * One page of the entries scheduled on a stream key that have not entered it yet, due first
   * first.
   *
   * @param stream the stream key (for a sharded stream, one shard's key)
   * @param pageToken the previous page's {@link ScheduledPage#nextPageToken()}; {@code null} or
   *     empty: from the entry due first
   * @param count the most entries (entries); 0 for the sidecar's default, 100; over 10,000:
   *     INVALID_ARGUMENT
   * @return the entries, the token of the next page ({@code ""} after the last) and how many the key
   *     has scheduled in all
   * @throws EchoMqException INVALID_ARGUMENT for a bad stream name or a malformed page token;
   *     UNAVAILABLE when the sidecar or Redis cannot be reached
   */
  public ScheduledPage listScheduled(String stream, String pageToken, int count) {
    ListScheduledRequest request =
        ListScheduledRequest.newBuilder()
            .setStream(stream)
            .setPageToken(pageToken == null ? "" : pageToken)
            .setCount(count)
            .build();
    ListScheduledResponse response =
        Rpc.call(() -> deadlined().listScheduled(request), "listing the scheduled entries of stream \"" + stream + "\"");
    List<ScheduledEntry> entries = new ArrayList<>(response.getEntriesCount());
    response
        .getEntriesList()
        .forEach(
            e -> {
              Map<String, byte[]> fields = new java.util.LinkedHashMap<>();
              e.getFieldsMap().forEach((name, value) -> fields.put(name, value.toByteArray()));
              entries.add(new ScheduledEntry(e.getId(), Rpc.toJava(e.getDeliverAt()), Collections.unmodifiableMap(fields)));
            });
    return new ScheduledPage(Collections.unmodifiableList(entries), response.getNextPageToken(), response.getTotal());
  }

  /** Every entry scheduled on a stream key, the sidecar's page size at a time; see {@link #scheduled(String, int)}. */
  public Stream<ScheduledEntry> scheduled(String stream) {
    return scheduled(stream, 0);
  }

  /**
   * Every entry scheduled on a stream key that has not entered it yet, the first due first, listed
   * lazily a page at a time (each page one call, following {@link ScheduledPage#nextPageToken()}).
   *
   * @param pageSize entries per call; 0 for the sidecar's default, 100
   * @return a sequential, ordered stream; a failed page throws {@link EchoMqException} from the
   *     stream's terminal operation
   */
  public Stream<ScheduledEntry> scheduled(String stream, int pageSize) {
    return Rpc.paged(
        "",
        token -> {
          ScheduledPage listed = listScheduled(stream, token, pageSize);
          return new Rpc.Page<>(listed.entries(), listed.hasMore() ? listed.nextPageToken() : null);
        });
  }

  /** Closes the channel if this client opened it. */
  @Override
  public void close() {
    Rpc.close(ownedChannel);
  }

  private StreamServiceGrpc.StreamServiceBlockingStub deadlined() {
    return stub.withDeadlineAfter(timeout.toNanos(), TimeUnit.NANOSECONDS);
  }

  private StreamServiceGrpc.StreamServiceFutureStub appending() {
    return futureStub.withDeadlineAfter(timeout.toNanos(), TimeUnit.NANOSECONDS);
  }

  private static Map<String, ByteString> toProto(Map<String, byte[]> fields) {
    Map<String, ByteString> out = new java.util.LinkedHashMap<>();
    fields.forEach((name, value) -> out.put(Objects.requireNonNull(name, "field name"), ByteString.copyFrom(value)));
    return out;
  }

  private static AppendResult result(AppendResponse response) {
    return new AppendResult(
        response.getId(), response.getStreamId(), response.getStream(), response.getDuplicate(), response.getScheduled());
  }

  /** A delay of either sign as the proto's Duration, whose seconds and nanos share the sign. */
  private static com.google.protobuf.Duration signed(Duration delay) {
    Duration abs = delay.abs();
    int sign = delay.isNegative() ? -1 : 1;
    return com.google.protobuf.Duration.newBuilder()
        .setSeconds(sign * abs.getSeconds())
        .setNanos(sign * abs.getNano())
        .build();
  }

  private static List<AppendResult> results(AppendBatchResponse response) {
    List<AppendResult> out = new ArrayList<>(response.getEntriesCount());
    response.getEntriesList().forEach(r -> out.add(result(r)));
    return out;
  }

  private static <T> CompletableFuture<T> toCompletable(ListenableFuture<T> future, String doing) {
    return Rpc.toCompletable(future, doing);
  }

  private static <T> T join(CompletableFuture<T> future) {
    return Rpc.join(future);
  }

  /**
   * The bounds of a read, both inclusive, each a stream id or an instant (not both: setting one
   * replaces the other). Immutable: each method returns a new range.
   *
   * <p>{@code Range.all().fromId("1718000000000-0").to(Instant.now())}
   */
  public static final class Range {
    private static final Range ALL = new Range(null, null, null, null);

    private final String startId;
    private final Instant startTime;
    private final String endId;
    private final Instant endTime;

    private Range(String startId, Instant startTime, String endId, Instant endTime) {
      this.startId = startId;
      this.startTime = startTime;
      this.endId = endId;
      this.endTime = endTime;
    }

    /** From the oldest entry to the newest. */
    public static Range all() {
      return ALL;
    }

    /** Starting at the stream id {@code <ms>-<seq>} (or {@code <ms>}), inclusive. */
    public Range fromId(String streamId) {
      return new Range(Objects.requireNonNull(streamId, "streamId"), null, endId, endTime);
    }

    /** Starting at entries appended at or after {@code instant} (its first possible stream id). */
    public Range from(Instant instant) {
      return new Range(null, Objects.requireNonNull(instant, "instant"), endId, endTime);
    }

    /** Ending at the stream id {@code <ms>-<seq>} (or {@code <ms>}), inclusive. */
    public Range toId(String streamId) {
      return new Range(startId, startTime, Objects.requireNonNull(streamId, "streamId"), null);
    }

    /** Ending at entries appended at or before {@code instant} (its last possible stream id). */
    public Range to(Instant instant) {
      return new Range(startId, startTime, null, Objects.requireNonNull(instant, "instant"));
    }

    void applyTo(ReadRequest.Builder request) {
      if (startId != null) {
        request.setStartId(startId);
      } else if (startTime != null) {
        request.setStartTime(Rpc.toProto(startTime));
      }
      if (endId != null) {
        request.setEndId(endId);
      } else if (endTime != null) {
        request.setEndTime(Rpc.toProto(endTime));
      }
    }

    @Override
    public String toString() {
      Object start = startId != null ? startId : startTime != null ? startTime : "-";
      Object end = endId != null ? endId : endTime != null ? endTime : "+";
      return "[" + start + ", " + end + "]";
    }
  }

  /**
   * One page of a read.
   *
   * @param entries the entries, oldest first; unmodifiable
   * @param nextStartId where the next page starts (pass it to {@link Range#fromId}, keeping the
   *     end bound); empty when this page reached the end of the range
   * @param oversizedIds stream ids of entries in this page's range too large for one gRPC message
   *     ({@code --max-message-bytes}) on their own: left out of {@code entries}
   */
  public record ReadPage(List<Entry> entries, String nextStartId, List<String> oversizedIds) {
    /** True when the range goes on after this page. */
    public boolean hasMore() {
      return !nextStartId.isEmpty();
    }
  }

  /**
   * Which entries a {@link #trim} removes: exactly one bound, and two options. Immutable.
   */
  public static final class Trim {
    private final long maxLen;
    private final String minId;
    private final Instant before;
    private final boolean approximate;
    private final boolean ignoreGroups;

    private Trim(long maxLen, String minId, Instant before, boolean approximate, boolean ignoreGroups) {
      this.maxLen = maxLen;
      this.minId = minId;
      this.before = before;
      this.approximate = approximate;
      this.ignoreGroups = ignoreGroups;
    }

    /**
     * Keep the newest {@code maxLen} entries (at least 1; to remove everything, use {@link
     * #minId} with an id above the last one).
     */
    public static Trim maxLen(long maxLen) {
      if (maxLen < 1) {
        throw new IllegalArgumentException("maxLen must be at least 1, got " + maxLen);
      }
      return new Trim(maxLen, null, null, false, false);
    }

    /** Remove the entries with a stream id below {@code streamId} ({@code <ms>-<seq>} or {@code <ms>}). */
    public static Trim minId(String streamId) {
      return new Trim(0, Objects.requireNonNull(streamId, "streamId"), null, false, false);
    }

    /** Remove the entries appended before {@code instant}. */
    public static Trim before(Instant instant) {
      return new Trim(0, null, Objects.requireNonNull(instant, "instant"), false, false);
    }

    /**
     * Let Redis remove whole radix-tree nodes only ({@code MINID ~}): cheaper, may keep a few more
     * entries; never removes more than asked.
     */
    public Trim approximate() {
      return new Trim(maxLen, minId, before, true, ignoreGroups);
    }

    /**
     * Trim as asked even past entries that groups have pending or not yet delivered: those
     * entries are lost to the groups. Off by default.
     */
    public Trim ignoringGroups() {
      return new Trim(maxLen, minId, before, approximate, true);
    }

    void applyTo(TrimRequest.Builder request) {
      request.setMaxLen(maxLen).setApproximate(approximate).setIgnoreGroups(ignoreGroups);
      if (minId != null) {
        request.setMinId(minId);
      }
      if (before != null) {
        request.setBefore(Rpc.toProto(before));
      }
    }
  }

  /**
   * What a trim did.
   *
   * @param trimmed entries removed (XTRIM's reply)
   * @param appliedMinId the MINID bound applied (entries below it are gone); empty when nothing
   *     could be trimmed
   * @param heldBackByGroups true when the safe mode raised the bound to protect entries a group
   *     has pending or not yet delivered
   */
  public record TrimResult(long trimmed, String appliedMinId, boolean heldBackByGroups) {}

  /**
   * One page of {@link #listScheduled}.
   *
   * @param entries the first due first (then by branded id); unmodifiable
   * @param nextPageToken pass as {@code pageToken} for the next page; {@code ""} after the last
   * @param total how many entries the stream key has scheduled in all
   */
  public record ScheduledPage(List<ScheduledEntry> entries, String nextPageToken, long total) {
    /** Whether another page follows. */
    public boolean hasMore() {
      return !nextPageToken.isEmpty();
    }
  }
}
