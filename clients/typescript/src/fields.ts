/**
 * The shapes of an entry's fields, shared by what appends them (producer.ts)
 * and what delivers or reads them (delivery.ts, entry.ts). A module of its
 * own, importing nothing, so those need not import each other.
 */

/** A field value: bytes, or text (written as UTF-8). */
export type FieldValue = Uint8Array | string;

/** An entry's fields, name → value. A field may not be named like the sidecar's reserved branded-id field (`id`). */
export type Fields = Readonly<Record<string, FieldValue>> | ReadonlyMap<string, FieldValue>;

/** A field whose name is not valid UTF-8 (a proto map key must be), byte for byte. */
export interface RawField {
  readonly name: Buffer;
  readonly value: Buffer;
}
