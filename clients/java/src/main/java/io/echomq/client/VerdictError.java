package io.echomq.client;

/**
 * A verdict (or lease extension) the sidecar did not apply. The call goes on.
 *
 * @param id the id as the client sent it
 * @param code why, as a code
 * @param message why, for a person
 */
public record VerdictError(String id, Code code, String message) {
  /** Why a verdict was not applied. */
  public enum Code {
    /** A code this client does not know (a newer sidecar). */
    UNSPECIFIED,
    /** The id is not held by this call: never delivered to it, already settled, or expired. */
    UNKNOWN_ID,
    /**
     * The entry was held but is no longer pending for this call: its lease was lost to a peer,
     * it was deleted from the stream, or another client acknowledged it. Nothing was applied.
     */
    NOT_PENDING,
    /** The id is not a branded id, or another field of the verdict is invalid. */
    INVALID_ARGUMENT,
    /** Redis failed while applying the verdict; the entry stays pending and comes again. */
    UNAVAILABLE,
    /**
     * Sent unprompted: a peer reclaimed an entry this call held, and it may be running elsewhere
     * now. The consumer has already signalled the delivery ({@link Delivery#leaseLost()},
     * {@link Delivery#isLeaseLost()}) and sends no verdict for it, whatever its handler returns;
     * if the entry comes back to this consumer, it is a new delivery.
     */
    LEASE_LOST,
    /**
     * An AckEmit named a stream outside the sidecar's allow-list. Nothing was written or
     * acknowledged; the call still holds the delivery ({@link AckEmitException#isHeld()}).
     */
    PERMISSION_DENIED;

    static Code of(io.echomq.v1.VerdictErrorCode code) {
      return switch (code) {
        case VERDICT_ERROR_CODE_UNKNOWN_ID -> UNKNOWN_ID;
        case VERDICT_ERROR_CODE_NOT_PENDING -> NOT_PENDING;
        case VERDICT_ERROR_CODE_INVALID_ARGUMENT -> INVALID_ARGUMENT;
        case VERDICT_ERROR_CODE_UNAVAILABLE -> UNAVAILABLE;
        case VERDICT_ERROR_CODE_LEASE_LOST -> LEASE_LOST;
        case VERDICT_ERROR_CODE_PERMISSION_DENIED -> PERMISSION_DENIED;
        default -> UNSPECIFIED;
      };
    }
  }

  static VerdictError of(io.echomq.v1.VerdictError proto) {
    return new VerdictError(proto.getId(), Code.of(proto.getCode()), proto.getMessage());
  }
}
