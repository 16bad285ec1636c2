// The one place that loads the proto contract and builds gRPC clients, so the
// proto-loader options and channel defaults are written once.
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { EchoMQError } from './errors.js';
import { DESCRIPTOR } from './gen/descriptor.js';
import type { ProtoGrpcType as AdminProto } from './gen/admin_service.js';
import type { ProtoGrpcType as ConsumerProto } from './gen/consumer_service.js';
import type { ProtoGrpcType as StreamProto } from './gen/stream_service.js';
import type { AdminServiceClient } from './gen/echomq/v1/AdminService.js';
import type { ConsumerServiceClient } from './gen/echomq/v1/ConsumerService.js';
import type { StreamServiceClient } from './gen/echomq/v1/StreamService.js';

/** The sidecar's default gRPC listen address (`--listen`). */
export const DEFAULT_TARGET = '127.0.0.1:50051';

/**
 * How proto-loader turns messages into objects. These must match the flags of
 * `scripts/generate.mjs`, which generates the types in `src/gen/` for exactly
 * these objects: camelCase fields, 64-bit integers as decimal strings, enums as
 * their names, defaults filled in, and a `kind` property naming the set oneof.
 */
const PROTO_LOADER_OPTIONS: protoLoader.Options = {
  keepCase: false,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
};

type Proto = ConsumerProto & StreamProto & AdminProto;
let loaded: Proto | undefined;

function proto(): Proto {
  if (!loaded) {
    // The contract compiled into the package by scripts/generate.mjs: no file
    // is read, so this works the same from ESM, CommonJS and a bundle.
    loaded = grpc.loadPackageDefinition(
      protoLoader.fromJSON(DESCRIPTOR as Parameters<typeof protoLoader.fromJSON>[0], PROTO_LOADER_OPTIONS),
    ) as unknown as Proto;
  }
  return loaded;
}

/** How to reach the sidecar. Shared by {@link Consumer}, {@link Streams} and {@link Admin}. */
export interface ConnectionOptions {
  /**
   * The sidecar's address: `host:port`, or `unix:/path/to/socket` for a unix
   * socket (the sidecar's `--listen`). Default: `127.0.0.1:50051`, the
   * sidecar's default.
   */
  target?: string;
  /** Channel credentials. Default: plaintext (`credentials.createInsecure()`), for a pod-local sidecar. */
  credentials?: grpc.ChannelCredentials;
  /** `@grpc/grpc-js` channel options, merged over this client's defaults. */
  channelOptions?: grpc.ChannelOptions;
  /** Client interceptors for every call (tracing, metrics, tests that observe frames). */
  interceptors?: grpc.Interceptor[];
}

/**
 * Channel defaults. Deliveries are as large as producers made them (Redis takes
 * entries far above gRPC's 4 MiB default), and refusing one would wedge it in
 * the PEL, so receiving is unlimited. The sidecar is local and restarts fast, so
 * the channel retries connecting sooner than gRPC's 1 s → 120 s default.
 */
const CHANNEL_DEFAULTS: grpc.ChannelOptions = {
  'grpc.max_receive_message_length': -1,
  'grpc.max_send_message_length': -1,
  'grpc.initial_reconnect_backoff_ms': 100,
  'grpc.max_reconnect_backoff_ms': 2_000,
};

function clientOptions(options: ConnectionOptions): grpc.ClientOptions {
  return { ...CHANNEL_DEFAULTS, ...options.channelOptions, interceptors: options.interceptors ?? [] };
}

export function consumerClient(options: ConnectionOptions): ConsumerServiceClient {
  const Client = proto().echomq.v1.ConsumerService;
  return new Client(
    options.target ?? DEFAULT_TARGET,
    options.credentials ?? grpc.credentials.createInsecure(),
    clientOptions(options),
  );
}

export function streamClient(options: ConnectionOptions): StreamServiceClient {
  const Client = proto().echomq.v1.StreamService;
  return new Client(
    options.target ?? DEFAULT_TARGET,
    options.credentials ?? grpc.credentials.createInsecure(),
    clientOptions(options),
  );
}

export function adminClient(options: ConnectionOptions): AdminServiceClient {
  const Client = proto().echomq.v1.AdminService;
  return new Client(
    options.target ?? DEFAULT_TARGET,
    options.credentials ?? grpc.credentials.createInsecure(),
    clientOptions(options),
  );
}

/** Options of one unary call (append, read, trim, the admin calls). */
export interface CallOptions {
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
 * Runs one unary call with `options` (deadline, cancellation, wait for ready)
 * and maps its answer: a failure becomes an {@link EchoMQError} saying `what`
 * was being done.
 */
export function unary<R, T>(
  what: string,
  options: CallOptions,
  start: (
    metadata: grpc.Metadata,
    callOptions: grpc.CallOptions,
    callback: (error: grpc.ServiceError | null, response?: R) => void,
  ) => { cancel(): void },
  map: (response: R) => T,
): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    options.signal?.throwIfAborted();
    const callOptions: grpc.CallOptions = {};
    if (options.deadlineMs !== undefined) callOptions.deadline = Date.now() + options.deadlineMs;
    const metadata = new grpc.Metadata({ waitForReady: options.waitForReady ?? false });
    const onAbort = () => call.cancel();
    const call = start(metadata, callOptions, (error, response) => {
      options.signal?.removeEventListener('abort', onAbort);
      if (error || response === undefined) {
        reject(EchoMQError.from(what, error ?? new Error('empty answer')));
        return;
      }
      try {
        resolve(map(response));
      } catch (mapError) {
        reject(mapError);
      }
    });
    options.signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** A `google.protobuf.Duration` as milliseconds; `undefined` when unset. */
export function msOf(duration: { seconds: string; nanos: number } | null | undefined): number | undefined {
  if (!duration) return undefined;
  return Number(duration.seconds) * 1000 + duration.nanos / 1_000_000;
}

/** A protobuf uint64 (a decimal string with `longs: String`) as a number. */
export function countOf(value: string | number | null | undefined): number {
  return value === null || value === undefined || value === '' ? 0 : Number(value);
}

/** Milliseconds as a `google.protobuf.Duration`. */
export function durationOf(ms: number): { seconds: string; nanos: number } {
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`a duration must be a finite number of ms >= 0, got ${ms}`);
  const whole = Math.floor(ms);
  return { seconds: String(Math.floor(whole / 1000)), nanos: (whole % 1000) * 1_000_000 + Math.round((ms - whole) * 1e6) };
}

/** A `google.protobuf.Timestamp` as a `Date` (millisecond precision). */
export function dateOf(ts: { seconds: string; nanos: number } | null | undefined): Date {
  if (!ts) return new Date(0);
  return new Date(Number(ts.seconds) * 1000 + Math.floor(ts.nanos / 1_000_000));
}

/** A `Date` as a `google.protobuf.Timestamp`. */
export function timestampOf(date: Date): { seconds: string; nanos: number } {
  const ms = date.getTime();
  if (!Number.isFinite(ms)) throw new RangeError('invalid Date');
  const seconds = Math.floor(ms / 1000);
  return { seconds: String(seconds), nanos: (ms - seconds * 1000) * 1_000_000 };
}
