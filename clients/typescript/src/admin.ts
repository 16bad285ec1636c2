import { entryOf, type Entry } from './entry.js';
import { adminClient, countOf, dateOf, msOf, unary, type CallOptions, type ConnectionOptions } from './grpc.js';
import type { ConsumerOptions } from './consumer.js';
import type { AdminServiceClient } from './gen/echomq/v1/AdminService.js';
import type { DescribeGroupResponse__Output } from './gen/echomq/v1/DescribeGroupResponse.js';
import type { ListDeadLettersResponse__Output } from './gen/echomq/v1/ListDeadLettersResponse.js';
import type { ReplayDeadLettersResponse__Output } from './gen/echomq/v1/ReplayDeadLettersResponse.js';

/** One consumer of a group, as {@link Admin.describeGroup} reports it. */
export interface ConsumerInfo {
  /** The consumer name (a sidecar's `--consumer-name`). */
  readonly name: string;
  /** Entries in its pending list (entries). */
  readonly pending: number;
  /** Milliseconds since it last read or claimed (XINFO CONSUMERS `idle`). */
  readonly idleMs: number;
}

/** A consumer group's state (XINFO GROUPS, XINFO CONSUMERS, XPENDING, XLEN). */
export interface GroupInfo {
  /** The stream key (for a shard: the shard's key). */
  readonly stream: string;
  readonly group: string;
  /** Entries delivered and not yet acknowledged: the PEL's size (entries). */
  readonly pending: number;
  /**
   * Entries appended that the group has not read yet (entries); `undefined`
   * when Redis cannot say (after XDEL or some trims, or before Redis 7.0).
   */
  readonly lag: number | undefined;
  /** The group's last-delivered stream id (empty for a sharded stream's sum). */
  readonly lastDeliveredId: string;
  readonly consumers: readonly ConsumerInfo[];
  /** The oldest pending entry's stream id; `undefined` when nothing is pending (as its age). */
  readonly oldestPendingId: string | undefined;
  /** How long ago (ms) the oldest pending entry was appended; `undefined` when nothing is pending. */
  readonly oldestPendingAgeMs: number | undefined;
  /** The highest delivery count among the oldest 10,000 pending entries. */
  readonly maxDeliveryCount: number;
  /** Entries in the stream (XLEN). */
  readonly streamLength: number;
  /**
   * For a sharded stream: each shard's state, in shard order; the fields
   * above then add up the shards. Empty for a plain stream.
   */
  readonly shards: readonly GroupInfo[];
  /**
   * Per-key limits ({@link ConsumerOptions.keyField}): the group's pending
   * entries that hold or wait for their key (entries); 0 when the group has
   * no key field.
   */
  readonly keyedEntries: number;
  /** The keys with entries held or waiting, the busiest first: at most 100, from the first 10,000 keyed entries. */
  readonly busyKeys: readonly BusyKey[];
}

/** A key of a group with per-key limits that has entries pending ({@link GroupInfo.busyKeys}). */
export interface BusyKey {
  /** The key: the value of the group's key field, as stored. */
  readonly key: Buffer;
  /** Its entries pending in the group, held or waiting for the key (entries). */
  readonly entries: number;
  /** The stream id of its oldest pending entry: the one that runs first. */
  readonly headId: string;
  /** The consumer whose pending list holds that entry. */
  readonly headConsumer: string;
}

/** One dead letter. */
export interface DeadLetter {
  /**
   * The entry as it sits in the dead-letter stream: `id` is its original
   * branded id, `streamId` its id in the dead-letter stream (what
   * {@link ReplayOptions.ids} names), `payload` the original payload
   * (without the `echomq.*` metadata fields).
   */
  readonly entry: Entry;
  /** The stream it came from. */
  readonly sourceStream: string;
  /** Its stream id in the source stream. */
  readonly sourceId: string;
  /** The group that gave up on it. */
  readonly group: string;
  /** Its delivery count when it was dead-lettered. */
  readonly attempts: number;
  /** The last failure reason. */
  readonly reason: string;
  /** When it was dead-lettered. */
  readonly deadLetteredAt: Date;
}

/** Which dead letters {@link Admin.listDeadLetters} returns. */
export interface ListDeadLettersOptions extends CallOptions {
  /** The dead-letter stream. Default: the stream's, `<stream>:dlq`. */
  deadLetterStream?: string;
  /** The first dead-letter stream id to return (inclusive). Default: the oldest. */
  startId?: string;
  /** The most dead letters (entries). Default (or 0): 100. At most 10,000. */
  count?: number;
}

/** A page of dead letters, oldest first. */
export interface DeadLetterPage {
  readonly deadLetters: readonly DeadLetter[];
  /** Pass as `startId` for the next page; empty at the end. */
  readonly nextStartId: string;
  /** Dead-letter stream ids of dead letters too large for one gRPC message: left out (replaying them still works). */
  readonly oversizedIds: readonly string[];
}

/** Which dead letters {@link Admin.replayDeadLetters} moves back. */
export interface ReplayOptions extends CallOptions {
  /** The dead-letter stream. Default: the stream's, `<stream>:dlq`. */
  deadLetterStream?: string;
  /** Dead-letter stream ids (`DeadLetter.entry.streamId`) to replay. Default: the oldest `count`. */
  ids?: readonly string[];
  /** Without `ids`: how many of the oldest to replay. Default (or 0): 100. At most 10,000. */
  count?: number;
}

/** What {@link Admin.replayDeadLetters} did. */
export interface ReplayResult {
  /** The replayed entries, in order: branded id (unchanged), old dead-letter id, new stream id in the source. */
  readonly replayed: readonly { readonly id: string; readonly deadLetterId: string; readonly streamId: string }[];
  /** Requested `ids` not in the dead-letter stream (already replayed, or never there): nothing done. */
  readonly notFoundIds: readonly string[];
  /** Dead letters whose recorded source is another stream sharing this dead-letter stream: left in place. */
  readonly otherSourceIds: readonly string[];
}

/**
 * The sidecar's `AdminService`: what a group holds and what is stuck, and
 * dead letters listed and moved back to their stream.
 *
 * Every method rejects with an {@link EchoMQError}: INVALID_ARGUMENT for an
 * empty or bad name or id; NOT_FOUND when {@link describeGroup}'s stream or
 * group does not exist; FAILED_PRECONDITION when a key is not a stream, or a
 * replay's source stream has no consumer group; UNAVAILABLE when the sidecar
 * or Redis cannot be reached. Nothing is retried by this client.
 */
export class Admin {
  readonly #client: AdminServiceClient;

  constructor(options: ConnectionOptions = {}) {
    this.#client = adminClient(options);
  }

  /** The state of `group` on `stream` (or, for a sharded stream's name, the sum of its shards). */
  describeGroup(stream: string, group: string, options: CallOptions = {}): Promise<GroupInfo> {
    return unary(
      `describe group ${JSON.stringify(group)} of stream ${JSON.stringify(stream)}`,
      options,
      (metadata, callOptions, callback) => this.#client.describeGroup({ stream, group }, metadata, callOptions, callback),
      groupInfoOf,
    );
  }

  /** One page of the dead letters of `stream` (from `<stream>:dlq` unless told otherwise), oldest first. */
  listDeadLetters(stream: string, options: ListDeadLettersOptions = {}): Promise<DeadLetterPage> {
    const request = {
      stream,
      deadLetterStream: options.deadLetterStream ?? '',
      startId: options.startId ?? '',
      count: options.count ?? 0,
    };
    return unary(
      `list the dead letters of stream ${JSON.stringify(stream)}`,
      options,
      (metadata, callOptions, callback) => this.#client.listDeadLetters(request, metadata, callOptions, callback),
      (response: ListDeadLettersResponse__Output) => ({
        deadLetters: response.deadLetters.map((d) => ({
          entry: entryOf(d.entry),
          sourceStream: d.sourceStream,
          sourceId: d.sourceId,
          group: d.group,
          attempts: d.attempts,
          reason: d.reason,
          deadLetteredAt: dateOf(d.deadLetteredAt),
        })),
        nextStartId: response.nextStartId,
        oversizedIds: response.oversizedIds,
      }),
    );
  }

  /** Every dead letter of `stream`, oldest first, paging by `nextStartId` (`count` per page). */
  async *deadLetters(stream: string, options: Omit<ListDeadLettersOptions, 'startId'> = {}): AsyncGenerator<DeadLetter, void, undefined> {
    let page = await this.listDeadLetters(stream, options);
    for (;;) {
      yield* page.deadLetters;
      if (page.nextStartId === '') return;
      page = await this.listDeadLetters(stream, { ...options, startId: page.nextStartId });
    }
  }

  /**
   * The old name of {@link Admin.deadLetters}.
   *
   * @deprecated Use {@link Admin.deadLetters}, the name every client gives it; goes away in the next release.
   */
  allDeadLetters(stream: string, options: Omit<ListDeadLettersOptions, 'startId'> = {}): AsyncGenerator<DeadLetter, void, undefined> {
    return this.deadLetters(stream, options);
  }

  /**
   * Moves dead letters back to `stream`: each is appended there (a new stream
   * id, the same branded id, the original payload) and deleted from the
   * dead-letter stream in one script, so a crash neither loses nor duplicates
   * one. Every group of `stream` reads a replayed entry, also one that had
   * acknowledged it. Moves batches of 100: an error after the first batch
   * says how many moved before it.
   */
  replayDeadLetters(stream: string, options: ReplayOptions = {}): Promise<ReplayResult> {
    const request = {
      stream,
      deadLetterStream: options.deadLetterStream ?? '',
      ids: [...(options.ids ?? [])],
      count: options.count ?? 0,
    };
    return unary(
      `replay the dead letters of stream ${JSON.stringify(stream)}`,
      options,
      (metadata, callOptions, callback) => this.#client.replayDeadLetters(request, metadata, callOptions, callback),
      (response: ReplayDeadLettersResponse__Output) => ({
        replayed: response.replayed.map((r) => ({ id: r.id, deadLetterId: r.deadLetterId, streamId: r.streamId })),
        notFoundIds: response.notFoundIds,
        otherSourceIds: response.otherSourceIds,
      }),
    );
  }

  /** Closes the channel. */
  close(): void {
    this.#client.close();
  }
}

function groupInfoOf(response: DescribeGroupResponse__Output): GroupInfo {
  return {
    stream: response.stream,
    group: response.group,
    pending: countOf(response.pending),
    lag: response._lag === 'lag' ? countOf(response.lag) : undefined,
    lastDeliveredId: response.lastDeliveredId,
    consumers: response.consumers.map((c) => ({ name: c.name, pending: countOf(c.pending), idleMs: msOf(c.idle) ?? 0 })),
    oldestPendingId: response.oldestPendingId === '' ? undefined : response.oldestPendingId,
    oldestPendingAgeMs: msOf(response.oldestPendingAge),
    maxDeliveryCount: countOf(response.maxDeliveryCount),
    streamLength: countOf(response.streamLength),
    shards: response.shards.map(groupInfoOf),
    keyedEntries: countOf(response.keyedEntries),
    busyKeys: response.busyKeys.map((k) => ({
      key: k.key,
      entries: countOf(k.entries),
      headId: k.headId,
      headConsumer: k.headConsumer,
    })),
  };
}
