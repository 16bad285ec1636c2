/**
 * The branded id: an entry's 14-byte identity (6 bytes of unix milliseconds,
 * then 8 bytes of sequence, both big-endian), written as 28 lowercase hex
 * characters. It is the XADD id `<ms>-<seq>` the entry got in the stream it was
 * first appended to, and copies of the entry (dead letters, replays) keep it, so
 * it is the idempotency key. The text is fixed-width, so comparing two ids as
 * strings orders them exactly as the stream does.
 *
 * @module
 */

declare const brand: unique symbol;

/**
 * A branded id, 28 lowercase hex characters. A plain `string` is not a
 * `BrandedId`: get one from a delivery, an append, or {@link parseBrandedId}.
 */
export type BrandedId = string & { readonly [brand]: 'echomq.BrandedId' };

const BRANDED_ID = /^[0-9a-f]{28}$/;
const STREAM_ID = /^(\d+)-(\d+)$/;
const MS_LIMIT = 1n << 48n;
const SEQ_LIMIT = 1n << 64n;

/** Whether `text` is a branded id: exactly 28 lowercase hex characters. */
export function isBrandedId(text: string): text is BrandedId {
  return BRANDED_ID.test(text);
}

/** Checks `text` and returns it as a {@link BrandedId}; throws a `TypeError` otherwise. */
export function parseBrandedId(text: string): BrandedId {
  if (!isBrandedId(text)) {
    throw new TypeError(`not a branded id (28 lowercase hex characters): ${JSON.stringify(text.slice(0, 64))}`);
  }
  return text;
}

/**
 * The branded id of a stream id `<ms>-<seq>`: what the sidecar derives for an
 * entry that another producer appended with a plain `XADD *`.
 */
export function brandedIdFromStreamId(streamId: string): BrandedId {
  const match = STREAM_ID.exec(streamId);
  if (!match) throw new TypeError(`not a stream id (<ms>-<seq>): ${JSON.stringify(streamId.slice(0, 64))}`);
  const ms = BigInt(match[1]!);
  const seq = BigInt(match[2]!);
  if (ms >= MS_LIMIT || seq >= SEQ_LIMIT) {
    throw new RangeError(`stream id ${streamId} does not fit a branded id (6 bytes of ms, 8 of sequence)`);
  }
  return (ms.toString(16).padStart(12, '0') + seq.toString(16).padStart(16, '0')) as BrandedId;
}

/** The stream id `<ms>-<seq>` a branded id was minted as. */
export function brandedIdToStreamId(id: BrandedId): string {
  const checked = parseBrandedId(id);
  return `${BigInt('0x' + checked.slice(0, 12))}-${BigInt('0x' + checked.slice(12))}`;
}

/** When the branded id was minted (its milliseconds). */
export function brandedIdTime(id: BrandedId): Date {
  return new Date(Number.parseInt(parseBrandedId(id).slice(0, 12), 16));
}

/**
 * Orders two branded ids as their entries are ordered in the stream: negative
 * when `a` is older, 0 when equal, positive when `a` is newer. Usable with
 * `Array.prototype.sort`.
 */
export function compareBrandedIds(a: BrandedId, b: BrandedId): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
