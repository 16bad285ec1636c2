package io.echomq.client;

/**
 * What an append wrote.
 *
 * @param id the branded id, 28 lowercase hex characters: the entry's idempotency key
 * @param streamId the stream id the entry got, {@code <ms>-<seq>}
 */
public record AppendResult(String id, String streamId) {}
