import { setTimeout as sleep } from 'node:timers/promises';
import { status as Status, type ClientDuplexStream, type StatusObject } from '@grpc/grpc-js';
import type { BrandedId } from './branded-id.js';
import type { Delivery, FailOptions, RawField } from './delivery.js';
import { EchoMQError } from './errors.js';
import { consumerClient, dateOf, durationOf, timestampOf, type ConnectionOptions } from './grpc.js';
import type { ConsumeRequest } from './gen/echomq/v1/ConsumeRequest.js';
import type { ConsumeResponse__Output } from './gen/echomq/v1/ConsumeResponse.js';
import type { ConsumerServiceClient } from './gen/echomq/v1/ConsumerService.js';
import type { Delivery__Output } from './gen/echomq/v1/Delivery.js';
import type { Subscribe } from './gen/echomq/v1/Subscribe.js';

/**
 * Where the group starts reading if it does not exist yet. Required, because
 * guessing wrong either skips or replays a whole stream. Ignored when the group
 * exists: it keeps its position.
 *
 * - `'new'`: only entries appended after the group is created (`$`);
 * - `'beginning'`: everything the stream holds, oldest first (`0`);
 * - `{ afterId }`: entries after this stream id (`<ms>-<seq>` or `<ms>`), exclusive;
 * - `{ at }`: entries appended at or after this instant.
 */
export type GroupStart = 'new' | 'beginning' | { readonly afterId: string } | { readonly at: Date };

/** Codes of a {@link VerdictError}. */
export type VerdictErrorCode = 'UNKNOWN_ID' | 'NOT_PENDING' | 'INVALID_ARGUMENT' | 'UNAVAILABLE' | 'UNSPECIFIED';

/** A verdict or extension the sidecar did not apply. The call goes on. */
export interface VerdictError {
  /** The id as the client sent it. */
  readonly id: string;
  /**
   * - `UNKNOWN_ID`: this call does not hold the id (never delivered to it,
   *   already settled, or past its ack deadline); nothing was applied;
   * - `NOT_PENDING`: Redis no longer has it pending (a peer reclaimed it); it
   *   may be delivered again;
   * - `INVALID_ARGUMENT`: a malformed id or a negative duration;
   * - `UNAVAILABLE`: Redis failed; the entry stays pending and comes back.
   */
  readonly code: VerdictErrorCode;
  /** The sidecar's explanation. */
  readonly message: string;
}

/** What the sidecar confirmed when a call subscribed. */
export interface Subscribed {
  readonly stream: string;
  readonly group: string;
  /** The sidecar's consumer name in the group. */
  readonly consumer: string;
  /** The effective `max_in_flight` after the sidecar's default. */
  readonly maxInFlight: number;
}

/** Passed to {@link ConsumerOptions.onReconnect} before each wait. */
export interface ReconnectInfo {
  /** Consecutive failed attempts so far (1 after the first). */
  readonly attempt: number;
  /** How long the consumer waits before the next call. */
  readonly delayMs: number;
  /** Why the last call ended. */
  readonly error: EchoMQError;
}

/** A handler: resolve to acknowledge, throw (or reject) to fail with the error's message. */
export type Handler = (delivery: Delivery) => unknown;

/** Settings of a {@link Consumer}. Only `stream`, `group` and `start` are required. */
export interface ConsumerOptions extends ConnectionOptions {
  /** The stream key (1 to 1024 bytes). */
  stream: string;
  /** The consumer group (1 to 256 bytes). Created on first subscribe with `start`. */
  group: string;
  /** Where a new group starts. Required: no default. */
  start: GroupStart;
  /**
   * Flow control: the most deliveries the call holds un-settled. Default: the
   * sidecar's `--default-max-in-flight` (64). The sidecar refuses values above
   * its `--max-in-flight-limit` (INVALID_ARGUMENT).
   */
  maxInFlight?: number;
  /**
   * How many handlers run at once. Default: the effective `maxInFlight`. More
   * than `maxInFlight` never run, since the call holds no more deliveries.
   */
  concurrency?: number;
  /** A delivery not settled within this many ms is treated as failed. Default: no deadline. */
  ackDeadlineMs?: number;
  /** The first retry delay after a fail without `retryAfterMs`. Default: the sidecar's (1 s). */
  retryBackoffInitialMs?: number;
  /** The cap of the retry delay. Default: the sidecar's (60 s). */
  retryBackoffMaxMs?: number;
  /** Where {@link Delivery.deadLetter} moves entries. Default: `<stream>:dlq`. */
  deadLetterStream?: string;
  /**
   * Reconnect delays: the n-th consecutive failed attempt waits a random time
   * between half and all of `min(maxMs, initialMs × 2^(n-1))`. Defaults: 100 ms
   * and 5,000 ms.
   */
  reconnect?: { initialMs?: number; maxMs?: number };
  /** The deadline of a graceful stop triggered by `run`'s `signal`. Default: 30,000 ms. */
  stopDeadlineMs?: number;
  /**
   * Called for each verdict the sidecar did not apply. Default: a process
   * warning (`process.emitWarning`, code `ECHOMQ_VERDICT_ERROR`).
   */
  onVerdictError?: (error: VerdictError) => void;
  /** Called each time a call has subscribed (first and after each reconnect). */
  onSubscribed?: (subscribed: Subscribed) => void;
  /** Called when a call ended unexpectedly, before waiting to reconnect. Default: nothing. */
  onReconnect?: (info: ReconnectInfo) => void;
}

/** Options of {@link Consumer.run}. */
export interface RunOptions {
  /** Aborting it stops the consumer gracefully (deadline `stopDeadlineMs`). */
  signal?: AbortSignal;
}

/** Options of {@link Consumer.stop}. */
export interface StopOptions {
  /**
   * How long in-flight handlers may take to finish and their verdicts to be
   * sent. Past it, their deliveries are abandoned (they stay pending and are
   * delivered again) and the call is cancelled. Default: 30,000 ms.
   */
  deadlineMs?: number;
}

const DEFAULT_STOP_DEADLINE_MS = 30_000;
const DEFAULT_RECONNECT_INITIAL_MS = 100;
const DEFAULT_RECONNECT_MAX_MS = 5_000;

const VERDICT_CODE_PREFIX = 'VERDICT_ERROR_CODE_';

/**
 * Consumes one stream through one consumer group over the sidecar's Consume
 * call, running a handler for each delivery with bounded concurrency.
 *
 * A consumer runs once: `run()` until `stop()`, `close()`, the `signal`, or a
 * permanent error. When the call breaks (the sidecar restarts, the connection
 * drops: any status but the permanent ones) it reconnects by itself with
 * jittered exponential backoff and subscribes again with the same settings.
 */
export class Consumer {
  readonly #options: ConsumerOptions;
  readonly #client: ConsumerServiceClient;
  #handler: Handler | undefined;
  #state: 'new' | 'running' | 'stopping' | 'stopped' = 'new';
  /** The current call; replaced on reconnect. Deliveries remember theirs. */
  #call: Call | undefined;
  /** Deliveries received and not yet handed to a handler (bounded by maxInFlight). */
  #queue: DeliveryImpl[] = [];
  /** Handler runs under way, across calls. */
  #inFlight = new Set<Promise<void>>();
  #concurrency = 1;
  /** Wakes the reconnect wait early (stop, close). */
  #wake = new AbortController();
  #done: Promise<void> | undefined;
  #closing: Promise<void> | undefined;
  #changeWaiters: (() => void)[] = [];

  constructor(options: ConsumerOptions) {
    if (!options.stream) throw new TypeError('ConsumerOptions.stream is required');
    if (!options.group) throw new TypeError('ConsumerOptions.group is required');
    subscribeOf(options); // validates `start` and the numbers now rather than on the first call
    this.#options = { ...options };
    this.#client = consumerClient(options);
  }

  /**
   * Runs `handler` for every delivery until the consumer is stopped. Resolves
   * after a graceful stop (or `close()`); rejects with an {@link EchoMQError}
   * on a permanent error (INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED,
   * FAILED_PRECONDITION, UNIMPLEMENTED), which is not retried.
   */
  run(handler: Handler, options: RunOptions = {}): Promise<void> {
    if (this.#state !== 'new') return Promise.reject(new Error('a Consumer runs once; create a new one'));
    this.#state = 'running';
    this.#handler = handler;
    const { signal } = options;
    const onAbort = () => void this.stop({ deadlineMs: this.#options.stopDeadlineMs ?? DEFAULT_STOP_DEADLINE_MS });
    const loop = this.#loop().finally(() => {
      signal?.removeEventListener('abort', onAbort);
      this.#state = 'stopped';
      this.#client.close();
    });
    this.#done = loop.then(
      () => undefined,
      () => undefined,
    );
    if (signal?.aborted) onAbort();
    else signal?.addEventListener('abort', onAbort, { once: true });
    return loop;
  }

  /**
   * Stops gracefully: first a `Drain` on the call, so the sidecar hands it
   * nothing more and reads nothing more for it (the credit the last verdicts
   * free cannot pull another entry into the group's pending list); then
   * handlers under way may finish within `deadlineMs` and their verdicts are
   * sent; then the call is closed. Deliveries received but not started, and
   * those still arriving after the Drain, are not handed to a handler: they
   * stay pending in the group and are delivered again after the sidecar's
   * backoff. Resolves when `run()` has returned; safe to call more than once
   * and before `run()`.
   */
  async stop(options: StopOptions = {}): Promise<void> {
    const deadlineMs = options.deadlineMs ?? DEFAULT_STOP_DEADLINE_MS;
    if (this.#state === 'new') {
      this.#state = 'stopped';
      this.#client.close();
      return;
    }
    if (this.#state === 'running') {
      this.#state = 'stopping';
      this.#queue = [];
      // Before any verdict of the handlers under way: the sidecar stops handing
      // out (and reading) before their credit frees.
      this.#call?.drain();
      this.#closing = this.#settleAndClose(Date.now() + deadlineMs);
    }
    await this.#closing;
    await this.#done;
  }

  /**
   * Stops at once: cancels the call without sending any more verdicts. What
   * the call held stays pending and is delivered again after the sidecar's
   * backoff. Handlers under way see their delivery's `signal` aborted.
   */
  close(): void {
    if (this.#state === 'new') {
      this.#state = 'stopped';
      this.#client.close();
      return;
    }
    if (this.#state === 'stopped') return;
    this.#state = 'stopping';
    this.#queue = [];
    this.#call?.cancel();
    this.#wake.abort();
  }

  /**
   * Low-level: sends an Ack of `ids` on the current call, whether or not this
   * consumer handed them out (the sidecar answers ids the call does not hold
   * with a {@link VerdictError}). Returns false when no call is open.
   */
  rawAck(ids: readonly string[]): boolean {
    return this.#call?.send({ ack: { ids: [...ids] } }) ?? false;
  }

  /** Low-level: sends a Fail of any `id` on the current call. Returns false when no call is open. */
  rawFail(id: string, options: { reason?: string; retryAfterMs?: number; deadLetter?: boolean } = {}): boolean {
    return this.#call?.send({ fail: failOf(id, options.reason ?? '', options.retryAfterMs, options.deadLetter ?? false) }) ?? false;
  }

  get #stopping(): boolean {
    return this.#state !== 'running';
  }

  async #loop(): Promise<void> {
    const initial = this.#options.reconnect?.initialMs ?? DEFAULT_RECONNECT_INITIAL_MS;
    const max = this.#options.reconnect?.maxMs ?? DEFAULT_RECONNECT_MAX_MS;
    let attempt = 0;
    while (!this.#stopping) {
      const call: Call = new Call(this.#client.consume(), {
        subscribed: (subscribed) => this.#onSubscribed(subscribed),
        delivery: (message) => this.#onDelivery(call, message),
        verdictError: (error) => this.#onVerdictError(error),
        ended: () => this.#onCallEnded(call),
      });
      this.#call = call;
      call.send({ subscribe: subscribeOf(this.#options) });
      const ended = await call.ended;
      if (this.#stopping) return;
      const error = EchoMQError.from(
        `consuming stream ${JSON.stringify(this.#options.stream)} as group ${JSON.stringify(this.#options.group)}`,
        ended.code === Status.OK ? { code: Status.UNAVAILABLE, details: 'the sidecar ended the call' } : ended,
      );
      if (error.permanent) {
        this.#state = 'stopping';
        throw error;
      }
      attempt = call.subscribed ? 1 : attempt + 1;
      const full = Math.min(max, initial * 2 ** Math.min(attempt - 1, 30));
      const delayMs = Math.round(full / 2 + (Math.random() * full) / 2);
      this.#options.onReconnect?.({ attempt, delayMs, error });
      await sleep(delayMs, undefined, { signal: this.#wake.signal }).catch(() => undefined);
    }
  }

  /** The graceful part of stop(), after the Drain: let handlers finish, flush, half-close, wait for the end. */
  async #settleAndClose(deadlineAt: number): Promise<void> {
    const finished = await this.#waitFor(() => this.#inFlight.size === 0, deadlineAt);
    const call = this.#call;
    if (call && !call.closed) {
      if (finished) {
        // Verdicts first, then the half-close: the sidecar applies what it read
        // before the end of the call, then returns anything else it held.
        call.halfClose();
        const ended = await this.#waitFor(() => call.closed, deadlineAt);
        if (!ended) call.cancel();
      } else {
        call.cancel();
      }
    }
    this.#wake.abort();
  }

  /**
   * Waits until `done()` holds, re-checking whenever a handler finishes or a
   * call ends (see #changed); false when the deadline passes first.
   */
  async #waitFor(done: () => boolean, deadlineAt: number): Promise<boolean> {
    if (done()) return true;
    const timer = new AbortController();
    const timeout = sleep(Math.max(0, deadlineAt - Date.now()), undefined, { signal: timer.signal }).then(
      () => true,
      () => true,
    );
    try {
      while (!done()) {
        const changed = new Promise<boolean>((resolve) => this.#changeWaiters.push(() => resolve(false)));
        if (await Promise.race([changed, timeout])) return done();
      }
      return true;
    } finally {
      timer.abort();
    }
  }

  /** Wakes #waitFor: a handler finished or a call ended. */
  #changed(): void {
    for (const resolve of this.#changeWaiters.splice(0)) resolve();
  }

  #onSubscribed(subscribed: Subscribed): void {
    const limit = subscribed.maxInFlight || Number.MAX_SAFE_INTEGER;
    this.#concurrency = Math.max(1, Math.min(this.#options.concurrency ?? limit, limit));
    this.#options.onSubscribed?.(subscribed);
  }

  #onDelivery(call: Call, message: Delivery__Output): void {
    const delivery = new DeliveryImpl(message, call);
    // While stopping, nothing new starts: the entry stays held by the call and
    // returns to the group's PEL when the call closes.
    if (this.#stopping || call !== this.#call) return;
    this.#queue.push(delivery);
    this.#pump();
  }

  #onVerdictError(error: VerdictError): void {
    if (this.#options.onVerdictError) {
      this.#options.onVerdictError(error);
    } else {
      process.emitWarning(`EchoMQ verdict for ${error.id} not applied: ${error.code}: ${error.message}`, {
        code: 'ECHOMQ_VERDICT_ERROR',
      });
    }
  }

  #onCallEnded(call: Call): void {
    // Deliveries of a broken call are not the new call's to settle: the
    // sidecar returns them to the PEL and delivers them again.
    this.#queue = this.#queue.filter((delivery) => delivery.call !== call);
    this.#changed();
  }

  #pump(): void {
    while (!this.#stopping && this.#inFlight.size < this.#concurrency) {
      const delivery = this.#queue.shift();
      if (!delivery) return;
      if (delivery.call.closed) continue;
      this.#start(delivery);
    }
  }

  #start(delivery: DeliveryImpl): void {
    const handler = this.#handler!;
    // In flight before the handler runs: a handler may call stop() (or abort
    // run's signal) synchronously, before its first await, and stop() must
    // then wait for it and send its verdict before the half-close.
    let finished!: () => void;
    const run = new Promise<void>((resolve) => (finished = resolve));
    this.#inFlight.add(run);
    void (async () => {
      try {
        await handler(delivery);
        delivery.ack();
      } catch (error) {
        delivery.fail(reasonOf(error));
      }
    })().finally(() => {
      this.#inFlight.delete(run);
      finished();
      this.#pump();
      this.#changed();
    });
  }
}

/** What a {@link Call} reports to its consumer. */
interface CallEvents {
  subscribed(subscribed: Subscribed): void;
  delivery(message: Delivery__Output): void;
  verdictError(error: VerdictError): void;
  /** The call ended (any status); called once, before `ended` resolves. */
  ended(): void;
}

/**
 * One Consume call: the duplex stream, the deliveries it holds, and its acks
 * waiting to be sent together.
 */
class Call {
  readonly #stream: ClientDuplexStream<ConsumeRequest, ConsumeResponse__Output>;
  readonly #events: CallEvents;
  /** Aborted when the call ends: verdicts of its deliveries can no longer be applied. */
  readonly abort = new AbortController();
  /** Resolves with the call's final status. */
  readonly ended: Promise<StatusObject>;
  subscribed = false;
  /** No more frames may be written (half-closed, cancelled or ended). */
  #writable = true;
  #closed = false;
  #drained = false;
  #acks: string[] = [];
  #flushScheduled = false;

  constructor(stream: ClientDuplexStream<ConsumeRequest, ConsumeResponse__Output>, events: CallEvents) {
    this.#stream = stream;
    this.#events = events;
    this.ended = new Promise((resolve) => {
      // 'error' precedes 'status' for a non-OK status; the status carries all we need.
      stream.on('error', () => undefined);
      stream.on('status', (status: StatusObject) => {
        this.#end();
        resolve(status);
      });
    });
    stream.on('data', (response: ConsumeResponse__Output) => this.#receive(response));
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Writes a frame; false when the call can no longer take one. */
  send(request: ConsumeRequest): boolean {
    if (!this.#writable) return false;
    this.#stream.write(request);
    return true;
  }

  /**
   * Asks the sidecar for no further deliveries on this call (verdicts still
   * work). Sent once; false when the call can no longer take a frame or was
   * already drained.
   */
  drain(): boolean {
    if (this.#drained) return false;
    this.#drained = this.send({ drain: {} });
    return this.#drained;
  }

  /** Queues an ack; acks queued in one turn of the event loop go out as one Ack frame. */
  ack(id: string): boolean {
    if (!this.#writable) return false;
    this.#acks.push(id);
    if (!this.#flushScheduled) {
      this.#flushScheduled = true;
      setImmediate(() => this.#flush());
    }
    return true;
  }

  /** Sends queued acks, then ends the client's side; the sidecar then ends the call with OK. */
  halfClose(): void {
    if (!this.#writable) return;
    this.#flush();
    this.#writable = false;
    this.#stream.end();
  }

  /** Ends the call now (CANCELLED); nothing more is sent. */
  cancel(): void {
    this.#writable = false;
    this.#acks = [];
    this.#stream.cancel();
  }

  #flush(): void {
    this.#flushScheduled = false;
    if (this.#acks.length === 0 || !this.#writable) return;
    const ids = this.#acks;
    this.#acks = [];
    this.#stream.write({ ack: { ids } });
  }

  #end(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#writable = false;
    this.#acks = [];
    this.abort.abort(new Error('the Consume call that delivered this entry ended'));
    this.#events.ended();
  }

  #receive(response: ConsumeResponse__Output): void {
    switch (response.kind) {
      case 'subscribed': {
        const s = response.subscribed!;
        this.subscribed = true;
        this.#events.subscribed({ stream: s.stream, group: s.group, consumer: s.consumer, maxInFlight: s.maxInFlight });
        break;
      }
      case 'delivery':
        if (!this.#closed) this.#events.delivery(response.delivery!);
        break;
      case 'verdictError': {
        const e = response.verdictError!;
        const code = (e.code.startsWith(VERDICT_CODE_PREFIX) ? e.code.slice(VERDICT_CODE_PREFIX.length) : e.code) as VerdictErrorCode;
        this.#events.verdictError({ id: e.id, code, message: e.message });
        break;
      }
      default:
        break;
    }
  }
}

class DeliveryImpl implements Delivery {
  readonly id: BrandedId;
  readonly streamId: string;
  readonly stream: string;
  readonly group: string;
  readonly payload: Readonly<Record<string, Buffer>>;
  readonly rawFields: readonly RawField[];
  readonly attempts: number;
  readonly mintedAt: Date;
  readonly traceparent: string;
  readonly call: Call;
  #settled = false;

  constructor(message: Delivery__Output, call: Call) {
    this.id = message.id as BrandedId;
    this.streamId = message.streamId;
    this.stream = message.stream;
    this.group = message.group;
    this.payload = message.payload;
    this.rawFields = message.rawFields.map((f) => ({ name: f.name, value: f.value }));
    this.attempts = message.attempts;
    this.mintedAt = dateOf(message.mintedAt);
    this.traceparent = message.traceparent;
    this.call = call;
  }

  get signal(): AbortSignal {
    return this.call.abort.signal;
  }

  get settled(): boolean {
    return this.#settled;
  }

  text(name: string): string | undefined {
    return Object.hasOwn(this.payload, name) ? this.payload[name]!.toString('utf8') : undefined;
  }

  ack(): boolean {
    if (!this.#settle()) return false;
    return this.call.ack(this.id);
  }

  fail(reason = '', options: FailOptions = {}): boolean {
    if (!this.#settle()) return false;
    return this.call.send({ fail: failOf(this.id, reason, options.retryAfterMs, false) });
  }

  deadLetter(reason: string): boolean {
    if (!this.#settle()) return false;
    return this.call.send({ fail: failOf(this.id, reason, undefined, true) });
  }

  extend(byMs: number): boolean {
    if (this.#settled) return false;
    return this.call.send({ extend: { ids: [this.id], by: durationOf(byMs) } });
  }

  /** Marks the delivery settled; false when it already was or its call is gone. */
  #settle(): boolean {
    if (this.#settled) return false;
    this.#settled = true;
    return !this.call.closed;
  }
}

function failOf(id: string, reason: string, retryAfterMs: number | undefined, deadLetter: boolean): ConsumeRequest['fail'] {
  return {
    id,
    reason,
    deadLetter,
    ...(retryAfterMs === undefined ? {} : { retryAfter: durationOf(retryAfterMs) }),
  };
}

function reasonOf(error: unknown): string {
  if (error instanceof Error) return error.message || error.name;
  return String(error);
}

function positive(name: string, value: number | undefined): void {
  if (value !== undefined && !(Number.isFinite(value) && value >= 0)) {
    throw new RangeError(`ConsumerOptions.${name} must be a number >= 0, got ${value}`);
  }
}

/** The Subscribe frame of `options`; throws on a missing or malformed start. */
function subscribeOf(options: ConsumerOptions): Subscribe {
  for (const name of ['maxInFlight', 'concurrency', 'ackDeadlineMs', 'retryBackoffInitialMs', 'retryBackoffMaxMs'] as const) {
    positive(name, options[name]);
  }
  const subscribe: Subscribe = {
    stream: options.stream,
    group: options.group,
    maxInFlight: options.maxInFlight ?? 0,
    deadLetterStream: options.deadLetterStream ?? '',
  };
  const start = options.start;
  if (start === 'new') subscribe.groupStart = 'GROUP_START_NEW';
  else if (start === 'beginning') subscribe.groupStart = 'GROUP_START_BEGINNING';
  else if (start && typeof start === 'object' && 'afterId' in start) {
    subscribe.groupStart = 'GROUP_START_ID';
    subscribe.startId = start.afterId;
  } else if (start && typeof start === 'object' && 'at' in start && start.at instanceof Date) {
    subscribe.groupStart = 'GROUP_START_INSTANT';
    subscribe.startTime = timestampOf(start.at);
  } else {
    throw new TypeError(
      "ConsumerOptions.start is required: 'new' (only new entries), 'beginning' (everything the stream holds), { afterId: '<ms>-<seq>' } or { at: Date }",
    );
  }
  if (options.ackDeadlineMs !== undefined) subscribe.ackDeadline = durationOf(options.ackDeadlineMs);
  if (options.retryBackoffInitialMs !== undefined) subscribe.retryBackoffInitial = durationOf(options.retryBackoffInitialMs);
  if (options.retryBackoffMaxMs !== undefined) subscribe.retryBackoffMax = durationOf(options.retryBackoffMaxMs);
  return subscribe;
}
