package io.echomq.client;

/**
 * Thrown by a handler for a delivery that can never succeed (it cannot be parsed, it breaks a
 * rule): the consumer fails it with {@link FailKind#POISON} and the message as the reason, and the
 * sidecar moves it to the dead-letter stream now, whatever {@code maxDeliveries} would allow.
 *
 * <p>Not an {@link EchoMqException}: it carries no gRPC status; the handler throws it, the client
 * does not.
 */
public class PoisonException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /**
   * Creates the exception.
   *
   * @param reason why the entry can never succeed, sent as the Fail's reason
   */
  public PoisonException(String reason) {
    super(reason);
  }

  /**
   * Creates the exception.
   *
   * @param reason why the entry can never succeed, sent as the Fail's reason
   * @param cause what failed, for the log
   */
  public PoisonException(String reason, Throwable cause) {
    super(reason, cause);
  }
}
