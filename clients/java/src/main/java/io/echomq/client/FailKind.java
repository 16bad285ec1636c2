package io.echomq.client;

/**
 * Whose fault a failure was, which decides whether it counts as an attempt ({@code
 * clients/CONTRACT.md}, "Failure kinds"). Given to {@link Delivery#fail(String, FailKind)} and
 * {@link Verdict#fail(String, FailKind)}; a handler may throw a {@link TransientException} or a
 * {@link PoisonException} instead.
 */
public enum FailKind {
  /**
   * The entry failed: its next delivery counts as another attempt, toward {@code maxDeliveries}.
   * What a fail is unless it says otherwise, and what any other exception a handler throws means.
   */
  MESSAGE(io.echomq.v1.FailKind.FAIL_KIND_MESSAGE),
  /**
   * The handler could not try it (its database is down, a rate limit): delivered again after the
   * delay with the attempts it had, and never dead-lettered for it.
   */
  TRANSIENT(io.echomq.v1.FailKind.FAIL_KIND_TRANSIENT),
  /** The entry can never succeed: it is moved to the dead-letter stream now. */
  POISON(io.echomq.v1.FailKind.FAIL_KIND_POISON);

  private final io.echomq.v1.FailKind wire;

  FailKind(io.echomq.v1.FailKind wire) {
    this.wire = wire;
  }

  /** The wire enum's value. */
  io.echomq.v1.FailKind toProto() {
    return wire;
  }

  /**
   * The kind a handler's exception means: {@link #TRANSIENT} for a {@link TransientException},
   * {@link #POISON} for a {@link PoisonException}, {@link #MESSAGE} for anything else.
   */
  static FailKind of(Throwable thrown) {
    if (thrown instanceof TransientException) {
      return TRANSIENT;
    }
    if (thrown instanceof PoisonException) {
      return POISON;
    }
    return MESSAGE;
  }
}
