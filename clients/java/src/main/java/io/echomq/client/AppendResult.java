package io.echomq.client;

/**
 * What an append wrote.
 *
 * @param id the branded id, 28 lowercase hex characters: the entry's idempotency key
 * @param streamId the stream id the entry got, {@code <ms>-<seq>}
 * @param stream the stream key written: the stream appended to, or for a sharded stream (the
 *     sidecar's {@code --sharded-streams}) the shard's key, {@code <stream>:{<stream>:<k>}}
 */
public record AppendResult(String id, String streamId, String stream) {
  /** A result without the stream key written (it is then {@code ""}). */
  public AppendResult(String id, String streamId) {
    this(id, streamId, "");
  }
}
