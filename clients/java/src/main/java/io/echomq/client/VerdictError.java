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
    /** Redis no longer has the entry pending for the group (reclaimed by a peer, group re-created). */
    NOT_PENDING,
    /** The id is not a branded id, or another field of the verdict is invalid. */
    INVALID_ARGUMENT,
    /** Redis failed while applying the verdict; the entry stays pending and comes again. */
    UNAVAILABLE;

    static Code of(io.echomq.v1.VerdictErrorCode code) {
      return switch (code) {
        case VERDICT_ERROR_CODE_UNKNOWN_ID -> UNKNOWN_ID;
        case VERDICT_ERROR_CODE_NOT_PENDING -> NOT_PENDING;
        case VERDICT_ERROR_CODE_INVALID_ARGUMENT -> INVALID_ARGUMENT;
        case VERDICT_ERROR_CODE_UNAVAILABLE -> UNAVAILABLE;
        default -> UNSPECIFIED;
      };
    }
  }

  static VerdictError of(io.echomq.v1.VerdictError proto) {
    return new VerdictError(proto.getId(), Code.of(proto.getCode()), proto.getMessage());
  }
}
