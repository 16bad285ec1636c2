import type { BrandedId } from './branded-id.js';
import type { AckEmitError, CallEndedError, LeaseLostError } from './errors.js';
import type { Fields, RawField } from './fields.js';

/**
 * Whose fault a failure was, which decides whether it counts as an attempt
 * (`clients/CONTRACT.md`, "Failure kinds"):
 * - `'message'`: the entry's. Its next delivery counts as another attempt,
 *   toward `maxDeliveries`. What a fail is unless it says otherwise.
 * - `'transient'`: not the entry's (its database is down, a rate limit):
 *   delivered again after the delay with the `attempts` it had, never
 *   dead-lettered for it. A handler may throw a `TransientError` instead.
 * - `'poison'`: it can never succeed: dead-lettered now. A handler may throw a
 *   `PoisonError` instead.
 */
export type FailKind = 'message' | 'transient' | 'poison';

/** Options of {@link Delivery.fail}. */
export interface FailOptions {
  /**
   * Deliver the entry again after this many milliseconds. Default: the
   * subscription's exponential backoff by attempts.
   */
  retryAfterMs?: number;
  /** Whose fault it was. Default: `'message'` (an attempt spent). */
  kind?: FailKind;
}

/** One entry {@link Delivery.ackEmit} appends: its stream key and fields (not the reserved field `id`). */
export interface Emit {
  readonly stream: string;
  /** Values are bytes, or text sent as UTF-8. */
  readonly fields: Fields;
}

/** One entry an {@link Delivery.ackEmit} appended. */
export interface EmittedEntry {
  /** Its new branded id (28 lowercase hex characters). */
  readonly id: BrandedId;
  /** Its id in `stream`, `<ms>-<seq>`. */
  readonly streamId: string;
  /** The stream key it was appended to. */
  readonly stream: string;
}

/**
 * One hand-over of an entry to this consumer.
 *
 * Settle it once: return from the handler (ack), throw (fail with the error's
 * message; a `TransientError` fails transient, a `PoisonError` poison), or call {@link ack}, {@link fail}, {@link deadLetter} or
 * {@link ackEmit} (acknowledge and append what it produced, exactly once) yourself.
 * The first settlement wins; later ones, and the automatic one after the handler
 * returns, do nothing.
 */
export interface Delivery {
  /** The branded id, 28 lowercase hex characters: the idempotency key. */
  readonly id: BrandedId;
  /** The entry's id in this stream, `<ms>-<seq>`. */
  readonly streamId: string;
  /** The stream key. */
  readonly stream: string;
  /** The consumer group. */
  readonly group: string;
  /**
   * The entry's fields without the reserved branded-id field: name → bytes.
   * Fields whose names are not valid UTF-8 are in {@link rawFields} instead.
   */
  readonly payload: Readonly<Record<string, Buffer>>;
  /** Fields whose names are not valid UTF-8, in stream order. Usually empty. */
  readonly rawFields: readonly RawField[];
  /** The entry's delivery count in the group (XPENDING): 1 on the first delivery. */
  readonly attempts: number;
  /** When the branded id was minted. */
  readonly mintedAt: Date;
  /** The W3C trace context stored with the entry; empty when none. */
  readonly traceparent: string;
  /**
   * Aborted while the delivery is unsettled when a verdict for it can no
   * longer be applied, with the reason as `signal.reason`:
   * - a {@link LeaseLostError} (`code` `LEASE_LOST`) when the sidecar said a
   *   peer reclaimed the entry: it may be running elsewhere now; the client
   *   sends no verdict for it, whatever the handler then returns or throws;
   * - a {@link CallEndedError} when the call that delivered it broke or was
   *   closed, or a graceful stop's deadline passed.
   * Either way the entry is delivered again (here or to a peer); a long
   * handler may give up early. Created on first read: a handler that never
   * reads it pays nothing for it.
   */
  readonly signal: AbortSignal;
  /** Whether this delivery was settled (by the handler, automatically, or by losing its lease). */
  readonly settled: boolean;
  /** True once the sidecar said LEASE_LOST for this delivery (see {@link signal}). */
  readonly leaseLost: boolean;

  /** The field `name` decoded as UTF-8 text, or `undefined` when absent. */
  text(name: string): string | undefined;
  /**
   * Acknowledges the entry (XACK). Returns false when it was already settled or
   * its call is gone, or a graceful stop's deadline passed (then the sidecar
   * delivers it again).
   */
  ack(): boolean;
  /**
   * Fails the entry: it stays pending and is delivered again after
   * `retryAfterMs` (or the subscription's backoff). `reason` is logged and kept
   * for a later dead letter. `kind` says whose fault it was: `'transient'`
   * spends no attempt (the database is down), `'poison'` dead-letters now.
   * Returns false when already settled or the call is gone.
   */
  fail(reason?: string, options?: FailOptions): boolean;
  /**
   * Moves the entry to the dead-letter stream now (with its branded id, payload,
   * attempts and `reason`) instead of retrying it: a fail of kind `'poison'`,
   * sent with the older `deadLetter` flag too, so that a sidecar that predates
   * the kinds does the same. Returns false when already settled or the call is gone.
   */
  deadLetter(reason: string): boolean;
  /**
   * Acknowledges the entry and appends `emits`, in one step the sidecar
   * applies only while this consumer still holds the entry: the emits of an
   * entry are written exactly once, together with its acknowledgement,
   * whatever redeliveries, reclaims and duplicate handler runs happened. No
   * emits: an ack that applies only while the entry is held.
   *
   * Sent at once as its own frame (never coalesced with acks); resolves with
   * the emitted entries, in the order of `emits`, once the sidecar answered.
   * Rejects with an {@link AckEmitError} when it was not applied (see its
   * `code` and `held`: after a bad emit the delivery is unsettled again, and
   * a handler that lets the error propagate fails it).
   */
  ackEmit(emits: readonly Emit[]): Promise<EmittedEntry[]>;
  /**
   * Pushes this delivery's ack deadline to `byMs` from now (only meaningful
   * with `ackDeadlineMs`). Returns false when settled or the call is gone.
   */
  extend(byMs: number): boolean;
}
