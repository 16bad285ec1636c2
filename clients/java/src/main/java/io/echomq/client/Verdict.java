package io.echomq.client;

import java.time.Duration;
import java.util.Objects;

/**
 * What a {@link BatchHandler} answers for one delivery: {@link #ack()}, {@link #fail(String)},
 * {@link #fail(String, Duration)} (each also with a {@link FailKind}) or {@link #deadLetter(String)}.
 */
public final class Verdict {
  private enum Kind { ACK, FAIL, DEAD_LETTER }

  private static final Verdict ACK = new Verdict(Kind.ACK, null, null, FailKind.MESSAGE);

  private final Kind kind;
  private final String reason;
  private final Duration retryAfter;
  private final FailKind failKind;

  private Verdict(Kind kind, String reason, Duration retryAfter, FailKind failKind) {
    this.kind = kind;
    this.reason = reason;
    this.retryAfter = retryAfter;
    this.failKind = Objects.requireNonNull(failKind, "kind");
  }

  /** Acknowledge: the entry leaves the group's pending list for good. */
  public static Verdict ack() {
    return ACK;
  }

  /** Fail: the entry is delivered again after the subscription's backoff. */
  public static Verdict fail(String reason) {
    return new Verdict(Kind.FAIL, reason, null, FailKind.MESSAGE);
  }

  /** Fail with a kind, as {@link Delivery#fail(String, FailKind)}. */
  public static Verdict fail(String reason, FailKind kind) {
    return new Verdict(Kind.FAIL, reason, null, kind);
  }

  /** Fail: the entry is delivered again after {@code retryAfter}. */
  public static Verdict fail(String reason, Duration retryAfter) {
    return new Verdict(Kind.FAIL, reason, Objects.requireNonNull(retryAfter, "retryAfter"), FailKind.MESSAGE);
  }

  /** Fail with a kind, delivered again after {@code retryAfter}, as {@link Delivery#fail(String, Duration, FailKind)}. */
  public static Verdict fail(String reason, Duration retryAfter, FailKind kind) {
    return new Verdict(Kind.FAIL, reason, Objects.requireNonNull(retryAfter, "retryAfter"), kind);
  }

  /** Move the entry to the dead-letter stream now, with {@code reason}. */
  public static Verdict deadLetter(String reason) {
    return new Verdict(Kind.DEAD_LETTER, reason, null, FailKind.POISON);
  }

  /** Settles {@code delivery} as this verdict says (nothing if it is settled already). */
  void applyTo(Delivery delivery) {
    switch (kind) {
      case ACK -> delivery.ack();
      case FAIL -> {
        if (retryAfter == null) {
          delivery.fail(reason, failKind);
        } else {
          delivery.fail(reason, retryAfter, failKind);
        }
      }
      case DEAD_LETTER -> delivery.deadLetter(reason);
    }
  }

  @Override
  public String toString() {
    return switch (kind) {
      case ACK -> "Verdict.ack()";
      case FAIL ->
          "Verdict.fail("
              + reason
              + (retryAfter == null ? "" : ", " + retryAfter)
              + (failKind == FailKind.MESSAGE ? "" : ", " + failKind)
              + ")";
      case DEAD_LETTER -> "Verdict.deadLetter(" + reason + ")";
    };
  }
}
