package io.echomq.client;

import io.grpc.Status;
import java.util.EnumSet;
import java.util.Set;

/**
 * An error from the sidecar, with the gRPC status code it came with.
 *
 * <p>{@link #isPermanent()} tells whether trying again can help: a permanent error
 * (INVALID_ARGUMENT, OUT_OF_RANGE, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, UNAUTHENTICATED,
 * FAILED_PRECONDITION, UNIMPLEMENTED: the set all four EchoMQ clients share, {@code
 * clients/CONTRACT.md}) means the request or the setup is wrong and must be fixed; the consumer
 * does not retry it. Every other code ({@code UNAVAILABLE} above all) is transient: the consumer
 * reconnects with its backoff.
 */
public class EchoMqException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** Status codes that no retry can fix. */
  static final Set<Status.Code> PERMANENT =
      EnumSet.of(
          Status.Code.INVALID_ARGUMENT,
          Status.Code.OUT_OF_RANGE,
          Status.Code.NOT_FOUND,
          Status.Code.ALREADY_EXISTS,
          Status.Code.PERMISSION_DENIED,
          Status.Code.UNAUTHENTICATED,
          Status.Code.FAILED_PRECONDITION,
          Status.Code.UNIMPLEMENTED);

  private final Status.Code code;
  private final String detail;

  /**
   * Creates an exception.
   *
   * @param code the gRPC status code
   * @param message what happened, and for a permanent error what to fix
   * @param cause the underlying exception, or null
   */
  public EchoMqException(Status.Code code, String message, Throwable cause) {
    super(code + ": " + message, cause);
    this.code = code;
    this.detail = message;
  }

  /** Wraps a gRPC failure (a {@code StatusRuntimeException} or anything else). */
  static EchoMqException from(Throwable t, String doing) {
    if (t instanceof EchoMqException e) {
      return e;
    }
    Status status = Status.fromThrowable(t);
    String description = status.getDescription() == null ? "" : ": " + status.getDescription();
    return new EchoMqException(status.getCode(), doing + description, t);
  }

  /** Whether the code is one that retrying cannot fix. */
  static boolean isPermanent(Status.Code code) {
    return PERMANENT.contains(code);
  }

  /** The gRPC status code the sidecar answered with. */
  public Status.Code code() {
    return code;
  }

  /**
   * The sidecar's message without the status code: which field or key is wrong and how to fix it.
   *
   * @return the status description
   */
  public String details() {
    return detail;
  }

  /**
   * The old name of {@link #details()}.
   *
   * @return the status description
   * @deprecated Use {@link #details()}, the name every client gives it; goes away in the next
   *     release.
   */
  @Deprecated(forRemoval = true)
  public String detail() {
    return details();
  }

  /** True when retrying cannot help (the request or the configuration must change). */
  public boolean isPermanent() {
    return isPermanent(code);
  }
}
