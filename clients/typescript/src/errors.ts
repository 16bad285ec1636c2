import { status as Status, type ServiceError } from '@grpc/grpc-js';

/** Codes of a {@link VerdictError}. */
export type VerdictErrorCode =
  | 'UNKNOWN_ID'
  | 'NOT_PENDING'
  | 'INVALID_ARGUMENT'
  | 'UNAVAILABLE'
  | 'LEASE_LOST'
  | 'PERMISSION_DENIED'
  | 'UNSPECIFIED';

/**
 * gRPC status codes that retrying cannot fix, the same in every EchoMQ client
 * (`clients/CONTRACT.md`): the request itself is wrong (INVALID_ARGUMENT,
 * OUT_OF_RANGE), names something that is not there or already is (NOT_FOUND,
 * ALREADY_EXISTS), the caller may not do it (PERMISSION_DENIED,
 * UNAUTHENTICATED), the data is in a state that forbids it
 * (FAILED_PRECONDITION, for example a stream key that holds another Redis
 * type), or the server is not an EchoMQ sidecar of a compatible version
 * (UNIMPLEMENTED). A consumer stops and rejects `run()` on these; every other
 * status (UNAVAILABLE above all, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED,
 * ABORTED, INTERNAL, UNKNOWN, a call reset mid-way) is retried with backoff.
 */
export const PERMANENT_CODES: ReadonlySet<Status> = new Set([
  Status.INVALID_ARGUMENT,
  Status.OUT_OF_RANGE,
  Status.NOT_FOUND,
  Status.ALREADY_EXISTS,
  Status.PERMISSION_DENIED,
  Status.UNAUTHENTICATED,
  Status.FAILED_PRECONDITION,
  Status.UNIMPLEMENTED,
]);

/** An error the sidecar answered (or the gRPC channel raised), with what was being done. */
export class EchoMQError extends Error {
  override readonly name: string = 'EchoMQError';
  /** The gRPC status code (`@grpc/grpc-js`'s `status` enum). */
  readonly code: Status;
  /** The status code's name, for example `INVALID_ARGUMENT`. */
  readonly codeName: string;
  /** The sidecar's own message: which field or key is wrong and how to fix it. */
  readonly details: string;
  /** True when retrying cannot help (see {@link PERMANENT_CODES}). */
  readonly permanent: boolean;

  constructor(what: string, code: Status, details: string, options?: { cause?: unknown }) {
    const codeName = Status[code] ?? `code ${code}`;
    super(`${what}: ${codeName}: ${details}`, options);
    this.code = code;
    this.codeName = codeName;
    this.details = details;
    this.permanent = PERMANENT_CODES.has(code);
  }

  /** Wraps a `@grpc/grpc-js` error; keeps it as `cause`. */
  static from(what: string, error: unknown): EchoMQError {
    if (error instanceof EchoMQError) return error;
    const service = error as Partial<ServiceError>;
    if (typeof service?.code === 'number') {
      return new EchoMQError(what, service.code, service.details ?? service.message ?? '', { cause: error });
    }
    return new EchoMQError(what, Status.UNKNOWN, error instanceof Error ? error.message : String(error), {
      cause: error,
    });
  }
}

/**
 * {@link Streams.cancelScheduled}'s answer when no such entry is scheduled on
 * that stream key (NOT_FOUND): it entered the stream already (a cancel and a
 * move race, and exactly one wins), was cancelled, or was never scheduled
 * there. An {@link EchoMQError} with `code` NOT_FOUND, permanent.
 */
export class NotScheduledError extends EchoMQError {
  override readonly name: string = 'NotScheduledError';

  constructor(what: string, details: string, options?: { cause?: unknown }) {
    super(what, Status.NOT_FOUND, details, options);
  }
}

/**
 * The reason a delivery's `signal` aborts with when the sidecar said
 * LEASE_LOST: a peer reclaimed the entry, which may be running elsewhere now.
 * The client sends no verdict for that delivery, whatever the handler does.
 */
export class LeaseLostError extends Error {
  override readonly name = 'LeaseLostError';
  /** Always `LEASE_LOST`, the verdict error code that caused it. */
  readonly code = 'LEASE_LOST' as const;
  /** The branded id of the delivery whose lease was lost. */
  readonly id: string;

  constructor(id: string, details: string) {
    super(`the lease of delivery ${id} was lost (a peer reclaimed the entry; no verdict will be sent for it)${details ? `: ${details}` : ''}`);
    this.id = id;
  }
}

/**
 * Why {@link Delivery.ackEmit} was not applied: nothing was written and
 * nothing acknowledged by it.
 *
 * `code` is the sidecar's verdict error code, or `undefined` when nothing was
 * sent (the delivery was already settled, its lease lost, its call gone) or
 * the call ended before the answer (then the outcome is unknown: the step may
 * have run, the entry acknowledged and its emits written, or not, and the
 * entry comes back; the emits are written once either way).
 *
 * `held` is true for a bad emit (`INVALID_ARGUMENT`, `PERMISSION_DENIED`): the
 * delivery is still this consumer's and unsettled, so a handler that lets
 * this error propagate fails it with the message, as any error does, or it
 * may answer it again. Otherwise (`NOT_PENDING`, `UNKNOWN_ID`: acknowledged
 * already; `LEASE_LOST`: a peer has it; `UNAVAILABLE`; no answer) the
 * delivery is settled and no verdict follows it.
 */
export class AckEmitError extends Error {
  override readonly name = 'AckEmitError';
  /** The branded id of the delivery. */
  readonly id: string;
  /** The verdict error code (`INVALID_ARGUMENT`, `NOT_PENDING`, …), or `undefined` (see the class). */
  readonly code: VerdictErrorCode | undefined;
  /** The sidecar's message, or why nothing was sent. */
  readonly details: string;

  constructor(id: string, code: VerdictErrorCode | undefined, details: string) {
    super(`ackEmit of ${id}: ${code ?? 'NOT_APPLIED'}: ${details}`);
    this.id = id;
    this.code = code;
    this.details = details;
  }

  /** True when the delivery is still held (a bad emit) and may be answered again. */
  get held(): boolean {
    return this.code === 'INVALID_ARGUMENT' || this.code === 'PERMISSION_DENIED';
  }
}

/** The reason a delivery's `signal` aborts with when its Consume call ended before it was settled. */
export class CallEndedError extends Error {
  override readonly name = 'CallEndedError';

  constructor() {
    super('the Consume call that delivered this entry ended: its verdict can no longer be applied (the sidecar delivers it again)');
  }
}

/**
 * Thrown by a handler that could not try the delivery (its database is down, a
 * rate limit): the consumer fails it with kind TRANSIENT and the message as
 * the reason. It comes back after the backoff with the `attempts` it had, so it
 * is never dead-lettered for this (`clients/CONTRACT.md`, "Failure kinds").
 * Keep the original as `cause`: `throw new TransientError('database down', { cause: error })`.
 */
export class TransientError extends Error {
  override readonly name = 'TransientError';
  /** The failure kind it stands for. */
  readonly kind = 'transient' as const;
}

/**
 * Thrown by a handler for a delivery that can never succeed (it cannot be
 * parsed, it breaks a rule): the consumer fails it with kind POISON and the
 * message as the reason, and the sidecar moves it to the dead-letter stream
 * now, whatever `maxDeliveries` would allow.
 */
export class PoisonError extends Error {
  override readonly name = 'PoisonError';
  /** The failure kind it stands for. */
  readonly kind = 'poison' as const;
}
