package io.echomq.client;

/**
 * One entry an AckEmit appended.
 *
 * @param id its new branded id (28 lowercase hex characters)
 * @param streamId its id in {@code stream}, {@code <ms>-<seq>}
 * @param stream the stream key it was appended to
 */
public record EmittedEntry(String id, String streamId, String stream) {}
