package io.echomq.client;

/**
 * What an append wrote.
 *
 * @param id the branded id, 28 lowercase hex characters: the entry's idempotency key
 * @param streamId the stream id the entry got, {@code <ms>-<seq>}; {@code ""} for a scheduled
 *     entry (its stream id is known only when it enters the stream)
 * @param stream the stream key written: the stream appended to, or for a sharded stream (the
 *     sidecar's {@code --sharded-streams}) the shard's key, {@code <stream>:{<stream>:<k>}}
 * @param duplicate true when the append's dedup key was already recorded on the stream (within the
 *     sidecar's {@code --dedup-window-ms}): nothing was written, and {@code id}, {@code streamId} and
 *     {@code stream} are the first append's; always false without a dedup key
 * @param scheduled true when the entry was scheduled (a deliver-at instant or a delay in the
 *     future): {@code id} is final, {@code streamId} is {@code ""}, and the entry enters the stream
 *     when due ({@link EchoMqStreams#cancelScheduled} can still remove it); a duplicate of a
 *     scheduled append says so too
 */
public record AppendResult(String id, String streamId, String stream, boolean duplicate, boolean scheduled) {
  /** A result that was not scheduled. */
  public AppendResult(String id, String streamId, String stream, boolean duplicate) {
    this(id, streamId, stream, duplicate, false);
  }

  /** A result that is not a duplicate. */
  public AppendResult(String id, String streamId, String stream) {
    this(id, streamId, stream, false, false);
  }

  /** A result that is not a duplicate, without the stream key written (it is then {@code ""}). */
  public AppendResult(String id, String streamId) {
    this(id, streamId, "", false, false);
  }

  /**
   * Whether the answer is the first append's for the same dedup key, nothing written (the same as
   * {@link #duplicate()}).
   */
  public boolean isDuplicate() {
    return duplicate;
  }

  /**
   * Whether the entry was scheduled and has not entered the stream yet (the same as {@link
   * #scheduled()}).
   */
  public boolean isScheduled() {
    return scheduled;
  }
}
