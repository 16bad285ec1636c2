package io.echomq.client;

import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;

/** Turns a sidecar address, {@code host:port} or {@code unix:/path}, into a gRPC channel. */
final class Targets {
  /**
   * Largest message the client accepts (bytes). gRPC's default of 4 MiB is too small for large
   * stream entries; a Redis value can be far larger than that.
   */
  static final int DEFAULT_MAX_INBOUND_BYTES = 64 * 1024 * 1024;

  private Targets() {}

  /** A plaintext channel to the sidecar: it listens on loopback or a unix socket in its pod. */
  static ManagedChannel open(String target) {
    return builder(target).maxInboundMessageSize(DEFAULT_MAX_INBOUND_BYTES).build();
  }

  static ManagedChannelBuilder<?> builder(String target) {
    String grpcTarget = grpcTarget(target);
    ManagedChannelBuilder<?> builder = Grpc.newChannelBuilder(grpcTarget, InsecureChannelCredentials.create());
    if (grpcTarget.startsWith("unix:")) {
      // grpc-java would send the socket path as :authority, which HTTP/2 servers (the sidecar's
      // hyper) reject as malformed (PROTOCOL_ERROR). "localhost" is what grpc-go sends for unix.
      builder.overrideAuthority("localhost");
    }
    return builder;
  }

  /**
   * The gRPC target string: {@code unix:/path} becomes {@code unix:///path}; {@code host:port}
   * becomes {@code dns:///host:port}, so a host name is never mistaken for a URI scheme.
   */
  static String grpcTarget(String target) {
    if (target == null || target.isBlank()) {
      throw new IllegalArgumentException("the sidecar address is required: `host:port` or `unix:/path`");
    }
    String t = target.trim();
    if (t.startsWith("unix:")) {
      String path = t.substring("unix:".length());
      while (path.startsWith("//")) {
        path = path.substring(1);
      }
      if (!path.startsWith("/")) {
        throw new IllegalArgumentException(
            "a unix socket address needs an absolute path: `unix:/path/to/socket`, not `" + target + "`");
      }
      return "unix://" + path;
    }
    int colon = t.lastIndexOf(':');
    if (colon <= 0 || colon == t.length() - 1) {
      throw new IllegalArgumentException(
          "`" + target + "` is neither `host:port` nor `unix:/path`");
    }
    try {
      int port = Integer.parseInt(t.substring(colon + 1));
      if (port < 1 || port > 65535) {
        throw new NumberFormatException();
      }
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException("`" + target + "` has no valid port (1 to 65535)");
    }
    return "dns:///" + t;
  }
}
