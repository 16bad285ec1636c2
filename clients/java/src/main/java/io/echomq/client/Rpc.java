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
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import java.util.function.Supplier;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

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

  /** One page for {@link #paged}: its items, and the cursor of the next page (null after the last). */
  record Page<C, T>(List<T> items, C next) {}

  /**
   * The items of consecutive pages as a lazy, sequential, ordered stream: {@code fetch} reads the
   * page at a cursor, starting at {@code first}, when the items before it have been taken. A failed
   * page throws from the stream's terminal operation.
   */
  static <C, T> Stream<T> paged(C first, Function<C, Page<C, T>> fetch) {
    Iterator<T> items =
        new Iterator<>() {
          private C next = first;
          private Iterator<T> page = Collections.emptyIterator();

          @Override
          public boolean hasNext() {
            while (!page.hasNext() && next != null) {
              Page<C, T> read = fetch.apply(next);
              page = read.items().iterator();
              next = read.next();
            }
            return page.hasNext();
          }

          @Override
          public T next() {
            if (!hasNext()) {
              throw new NoSuchElementException();
            }
            return page.next();
          }
        };
    return StreamSupport.stream(Spliterators.spliteratorUnknownSize(items, Spliterator.ORDERED | Spliterator.NONNULL), false);
  }

  static String orEmpty(String s) {
    return s == null ? "" : s;
  }
}
