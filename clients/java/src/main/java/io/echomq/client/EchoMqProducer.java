package io.echomq.client;

import com.google.common.util.concurrent.ListenableFuture;
import com.google.protobuf.ByteString;
import io.echomq.v1.AppendBatchRequest;
import io.echomq.v1.AppendBatchResponse;
import io.echomq.v1.AppendRequest;
import io.echomq.v1.AppendResponse;
import io.echomq.v1.BatchEntry;
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
 * reserved id field), FAILED_PRECONDITION (the key is not a stream), UNAVAILABLE (Redis or the
 * sidecar unreachable: safe to retry, at the price of a possible duplicate entry).
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
    AppendRequest request =
        AppendRequest.newBuilder()
            .setStream(stream)
            .putAllFields(toProto(fields))
            .setMaxLen(maxLen)
            .setPartitionKey(partitionKey == null ? "" : partitionKey)
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
   * consecutive and in the order given.
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
    AppendBatchRequest.Builder request =
        AppendBatchRequest.newBuilder()
            .setStream(stream)
            .setMaxLen(maxLen)
            .setPartitionKey(partitionKey == null ? "" : partitionKey);
    for (Map<String, byte[]> fields : entries) {
      request.addEntries(BatchEntry.newBuilder().putAllFields(toProto(fields)));
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
    return new AppendResult(response.getId(), response.getStreamId(), response.getStream());
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
