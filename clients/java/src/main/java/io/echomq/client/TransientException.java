package io.echomq.client;

/**
 * Thrown by a handler that could not try the delivery (its database is down, a rate limit): the
 * consumer fails it with {@link FailKind#TRANSIENT} and the message as the reason. It comes back
 * after the backoff with the attempts it had, so it is never dead-lettered for this.
 *
 * <pre>{@code
 * try {
 *   orders.save(order);
 * } catch (SQLException e) {
 *   throw new TransientException("the database is down", e); // no attempt spent
 * }
 * }</pre>
 *
 * <p>Not an {@link EchoMqException}: it carries no gRPC status; the handler throws it, the client
 * does not.
 */
public class TransientException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /**
   * Creates the exception.
   *
   * @param reason why the handler could not try, sent as the Fail's reason
   */
  public TransientException(String reason) {
    super(reason);
  }

  /**
   * Creates the exception.
   *
   * @param reason why the handler could not try, sent as the Fail's reason
   * @param cause what failed, for the log
   */
  public TransientException(String reason, Throwable cause) {
    super(reason, cause);
  }
}
