package io.echomq.client;

import io.echomq.v1.Ack;
import io.echomq.v1.ConsumeRequest;
import io.echomq.v1.ConsumerServiceGrpc;
import io.echomq.v1.Subscribe;
import io.grpc.Channel;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Consumer;

/**
 * Consumes one stream through one consumer group of the EchoMQ sidecar, handing each delivery to a
 * {@link DeliveryHandler} (or each frame to a {@link BatchHandler}) on a fixed pool of
 * {@code concurrency} threads that read from one bounded queue.
 *
 * <pre>{@code
 * try (var consumer = EchoMqConsumer.builder()
 *     .target("127.0.0.1:50051").stream("orders").group("billing")
 *     .startPosition(StartPosition.beginning())
 *     .handler(delivery -> bill(delivery.payloadText("order")))
 *     .build()) {
 *   consumer.start().join();      // subscribed
 *   consumer.terminated().join(); // runs until stop(), close() or a permanent error
 * }
 * }</pre>
 *
 * <h2>Batched frames and coalesced acks</h2>
 * The consumer always asks the sidecar for batched frames ({@code Subscribe.max_batch}, see
 * {@link FlowControl#maxBatch()}): up to that many deliveries arrive in one gRPC message, and never wait
 * to fill one, so batching adds no latency at low rates. A {@link DeliveryHandler} still sees one
 * delivery at a time. Acks are coalesced into one {@code Ack} message per short window
 * ({@link Builder#ackLinger}, {@link Builder#ackBatch}); fails and extensions go out at once,
 * after the acks given before them.
 *
 * <h2>Lifecycle</h2>
 * <ul>
 *   <li>{@link #start()} opens the Consume call and subscribes; the future completes on the first
 *       {@code Subscribed}, or fails with a permanent {@link EchoMqException}.</li>
 *   <li>When the call breaks (the sidecar restarts, {@code UNAVAILABLE}, connection refused) the
 *       consumer opens a new one after a jittered exponential backoff and subscribes with the same
 *       settings. Handlers still running for the broken call finish, but their verdicts are
 *       dropped: the new call does not hold those ids, and the sidecar delivers them again.</li>
 *   <li>A permanent error ({@link EchoMqException#isPermanent()}: INVALID_ARGUMENT, OUT_OF_RANGE,
 *       NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, UNAUTHENTICATED, FAILED_PRECONDITION,
 *       UNIMPLEMENTED) is not retried: {@link #terminated()} fails with it.</li>
 *   <li>A delivery whose lease a peer took ({@code LEASE_LOST}) is signalled
 *       ({@link Delivery#leaseLost()}) and gets no verdict from this consumer.</li>
 *   <li>{@link #stop(Duration)} sends {@code Drain} (the sidecar hands the call nothing more),
 *       stops taking work, lets running handlers finish within the deadline, sends their
 *       verdicts (the coalesced acks included), then closes the call. Deliveries that were received but
 *       not yet handed to a handler go back to the group at once in a {@code Release}, with the
 *       attempts they had, for its other consumers. At the
 *       deadline only the handlers still running lose their verdicts; those given before still
 *       go out.</li>
 *   <li>{@link #abort()} drops the call at once, with no verdicts.</li>
 * </ul>
 */
public final class EchoMqConsumer implements AutoCloseable {
  private static final System.Logger LOG = System.getLogger(EchoMqConsumer.class.getName());

  private enum State { NEW, RUNNING, STOPPING, STOPPED }

  /**
   * The sidecar's default {@code --default-max-in-flight}: the cap of the adaptive window that an
   * unset {@link FlowControl#maxInFlight()} (sent as 0) gets. The window starts at 64 and grows
   * toward the cap while the handlers keep up; {@code Subscribed.max_in_flight} reports the cap.
   * Used only until the sidecar says. It was 64, the fixed default and the default handler
   * concurrency, before the adaptive window (issue 27); the concurrency is {@link
   * #DEFAULT_CONCURRENCY} now.
   */
  public static final int DEFAULT_MAX_IN_FLIGHT = 1024;
  /**
   * Handler threads when neither {@link FlowControl#concurrency()} nor {@link
   * FlowControl#maxInFlight()} is set. Not the adaptive window's cap: 64 threads keep up with a fast
   * handler's whole window, and when handlers are slow the deliveries queue in the client, which
   * the sidecar sees as delay and answers by shrinking the window; 1024 threads would mostly idle.
   */
  public static final int DEFAULT_CONCURRENCY = 64;
  /** The most deliveries per frame asked for by default ({@link FlowControl#maxBatch()}). */
  public static final int DEFAULT_MAX_BATCH = 256;
  /** The sidecar refuses a {@code max_batch} above this with INVALID_ARGUMENT. */
  public static final int MAX_BATCH_LIMIT = 4096;
  /** How long an ack waits for others to share its Ack message by default ({@link Builder#ackLinger}). */
  public static final Duration DEFAULT_ACK_LINGER = Duration.ofMillis(1);
  /** The most ids of one Ack message by default ({@link Builder#ackBatch}). */
  public static final int DEFAULT_ACK_BATCH = 256;
  /**
   * The least time a stop waits for the sidecar to end the half-closed call, also when its deadline
   * has (nearly) passed: the sidecar ends a call only after applying the verdicts read before the
   * half-close (milliseconds); the bound is for a broken call, which is then cancelled.
   */
  private static final long STOP_CLOSE_GRACE_NANOS = TimeUnit.SECONDS.toNanos(1);
  /** The sidecar's default limit of {@code max_in_flight}: the handler queue's bound when it is 0. */
  private static final int MAX_IN_FLIGHT_LIMIT = 10_000;

  private final String stream;
  private final String group;
  private final ConsumeRequest subscribe;
  /** Exactly one of handler and batchHandler is set. */
  private final DeliveryHandler handler;
  private final BatchHandler batchHandler;
  private final Consumer<VerdictError> verdictErrors;
  private final Duration closeTimeout;
  /** The channel this consumer built and closes; null when the caller supplied one. */
  private final ManagedChannel ownedChannel;
  private final ConsumerServiceGrpc.ConsumerServiceStub stub;
  /** Runs handlers: exactly {@code concurrency} threads, so never more handlers at once. */
  private final HandlerPool handlers;
  /** Runs reconnect attempts after their backoff delay, and the ack windows' linger timers. */
  private final ScheduledThreadPoolExecutor scheduler;
  private final ConsumerCall.AckWindow ackWindow;
  /** The max_in_flight asked for (0: the sidecar's default). */
  private final int maxInFlight;
  private final Backoff backoff;
  private final CompletableFuture<Void> subscribed = new CompletableFuture<>();
  private final CompletableFuture<Void> terminated = new CompletableFuture<>();
  private final ConsumerCall.Listener listener = new CallListener();

  private final Object lock = new Object();
  private volatile State state = State.NEW;
  /** The live call, or null between calls. Guarded by {@code lock}. */
  private ConsumerCall current;
  private long generations;
  private ScheduledFuture<?> pendingReconnect;
  private CompletableFuture<Boolean> stopping;

  private EchoMqConsumer(Builder b) {
    this.stream = b.stream;
    this.group = b.group;
    this.handler = b.handler;
    this.batchHandler = b.batchHandler;
    this.maxInFlight = b.effectiveMaxInFlight();
    this.verdictErrors = b.verdictErrors;
    this.closeTimeout = b.closeTimeout;
    this.backoff = new Backoff(b.reconnectBackoffInitial, b.reconnectBackoffMax);

    Subscribe.Builder sub =
        Subscribe.newBuilder()
            .setStream(b.stream)
            .setGroup(b.group)
            .setMaxInFlight(maxInFlight)
            .setMaxBatch(b.effectiveMaxBatch());
    b.startPosition.applyTo(sub);
    if (b.ackDeadline != null) {
      sub.setAckDeadline(Delivery.toProto(b.ackDeadline));
    }
    if (b.retryBackoffInitial != null) {
      sub.setRetryBackoffInitial(Delivery.toProto(b.retryBackoffInitial));
    }
    if (b.retryBackoffMax != null) {
      sub.setRetryBackoffMax(Delivery.toProto(b.retryBackoffMax));
    }
    if (b.deadLetterStream != null) {
      sub.setDeadLetterStream(b.deadLetterStream);
    }
    sub.setMaxDeliveries(b.maxDeliveries);
    sub.setNoAck(b.noAck);
    if (b.keyField != null) {
      sub.setKeyField(b.keyField);
    }
    sub.setMaxInFlightPerKey(b.maxInFlightPerKey);
    this.subscribe = ConsumeRequest.newBuilder().setSubscribe(sub).build();

    Channel channel;
    if (b.channel != null) {
      this.ownedChannel = null;
      channel = b.channel;
    } else {
      this.ownedChannel = Targets.open(b.target);
      channel = ownedChannel;
    }
    this.stub = ConsumerServiceGrpc.newStub(ClientInterceptors.intercept(channel, b.interceptors));
    // The sidecar never hands a call more than its max_in_flight (at most 10,000) un-settled.
    this.handlers =
        new HandlerPool(
            b.effectiveConcurrency(), maxInFlight > 0 ? maxInFlight : MAX_IN_FLIGHT_LIMIT,
            "echomq-handler-" + b.stream + "-", this::runItem);
    this.scheduler = new ScheduledThreadPoolExecutor(1, threads("echomq-timer-"));
    scheduler.setRemoveOnCancelPolicy(true);
    this.ackWindow = new ConsumerCall.AckWindow(b.ackLinger.toNanos(), b.ackBatch, scheduler, b.noAck);
  }

  /** A builder; {@code target} (or {@code channel}), stream, group, start position and handler are required. */
  public static Builder builder() {
    return new Builder();
  }

  /**
   * Opens the call and subscribes. Call once.
   *
   * @return completes when the sidecar confirmed the first subscription; fails with a permanent
   *     {@link EchoMqException}; stays pending while the sidecar is unreachable (the consumer keeps
   *     trying)
   */
  public CompletableFuture<Void> start() {
    synchronized (lock) {
      if (state != State.NEW) {
        throw new IllegalStateException("a consumer starts once (state: " + state + ")");
      }
      state = State.RUNNING;
      handlers.start();
      connectLocked();
    }
    return subscribed.copy();
  }

  /**
   * Completes when the consumer has stopped ({@link #stop}, {@link #close}, {@link #abort}), or
   * fails with the permanent {@link EchoMqException} that ended it.
   */
  public CompletableFuture<Void> terminated() {
    return terminated.copy();
  }

  /** True while a call is open and subscribed-to (false while reconnecting or stopped). */
  public boolean isConnected() {
    synchronized (lock) {
      return current != null && current.isOpen() && state == State.RUNNING;
    }
  }

  /**
   * Stops gracefully: first sends {@code Drain} on the call, so the sidecar hands it nothing more
   * and reads nothing more from Redis on its behalf; hands no new delivery to a handler, lets
   * running handlers finish within {@code deadline}, sends their verdicts, then closes the call.
   * What was received but not started (including deliveries that were already on the wire when
   * the sidecar got the Drain) is given back in one {@code Release} right after the Drain: the
   * group's other consumers (this sidecar's other calls, or a peer sidecar's next reclaim beat)
   * get it at once, with the {@code attempts} it had, so a rolling restart costs no attempt and no
   * wait for the sidecar's {@code --reclaim-min-idle-ms} (with {@code noAck} nothing is pending,
   * so nothing is released).
   *
   * <p>Running handlers get 90 % of the deadline (the rest, at most 1 s, is kept to close the
   * call). If some are still running then, only they lose their verdicts: the call refuses
   * verdicts from that moment ({@link Delivery#ack()} and {@code fail(…)} return false), then the
   * handler threads are interrupted, so a handler that gives up and returns acknowledges nothing;
   * their entries stay pending and are delivered again. Every verdict given before (acks waiting
   * in the coalescing window, fails, dead letters) still goes out on the same call, which is then
   * half-closed; the stop waits for the sidecar to apply them and end the call (milliseconds) for
   * the rest of the deadline, at least 1 s, then cancels it (a broken call: verdicts it had not
   * applied are lost with it, and their entries come back too). It does not wait for handlers
   * that ignore the interrupt. Safe to call more than once (later calls return the first call's
   * future).
   *
   * @return completes with true when every running handler finished and the call closed cleanly
   *     within the deadline, false otherwise; it completes no later than about {@code deadline}
   *     (about 1 s after the half-close, for a deadline under 10 s whose handlers ran late)
   */
  public CompletableFuture<Boolean> stop(Duration deadline) {
    Objects.requireNonNull(deadline, "deadline");
    CompletableFuture<Boolean> result;
    ConsumerCall call;
    synchronized (lock) {
      if (stopping != null) {
        return stopping.copy();
      }
      stopping = result = new CompletableFuture<>();
      if (state == State.NEW || state == State.STOPPED) {
        state = State.STOPPED;
        handlers.shutdown();
        releaseResources(false);
        subscribed.cancel(false);
        terminated.complete(null);
        result.complete(true);
        return result.copy();
      }
      state = State.STOPPING;
      if (pendingReconnect != null) {
        pendingReconnect.cancel(false);
      }
      // From here on no handler starts and no reconnect opens a call, so this is the call to drain.
      call = current;
    }
    // First step, before waiting for the running handlers: Drain, so the credit their acks free
    // cannot pull another entry into this call (and the group's PEL) just before it closes.
    // Then what no handler started goes back to the group (deliveries still on the wire too, as
    // they arrive: onDeliveries).
    if (call != null) {
      call.drain();
      call.release(unstarted(handlers.takeWaiting()));
    }
    Thread stopper = new Thread(() -> finishStop(deadline, result), "echomq-stop-" + stream);
    stopper.setDaemon(true);
    stopper.start();
    return result.copy();
  }

  /**
   * Drops the call at once: no graceful stop and no verdicts. Running handlers are interrupted and
   * whatever the call held stays pending (delivered again after the backoff).
   */
  public void abort() {
    ConsumerCall call;
    synchronized (lock) {
      if (state == State.STOPPED) {
        return;
      }
      state = State.STOPPED;
      call = current;
      current = null;
      if (pendingReconnect != null) {
        pendingReconnect.cancel(false);
      }
    }
    if (call != null) {
      call.cancel("consumer aborted");
    }
    handlers.shutdownNow();
    releaseResources(true);
    subscribed.cancel(false);
    terminated.complete(null);
    synchronized (lock) {
      if (stopping != null) {
        stopping.complete(false);
      }
    }
  }

  /** {@link #stop(Duration)} with the builder's {@code closeTimeout} (default 30 s), waiting for it. */
  @Override
  public void close() {
    stop(closeTimeout).join();
  }

  /**
   * Low-level: sends a raw Ack of any ids on the current call, bypassing delivery bookkeeping. An id
   * the call does not hold gets a {@link VerdictError} ({@code UNKNOWN_ID}). Prefer
   * {@link Delivery#ack()}.
   *
   * @return false when no call is open (reconnecting or stopped): nothing was sent
   */
  public boolean rawAck(String... ids) {
    if (ids.length == 0) {
      throw new IllegalArgumentException("rawAck needs at least one id");
    }
    ConsumerCall call = currentCall();
    return call != null && call.send(ConsumeRequest.newBuilder().setAck(Ack.newBuilder().addAllIds(Arrays.asList(ids))).build());
  }

  /**
   * Low-level: sends a raw Fail of any id on the current call. Prefer {@link Delivery#fail}.
   *
   * @param retryAfter null for the subscription's backoff
   * @return false when no call is open: nothing was sent
   */
  public boolean rawFail(String id, String reason, Duration retryAfter, boolean deadLetter) {
    return rawFail(id, reason, retryAfter, deadLetter, FailKind.MESSAGE);
  }

  /**
   * Low-level: sends a raw Fail of any id, with a kind, on the current call. Prefer {@link
   * Delivery#fail(String, FailKind)}.
   *
   * @param retryAfter null for the subscription's backoff
   * @return false when no call is open: nothing was sent
   */
  public boolean rawFail(String id, String reason, Duration retryAfter, boolean deadLetter, FailKind kind) {
    ConsumerCall call = currentCall();
    return call != null
        && call.send(Delivery.failRequest(id, reason, retryAfter, Objects.requireNonNull(kind, "kind"), deadLetter));
  }

  private ConsumerCall currentCall() {
    synchronized (lock) {
      return current;
    }
  }

  /** Opens a new call and sends the subscribe. Holds {@code lock}. */
  private void connectLocked() {
    ConsumerCall call = new ConsumerCall(++generations, listener, ackWindow, maxInFlight);
    current = call;
    try {
      stub.consume(call);
      call.send(subscribe);
    } catch (RuntimeException e) {
      // The channel refused to start a call (for example it is shutting down): retry like a broken call.
      LOG.log(Level.WARNING, "could not open the Consume call: " + e);
      current = null;
      scheduleReconnectLocked(Status.fromThrowable(e));
    }
  }

  private void scheduleReconnectLocked(Status why) {
    Duration delay = backoff.next();
    LOG.log(
        Level.INFO,
        "Consume call on stream {0} group {1} ended ({2}); reconnecting in {3} ms",
        stream, group, describe(why), delay.toMillis());
    try {
      pendingReconnect = scheduler.schedule(this::reconnect, delay.toNanos(), TimeUnit.NANOSECONDS);
    } catch (RejectedExecutionException e) {
      // Stopped meanwhile.
    }
  }

  private void reconnect() {
    synchronized (lock) {
      if (state != State.RUNNING) {
        return;
      }
      if (ownedChannel != null) {
        // The channel has its own, slower connect backoff; ours decides when to try.
        ownedChannel.resetConnectBackoff();
      }
      connectLocked();
    }
  }

  /** The deliveries of handler-queue items (deliveries, or frames for the batch handler). */
  @SuppressWarnings("unchecked")
  private static List<Delivery> unstarted(List<Object> items) {
    List<Delivery> deliveries = new ArrayList<>(items.size());
    for (Object item : items) {
      if (item instanceof Delivery delivery) {
        deliveries.add(delivery);
      } else {
        deliveries.addAll((List<Delivery>) item);
      }
    }
    return deliveries;
  }

  /** Runs one item of the handler queue: a delivery, or a frame for the batch handler. */
  @SuppressWarnings("unchecked")
  private void runItem(Object item) {
    if (item instanceof Delivery delivery) {
      runHandler(delivery);
    } else {
      runBatchHandler((List<Delivery>) item);
    }
  }

  private void runHandler(Delivery delivery) {
    if (state != State.RUNNING || !delivery.sink().isOpen() || delivery.isLeaseLost()) {
      // Stopping: given back, never started. The call broke while the delivery waited: the
      // sidecar returned it already. Or a peer took the entry before its handler started: it is
      // the peer's to run now (nothing is released for it).
      delivery.sink().release(List.of(delivery));
      return;
    }
    try {
      handler.handle(delivery);
      if (!delivery.isSettled()) {
        delivery.ack();
      }
    } catch (Throwable t) {
      if (!delivery.isSettled()) {
        delivery.fail(reasonOf(t), FailKind.of(t));
      }
      if (t instanceof Error) {
        LOG.log(Level.WARNING, "handler threw on " + delivery + "; failed it", t);
      }
    }
  }

  private void runBatchHandler(List<Delivery> batch) {
    if (state != State.RUNNING || !batch.get(0).sink().isOpen()) {
      batch.get(0).sink().release(batch); // As for a single delivery.
      return;
    }
    List<Verdict> verdicts;
    try {
      verdicts = batchHandler.handle(batch);
    } catch (Throwable t) {
      String reason = reasonOf(t);
      FailKind kind = FailKind.of(t);
      for (Delivery delivery : batch) {
        if (!delivery.isSettled()) {
          delivery.fail(reason, kind);
        }
      }
      if (t instanceof Error) {
        LOG.log(Level.WARNING, "batch handler threw on " + batch.size() + " deliveries; failed them", t);
      }
      return;
    }
    if (verdicts != null && verdicts.size() != batch.size()) {
      String reason = "the batch handler answered " + verdicts.size() + " verdicts for " + batch.size() + " deliveries";
      LOG.log(Level.ERROR, reason + "; failing them");
      for (Delivery delivery : batch) {
        if (!delivery.isSettled()) {
          delivery.fail(reason);
        }
      }
      return;
    }
    for (int i = 0; i < batch.size(); i++) {
      Delivery delivery = batch.get(i);
      if (delivery.isSettled()) {
        continue;
      }
      Verdict verdict = verdicts == null ? null : verdicts.get(i);
      if (verdict == null) {
        delivery.ack();
      } else {
        verdict.applyTo(delivery);
      }
    }
  }

  /** The rest of a graceful stop, after the Drain: on its own thread. */
  private void finishStop(Duration deadline, CompletableFuture<Boolean> result) {
    long start = System.nanoTime();
    long total = deadline.toNanos();
    // Keep a tenth of the deadline (at most 1 s) to close the call after the handlers.
    long closeReserve = Math.min(total / 10, TimeUnit.SECONDS.toNanos(1));
    handlers.shutdown();
    boolean drained;
    try {
      drained = handlers.awaitTermination(Math.max(0, total - closeReserve));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      drained = false;
    }
    ConsumerCall call;
    synchronized (lock) {
      call = current;
    }
    if (!drained) {
      // The handlers still running lose their verdicts: refused first, then interrupted, so one
      // that gives up and returns acks nothing. The verdicts given before still go out below.
      if (call != null) {
        call.refuseVerdicts();
      }
      handlers.shutdownNow();
      LOG.log(
          Level.WARNING,
          "stop deadline {0} passed with handlers still running: they were interrupted and their entries stay pending;"
              + " the verdicts given before are sent",
          deadline);
    }
    boolean closed = true;
    if (call != null) {
      // Sends the coalesced acks first: a graceful stop settles on the wire all that was handled.
      call.halfClose();
      long left = Math.max(total - (System.nanoTime() - start), STOP_CLOSE_GRACE_NANOS);
      closed = awaitQuietly(call.ended(), left);
      if (!closed) {
        call.cancel("the sidecar did not close the call in time after the stop's half-close");
      }
    }
    synchronized (lock) {
      state = State.STOPPED;
      current = null;
    }
    releaseResources(false);
    subscribed.cancel(false);
    terminated.complete(null);
    result.complete(drained && closed);
  }

  private void releaseResources(boolean now) {
    scheduler.shutdownNow();
    if (ownedChannel != null) {
      if (now) {
        ownedChannel.shutdownNow();
      } else {
        ownedChannel.shutdown();
      }
    }
  }

  private void failPermanently(ConsumerCall call, Status status) {
    EchoMqException error =
        new EchoMqException(
            status.getCode(),
            "the sidecar refused the subscription to stream \"" + stream + "\" group \"" + group + "\""
                + (status.getDescription() == null ? "" : ": " + status.getDescription())
                + " (not retried: fix the request or the setup)",
            status.asRuntimeException());
    LOG.log(Level.ERROR, error.getMessage());
    handlers.shutdown();
    releaseResources(false);
    subscribed.completeExceptionally(error);
    terminated.completeExceptionally(error);
  }

  private final class CallListener implements ConsumerCall.Listener {
    @Override
    public void onSubscribed(ConsumerCall call, io.echomq.v1.Subscribed confirmed) {
      synchronized (lock) {
        if (call != current) {
          return;
        }
        backoff.reset();
        call.confirmMaxInFlight(confirmed.getMaxInFlight());
      }
      LOG.log(
          Level.DEBUG, "subscribed to stream {0} group {1} as consumer {2} (max_in_flight {3})",
          confirmed.getStream(), confirmed.getGroup(), confirmed.getConsumer(), confirmed.getMaxInFlight());
      subscribed.complete(null);
    }

    @Override
    public void onDeliveries(ConsumerCall call, List<Delivery> frame) {
      // Stopping (Drain sent; these were already on the wire): not handed to a handler, given
      // back. The queue holds the call's max_in_flight, which the sidecar never exceeds, so this
      // waits only while a broken call's leftovers are skipped.
      if (state != State.RUNNING) {
        call.release(frame);
        return;
      }
      java.util.function.BooleanSupplier wanted = () -> state == State.RUNNING && call.isOpen();
      if (batchHandler != null) {
        handlers.offer(frame, wanted);
        return;
      }
      for (Delivery delivery : frame) {
        if (!handlers.offer(delivery, wanted)) {
          return;
        }
      }
    }

    @Override
    public void onVerdictError(ConsumerCall call, VerdictError error) {
      try {
        verdictErrors.accept(error);
      } catch (RuntimeException e) {
        LOG.log(Level.WARNING, "verdict error listener threw", e);
      }
    }

    @Override
    public void onEnded(ConsumerCall call, Status status) {
      synchronized (lock) {
        if (call != current || state != State.RUNNING) {
          return; // An older call, or stop()/abort() is in charge.
        }
        current = null;
        if (!EchoMqException.isPermanent(status.getCode())) {
          scheduleReconnectLocked(status);
          return;
        }
        state = State.STOPPED;
      }
      failPermanently(call, status);
    }
  }

  private static String describe(Status status) {
    return status.getCode() + (status.getDescription() == null ? "" : ": " + status.getDescription());
  }

  private static String reasonOf(Throwable t) {
    return t.getMessage() != null ? t.getMessage() : t.getClass().getName();
  }

  private static boolean awaitQuietly(CompletableFuture<?> future, long nanos) {
    try {
      future.get(Math.max(0, nanos), TimeUnit.NANOSECONDS);
      return true;
    } catch (TimeoutException | ExecutionException e) {
      return future.isDone();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  private static ThreadFactory threads(String prefix) {
    AtomicInteger n = new AtomicInteger();
    return runnable -> {
      Thread thread = new Thread(runnable, prefix + n.incrementAndGet());
      thread.setDaemon(true);
      return thread;
    };
  }

  /** Settings of a consumer. Every setting's default is named in its method's doc. */
  public static final class Builder {
    private String target;
    private Channel channel;
    private String stream;
    private String group;
    private StartPosition startPosition;
    private int maxInFlight;
    /** -1: unset, the effective max in flight (1 for a batch handler). */
    private int concurrency = -1;
    private DeliveryHandler handler;
    private BatchHandler batchHandler;
    private int maxBatch = -1;
    private Duration ackLinger = DEFAULT_ACK_LINGER;
    private int ackBatch = DEFAULT_ACK_BATCH;
    private Consumer<VerdictError> verdictErrors =
        error -> LOG.log(Level.WARNING, "verdict not applied: {0} {1}: {2}", error.code(), error.id(), error.message());
    private Duration ackDeadline;
    private Duration retryBackoffInitial;
    private Duration retryBackoffMax;
    private String deadLetterStream;
    private int maxDeliveries;
    private boolean noAck;
    private String keyField;
    private int maxInFlightPerKey;
    private Duration reconnectBackoffInitial = Duration.ofMillis(100);
    private Duration reconnectBackoffMax = Duration.ofSeconds(5);
    private Duration closeTimeout = Duration.ofSeconds(30);
    private final List<ClientInterceptor> interceptors = new ArrayList<>();

    private Builder() {}

    /** The sidecar's address: {@code host:port} or {@code unix:/path}. Required unless {@link #channel} is set. */
    public Builder target(String target) {
      this.target = target;
      return this;
    }

    /** A channel to use instead of {@link #target}; the caller owns it and closes it. */
    public Builder channel(Channel channel) {
      this.channel = channel;
      return this;
    }

    /** The stream key. Required. */
    public Builder stream(String stream) {
      this.stream = stream;
      return this;
    }

    /** The consumer group. Required. */
    public Builder group(String group) {
      this.group = group;
      return this;
    }

    /** Where the group starts if the sidecar has to create it. Required: there is no default. */
    public Builder startPosition(StartPosition startPosition) {
      this.startPosition = startPosition;
      return this;
    }

    /**
     * How much the consumer takes on at once: max in flight, concurrency and max batch (see {@link
     * FlowControl}). Default {@link FlowControl#DEFAULTS}: every setting's default. Replaces what
     * the deprecated {@link #maxInFlight}, {@link #concurrency} and {@link #maxBatch} set.
     *
     * @param flowControl the settings
     * @return this builder
     */
    public Builder flowControl(FlowControl flowControl) {
      Objects.requireNonNull(flowControl, "flowControl");
      this.maxInFlight = flowControl.maxInFlight();
      this.concurrency = flowControl.concurrency() == 0 ? -1 : flowControl.concurrency();
      this.maxBatch = flowControl.maxBatch() == 0 ? -1 : flowControl.maxBatch();
      return this;
    }

    /**
     * Sets {@link FlowControl#maxInFlight()} alone.
     *
     * @param maxInFlight the most deliveries held un-settled; 0: the sidecar's default
     * @return this builder
     * @deprecated Use {@link #flowControl(FlowControl)}; goes away in the next release.
     */
    @Deprecated(forRemoval = true)
    public Builder maxInFlight(int maxInFlight) {
      this.maxInFlight = maxInFlight;
      return this;
    }

    /**
     * Sets {@link FlowControl#concurrency()} alone.
     *
     * @param concurrency the most handlers at once
     * @return this builder
     * @deprecated Use {@link #flowControl(FlowControl)}; goes away in the next release.
     */
    @Deprecated(forRemoval = true)
    public Builder concurrency(int concurrency) {
      this.concurrency = concurrency;
      return this;
    }

    /** The handler, called once per delivery. Required, unless {@link #batchHandler} is set instead. */
    public Builder handler(DeliveryHandler handler) {
      this.handler = handler;
      return this;
    }

    /**
     * Opt-in, instead of {@link #handler}: a handler of whole frames, for work done in bulk. It gets
     * the deliveries of one frame (1 to {@link FlowControl#maxBatch()} of them) and answers one {@link Verdict}
     * per delivery; at most {@code concurrency} batches run at once. Everything else (stop,
     * reconnects, coalesced acks) is as with a {@link DeliveryHandler}.
     */
    public Builder batchHandler(BatchHandler batchHandler) {
      this.batchHandler = batchHandler;
      return this;
    }

    /**
     * Sets {@link FlowControl#maxBatch()} alone.
     *
     * @param maxBatch the most deliveries per frame
     * @return this builder
     * @deprecated Use {@link #flowControl(FlowControl)}; goes away in the next release.
     */
    @Deprecated(forRemoval = true)
    public Builder maxBatch(int maxBatch) {
      this.maxBatch = maxBatch;
      return this;
    }

    /**
     * How long an ack waits for others to travel in the same {@code Ack} message. An ack goes out
     * at the latest this long after it was given, sooner when {@link #ackBatch} acks are waiting,
     * when every delivery the call holds has its ack waiting, or when a fail, an extension or a
     * graceful stop's end is sent (in order, after the acks before it). Fails are never delayed.
     * Default 1 ms. {@link Duration#ZERO}: no linger, each ack goes out when given.
     */
    public Builder ackLinger(Duration ackLinger) {
      this.ackLinger = Objects.requireNonNull(ackLinger, "ackLinger");
      return this;
    }

    /**
     * The most ids in one {@code Ack} message. Default {@value EchoMqConsumer#DEFAULT_ACK_BATCH}. Never more than
     * a quarter of the effective max in flight (at least 1): the sidecar reads again when that much
     * credit is free, so waiting for more would only stall the flow.
     */
    public Builder ackBatch(int ackBatch) {
      this.ackBatch = ackBatch;
      return this;
    }

    /**
     * Called with each verdict error the sidecar sends: a verdict or extension it did not apply
     * ({@code UNKNOWN_ID}, {@code NOT_PENDING}, {@code INVALID_ARGUMENT}, {@code UNAVAILABLE}), and
     * the unprompted {@code LEASE_LOST}, which comes after the consumer has signalled the delivery
     * ({@link Delivery#leaseLost()}). Called on a gRPC thread: do not block. A listener that throws
     * is logged and ignored. Default: a WARNING log line.
     */
    public Builder onVerdictError(Consumer<VerdictError> listener) {
      this.verdictErrors = Objects.requireNonNull(listener, "listener");
      return this;
    }

    /**
     * How long a delivery may stay un-settled before the sidecar treats it as failed: it returns to
     * the group's pending list and is delivered again after the retry backoff (a verdict given
     * later is answered {@code UNKNOWN_ID}). {@link Delivery#extend} pushes it back.
     * Default: unset, no deadline (a delivery is held as long as the call lives). {@code null} or
     * {@link Duration#ZERO} unsets it.
     *
     * @throws IllegalArgumentException from {@link #build()} when negative
     */
    public Builder ackDeadline(Duration ackDeadline) {
      this.ackDeadline = ackDeadline;
      return this;
    }

    /**
     * The first retry delay after a Fail without its own delay, a dropped call or a passed ack
     * deadline; doubled per attempt, jittered into its upper half, up to {@link
     * #retryBackoffMax}. Default: unset, the sidecar's ({@code --retry-backoff-initial-ms}, 1 s).
     *
     * @throws IllegalArgumentException from {@link #build()} when negative
     */
    public Builder retryBackoffInitial(Duration delay) {
      this.retryBackoffInitial = delay;
      return this;
    }

    /**
     * The cap of the retry delay. Default: unset, the sidecar's ({@code --retry-backoff-max-ms},
     * 60 s).
     *
     * @throws IllegalArgumentException from {@link #build()} when negative
     */
    public Builder retryBackoffMax(Duration delay) {
      this.retryBackoffMax = delay;
      return this;
    }

    /** {@link #retryBackoffInitial} and {@link #retryBackoffMax} in one call. */
    public Builder retryBackoff(Duration initial, Duration max) {
      return retryBackoffInitial(initial).retryBackoffMax(max);
    }

    /**
     * The dead-letter stream, for poison entries ({@link #maxDeliveries}) and {@link
     * Delivery#deadLetter}. Default: unset, {@code <stream>:dlq}. A group setting: every
     * subscription of the group on one sidecar must name the same one (else the sidecar refuses
     * the later one with FAILED_PRECONDITION, a permanent error).
     */
    public Builder deadLetterStream(String deadLetterStream) {
      this.deadLetterStream = deadLetterStream;
      return this;
    }

    /**
     * Poison entries: an entry delivered this many times is not handed out again but moved to the
     * dead-letter stream, with its branded id, source stream, group, attempts and last failure
     * reason. Default: 0, the sidecar's ({@code --default-max-deliveries}, itself 0: no limit). A
     * group setting, like {@link #deadLetterStream}.
     *
     * @throws IllegalArgumentException from {@link #build()} when negative
     */
    public Builder maxDeliveries(int maxDeliveries) {
      this.maxDeliveries = maxDeliveries;
      return this;
    }

    /**
     * At-most-once mode, off by default: <strong>entries can be lost</strong>. The sidecar reads
     * with {@code XREADGROUP … NOACK}, so entries are never pending: an entry whose handler
     * throws, fails or never returns, or that is in flight when the process dies, is gone, with no
     * retry, reclaim or dead-lettering. Ask for it only where losing entries is acceptable (metrics,
     * caches). In this mode a handler that throws, {@link Delivery#fail} and {@link
     * Delivery#deadLetter} settle the delivery like an ack (the sidecar cannot retry it; the ack
     * only frees its slot) and log a WARNING that the entry was lost.
     */
    public Builder noAck(boolean noAck) {
      this.noAck = noAck;
      return this;
    }

    /**
     * Per-key limits (ordering by key): the payload field whose value is an entry's key (an
     * order's {@code customer}, an account). At most {@link #maxInFlightPerKey} entries of one
     * key are then held at once anywhere in the group, across every sidecar, and a key's entries
     * start in stream order: a failed entry is retried before its key's later ones, and an ack or
     * a dead letter frees the key. Entries without the field are not limited; other keys never
     * wait behind a busy one. Default: unset, no per-key limit. A group setting, like {@link
     * #deadLetterStream}: every subscription of the group should name the same field and limit.
     *
     * <p>The sidecar checks both at subscribe, and the consumer stops with its permanent {@link
     * EchoMqException} (from {@link EchoMqConsumer#terminated()}), carrying its status and
     * message: INVALID_ARGUMENT for a key field without {@link #maxInFlightPerKey} (or the
     * reverse), one over the name limit or equal to the reserved {@code id} field, with {@link
     * #noAck}, or on a sharded stream; FAILED_PRECONDITION for another field or limit than the
     * group's subscriptions on that sidecar use.
     */
    public Builder keyField(String keyField) {
      this.keyField = keyField;
      return this;
    }

    /**
     * The most entries of one key held at once in the group (entries), with {@link #keyField}; 1
     * handles each key's entries one at a time, in order. Required with {@link #keyField}: the
     * default, 0, is sent as 0, which the sidecar refuses then.
     *
     * @throws IllegalArgumentException from {@link #build()} when negative
     */
    public Builder maxInFlightPerKey(int maxInFlightPerKey) {
      this.maxInFlightPerKey = maxInFlightPerKey;
      return this;
    }

    /** Reconnect backoff: first delay (default 100 ms) and cap (default 5 s), jittered, doubling. */
    public Builder reconnectBackoff(Duration initial, Duration max) {
      this.reconnectBackoffInitial = Objects.requireNonNull(initial, "initial");
      this.reconnectBackoffMax = Objects.requireNonNull(max, "max");
      return this;
    }

    /** The deadline {@link EchoMqConsumer#close()} gives {@link EchoMqConsumer#stop}. Default 30 s. */
    public Builder closeTimeout(Duration closeTimeout) {
      this.closeTimeout = Objects.requireNonNull(closeTimeout, "closeTimeout");
      return this;
    }

    /** gRPC interceptors for the Consume call (metadata, metrics, tests). */
    public Builder intercept(ClientInterceptor... interceptors) {
      this.interceptors.addAll(Arrays.asList(interceptors));
      return this;
    }

    /** What Subscribe carries: 0 (the sidecar's default) unless set. */
    private int effectiveMaxInFlight() {
      return maxInFlight;
    }

    /** The most the sidecar hands out: the setting, or the adaptive window's default cap when 0. */
    private int appliedMaxInFlight() {
      return maxInFlight > 0 ? maxInFlight : DEFAULT_MAX_IN_FLIGHT;
    }

    int effectiveConcurrency() {
      if (concurrency > 0) {
        return concurrency;
      }
      if (batchHandler != null) {
        return 1;
      }
      // Unset max_in_flight: the adaptive window's cap is no pool size (DEFAULT_CONCURRENCY).
      return maxInFlight > 0 ? maxInFlight : DEFAULT_CONCURRENCY;
    }

    int effectiveMaxBatch() {
      return maxBatch > 0 ? maxBatch : Math.min(DEFAULT_MAX_BATCH, appliedMaxInFlight());
    }

    /**
     * Checks the settings and builds the consumer (not started).
     *
     * @throws IllegalStateException when a required setting is missing
     * @throws IllegalArgumentException when a setting is out of range
     */
    public EchoMqConsumer build() {
      if (target == null && channel == null) {
        throw new IllegalStateException("target (host:port or unix:/path) or channel is required");
      }
      if (stream == null || stream.isEmpty()) {
        throw new IllegalStateException("stream is required");
      }
      if (group == null || group.isEmpty()) {
        throw new IllegalStateException("group is required");
      }
      if (startPosition == null) {
        throw new IllegalStateException(
            "startPosition is required: StartPosition.newEntries(), beginning(), afterId(id) or at(instant)");
      }
      if (handler == null && batchHandler == null) {
        throw new IllegalStateException("handler (or batchHandler) is required");
      }
      if (handler != null && batchHandler != null) {
        throw new IllegalStateException("set handler or batchHandler, not both");
      }
      if (maxBatch == 0 || maxBatch < -1) {
        throw new IllegalArgumentException("maxBatch must be at least 1, got " + maxBatch);
      }
      for (Duration d : new Duration[] {ackDeadline, retryBackoffInitial, retryBackoffMax}) {
        if (d != null && d.isNegative()) {
          throw new IllegalArgumentException("ackDeadline and retry backoffs must not be negative, got " + d);
        }
      }
      if (maxDeliveries < 0) {
        throw new IllegalArgumentException("maxDeliveries must be 0 (the sidecar's default) or more, got " + maxDeliveries);
      }
      if (maxInFlightPerKey < 0) {
        throw new IllegalArgumentException("maxInFlightPerKey must be 0 (unset) or more, got " + maxInFlightPerKey);
      }
      if (ackLinger.isNegative()) {
        throw new IllegalArgumentException("ackLinger must not be negative, got " + ackLinger);
      }
      if (ackBatch < 1) {
        throw new IllegalArgumentException("ackBatch must be at least 1, got " + ackBatch);
      }
      if (concurrency == 0 || concurrency < -1) {
        throw new IllegalArgumentException("concurrency must be at least 1, got " + concurrency);
      }
      if (maxInFlight < 0 || (maxInFlight > 0 && maxInFlight < concurrency)) {
        throw new IllegalArgumentException(
            "maxInFlight (" + maxInFlight + ") must be 0 (sidecar default) or at least concurrency ("
                + concurrency + "): handlers can only run on deliveries the call holds");
      }
      if (channel == null) {
        Targets.grpcTarget(target);
      }
      return new EchoMqConsumer(this);
    }
  }
}
