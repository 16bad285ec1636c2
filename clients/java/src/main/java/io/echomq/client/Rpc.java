package io.echomq.client;

import com.google.common.util.concurrent.FutureCallback;
import com.google.common.util.concurrent.Futures;
import com.google.common.util.concurrent.ListenableFuture;
import com.google.common.util.concurrent.MoreExecutors;
import com.google.protobuf.Timestamp;
import io.grpc.ManagedChannel;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.time.Instant;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;

/**
 * What the unary wrappers ({@link EchoMqStreams}, {@link EchoMqAdmin})
 * share: turning gRPC failures into {@link EchoMqException}s, closing an owned channel, and the
 * conversions between the proto's Duration and Timestamp and {@code java.time}.
 */
final class Rpc {
  private Rpc() {}

  /** Runs a blocking call; a gRPC failure becomes an {@link EchoMqException} saying what was done. */
  static <T> T call(Supplier<T> call, String doing) {
    try {
      return call.get();
    } catch (StatusRuntimeException e) {
      throw EchoMqException.from(e, doing);
    }
  }

  static <T> CompletableFuture<T> toCompletable(ListenableFuture<T> future, String doing) {
    CompletableFuture<T> out = new CompletableFuture<>();
    Futures.addCallback(
        future,
        new FutureCallback<T>() {
          @Override
          public void onSuccess(T value) {
            out.complete(value);
          }

          @Override
          public void onFailure(Throwable t) {
            out.completeExceptionally(EchoMqException.from(t, doing));
          }
        },
        MoreExecutors.directExecutor());
    return out;
  }

  static <T> T join(CompletableFuture<T> future) {
    try {
      return future.join();
    } catch (CompletionException e) {
      if (e.getCause() instanceof EchoMqException cause) {
        // Rethrown from this thread so the stack trace shows the caller.
        throw new EchoMqException(cause.code(), cause.details(), cause);
      }
      throw e;
    } catch (StatusRuntimeException e) {
      throw EchoMqException.from(e, "calling the sidecar");
    }
  }

  /** Closes a channel the wrapper opened: waits up to 5 s for calls to finish, then cuts them. */
  static void close(ManagedChannel owned) {
    if (owned == null) {
      return;
    }
    owned.shutdown();
    try {
      if (!owned.awaitTermination(5, TimeUnit.SECONDS)) {
        owned.shutdownNow();
      }
    } catch (InterruptedException e) {
      owned.shutdownNow();
      Thread.currentThread().interrupt();
    }
  }

  static com.google.protobuf.Duration toProto(Duration duration) {
    return com.google.protobuf.Duration.newBuilder()
        .setSeconds(duration.getSeconds())
        .setNanos(duration.getNano())
        .build();
  }

  static Duration toJava(com.google.protobuf.Duration duration) {
    return Duration.ofSeconds(duration.getSeconds(), duration.getNanos());
  }

  static Timestamp toProto(Instant instant) {
    return Timestamp.newBuilder().setSeconds(instant.getEpochSecond()).setNanos(instant.getNano()).build();
  }

  static Instant toJava(Timestamp timestamp) {
    return Instant.ofEpochSecond(timestamp.getSeconds(), timestamp.getNanos());
  }

  static String orEmpty(String s) {
    return s == null ? "" : s;
  }
}
