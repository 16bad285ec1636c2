package io.echomq.client;

import io.echomq.v1.Ack;
import io.echomq.v1.ConsumeRequest;
import io.echomq.v1.ConsumeResponse;
import io.echomq.v1.Drain;
import io.echomq.v1.Release;
import io.echomq.v1.VerdictErrorCode;
import io.grpc.Status;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

/**
 * One Consume call: the unit that holds deliveries. Verdicts for its deliveries go only through it;
 * once it has ended (or was cancelled or half-closed) it drops them, so a verdict can never reach a
 * later call, which would not hold the id.
 *
 * <p>Acks are coalesced: {@link #ack} adds the id to the current window, which goes out as one
 * {@code Ack} message when the first ack in it has waited the linger, when it holds
 * {@code ackBatch} ids, or when every delivery the call holds has its ack waiting (no further ack
 * can come until new deliveries do). Any other message ({@code Fail}, {@code Extend}, a raw
 * verdict, the half-close) first sends the window, so the sidecar sees verdicts in the order they
 * were given; only {@code Drain} goes ahead of it, so the credit those acks free pulls nothing new.
 * When the call ends the window is dropped: those ids are valid on no other call. A graceful stop,
 * also one past its deadline ({@link #refuseVerdicts} first), half-closes instead, after the window.
 *
 * <p>The call indexes the deliveries it holds by branded id (one map entry per delivery, added
 * when its frame arrives, removed at its verdict), so an unprompted {@code LEASE_LOST} can find
 * the delivery, signal its handler and make sure no verdict for it goes out.
 */
final class ConsumerCall implements ClientResponseObserver<ConsumeRequest, ConsumeResponse>, VerdictSink {
  /** What the consumer does with the call's events; invoked on gRPC's callback threads. */
  interface Listener {
    void onSubscribed(ConsumerCall call, io.echomq.v1.Subscribed subscribed);

    /** The deliveries of one frame (1 for a {@code Delivery} frame, 1 to max_batch for a batch). */
    void onDeliveries(ConsumerCall call, List<Delivery> frame);

    void onVerdictError(ConsumerCall call, VerdictError error);

    void onEnded(ConsumerCall call, Status status);
  }

  /**
   * How acks are coalesced, and whether the subscription is at-most-once ({@code noAck}: a Fail
   * cannot be applied there, so the call sends an ack to free the slot instead).
   */
  record AckWindow(long lingerNanos, int maxIds, ScheduledExecutorService timers, boolean noAck) {}

  private static final System.Logger LOG = System.getLogger(EchoMqConsumer.class.getName());

  /** Tells the sidecar the client is stopping: hand this call nothing more (verdicts still work). */
  private static final ConsumeRequest DRAIN = ConsumeRequest.newBuilder().setDrain(Drain.getDefaultInstance()).build();

  private final long generation;
  private final Listener listener;
  private final AckWindow settings;
  private final CompletableFuture<Status> ended = new CompletableFuture<>();
  /** Set once by gRPC before the call starts; used under {@code this}: request observers are not thread-safe. */
  private ClientCallStreamObserver<ConsumeRequest> requests;
  /** True while verdicts may be sent: not ended, cancelled or half-closed. Written under {@code this}. */
  private volatile boolean open = true;
  /**
   * A stop's deadline passed with handlers running: no new verdict (or extension, or raw verdict)
   * is taken; the acks already in the window still go out with {@link #halfClose}. Written under
   * {@code this}.
   */
  private volatile boolean refusing;

  // The ack window; all guarded by this.
  /** Most ids per Ack message: the setting, capped at a quarter of the call's max_in_flight. */
  private int ackBatch;
  private List<String> acks = new ArrayList<>();
  private ScheduledFuture<?> lingerTimer;
  /** Bumped at every flush, so a linger timer that lost the race to a flush does nothing. */
  private long window;
  /**
   * Deliveries received and given no verdict yet (neither an ack in the window nor a Fail sent),
   * nor lost to a peer, by branded id.
   */
  private final Map<String, Delivery> holding = new HashMap<>();
  /** AckEmits sent and not answered yet, by branded id. */
  private final Map<String, CompletableFuture<Object>> emits = new HashMap<>();
  /** The Drain went out (see {@link #release}). */
  private boolean drained;
  /** Deliveries given back before the Drain went out, released right after it. */
  private List<Delivery> unstarted = new ArrayList<>();

  ConsumerCall(long generation, Listener listener, AckWindow settings, int maxInFlight) {
    this.generation = generation;
    this.listener = listener;
    this.settings = settings;
    this.ackBatch = ackBatchFor(settings.maxIds(), maxInFlight);
  }

  /**
   * The most ids of one Ack message: {@code maxIds}, but never more than a quarter of
   * {@code maxInFlight} (the sidecar reads again when that much credit is free, so waiting for
   * more only stalls the flow), and at least 1. A {@code maxInFlight} of 0 (the adaptive window)
   * counts as its default cap, {@value EchoMqConsumer#DEFAULT_MAX_IN_FLIGHT}, until {@code
   * Subscribed} says.
   */
  static int ackBatchFor(int maxIds, int maxInFlight) {
    int inFlight = maxInFlight > 0 ? maxInFlight : EchoMqConsumer.DEFAULT_MAX_IN_FLIGHT;
    return Math.max(1, Math.min(maxIds, inFlight / 4));
  }

  long generation() {
    return generation;
  }

  /** Completes with the status the call ended with. */
  CompletableFuture<Status> ended() {
    return ended;
  }

  /** Sizes the ack window by the max_in_flight the sidecar confirmed. */
  synchronized void confirmMaxInFlight(int maxInFlight) {
    ackBatch = ackBatchFor(settings.maxIds(), maxInFlight);
  }

  @Override
  public void beforeStart(ClientCallStreamObserver<ConsumeRequest> requestStream) {
    this.requests = requestStream;
  }

  @Override
  public synchronized boolean send(ConsumeRequest request) {
    if (!open || refusing) {
      return false;
    }
    if (!request.hasDrain() && !flushAcksLocked()) {
      return false;
    }
    if (request.hasFail()) {
      holding.remove(request.getFail().getId());
    }
    return writeLocked(request);
  }

  @Override
  public boolean fail(Delivery delivery, ConsumeRequest request) {
    if (!settings.noAck()) {
      synchronized (this) {
        return release(delivery) && flushAcksLocked() && writeLocked(request);
      }
    }
    // At-most-once: the entry is not pending, so the sidecar would refuse the Fail
    // (INVALID_ARGUMENT) and keep the slot taken. The entry is lost either way: ack, and say so
    // (outside the lock: a log handler may block).
    boolean acked = ack(delivery);
    if (acked) {
      LOG.log(
          System.Logger.Level.WARNING,
          "at-most-once (noAck) subscription: entry {0} failed ({1}) and is lost; acked it to free its slot",
          delivery.id(), request.getFail().getReason());
    }
    return acked;
  }

  @Override
  public CompletableFuture<Object> ackEmit(Delivery delivery, ConsumeRequest request) {
    synchronized (this) {
      if (emits.containsKey(delivery.id()) || !release(delivery) || !flushAcksLocked()) {
        return null;
      }
      CompletableFuture<Object> answer = new CompletableFuture<>();
      emits.put(delivery.id(), answer);
      if (!writeLocked(request)) {
        emits.remove(delivery.id());
        return null;
      }
      return answer;
    }
  }

  @Override
  public synchronized void rehold(Delivery delivery) {
    if (open) {
      holding.put(delivery.id(), delivery);
    }
  }

  /** Completes the waiting AckEmit of {@code id} with {@code answer} (outside the lock). */
  private void answerEmit(String id, Object answer) {
    CompletableFuture<Object> waiting;
    synchronized (this) {
      waiting = emits.remove(id);
    }
    if (waiting != null) {
      waiting.complete(answer);
    }
  }

  @Override
  public synchronized boolean ack(Delivery delivery) {
    return release(delivery) && queueAckLocked(delivery.id());
  }

  /**
   * Takes {@code delivery} out of the index before its verdict goes out; false when no verdict may
   * go out: the call has ended (or refuses verdicts: a stop's deadline passed), or the lease was lost (the entry is a peer's now). A delivery that
   * is not indexed otherwise (a newer delivery of the same entry replaced it, after its ack
   * deadline passed) still sends its verdict: the sidecar decides.
   */
  private boolean release(Delivery delivery) {
    if (!open || refusing) {
      return false;
    }
    return holding.remove(delivery.id(), delivery) || !delivery.isLeaseLost();
  }

  private boolean queueAckLocked(String id) {
    acks.add(id);
    // Every delivery still held has its ack waiting: no other ack can join until more arrive.
    if (acks.size() >= ackBatch || holding.isEmpty() || settings.lingerNanos() <= 0) {
      return flushAcksLocked();
    }
    if (acks.size() == 1) {
      long mine = window;
      try {
        lingerTimer = settings.timers().schedule(() -> flushWindow(mine), settings.lingerNanos(), TimeUnit.NANOSECONDS);
      } catch (RejectedExecutionException e) {
        return flushAcksLocked(); // The consumer is shutting down: no linger.
      }
    }
    return true;
  }

  /** The linger timer of window {@code which} fired: sends it unless it went out already. */
  private synchronized void flushWindow(long which) {
    if (which == window && open) {
      flushAcksLocked();
    }
  }

  /** Sends the waiting acks as one Ack message; false when the call is over. */
  private boolean flushAcksLocked() {
    if (acks.isEmpty()) {
      return true;
    }
    window++;
    if (lingerTimer != null) {
      lingerTimer.cancel(false);
      lingerTimer = null;
    }
    ConsumeRequest request = ConsumeRequest.newBuilder().setAck(Ack.newBuilder().addAllIds(acks)).build();
    acks = new ArrayList<>(Math.min(ackBatch, 64));
    return writeLocked(request);
  }

  /** The call is over: the waiting acks are dropped (their entries return to the group with it). */
  private void dropAcksLocked() {
    window++;
    if (lingerTimer != null) {
      lingerTimer.cancel(false);
      lingerTimer = null;
    }
    acks = new ArrayList<>();
  }

  private boolean writeLocked(ConsumeRequest request) {
    try {
      requests.onNext(request);
      return true;
    } catch (RuntimeException e) {
      // The call was closed under us (cancelled by the transport): nothing more goes out on it.
      open = false;
      dropAcksLocked();
      return false;
    }
  }

  /**
   * Sends {@code Drain}: the sidecar hands this call no more deliveries and reads nothing more from
   * Redis on its behalf, while verdicts keep working. Deliveries already on the wire may still
   * arrive; the consumer leaves them un-settled. It goes ahead of the waiting acks.
   *
   * @return false when the call is no longer open: nothing was sent
   */
  synchronized boolean drain() {
    boolean sent = send(DRAIN);
    drained = true;
    List<Delivery> waiting = unstarted;
    unstarted = new ArrayList<>();
    releaseLocked(waiting);
    return sent;
  }

  /**
   * Sends one {@code Release} of {@code deliveries} (of this call, never handed to a handler): the
   * sidecar gives them back to the group at once with their delivery count restored, for another
   * consumer (this sidecar's other calls, or a peer's next reclaim beat), so they cost no attempt
   * and no wait for the reclaim's min-idle. Each counts as settled here. Before the {@code Drain}
   * they wait for it: released earlier, an entry would be handed straight back to this call, the
   * one with room. Nothing is sent for one already settled or whose lease was lost, at most once
   * (nothing is pending), or once the call ended (the sidecar returned them already). It goes
   * ahead of the waiting acks, as the Drain: they name other deliveries.
   */
  @Override
  public synchronized void release(List<Delivery> deliveries) {
    if (!drained) {
      unstarted.addAll(deliveries);
      return;
    }
    releaseLocked(deliveries);
  }

  private void releaseLocked(List<Delivery> deliveries) {
    if (deliveries.isEmpty() || settings.noAck() || !open) {
      return;
    }
    List<String> ids = new ArrayList<>(deliveries.size());
    for (Delivery delivery : deliveries) {
      if (delivery.sink() == this && delivery.markReleased()) {
        holding.remove(delivery.id(), delivery);
        ids.add(delivery.id());
      }
    }
    if (ids.isEmpty()) {
      return;
    }
    if (writeLocked(ConsumeRequest.newBuilder().setRelease(Release.newBuilder().addAllIds(ids)).build())) {
      LOG.log(System.Logger.Level.INFO, "stop: released {0} deliveries no handler started back to the group", ids.size());
    }
  }

  @Override
  public boolean isOpen() {
    return open && !refusing;
  }

  /**
   * A stop's deadline passed: every verdict given from now on is refused (the delivery's
   * {@code ack()}/{@code fail(…)} return false and send nothing), so a handler that gives up when
   * interrupted acknowledges nothing. What was given before (the acks in the window) still goes out
   * with {@link #halfClose}.
   */
  synchronized void refuseVerdicts() {
    refusing = true;
  }

  /**
   * Closes the client's side after sending the waiting acks: the sidecar applies what was sent,
   * then ends the call with OK.
   */
  synchronized void halfClose() {
    if (open) {
      flushAcksLocked();
      open = false;
      requests.onCompleted();
    }
  }

  /** Ends the call at once, dropping waiting acks; what it holds is delivered again after the backoff. */
  void cancel(String why) {
    synchronized (this) {
      open = false;
      dropAcksLocked();
    }
    if (!ended.isDone()) {
      requests.cancel(why, null);
    }
  }

  @Override
  public void onNext(ConsumeResponse response) {
    switch (response.getKindCase()) {
      case SUBSCRIBED -> listener.onSubscribed(this, response.getSubscribed());
      case DELIVERY -> {
        List<Delivery> frame = List.of(new Delivery(response.getDelivery(), this));
        received(frame);
        listener.onDeliveries(this, frame);
      }
      case BATCH -> {
        List<io.echomq.v1.Delivery> protos = response.getBatch().getDeliveriesList();
        if (protos.isEmpty()) {
          return;
        }
        List<Delivery> frame = new ArrayList<>(protos.size());
        for (io.echomq.v1.Delivery proto : protos) {
          frame.add(new Delivery(proto, this));
        }
        received(frame);
        listener.onDeliveries(this, frame);
      }
      case VERDICT_ERROR -> {
        io.echomq.v1.VerdictError error = response.getVerdictError();
        if (error.getCode() == VerdictErrorCode.VERDICT_ERROR_CODE_LEASE_LOST) {
          leaseLost(error.getId());
        }
        VerdictError verdictError = VerdictError.of(error);
        // An AckEmit's refusal goes to its caller and to the hook.
        answerEmit(error.getId(), verdictError);
        listener.onVerdictError(this, verdictError);
      }
      case EMITTED -> answerEmit(response.getEmitted().getId(), response.getEmitted());
      default -> {
        // A message kind newer than this client: nothing to do with it.
      }
    }
  }

  private synchronized void received(List<Delivery> frame) {
    for (Delivery delivery : frame) {
      holding.put(delivery.id(), delivery);
    }
  }

  /**
   * A peer took the entry {@code id}: the call no longer holds it, so no verdict for it may go out
   * (it would only be answered NOT_PENDING), and its handler is told. An id the call gave a verdict
   * already (its ack waiting in the window) has nothing left to signal.
   */
  private void leaseLost(String id) {
    Delivery lost;
    synchronized (this) {
      lost = holding.remove(id);
      if (lost != null) {
        lost.loseLease();
      }
    }
    if (lost != null) {
      lost.signalLeaseLost();
    }
  }

  @Override
  public void onError(Throwable t) {
    end(Status.fromThrowable(t));
  }

  @Override
  public void onCompleted() {
    end(Status.OK);
  }

  private void end(Status status) {
    List<CompletableFuture<Object>> unanswered;
    synchronized (this) {
      open = false;
      dropAcksLocked();
      unanswered = new ArrayList<>(emits.values());
      emits.clear();
    }
    for (CompletableFuture<Object> waiting : unanswered) {
      waiting.complete(null); // the answer is lost with the call
    }
    listener.onEnded(this, status);
    ended.complete(status);
  }
}
