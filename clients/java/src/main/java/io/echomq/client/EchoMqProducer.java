package io.echomq.client;

import io.grpc.Channel;
import io.grpc.ManagedChannel;
import java.time.Duration;
import java.util.Objects;

/**
 * The old name of {@link EchoMqStreams}, which appends, reads and trims: an {@code EchoMqStreams}
 * in every way, made by the same factories.
 *
 * @deprecated Use {@link EchoMqStreams} ({@link EchoMqStreams#connect}, {@link
 *     EchoMqStreams#create}): the same methods. {@code EchoMqProducer} goes away in the next
 *     release.
 */
@Deprecated(forRemoval = true)
public final class EchoMqProducer extends EchoMqStreams {
  /** Default deadline of one append. */
  public static final Duration DEFAULT_TIMEOUT = EchoMqStreams.DEFAULT_TIMEOUT;

  private EchoMqProducer(Channel channel, ManagedChannel owned, Duration timeout) {
    super(channel, owned, timeout);
  }

  /**
   * A producer on its own channel to {@code host:port} or {@code unix:/path}; {@link #close()}
   * closes it.
   *
   * @param target the sidecar's address
   * @return a new producer
   * @deprecated Use {@link EchoMqStreams#connect(String)}.
   */
  @Deprecated(forRemoval = true)
  public static EchoMqProducer connect(String target) {
    ManagedChannel channel = Targets.open(target);
    return new EchoMqProducer(channel, channel, DEFAULT_TIMEOUT);
  }

  /**
   * A producer on a channel the caller owns (and closes).
   *
   * @param channel the channel
   * @return a new producer
   * @deprecated Use {@link EchoMqStreams#create(Channel)}.
   */
  @Deprecated(forRemoval = true)
  public static EchoMqProducer create(Channel channel) {
    return new EchoMqProducer(Objects.requireNonNull(channel, "channel"), null, DEFAULT_TIMEOUT);
  }

  /** This producer with another per-call deadline (default 10 s); shares the channel. */
  @Override
  public EchoMqProducer withTimeout(Duration timeout) {
    return new EchoMqProducer(channel(), null, Objects.requireNonNull(timeout, "timeout"));
  }
}
