package io.echomq.client;

/**
 * Why {@link Delivery#ackEmit(java.util.List)} was not applied: nothing was written and nothing
 * acknowledged by it.
 *
 * <p>{@link #code()} is the sidecar's verdict error code, or null when nothing was sent (the
 * delivery was settled already, its lease lost, its call gone) or the call ended before the answer
 * (the outcome is then unknown: the step may have run, the entry acknowledged and its emits
 * written, or not, and the entry comes back; the emits are written once either way).
 *
 * <p>{@link #isHeld()} is true for a bad emit ({@code INVALID_ARGUMENT}, {@code PERMISSION_DENIED}):
 * the delivery is still this consumer's and unsettled again, so a handler that lets this exception
 * propagate fails it with the message, as any exception does, or it may answer it again. Otherwise
 * ({@code NOT_PENDING}, {@code UNKNOWN_ID}: acknowledged already, say by a duplicate run; {@code
 * LEASE_LOST}: a peer has it; {@code UNAVAILABLE}; no answer) the delivery is settled and no
 * verdict follows it.
 *
 * <p>Not an {@link EchoMqException}: it carries no gRPC status (the call goes on).
 */
public class AckEmitException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final String id;
  private final VerdictError.Code code;

  /**
   * Creates the exception.
   *
   * @param id the delivery's branded id
   * @param code the verdict error code, or null (see the class)
   * @param message the sidecar's message, or why nothing was sent
   */
  public AckEmitException(String id, VerdictError.Code code, String message) {
    super("ackEmit of " + id + ": " + (code == null ? "NOT_APPLIED" : code.name()) + ": " + message);
    this.id = id;
    this.code = code;
  }

  /** The branded id of the delivery. */
  public String id() {
    return id;
  }

  /** The verdict error code, or null when nothing was sent or no answer came. */
  public VerdictError.Code code() {
    return code;
  }

  /** True when the delivery is still held (a bad emit) and may be answered again. */
  public boolean isHeld() {
    return code == VerdictError.Code.INVALID_ARGUMENT || code == VerdictError.Code.PERMISSION_DENIED;
  }
}
