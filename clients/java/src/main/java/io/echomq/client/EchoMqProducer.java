package io.echomq.client;

import com.google.common.util.concurrent.ListenableFuture;
import com.google.protobuf.ByteString;
import io.echomq.v1.AppendBatchRequest;
import io.echomq.v1.AppendBatchResponse;
import io.echomq.v1.AppendRequest;
import io.echomq.v1.AppendResponse;
import io.echomq.v1.StreamServiceGrpc;
import io.grpc.Channel;
import io.grpc.ManagedChannel;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * Appends entries to streams through the sidecar, which mints each entry's branded id atomically
 * with the XADD. Thread-safe; one producer per process is enough.
 *
 * <pre>{@code
 * try (var producer = EchoMqProducer.connect("127.0.0.1:50051")) {
 *   AppendResult written = producer.append("orders", Fields.of("order", "42"));
 * }
 * }</pre>
 *
 * <p>Errors are {@link EchoMqException}s: INVALID_ARGUMENT (bad stream name, a field named like the
 * reserved id field, a dedup key over the sidecar's {@code --max-name-bytes}), FAILED_PRECONDITION
 * (the key is not a stream), UNAVAILABLE (Redis or the sidecar unreachable, a failover, or the
 * sidecar's {@code --wait-replicas} not confirmed in time) and DEADLINE_EXCEEDED.
 *
 * <p>Nothing is retried by the producer: an append that failed with UNAVAILABLE or DEADLINE_EXCEEDED
 * may or may not have been written, and a plain retry could write it twice. Give it a dedup key
 * ({@link #append(String, Map, long, String, String)}, or {@link BatchEntry#dedupKey()} in a batch)
 * and retry with the same key: if the first attempt was written, the retry writes nothing and
 * answers its ids with {@link AppendResult#isDuplicate()} true.
 *
 * <pre>{@code
 * AppendResult written = null;
 * for (int attempt = 0; written == null; attempt++) {
 *   try {
 *     written = producer.append("orders", fields, 0, null, "order-1001");
 *   } catch (EchoMqException e) {
 *     if (e.isPermanent() || attempt == 4) throw e;
 *     Thread.sleep(500L << attempt); // same call, same key
 *   }
 * }
 * }</pre>
 *
 * <p>Reading and trimming streams is {@link EchoMqStreams}'s; groups and dead letters are
 * {@link EchoMqAdmin}'s.
 */
public final class EchoMqProducer implements AutoCloseable {
  /** Default deadline of one append. */
  public static final Duration DEFAULT_TIMEOUT = Duration.ofSeconds(10);

  private final ManagedChannel ownedChannel;
  private final StreamServiceGrpc.StreamServiceFutureStub stub;
  private final Duration timeout;

  private EchoMqProducer(Channel channel, ManagedChannel owned, Duration timeout) {
    this.ownedChannel = owned;
    this.stub = StreamServiceGrpc.newFutureStub(channel);
    this.timeout = timeout;
  }

  /** A producer on its own channel to {@code host:port} or {@code unix:/path}; {@link #close()} closes it. */
  public static EchoMqProducer connect(String target) {
    ManagedChannel channel = Targets.open(target);
    return new EchoMqProducer(channel, channel, DEFAULT_TIMEOUT);
  }

  /** A producer on a channel the caller owns (and closes). */
  public static EchoMqProducer create(Channel channel) {
    return new EchoMqProducer(Objects.requireNonNull(channel, "channel"), null, DEFAULT_TIMEOUT);
  }

  /** This producer with another per-append deadline (default 10 s); shares the channel. */
  public EchoMqProducer withTimeout(Duration timeout) {
    return new EchoMqProducer(stub.getChannel(), null, Objects.requireNonNull(timeout, "timeout"));
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
    AppendRequest request =
        AppendRequest.newBuilder()
            .setStream(stream)
            .putAllFields(toProto(fields))
            .setMaxLen(maxLen)
            .setPartitionKey(partitionKey == null ? "" : partitionKey)
            .setDedupKey(dedupKey == null ? "" : dedupKey)
            .build();
    return toCompletable(deadlined().append(request), "appending to stream \"" + stream + "\"")
        .thenApply(EchoMqProducer::result);
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
   * shard of its first dedup key.
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
      request.addEntries(
          io.echomq.v1.BatchEntry.newBuilder()
              .putAllFields(toProto(entry.fields()))
              .setDedupKey(entry.dedupKey() == null ? "" : entry.dedupKey()));
    }
    return toCompletable(deadlined().appendBatch(request.build()), "appending a batch to stream \"" + stream + "\"")
        .thenApply(EchoMqProducer::results);
  }

  /** Closes the channel if this producer opened it. */
  @Override
  public void close() {
    Rpc.close(ownedChannel);
  }

  private StreamServiceGrpc.StreamServiceFutureStub deadlined() {
    return stub.withDeadlineAfter(timeout.toNanos(), TimeUnit.NANOSECONDS);
  }

  private static Map<String, ByteString> toProto(Map<String, byte[]> fields) {
    Map<String, ByteString> out = new java.util.LinkedHashMap<>();
    fields.forEach((name, value) -> out.put(Objects.requireNonNull(name, "field name"), ByteString.copyFrom(value)));
    return out;
  }

  private static AppendResult result(AppendResponse response) {
    return new AppendResult(response.getId(), response.getStreamId(), response.getStream(), response.getDuplicate());
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
}
