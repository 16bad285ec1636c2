import type { BrandedId } from './branded-id.js';
import type { RawField } from './fields.js';
import { dateOf } from './grpc.js';
import type { Entry__Output } from './gen/echomq/v1/Entry.js';

/** One stream entry, outside any consumer group: what `read` and the dead-letter list return. */
export interface Entry {
  /** The branded id, 28 lowercase hex characters: from the reserved field, else derived from the stream id. */
  readonly id: BrandedId;
  /** The entry's id in the stream it was read from, `<ms>-<seq>`. */
  readonly streamId: string;
  /** The fields without the reserved one: name → bytes. Names that are not UTF-8 are in {@link rawFields}. */
  readonly payload: Readonly<Record<string, Buffer>>;
  /** Fields whose names are not valid UTF-8 (or repeated names), in stream order. Usually empty. */
  readonly rawFields: readonly RawField[];
  /** When the branded id was minted (millisecond precision). */
  readonly mintedAt: Date;
  /** The W3C trace context stored with the entry; empty when none. */
  readonly traceparent: string;
  /** The field `name` decoded as UTF-8 text, or `undefined` when absent. */
  text(name: string): string | undefined;
}

class EntryImpl implements Entry {
  readonly id: BrandedId;
  readonly streamId: string;
  readonly payload: Readonly<Record<string, Buffer>>;
  readonly rawFields: readonly RawField[];
  readonly mintedAt: Date;
  readonly traceparent: string;

  constructor(message: Entry__Output) {
    this.id = message.id as BrandedId;
    this.streamId = message.streamId;
    this.payload = message.payload;
    this.rawFields = message.rawFields.map((f) => ({ name: f.name, value: f.value }));
    this.mintedAt = dateOf(message.mintedAt);
    this.traceparent = message.traceparent;
  }

  text(name: string): string | undefined {
    return Object.hasOwn(this.payload, name) ? this.payload[name]!.toString('utf8') : undefined;
  }
}

/** The wire entry as an {@link Entry}. */
export function entryOf(message: Entry__Output | null | undefined): Entry {
  return new EntryImpl(message ?? { id: '', streamId: '', payload: {}, rawFields: [], mintedAt: null, traceparent: '', archived: false });
}
