/**
 * Idempotency helpers keyed by the branded id.
 *
 * <p>EchoMQ delivers at least once: an entry comes again after a Fail, a dropped call, a sidecar
 * crash before the ack reached Redis, or a peer's reclaim, and a dead-lettered entry can be
 * replayed. Every copy carries the same branded id, so the id is the deduplication key. Two
 * patterns cover most handlers:
 *
 * <ul>
 *   <li><b>Seen-set</b> ({@link io.echomq.client.idempotency.Idempotency#once}): skip an id that was
 *       processed before. The id is recorded after the handler's effect succeeds, so a crash in
 *       between repeats the effect rather than losing it.</li>
 *   <li><b>Newer-wins</b> ({@link io.echomq.client.idempotency.Idempotency#applyIfNewer}): per
 *       business key (an order, an account), remember the highest branded id applied and skip an
 *       older or equal one. Branded ids order like the stream, and their fixed-width hex text
 *       compares like their bytes, so a stale replay can never overwrite a newer state.</li>
 * </ul>
 *
 * <p>The in-memory store forgets on restart and is per process. For effects that must survive
 * either, implement {@link io.echomq.client.idempotency.IdempotencyStore} on the database that
 * holds the effect, and record the id in the same transaction as the effect: then a crash can
 * neither apply an entry twice nor lose it.
 */
package io.echomq.client.idempotency;
