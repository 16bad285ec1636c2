package io.echomq.client;

import io.echomq.v1.GroupStart;
import io.echomq.v1.Subscribe;
import com.google.protobuf.Timestamp;
import java.time.Instant;
import java.util.Objects;

/**
 * Where a consumer group that does not exist yet starts reading. There is deliberately no default:
 * guessing wrong either skips or replays a whole stream. Ignored when the group already exists (it
 * keeps its position).
 */
public final class StartPosition {
  private final GroupStart kind;
  private final String startId;
  private final Instant startTime;

  private StartPosition(GroupStart kind, String startId, Instant startTime) {
    this.kind = kind;
    this.startId = startId;
    this.startTime = startTime;
  }

  /** Only entries appended after the group is created ({@code XGROUP CREATE … $}). */
  public static StartPosition newEntries() {
    return new StartPosition(GroupStart.GROUP_START_NEW, "", null);
  }

  /** Every entry the stream holds, oldest first ({@code XGROUP CREATE … 0}). */
  public static StartPosition beginning() {
    return new StartPosition(GroupStart.GROUP_START_BEGINNING, "", null);
  }

  /** Entries after the stream id {@code <ms>-<seq>} (or {@code <ms>}), exclusive. */
  public static StartPosition afterId(String streamId) {
    return new StartPosition(GroupStart.GROUP_START_ID, Objects.requireNonNull(streamId, "streamId"), null);
  }

  /** Entries appended at or after {@code instant}. */
  public static StartPosition at(Instant instant) {
    return new StartPosition(GroupStart.GROUP_START_INSTANT, "", Objects.requireNonNull(instant, "instant"));
  }

  void applyTo(Subscribe.Builder subscribe) {
    subscribe.setGroupStart(kind);
    if (kind == GroupStart.GROUP_START_ID) {
      subscribe.setStartId(startId);
    } else if (kind == GroupStart.GROUP_START_INSTANT) {
      subscribe.setStartTime(
          Timestamp.newBuilder().setSeconds(startTime.getEpochSecond()).setNanos(startTime.getNano()));
    }
  }

  @Override
  public String toString() {
    return switch (kind) {
      case GROUP_START_NEW -> "newEntries";
      case GROUP_START_BEGINNING -> "beginning";
      case GROUP_START_ID -> "afterId(" + startId + ")";
      default -> "at(" + startTime + ")";
    };
  }
}
