package io.echomq.client;

import io.echomq.v1.AckEmit;
import io.echomq.v1.ConsumeRequest;
import io.echomq.v1.Extend;
import io.echomq.v1.Fail;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * One hand-over of a stream entry to this consumer. Settle it once: return from the handler (ack),
 * throw (fail), or call {@link #ack()}, {@link #fail(String, Duration)}, {@link #deadLetter(String)} or
 * {@link #ackEmit(List)} (acknowledge and append what it produced, exactly once) yourself. Only the first settlement counts; later ones return false and send nothing.
 *
 * <p>A verdict travels on the call that delivered the entry. If that call has broken in the
 * meantime (the consumer reconnected), the verdict is dropped: the new call does not hold the id,
 * and the sidecar delivers the entry again.
 *
 * <h2>Lost leases</h2>
 * While the consumer holds a delivery, the sidecar keeps it from being reclaimed by peers. If a
 * peer takes it anyway (the sidecar says {@code LEASE_LOST}), the entry may now run elsewhere:
 * {@link #leaseLost()} completes and {@link #isLeaseLost()} turns true, so a long handler can check
 * and give up early. The handler thread is not interrupted (cancelling user code mid-write loses
 * work), and no verdict is sent for this delivery any more, whatever the handler returns or calls:
 * the entry belongs to the peer. If it comes back to this consumer, it is a new delivery with a
 * higher {@link #attempts()}.
 */
public final class Delivery {
  private final io.echomq.v1.Delivery proto;
  private final VerdictSink sink;
  private final Map<String, byte[]> payload;
  private final List<RawField> rawFields;
  private final AtomicBoolean settled = new AtomicBoolean();
  /** Set once, by the call, when the sidecar says LEASE_LOST. */
  private volatile boolean leaseLost;
  /**
   * Completed when the lease is lost; created only when someone asks ({@link #leaseLost()}), so a
   * delivery whose handler never looks costs nothing. Guarded by {@code this}.
   */
  private CompletableFuture<Void> leaseLostSignal;

  /**
   * A field whose name is not valid UTF-8, byte for byte.
   *
   * @param name the field name as Redis stores it
   * @param value the field value
   */
  public record RawField(byte[] name, byte[] value) {}

  Delivery(io.echomq.v1.Delivery proto, VerdictSink sink) {
    this.proto = proto;
    this.sink = sink;
    Map<String, byte[]> fields = new LinkedHashMap<>();
    proto.getPayloadMap().forEach((name, value) -> fields.put(name, value.toByteArray()));
    this.payload = Collections.unmodifiableMap(fields);
    List<RawField> raw = new ArrayList<>(proto.getRawFieldsCount());
    proto.getRawFieldsList().forEach(f -> raw.add(new RawField(f.getName().toByteArray(), f.getValue().toByteArray())));
    this.rawFields = Collections.unmodifiableList(raw);
  }

  /** The branded id: 28 lowercase hex characters, the entry's idempotency key. */
  public String id() {
    return proto.getId();
  }

  /** The entry's id in this stream, {@code <ms>-<seq>}. */
  public String streamId() {
    return proto.getStreamId();
  }

  /** The stream key. */
  public String stream() {
    return proto.getStream();
  }

  /** The consumer group. */
  public String group() {
    return proto.getGroup();
  }

  /**
   * The entry's fields, name to value bytes, without the reserved branded-id field. Fields whose
   * names are not valid UTF-8 are in {@link #rawFields()} instead.
   */
  public Map<String, byte[]> payload() {
    return payload;
  }

  /** A payload field decoded as UTF-8, or null when absent. */
  public String payloadText(String name) {
    byte[] value = payload.get(name);
    return value == null ? null : new String(value, StandardCharsets.UTF_8);
  }

  /** Fields whose names are not valid UTF-8, in stream order. Usually empty. */
  public List<RawField> rawFields() {
    return rawFields;
  }

  /** The entry's delivery count in the group: 1 on the first delivery, one more per hand-over. */
  public int attempts() {
    return proto.getAttempts();
  }

  /** When the branded id was minted. */
  public Instant mintedAt() {
    return Instant.ofEpochSecond(proto.getMintedAt().getSeconds(), proto.getMintedAt().getNanos());
  }

  /** The W3C trace context stored with the entry, or empty. */
  public String traceparent() {
    return proto.getTraceparent();
  }

  /** The delivery as it came off the wire. */
  public io.echomq.v1.Delivery proto() {
    return proto;
  }

  /**
   * True once a verdict was given (explicitly or by the consumer after the handler), or the lease
   * was lost ({@link #isLeaseLost()}): either way no verdict will be sent for this delivery now.
   */
  public boolean isSettled() {
    return settled.get();
  }

  /**
   * True once the sidecar said {@code LEASE_LOST} for this delivery: a peer reclaimed the entry,
   * which may be running elsewhere now. From then on no verdict is sent for it.
   */
  public boolean isLeaseLost() {
    return leaseLost;
  }

  /**
   * Completes (with {@code null}) when this delivery's lease is lost ({@link #isLeaseLost()}); it
   * never completes otherwise, also not when the delivery is settled. Use it to stop long work
   * early, for example {@code d.leaseLost().thenRun(job::cancel)} or
   * {@code d.leaseLost().isDone()} in a loop. Each call returns a new dependent future, so
   * completing or cancelling it does not signal anything. Actions chained without an executor
   * run on a gRPC thread: keep them short, or use the {@code ...Async} forms.
   */
  public CompletableFuture<Void> leaseLost() {
    CompletableFuture<Void> signal;
    synchronized (this) {
      if (leaseLostSignal == null) {
        leaseLostSignal = new CompletableFuture<>();
        if (leaseLost) {
          leaseLostSignal.complete(null);
        }
      }
      signal = leaseLostSignal;
    }
    return signal.copy();
  }

  /**
   * The sidecar said LEASE_LOST, first half: settles the delivery without a verdict, so nothing is
   * sent for it any more. The call runs this under its lock, so a verdict racing with it either
   * went out before or sees the flag.
   */
  void loseLease() {
    settled.set(true);
    leaseLost = true;
  }

  /**
   * Given back unstarted by a graceful stop (a {@code Release}): settled without a verdict, so
   * nothing more is sent for it. The call runs this under its lock.
   *
   * @return false when it was settled already (or its lease was lost): it is not released
   */
  boolean markReleased() {
    return settled.compareAndSet(false, true);
  }

  /** Second half, outside the call's lock: completes {@link #leaseLost()} (on a gRPC thread). */
  void signalLeaseLost() {
    CompletableFuture<Void> signal;
    synchronized (this) {
      signal = leaseLostSignal;
    }
    if (signal != null) {
      signal.complete(null);
    }
  }


  /**
   * Acknowledges the entry (XACK): it leaves the group's pending list for good. The ack is
   * coalesced with others into one {@code Ack} message: it goes out within the consumer's
   * {@code ackLinger} (default 1 ms), sooner when the window is full or every delivery the call
   * holds has its ack waiting, and always before a later {@code Fail} or {@code Extend} and before
   * a graceful stop closes the call.
   *
   * @return true when this call settled the delivery and the ack was queued on its call; false
   *     when it was settled already, its lease was lost, its call has ended, or a stop's deadline
   *     passed while it was unsettled (nothing is sent)
   */
  public boolean ack() {
    if (!settled.compareAndSet(false, true)) {
      return false;
    }
    return sink.ack(this);
  }

  /**
   * Fails the entry; it is delivered again after the subscription's backoff.
   *
   * @return true when this call settled the delivery and the verdict was sent
   */
  public boolean fail(String reason) {
    return settle(failRequest(id(), reason, null, FailKind.MESSAGE, false));
  }

  /**
   * Fails the entry with a kind: {@link FailKind#TRANSIENT} when it is not to blame (the database
   * is down: no attempt spent), {@link FailKind#POISON} to dead-letter it now; delivered again (if
   * at all) after the subscription's backoff.
   *
   * @return true when this call settled the delivery and the verdict was sent
   */
  public boolean fail(String reason, FailKind kind) {
    return settle(failRequest(id(), reason, null, Objects.requireNonNull(kind, "kind"), false));
  }

  /**
   * Fails the entry; it is delivered again after {@code retryAfter}.
   *
   * @return true when this call settled the delivery and the verdict was sent
   */
  public boolean fail(String reason, Duration retryAfter) {
    return settle(failRequest(id(), reason, Objects.requireNonNull(retryAfter, "retryAfter"), FailKind.MESSAGE, false));
  }

  /**
   * Fails the entry with a kind (see {@link #fail(String, FailKind)}); it is delivered again after
   * {@code retryAfter}, for example when a rate limit says when.
   *
   * @return true when this call settled the delivery and the verdict was sent
   */
  public boolean fail(String reason, Duration retryAfter, FailKind kind) {
    return settle(
        failRequest(
            id(),
            reason,
            Objects.requireNonNull(retryAfter, "retryAfter"),
            Objects.requireNonNull(kind, "kind"),
            false));
  }

  /**
   * Moves the entry to the dead-letter stream now (default {@code <stream>:dlq}), keeping its
   * branded id and payload, with {@code reason}: a {@link FailKind#POISON} fail, sent with the
   * older {@code dead_letter} flag too, so that a sidecar that predates the kinds does the same.
   *
   * @return true when this call settled the delivery and the verdict was sent
   */
  public boolean deadLetter(String reason) {
    return settle(failRequest(id(), reason, null, FailKind.POISON, true));
  }

  /**
   * Acknowledges the entry and appends {@code emits}, in one step the sidecar applies only while
   * this consumer still holds the entry: the emits of an entry are written exactly once, together
   * with its acknowledgement, whatever redeliveries, reclaims and duplicate handler runs happened.
   * No emits: an ack that applies only while the entry is held.
   *
   * <p>Sent at once as its own message (never coalesced with acks); blocks until the sidecar
   * answers (at most until the call ends).
   *
   * @param emits the entries to append, in order
   * @return the emitted entries, in the order of {@code emits}
   * @throws AckEmitException when it was not applied (nothing written); after a bad emit ({@link
   *     AckEmitException#isHeld()}) the delivery is unsettled again, and a handler that lets the
   *     exception propagate fails it
   */
  public List<EmittedEntry> ackEmit(List<Emit> emits) {
    try {
      return ackEmitAsync(emits).join();
    } catch (CompletionException e) {
      if (e.getCause() instanceof AckEmitException refused) {
        throw refused;
      }
      throw e;
    }
  }

  /**
   * {@link #ackEmit(List)} without blocking: the future completes with the emitted entries, or
   * exceptionally with an {@link AckEmitException}. It completes on a gRPC thread: keep what runs
   * on it short.
   *
   * @param emits the entries to append, in order
   * @return the future of the emitted entries
   */
  public CompletableFuture<List<EmittedEntry>> ackEmitAsync(List<Emit> emits) {
    AckEmit.Builder wire = AckEmit.newBuilder().setId(id());
    for (Emit emit : emits) {
      io.echomq.v1.Emit.Builder one = io.echomq.v1.Emit.newBuilder().setStream(emit.stream());
      emit.fields().forEach((name, value) -> one.putFields(name, com.google.protobuf.ByteString.copyFrom(value)));
      wire.addEmits(one);
    }
    ConsumeRequest request = ConsumeRequest.newBuilder().setAckEmit(wire).build();
    if (!settled.compareAndSet(false, true)) {
      String why = leaseLost ? "the lease was lost" : "the delivery is already settled";
      return CompletableFuture.failedFuture(new AckEmitException(id(), null, "not sent: " + why));
    }
    CompletableFuture<Object> answer = sink.ackEmit(this, request);
    if (answer == null) {
      return CompletableFuture.failedFuture(
          new AckEmitException(id(), null, "not sent: the call it arrived on has ended"));
    }
    return answer.thenApply(this::emitted);
  }

  /** The answer to this delivery's AckEmit as its result, or its refusal thrown. */
  private List<EmittedEntry> emitted(Object answer) {
    if (answer instanceof io.echomq.v1.Emitted emitted) {
      List<EmittedEntry> entries = new ArrayList<>(emitted.getEntriesCount());
      emitted.getEntriesList().forEach(e -> entries.add(new EmittedEntry(e.getId(), e.getStreamId(), e.getStream())));
      return Collections.unmodifiableList(entries);
    }
    if (answer instanceof VerdictError error) {
      AckEmitException refused = new AckEmitException(id(), error.code(), error.message());
      if (refused.isHeld() && !leaseLost) {
        settled.set(false); // still held: it may be answered again
        sink.rehold(this);
      }
      throw refused;
    }
    throw new AckEmitException(
        id(),
        null,
        "the call ended before the answer: the step may have been applied (the entry acknowledged, its emits"
            + " written once) or not (the entry comes back)");
  }

  /**
   * Pushes the ack deadline back to {@code by} from now (only meaningful with an ack deadline set
   * on the subscription). Does not settle the delivery.
   *
   * @return false when the delivery is settled or its call has ended
   */
  public boolean extend(Duration by) {
    if (settled.get()) {
      return false;
    }
    return sink.send(
        ConsumeRequest.newBuilder()
            .setExtend(Extend.newBuilder().addIds(id()).setBy(toProto(by)))
            .build());
  }

  /** The call that delivered this. */
  VerdictSink sink() {
    return sink;
  }

  /** Sends the Fail unless a verdict was given already or the lease was lost. */
  private boolean settle(ConsumeRequest verdict) {
    if (!settled.compareAndSet(false, true)) {
      return false;
    }
    return sink.fail(this, verdict);
  }

  /** The one place a Fail is built, so every fail, thrown or explicit, carries its kind. */
  static ConsumeRequest failRequest(String id, String reason, Duration retryAfter, FailKind kind, boolean deadLetter) {
    Fail.Builder fail =
        Fail.newBuilder()
            .setId(id)
            .setReason(reason == null ? "" : reason)
            .setKind(kind.toProto())
            .setDeadLetter(deadLetter);
    if (retryAfter != null) {
      fail.setRetryAfter(toProto(retryAfter));
    }
    return ConsumeRequest.newBuilder().setFail(fail).build();
  }

  static com.google.protobuf.Duration toProto(Duration duration) {
    return com.google.protobuf.Duration.newBuilder()
        .setSeconds(duration.getSeconds())
        .setNanos(duration.getNano())
        .build();
  }

  @Override
  public String toString() {
    return "Delivery{id=" + id() + ", stream=" + stream() + ", streamId=" + streamId() + ", attempts=" + attempts() + "}";
  }
}
