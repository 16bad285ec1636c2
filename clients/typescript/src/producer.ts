import type { CallOptions, Metadata } from '@grpc/grpc-js';
import { Metadata as GrpcMetadata } from '@grpc/grpc-js';
import { parseBrandedId, type BrandedId } from './branded-id.js';
import { EchoMQError } from './errors.js';
import { streamClient, type ConnectionOptions } from './grpc.js';
import type { AppendResponse__Output } from './gen/echomq/v1/AppendResponse.js';
import type { StreamServiceClient } from './gen/echomq/v1/StreamService.js';

/** A field value: bytes, or text (written as UTF-8). */
export type FieldValue = Uint8Array | string;

/** An entry's fields, name → value. A field may not be named like the sidecar's reserved branded-id field (`id`). */
export type Fields = Readonly<Record<string, FieldValue>> | ReadonlyMap<string, FieldValue>;

/** What an append wrote. */
export interface AppendResult {
  /** The entry's branded id: its idempotency key, kept by every copy. */
  readonly id: BrandedId;
  /** The stream id the entry got, `<ms>-<seq>`. */
  readonly streamId: string;
  /**
   * The stream key written: the stream appended to, or for a sharded stream
   * (the sidecar's `--sharded-streams`) the shard's key, `<stream>:{<stream>:<k>}`.
   */
  readonly stream: string;
}

/** Options of one append. */
export interface AppendOptions {
  /**
   * Trim the stream to about this many entries as part of the XADD
   * (`MAXLEN ~ maxLen`; Redis trims whole nodes, so a few more may stay).
   * Default: no trimming.
   */
  maxLen?: number | bigint;
  /**
   * For a sharded stream (the sidecar's `--sharded-streams`): entries with the
   * same partition key go to the same shard, so they are consumed in the order
   * they were appended (a batch goes to one shard as a whole). Default (or
   * `''`): the shards are taken in turn. A stream that is not sharded ignores it.
   */
  partitionKey?: string;
  /** Give up after this many milliseconds (DEADLINE_EXCEEDED). Default: no deadline. */
  deadlineMs?: number;
  /** Cancels the call (CANCELLED). */
  signal?: AbortSignal;
  /**
   * Wait for the sidecar to become reachable instead of failing at once with
   * UNAVAILABLE (use with `deadlineMs`). Default: false.
   */
  waitForReady?: boolean;
}

/**
 * Appends entries to streams through the sidecar's `StreamService`. The
 * sidecar mints each entry's branded id atomically with the XADD.
 *
 * An append is not retried by this client: if the answer is lost (UNAVAILABLE
 * after the request was sent) the entry may or may not have been written, and
 * a retry could write it twice. Retry yourself where a duplicate is harmless;
 * consumers deduplicate by branded id, but a retried append mints a new one.
 */
export class Producer {
  readonly #client: StreamServiceClient;

  constructor(options: ConnectionOptions = {}) {
    this.#client = streamClient(options);
  }

  /** Appends one entry to `stream` (created if absent). */
  append(stream: string, fields: Fields, options: AppendOptions = {}): Promise<AppendResult> {
    const request = {
      stream,
      fields: encodeFields(fields),
      maxLen: maxLenOf(options.maxLen),
      partitionKey: options.partitionKey ?? '',
    };
    return this.#unary(`append to stream ${JSON.stringify(stream)}`, options, (metadata, callOptions, done) =>
      this.#client.append(request, metadata, callOptions, (error, response) =>
        done(error, response && resultOf(response)),
      ),
    );
  }

  /**
   * Appends several entries to `stream` in one server-side script: all of them
   * or none. Results are in request order; ids are consecutive.
   */
  appendBatch(stream: string, entries: readonly Fields[], options: AppendOptions = {}): Promise<AppendResult[]> {
    const request = {
      stream,
      entries: entries.map((fields) => ({ fields: encodeFields(fields) })),
      maxLen: maxLenOf(options.maxLen),
      partitionKey: options.partitionKey ?? '',
    };
    return this.#unary(`append a batch of ${entries.length} to stream ${JSON.stringify(stream)}`, options, (metadata, callOptions, done) =>
      this.#client.appendBatch(request, metadata, callOptions, (error, response) =>
        done(error, response && response.entries.map(resultOf)),
      ),
    );
  }

  /** Closes the channel. Calls under way fail with CANCELLED or UNAVAILABLE. */
  close(): void {
    this.#client.close();
  }

  #unary<T>(
    what: string,
    options: AppendOptions,
    start: (
      metadata: Metadata,
      callOptions: CallOptions,
      done: (error: unknown, value: T | undefined) => void,
    ) => { cancel(): void },
  ): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      options.signal?.throwIfAborted();
      const callOptions: CallOptions = {};
      if (options.deadlineMs !== undefined) callOptions.deadline = Date.now() + options.deadlineMs;
      const metadata = new GrpcMetadata({ waitForReady: options.waitForReady ?? false });
      const onAbort = () => call.cancel();
      const call = start(metadata, callOptions, (error, value) => {
        options.signal?.removeEventListener('abort', onAbort);
        if (error || value === undefined) reject(EchoMQError.from(what, error ?? new Error('empty answer')));
        else resolve(value);
      });
      options.signal?.addEventListener('abort', onAbort, { once: true });
    });
  }
}

function encodeFields(fields: Fields): Record<string, Uint8Array> {
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
  return { id: parseBrandedId(response.id), streamId: response.streamId, stream: response.stream };
}
