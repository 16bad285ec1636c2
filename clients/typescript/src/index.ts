/**
 * `@echomq/client`: the TypeScript client of the EchoMQ sidecar.
 *
 * Layout:
 * - `consumer.ts`: {@link Consumer}, the Consume call: subscribe, run a handler
 *   batched frames, a handler per delivery (or per batch) on a fixed set of
 *   workers, coalesced acks, verdicts, reconnect, graceful stop;
 * - `delivery.ts`: the {@link Delivery} a handler receives and settles;
 * - `producer.ts`: {@link Producer}, Append and AppendBatch;
 * - `branded-id.ts`: the {@link BrandedId} type and helpers;
 * - `idempotency.ts`: {@link SeenSet} and {@link NewerWins}, deduplication by branded id;
 * - `errors.ts`: {@link EchoMQError} and which gRPC codes are permanent;
 * - `grpc.ts`: proto loading and channel defaults;
 * - `gen/`: types generated from `proto/` at build time (never committed).
 *
 * @module
 */
export {
  Consumer,
  DEFAULT_ACK_BATCH,
  DEFAULT_ACK_LINGER_MS,
  DEFAULT_MAX_BATCH,
  type BatchHandler,
  type BatchVerdicts,
  type ConsumerOptions,
  type GroupStart,
  type Handler,
  type ReconnectInfo,
  type RunOptions,
  type StopOptions,
  type Subscribed,
  type Verdict,
  type VerdictError,
  type VerdictErrorCode,
} from './consumer.js';
export type { Delivery, FailOptions, RawField } from './delivery.js';
export { Producer, type AppendOptions, type AppendResult, type FieldValue, type Fields } from './producer.js';
export {
  brandedIdFromStreamId,
  brandedIdTime,
  brandedIdToStreamId,
  compareBrandedIds,
  isBrandedId,
  parseBrandedId,
  type BrandedId,
} from './branded-id.js';
export {
  MemoryNewerWinsStore,
  MemorySeenStore,
  NewerWins,
  SeenSet,
  type NewerWinsStore,
  type SeenStore,
} from './idempotency.js';
export { CallEndedError, EchoMQError, LeaseLostError, PERMANENT_CODES } from './errors.js';
export { DEFAULT_TARGET, type ConnectionOptions } from './grpc.js';
