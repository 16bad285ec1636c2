/**
 * Idempotency helpers keyed by the branded id.
 *
 * Why they are needed: delivery is at-least-once. An entry is delivered again
 * after a fail, after a call or sidecar dies before its ack reached Redis, and
 * after a peer reclaims a slow consumer's entry; a dead letter replayed to its
 * source is a second copy. Every copy carries the same branded id, minted once
 * when the entry was first appended, so a handler that remembers which ids it
 * has applied turns at-least-once delivery into an effectively-once effect.
 *
 * Remember an id only after its effect is durable (the helpers below record it
 * after your function resolves). A crash between the effect and the record means
 * one more run of the function on redelivery, never a lost entry: make the effect
 * itself tolerate that (an upsert), or keep the record in the same transaction as
 * the effect by implementing the store over your database.
 *
 * @module
 */
import { compareBrandedIds, type BrandedId } from './branded-id.js';

type Awaitable<T> = T | Promise<T>;

/** Where a {@link SeenSet} remembers processed ids. Implement it over Redis, SQL, … to share it. */
export interface SeenStore {
  /** Whether `id` was recorded. */
  has(id: BrandedId): Awaitable<boolean>;
  /** Records `id`. */
  add(id: BrandedId): Awaitable<void>;
}

/**
 * The in-memory {@link SeenStore}: remembers the last `capacity` ids (default
 * 100,000), forgetting the oldest recorded first. Per process, lost on restart:
 * enough to absorb the redeliveries of one running consumer.
 */
export class MemorySeenStore implements SeenStore {
  readonly #ids = new Set<string>();
  readonly #capacity: number;

  constructor(options: { capacity?: number } = {}) {
    this.#capacity = options.capacity ?? 100_000;
    if (!(this.#capacity >= 1)) throw new RangeError('capacity must be at least 1');
  }

  has(id: BrandedId): boolean {
    return this.#ids.has(id);
  }

  add(id: BrandedId): void {
    this.#ids.delete(id);
    this.#ids.add(id);
    if (this.#ids.size > this.#capacity) {
      const oldest = this.#ids.values().next().value as string;
      this.#ids.delete(oldest);
    }
  }

  get size(): number {
    return this.#ids.size;
  }
}

/** Where a {@link NewerWins} remembers the highest id applied per business key. */
export interface VersionStore {
  /** The highest id recorded for `key`, if any. */
  get(key: string): Awaitable<BrandedId | undefined>;
  /**
   * Records `id` for `key` unless an equal or newer id is already recorded
   * (compare-and-set; the stored id never goes backwards). Returns whether it
   * recorded.
   */
  setIfNewer(key: string, id: BrandedId): Awaitable<boolean>;
}

/** The in-memory {@link VersionStore}: a Map, per process. */
export class MemoryVersionStore implements VersionStore {
  readonly #latest = new Map<string, BrandedId>();

  get(key: string): BrandedId | undefined {
    return this.#latest.get(key);
  }

  setIfNewer(key: string, id: BrandedId): boolean {
    const current = this.#latest.get(key);
    if (current !== undefined && compareBrandedIds(id, current) <= 0) return false;
    this.#latest.set(key, id);
    return true;
  }
}

/** Serializes async work per key inside this process. */
class KeyedLock {
  readonly #tails = new Map<string, Promise<unknown>>();

  async run<T>(key: string, work: () => Promise<T>): Promise<T> {
    const previous = this.#tails.get(key) ?? Promise.resolve();
    const result = previous.then(work, work);
    const tail = result.then(
      () => undefined,
      () => undefined,
    );
    this.#tails.set(key, tail);
    try {
      return await result;
    } finally {
      if (this.#tails.get(key) === tail) this.#tails.delete(key);
    }
  }
}

/**
 * Seen-set deduplication: run an effect at most once per branded id.
 *
 * ```ts
 * const seen = new SeenSet();
 * await consumer.run((d) => seen.once(d.id, () => chargeCard(d.payload)));
 * ```
 */
export class SeenSet {
  readonly #store: SeenStore;
  readonly #lock = new KeyedLock();

  constructor(store: SeenStore = new MemorySeenStore()) {
    this.#store = store;
  }

  /** Whether `id` was already processed. */
  async has(id: BrandedId): Promise<boolean> {
    return await this.#store.has(id);
  }

  /** Records `id` as processed. */
  async add(id: BrandedId): Promise<void> {
    await this.#store.add(id);
  }

  /**
   * Runs `effect` unless `id` was processed, then records `id`. Resolves to
   * true when it ran. Copies of one id handled at the same time in this process
   * run one after the other, so the second sees the first's record. If `effect`
   * throws, nothing is recorded and the error propagates (the entry is failed
   * and comes back).
   */
  once(id: BrandedId, effect: () => unknown): Promise<boolean> {
    return this.#lock.run(id, async () => {
      if (await this.#store.has(id)) return false;
      await effect();
      await this.#store.add(id);
      return true;
    });
  }
}

/**
 * Newer-wins: per business key (an order, an account), apply an update only if
 * its branded id is newer than the last one applied for that key. Branded ids
 * order like the stream, so a stale redelivery or replay of an older update is
 * skipped and never overwrites a newer state. An equal id is a duplicate and is
 * skipped too.
 *
 * ```ts
 * const latest = new NewerWins();
 * await consumer.run((d) => latest.apply(d.text('order')!, d.id, () => saveOrder(d.payload)));
 * ```
 */
export class NewerWins {
  readonly #store: VersionStore;
  readonly #lock = new KeyedLock();

  constructor(store: VersionStore = new MemoryVersionStore()) {
    this.#store = store;
  }

  /** Whether `id` is newer than the last id applied for `key` (true when none was). */
  async isNewer(key: string, id: BrandedId): Promise<boolean> {
    const current = await this.#store.get(key);
    return current === undefined || compareBrandedIds(id, current) > 0;
  }

  /**
   * Runs `effect` if `id` is newer than the last id applied for `key`, then
   * records it. Resolves to true when it ran. Updates of one key run one after
   * the other in this process. If `effect` throws, nothing is recorded.
   */
  apply(key: string, id: BrandedId, effect: () => unknown): Promise<boolean> {
    return this.#lock.run(key, async () => {
      if (!(await this.isNewer(key, id))) return false;
      await effect();
      await this.#store.setIfNewer(key, id);
      return true;
    });
  }
}

/**
 * The old name of {@link VersionStore}.
 *
 * @deprecated Use {@link VersionStore}, the name every client gives it; goes away in the next release.
 */
export type NewerWinsStore = VersionStore;

/**
 * The old name of {@link MemoryVersionStore}.
 *
 * @deprecated Use {@link MemoryVersionStore}, the name every client gives it; goes away in the next release.
 */
export const MemoryNewerWinsStore = MemoryVersionStore;
/** @deprecated Use {@link MemoryVersionStore}; goes away in the next release. */
export type MemoryNewerWinsStore = MemoryVersionStore;

