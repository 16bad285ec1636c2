import { parseBrandedId, type BrandedId } from './branded-id.js';
import { entryOf, type Entry } from './entry.js';
import { status as Status } from '@grpc/grpc-js';
import { EchoMQError, NotScheduledError } from './errors.js';
import type { Fields } from './fields.js';
import { countOf, dateOf, streamClient, timestampOf, unary, type CallOptions, type ConnectionOptions } from './grpc.js';
import type { CancelScheduledResponse__Output } from './gen/echomq/v1/CancelScheduledResponse.js';
import type { ListScheduledResponse__Output } from './gen/echomq/v1/ListScheduledResponse.js';
import type { AppendBatchResponse__Output } from './gen/echomq/v1/AppendBatchResponse.js';
import type { AppendResponse__Output } from './gen/echomq/v1/AppendResponse.js';
import type { ReadResponse__Output } from './gen/echomq/v1/ReadResponse.js';
import type { TrimResponse__Output } from './gen/echomq/v1/TrimResponse.js';
import type { ReadRequest } from './gen/echomq/v1/ReadRequest.js';
import type { StreamServiceClient } from './gen/echomq/v1/StreamService.js';
import type { TrimRequest } from './gen/echomq/v1/TrimRequest.js';
/** What an append wrote. */
export interface AppendResult {
  /** The entry's branded id: its idempotency key, kept by every copy. */
  readonly id: BrandedId;
  /** The stream id the entry got, `<ms>-<seq>`; `''` for a scheduled entry (known only when it enters the stream). */
  readonly streamId: string;
  /**
   * The stream key written: the stream appended to, or for a sharded stream
   * (the sidecar's `--sharded-streams`) the shard's key, `<stream>:{<stream>:<k>}`.
   */
  readonly stream: string;
  /**
   * True when the append's dedup key was already recorded on the stream (within
   * the sidecar's `--dedup-window-ms`): nothing was written, and `id`,
   * `streamId` and `stream` are the first append's. Always false without a
   * dedup key.
   */
  readonly duplicate: boolean;
  /**
   * True when the entry was scheduled (`deliverAt` or `delayMs` in the
   * future): `id` is final, `streamId` is `''`, and the entry enters the
   * stream when due ({@link Streams.cancelScheduled} can still remove it). A
   * duplicate of a scheduled append says so too.
   */
  readonly scheduled: boolean;
}

/**
 * When an entry enters its stream: at an instant, or after a delay. Unset:
 * at once. See {@link AppendOptions.deliverAt}.
 */
export interface Schedule {
  /**
   * Schedule the entry for this instant: it gets its branded id now
   * ({@link AppendResult.scheduled}) and enters the stream when due (within the
   * sidecar's `--schedule-poll-ms`), exactly once; until then no consumer or
   * {@link Streams.read} sees it, {@link Streams.listScheduled} does and
   * {@link Streams.cancelScheduled} removes it. An instant already past
   * appends at once. More than 365 days ahead, with `delayMs`, or with
   * `maxLen`: the sidecar's INVALID_ARGUMENT.
   */
  deliverAt?: Date;
  /**
   * Schedule the entry this many milliseconds after the append (on the Redis
   * server's clock), as `deliverAt`. 0: at once; negative: INVALID_ARGUMENT.
   */
  delayMs?: number;
}

/**
 * An entry of {@link Streams.appendBatch} with a dedup key (as
 * {@link AppendOptions.dedupKey}) or a schedule ({@link Schedule}); a plain
 * {@link Fields} is an entry with neither, and a batch may mix both:
 *
 * ```ts
 * await streams.appendBatch('orders', [
 *   { fields: { order: '42' }, dedupKey: 'order-42' },
 *   { fields: { remind: '42' }, delayMs: 3_600_000 },
 *   { note: 'no key' },
 * ]);
 * ```
 *
 * An entry whose key is recorded on the stream, or was used by an earlier
 * entry of the same batch, is not written: its result is the first one's, with
 * `duplicate` set.
 */
export interface BatchEntry extends Schedule {
  /** The entry's fields. */
  readonly fields: Fields;
  /** The entry's dedup key. Default (or `''`): none, never deduplicated. */
  readonly dedupKey?: string;
}

/** Options of {@link Streams.appendBatch}: those of an append but `dedupKey`, which is per entry there ({@link BatchEntry}). */
export interface AppendBatchOptions extends CallOptions {
  /**
   * Trim the stream to about this many entries as part of the XADD
   * (`MAXLEN ~ maxLen`; Redis trims whole nodes, so a few more may stay).
   * Unlike {@link Streams.trim} this does NOT spare entries a group still has
   * pending or has not read. Default: no trimming.
   */
  maxLen?: number | bigint;
  /**
   * For a sharded stream (the sidecar's `--sharded-streams`): entries with the
   * same partition key go to the same shard, so they are consumed in the order
   * they were appended (a batch goes to one shard as a whole). Default (or
   * `''`): the shards are taken in turn. A stream that is not sharded ignores it.
   */
  partitionKey?: string;
}

/** Options of one append. */
export interface AppendOptions extends AppendBatchOptions, Schedule {
  /**
   * Makes the append idempotent: if an append to the same stream with the same
   * key was recorded within the sidecar's `--dedup-window-ms` (2 minutes by
   * default), nothing is written and the result is that append's, with
   * {@link AppendResult.duplicate} set. So an append whose outcome is unknown
   * (UNAVAILABLE, DEADLINE_EXCEEDED, a lost connection) can be retried with
   * the same key without a second copy. Default (or `''`): no deduplication.
   * A key over the sidecar's `--max-name-bytes` (1024) is INVALID_ARGUMENT. On
   * a sharded stream, retry with the same `partitionKey` (or none).
   */
  dedupKey?: string;
}

/**
 * One bound of a {@link ReadRange}: a stream id (`<ms>-<seq>` or `<ms>`), or
 * an instant (a `Date`: the first, or last, possible stream id of that
 * millisecond).
 */
export type ReadBound = string | Date;

/** Which entries to read. Both bounds are inclusive. */
export interface ReadRange {
  /** The first entry to return. Default: the oldest. */
  start?: ReadBound;
  /** The last entry to return. Default: the newest. */
  end?: ReadBound;
  /**
   * The most entries per page (entries). Default (or 0): the sidecar's, 100.
   * At most 10,000 (INVALID_ARGUMENT above). {@link Streams.readAll} reads
   * pages of this size.
   */
  count?: number;
}

/** One page of {@link Streams.read}. */
export interface ReadPage {
  /** The entries, oldest first. */
  readonly entries: readonly Entry[];
  /**
   * Where the next page starts: pass it as `start` (keeping `end`). Empty when
   * this page reached the end of the range. A page may hold fewer than
   * `count` entries when more would not fit in one gRPC message.
   */
  readonly nextStartId: string;
  /**
   * Stream ids in this page's range of entries too large for one gRPC
   * message on their own (the sidecar's `--max-message-bytes`): left out.
   */
  readonly oversizedIds: readonly string[];
}

/** Options of {@link Streams.readAll}. */
export interface ReadAllOptions extends CallOptions {
  /**
   * Called with the stream ids of entries left out because each alone is too
   * large for one gRPC message. Default: a process warning (code
   * `ECHOMQ_OVERSIZED`).
   */
  onOversized?: (streamIds: readonly string[]) => void;
}

/** Where {@link Streams.trim} cuts: exactly one of the three. */
export type TrimBound =
  /** Keep the newest `maxLen` entries (entries, at least 1). */
  | { readonly maxLen: number | bigint }
  /** Remove entries with a stream id below `minId`. */
  | { readonly minId: string }
  /** Remove entries appended before this instant. */
  | { readonly before: Date };

/** Which page {@link Streams.listScheduled} returns. */
export interface ListScheduledOptions extends CallOptions {
  /** The previous page's `nextPageToken`. Default (or `''`): from the entry due first. */
  pageToken?: string;
  /** The most entries (entries). Default (or 0): 100. At most 10,000. */
  count?: number;
}

/** An entry waiting for its time. */
export interface ScheduledEntry {
  /** Its branded id, as the append answered it. */
  readonly id: string;
  /** When it is due to enter the stream. */
  readonly deliverAt: Date;
  /** Its fields as appended (with the stored `traceparent`, if any). */
  readonly fields: Readonly<Record<string, Uint8Array>>;
}

/** A page of {@link Streams.listScheduled}, the first due first. */
export interface ScheduledPage {
  readonly entries: readonly ScheduledEntry[];
  /** Pass as `pageToken` for the next page; empty after the last. */
  readonly nextPageToken: string;
  /** How many entries the stream key has scheduled in all. */
  readonly total: number;
}

/** Options of {@link Streams.trim}. */
export interface TrimOptions extends CallOptions {
  /**
   * Let Redis trim whole radix-tree nodes only (`MINID ~`): cheaper, may keep
   * a few more entries; never removes more than asked. Default: false.
   */
  approximate?: boolean;
  /**
   * Trim as asked even past entries that groups have pending or not yet
   * delivered: **those entries are lost to the groups**. Default: false, the
   * safe mode, which raises the bound to the oldest such entry.
   */
  ignoreGroups?: boolean;
}

/** What {@link Streams.trim} did. */
export interface TrimResult {
  /** Entries removed. */
  readonly trimmed: number;
  /** The MINID bound applied (entries below it are gone); empty when nothing could be trimmed. */
  readonly appliedMinId: string;
  /** True when the safe mode raised the bound to protect a group's pending or undelivered entries. */
  readonly heldBackByGroups: boolean;
}

/**
 * The sidecar's `StreamService`: appends entries (the sidecar mints each
 * entry's branded id atomically with the XADD), reads ranges of a stream
 * without a consumer group, and trims.
 *
 * Nothing here is retried by this client: if an append's answer is lost
 * (UNAVAILABLE or DEADLINE_EXCEEDED after the request was sent, e.g. during a
 * Redis failover or when the sidecar's `--wait-replicas` did not confirm it)
 * the entry may or may not have been written, and a plain retry could write it
 * twice, with a new branded id. Give the append a `dedupKey` and retry with
 * the same key: the retry writes nothing if the first attempt was written, and
 * answers its ids with `duplicate` set.
 *
 * ```ts
 * for (let attempt = 0; ; attempt++) {
 *   try {
 *     const result = await streams.append('orders', fields, { dedupKey: 'order-42' });
 *     break;
 *   } catch (error) {
 *     if (!(error instanceof EchoMQError) || error.permanent || attempt === 4) throw error;
 *     await setTimeout(500 * 2 ** attempt); // node:timers/promises
 *   }
 * }
 * ```
 *
 * Errors: every method rejects with an {@link EchoMQError}: INVALID_ARGUMENT
 * for a bad name, id or bound (the message says which); FAILED_PRECONDITION
 * when the key holds another Redis type; UNAVAILABLE when the sidecar or Redis
 * cannot be reached.
 */
export class Streams {
  readonly #client: StreamServiceClient;

  constructor(options: ConnectionOptions = {}) {
    this.#client = streamClient(options);
  }

  /**
   * Appends one entry to `stream` (created if absent); `options.dedupKey`
   * makes it idempotent; `options.deliverAt` or `options.delayMs` schedules it
   * ({@link Schedule}):
   *
   * ```ts
   * const reminder = await streams.append('reminders', { order: '42' }, { delayMs: 60 * 60_000 });
   * // reminder.scheduled === true; streams.cancelScheduled('reminders', reminder.id) until it is due
   * ```
   */
  append(stream: string, fields: Fields, options: AppendOptions = {}): Promise<AppendResult> {
    const request = {
      stream,
      fields: encodeFields(fields),
      maxLen: maxLenOf(options.maxLen),
      partitionKey: options.partitionKey ?? '',
      dedupKey: options.dedupKey ?? '',
      ...scheduleOf(options),
    };
    return unary(
      `append to stream ${JSON.stringify(stream)}`,
      options,
      (metadata, callOptions, callback) => this.#client.append(request, metadata, callOptions, callback),
      resultOf,
    );
  }

  /**
   * Appends several entries to `stream` in one server-side script: all of them
   * or none. Results are in request order; ids are consecutive. An entry is its
   * {@link Fields}, or a {@link BatchEntry} with a dedup key too: an entry whose
   * key is recorded, or was used by an earlier entry of the batch, is not
   * written and its result is the first one's, with `duplicate` set. On a
   * sharded stream, a batch without `partitionKey` goes to the shard of its
   * first dedup key. A `dedupKey` in `options` is refused (TypeError): the
   * keys are per entry. So are `deliverAt` and `delayMs`: a
   * {@link BatchEntry} carries its own schedule, and a batch may mix entries
   * appended at once and scheduled ones.
   */
  appendBatch(stream: string, entries: readonly (Fields | BatchEntry)[], options: AppendBatchOptions = {}): Promise<AppendResult[]> {
    if ((options as AppendOptions).dedupKey) {
      throw new TypeError('appendBatch takes dedup keys per entry ({ fields, dedupKey }), not in its options');
    }
    if ((options as AppendOptions).deliverAt !== undefined || (options as AppendOptions).delayMs !== undefined) {
      throw new TypeError('appendBatch takes schedules per entry ({ fields, deliverAt } or { fields, delayMs }), not in its options');
    }
    const request = {
      stream,
      entries: entries.map(batchEntryOf),
      maxLen: maxLenOf(options.maxLen),
      partitionKey: options.partitionKey ?? '',
    };
    return unary(
      `append a batch of ${entries.length} to stream ${JSON.stringify(stream)}`,
      options,
      (metadata, callOptions, callback) => this.#client.appendBatch(request, metadata, callOptions, callback),
      (response: AppendBatchResponse__Output) => response.entries.map(resultOf),
    );
  }

  /**
   * Reads one page of `stream`, oldest first, without a consumer group
   * (XRANGE): nothing is acknowledged or counted. For the next page pass
   * `nextStartId` as `start`; or let {@link readAll} page for you.
   *
   * Errors: INVALID_ARGUMENT for a bad stream name or id, or `count` over
   * 10,000; FAILED_PRECONDITION when the key is not a stream; UNAVAILABLE.
   * A stream that does not exist reads as empty.
   */
  read(stream: string, range: ReadRange = {}, options: CallOptions = {}): Promise<ReadPage> {
    const request = readRequestOf(stream, range);
    return unary(
      `read stream ${JSON.stringify(stream)}`,
      options,
      (metadata, callOptions, callback) => this.#client.read(request, metadata, callOptions, callback),
      (response: ReadResponse__Output) => ({
        entries: response.entries.map(entryOf),
        nextStartId: response.nextStartId,
        oversizedIds: response.oversizedIds,
      }),
    );
  }

  /**
   * Every entry of `range`, oldest first, one page (`range.count`, default
   * 100) at a time by `nextStartId`: `for await (const entry of
   * streams.readAll('orders', { start: since })) …`. The next page is asked
   * for when the loop has taken the last entry of this one; breaking out of
   * the loop asks for nothing more. Entries appended meanwhile within the range
   * are read too. Rejects (throws in the loop) as {@link read}.
   */
  async *readAll(stream: string, range: ReadRange = {}, options: ReadAllOptions = {}): AsyncGenerator<Entry, void, undefined> {
    let page = await this.read(stream, range, options);
    for (;;) {
      if (page.oversizedIds.length > 0) {
        if (options.onOversized) options.onOversized(page.oversizedIds);
        else process.emitWarning(`EchoMQ: read of ${JSON.stringify(stream)} left out ${page.oversizedIds.length} entries too large for one gRPC message: ${page.oversizedIds.join(', ')}`, { code: 'ECHOMQ_OVERSIZED' });
      }
      yield* page.entries;
      if (page.nextStartId === '') return;
      page = await this.read(stream, { ...range, start: page.nextStartId }, options);
    }
  }

  /**
   * Removes the oldest entries of `stream` (XTRIM MINID) up to `bound`. In the
   * safe mode (the default) it never removes an entry that any group of the
   * stream still has pending or has not yet been delivered: the bound is
   * raised to the oldest such entry (`heldBackByGroups`), computed and applied
   * atomically in one script.
   *
   * Errors: INVALID_ARGUMENT without exactly one bound (a `maxLen` of 0 is no
   * bound: to remove everything give `minId`); FAILED_PRECONDITION when the
   * key is not a stream; UNAVAILABLE.
   */
  trim(stream: string, bound: TrimBound, options: TrimOptions = {}): Promise<TrimResult> {
    const request: TrimRequest = { stream, approximate: options.approximate ?? false, ignoreGroups: options.ignoreGroups ?? false };
    if ('maxLen' in bound) request.maxLen = maxLenOf(bound.maxLen);
    else if ('minId' in bound) request.minId = bound.minId;
    else if ('before' in bound && bound.before instanceof Date) request.before = timestampOf(bound.before);
    else throw new TypeError('trim needs exactly one bound: { maxLen }, { minId } or { before: Date }');
    return unary(
      `trim stream ${JSON.stringify(stream)}`,
      options,
      (metadata, callOptions, callback) => this.#client.trim(request, metadata, callOptions, callback),
      (response: TrimResponse__Output) => ({
        trimmed: countOf(response.trimmed),
        appliedMinId: response.appliedMinId,
        heldBackByGroups: response.heldBackByGroups,
      }),
    );
  }

  /**
   * Cancels the scheduled entry `id` (its branded id) on `stream` before it
   * enters the stream: it is then never delivered. `stream` is the key the
   * append answered ({@link AppendResult.stream}: a sharded stream's shard
   * key). Resolves to when the entry was due.
   *
   * Rejects with a {@link NotScheduledError} (NOT_FOUND) when no such entry
   * is scheduled there: it entered the stream already, was cancelled, or was
   * never scheduled there; otherwise with an {@link EchoMQError}:
   * INVALID_ARGUMENT for a bad stream name or an id that is not a branded id,
   * UNAVAILABLE.
   */
  async cancelScheduled(stream: string, id: string, options: CallOptions = {}): Promise<Date> {
    const what = `cancel scheduled entry ${id} of stream ${JSON.stringify(stream)}`;
    try {
      return await unary(
        what,
        options,
        (metadata, callOptions, callback) => this.#client.cancelScheduled({ stream, id }, metadata, callOptions, callback),
        (response: CancelScheduledResponse__Output) => dateOf(response.deliverAt),
      );
    } catch (error) {
      if (error instanceof EchoMQError && error.code === Status.NOT_FOUND) {
        throw new NotScheduledError(what, error.details, { cause: error.cause });
      }
      throw error;
    }
  }

  /**
   * One page of the entries scheduled on `stream` (a stream key: list each
   * shard key of a sharded stream) that have not entered it yet, due first
   * first. For the next page pass `nextPageToken` as `pageToken`; or let
   * {@link scheduled} page for you.
   *
   * Errors: INVALID_ARGUMENT for a bad stream name, a malformed `pageToken`
   * or `count` over 10,000; UNAVAILABLE.
   */
  listScheduled(stream: string, options: ListScheduledOptions = {}): Promise<ScheduledPage> {
    const request = { stream, pageToken: options.pageToken ?? '', count: options.count ?? 0 };
    return unary(
      `list the scheduled entries of stream ${JSON.stringify(stream)}`,
      options,
      (metadata, callOptions, callback) => this.#client.listScheduled(request, metadata, callOptions, callback),
      (response: ListScheduledResponse__Output) => ({
        entries: response.entries.map((e) => ({ id: e.id, deliverAt: dateOf(e.deliverAt), fields: e.fields })),
        nextPageToken: response.nextPageToken,
        total: countOf(response.total),
      }),
    );
  }

  /**
   * Every entry scheduled on `stream`, the first due first, one page (`count`,
   * default 100) at a time by `nextPageToken`: `for await (const entry of
   * streams.scheduled('reminders')) …`. Rejects (throws in the loop) as
   * {@link listScheduled}.
   */
  async *scheduled(stream: string, options: Omit<ListScheduledOptions, 'pageToken'> = {}): AsyncGenerator<ScheduledEntry, void, undefined> {
    let page = await this.listScheduled(stream, options);
    for (;;) {
      yield* page.entries;
      if (page.nextPageToken === '') return;
      page = await this.listScheduled(stream, { ...options, pageToken: page.nextPageToken });
    }
  }

  /** Closes the channel. Calls under way fail with CANCELLED or UNAVAILABLE. */
  close(): void {
    this.#client.close();
  }
}

/**
 * The old name of {@link Streams}, which appends, reads and trims.
 *
 * @deprecated Use {@link Streams} (the same methods); `Producer` goes away in
 * the next release.
 */
export class Producer extends Streams {}

function readRequestOf(stream: string, range: ReadRange): ReadRequest {
  if (range.count !== undefined && !(Number.isInteger(range.count) && range.count >= 0)) {
    throw new RangeError(`ReadRange.count must be an integer >= 0, got ${range.count}`);
  }
  const request: ReadRequest = { stream, count: range.count ?? 0 };
  if (range.start instanceof Date) request.startTime = timestampOf(range.start);
  else if (range.start !== undefined) request.startId = range.start;
  if (range.end instanceof Date) request.endTime = timestampOf(range.end);
  else if (range.end !== undefined) request.endId = range.end;
  return request;
}

function isBatchEntry(entry: Fields | BatchEntry): entry is BatchEntry {
  if (entry instanceof Map || !Object.hasOwn(entry, 'fields')) return false;
  // A Fields record may name a field `fields`, but its value is a string or bytes.
  const fields = (entry as { fields: unknown }).fields;
  return typeof fields === 'object' && fields !== null && !(fields instanceof Uint8Array);
}

function batchEntryOf(entry: Fields | BatchEntry): { fields: Record<string, Uint8Array>; dedupKey: string } {
  return isBatchEntry(entry)
    ? { fields: encodeFields(entry.fields), dedupKey: entry.dedupKey ?? '', ...scheduleOf(entry) }
    : { fields: encodeFields(entry), dedupKey: '' };
}

type Stamp = { seconds: string; nanos: number };

/**
 * A {@link Schedule} as the request's `deliverAt` and `delay`, each only when
 * given. Sent as given (both, a negative delay): the sidecar refuses those
 * with INVALID_ARGUMENT and says why.
 */
function scheduleOf(schedule: Schedule): { deliverAt?: Stamp; delay?: Stamp } {
  const out: { deliverAt?: Stamp; delay?: Stamp } = {};
  if (schedule.deliverAt !== undefined) out.deliverAt = timestampOf(schedule.deliverAt);
  if (schedule.delayMs !== undefined) out.delay = signedDurationOf(schedule.delayMs);
  return out;
}

/** Milliseconds, of either sign, as a `google.protobuf.Duration` (seconds and nanos share the sign). */
function signedDurationOf(ms: number): Stamp {
  if (!Number.isFinite(ms)) throw new RangeError(`delayMs must be a finite number, got ${ms}`);
  const sign = ms < 0 ? -1 : 1;
  const abs = Math.abs(ms);
  const seconds = Math.floor(abs / 1000);
  const nanos = Math.round((abs - seconds * 1000) * 1e6);
  return { seconds: String(sign * seconds), nanos: sign * nanos };
}

/** Field values as bytes; text is encoded as UTF-8. */
export function encodeFields(fields: Fields): Record<string, Uint8Array> {
  const entries = fields instanceof Map ? [...fields] : Object.entries(fields);
  const out: Record<string, Uint8Array> = Object.create(null) as Record<string, Uint8Array>;
  for (const [name, value] of entries) {
    out[name] = typeof value === 'string' ? Buffer.from(value, 'utf8') : value;
  }
  return out;
}

function maxLenOf(maxLen: number | bigint | undefined): string {
  if (maxLen === undefined) return '0';
  if ((typeof maxLen === 'number' && (!Number.isSafeInteger(maxLen) || maxLen < 0)) || maxLen < 0) {
    throw new RangeError(`maxLen must be a whole number >= 0, got ${maxLen}`);
  }
  return String(maxLen);
}

function resultOf(response: AppendResponse__Output): AppendResult {
  return {
    id: parseBrandedId(response.id),
    streamId: response.streamId,
    stream: response.stream,
    duplicate: response.duplicate,
    scheduled: response.scheduled,
  };
}
