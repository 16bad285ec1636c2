package io.echomq.client.testing;

import io.echomq.v1.ConsumeRequest;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.MethodDescriptor;
import java.util.function.Consumer;

/** A client interceptor that shows the tests every Consume request a consumer sends. */
public final class SentRequests {
  private SentRequests() {}

  /**
   * An interceptor that hands each {@link ConsumeRequest} to {@code seen} before it is sent.
   *
   * @param seen called on the sending thread, once per request
   * @return the interceptor, for {@code EchoMqConsumer.Builder#intercept}
   */
  public static ClientInterceptor to(Consumer<ConsumeRequest> seen) {
    return new ClientInterceptor() {
      @Override
      public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
        return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
          @Override
          public void sendMessage(Q message) {
            if (message instanceof ConsumeRequest request) {
              seen.accept(request);
            }
            super.sendMessage(message);
          }
        };
      }
    };
  }
}
