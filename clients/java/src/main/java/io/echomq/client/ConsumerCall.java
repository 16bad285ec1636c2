package io.echomq.client;

import io.echomq.v1.ConsumeRequest;
import io.echomq.v1.ConsumeResponse;
import io.echomq.v1.Drain;
import io.grpc.Status;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import java.util.concurrent.CompletableFuture;

/**
 * One Consume call: the unit that holds deliveries. Verdicts for its deliveries go only through it;
 * once it has ended (or was cancelled or half-closed) it drops them, so a verdict can never reach a
 * later call, which would not hold the id.
 */
final class ConsumerCall implements ClientResponseObserver<ConsumeRequest, ConsumeResponse>, VerdictSink {
  /** What the consumer does with the call's events; invoked on gRPC's callback threads. */
  interface Listener {
    void onSubscribed(ConsumerCall call, io.echomq.v1.Subscribed subscribed);

    void onDelivery(ConsumerCall call, Delivery delivery);

    void onVerdictError(ConsumerCall call, VerdictError error);

    void onEnded(ConsumerCall call, Status status);
  }

  /** Tells the sidecar the client is stopping: hand this call nothing more (verdicts still work). */
  private static final ConsumeRequest DRAIN = ConsumeRequest.newBuilder().setDrain(Drain.getDefaultInstance()).build();

  private final long generation;
  private final Listener listener;
  private final CompletableFuture<Status> ended = new CompletableFuture<>();
  /** Set once by gRPC before the call starts; used under {@code this}: request observers are not thread-safe. */
  private ClientCallStreamObserver<ConsumeRequest> requests;
  /** True while verdicts may be sent: not ended, cancelled or half-closed. Guarded by {@code this}. */
  private boolean open = true;

  ConsumerCall(long generation, Listener listener) {
    this.generation = generation;
    this.listener = listener;
  }

  long generation() {
    return generation;
  }

  /** Completes with the status the call ended with. */
  CompletableFuture<Status> ended() {
    return ended;
  }

  @Override
  public void beforeStart(ClientCallStreamObserver<ConsumeRequest> requestStream) {
    this.requests = requestStream;
  }

  @Override
  public synchronized boolean send(ConsumeRequest request) {
    if (!open) {
      return false;
    }
    try {
      requests.onNext(request);
      return true;
    } catch (RuntimeException e) {
      // The call was closed under us (cancelled by the transport): nothing more goes out on it.
      open = false;
      return false;
    }
  }

  /**
   * Sends {@code Drain}: the sidecar hands this call no more deliveries and reads nothing more from
   * Redis on its behalf, while verdicts keep working. Deliveries already on the wire may still
   * arrive; the consumer leaves them un-settled.
   *
   * @return false when the call is no longer open: nothing was sent
   */
  boolean drain() {
    return send(DRAIN);
  }

  synchronized boolean isOpen() {
    return open;
  }

  /** Closes the client's side: the sidecar applies what was sent, then ends the call with OK. */
  synchronized void halfClose() {
    if (open) {
      open = false;
      requests.onCompleted();
    }
  }

  /** Ends the call at once; what it holds stays pending and is delivered again after the backoff. */
  void cancel(String why) {
    synchronized (this) {
      open = false;
    }
    if (!ended.isDone()) {
      requests.cancel(why, null);
    }
  }

  @Override
  public void onNext(ConsumeResponse response) {
    switch (response.getKindCase()) {
      case SUBSCRIBED -> listener.onSubscribed(this, response.getSubscribed());
      case DELIVERY -> listener.onDelivery(this, new Delivery(response.getDelivery(), this));
      case VERDICT_ERROR -> listener.onVerdictError(this, VerdictError.of(response.getVerdictError()));
      default -> {
        // A message kind newer than this client: nothing to do with it.
      }
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
    synchronized (this) {
      open = false;
    }
    listener.onEnded(this, status);
    ended.complete(status);
  }
}
