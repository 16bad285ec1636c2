package io.echomq.client;

/**
 * How much an {@link EchoMqConsumer} takes on at once, grouped as google-cloud-pubsub groups its
 * {@code FlowControlSettings} (clients/CONTRACT.md, "Surface"). 0 leaves a setting to its
 * default. There is no byte bound: the protocol counts entries.
 *
 * <pre>{@code
 * EchoMqConsumer.builder()
 *     .flowControl(FlowControl.builder().maxInFlight(128).concurrency(16).build())
 *     ...
 * }</pre>
 *
 * @param maxInFlight the most deliveries the call holds un-settled (entries, sent in Subscribe),
 *     fixed. 0 (sent as 0): an adaptive window of 64 up to the sidecar's cap ({@code
 *     --default-max-in-flight}, {@value EchoMqConsumer#DEFAULT_MAX_IN_FLIGHT} by default), which
 *     doubles while the handlers keep up and shrinks by a quarter (down to 8) when deliveries queue
 *     in the client. The client holds at most the cap's deliveries: cap &times; entry size bytes.
 *     The sidecar refuses more than its {@code --max-in-flight-limit} (10,000) with
 *     INVALID_ARGUMENT ({@link EchoMqConsumer#start()} fails).
 * @param concurrency the most handlers running at once: the threads of the handler pool, started
 *     once. 0: {@code maxInFlight} when that is set, else {@value
 *     EchoMqConsumer#DEFAULT_CONCURRENCY} (not the adaptive window's cap: 64 threads keep a fast
 *     handler's window full, and slow handlers let deliveries queue, which shrinks the window); 1
 *     with a batch handler. At most {@code maxInFlight} when that is set.
 * @param maxBatch the most deliveries the sidecar may put in one frame ({@code
 *     Subscribe.max_batch}), and the most a batch handler gets at once. 0: the smaller of {@value
 *     EchoMqConsumer#DEFAULT_MAX_BATCH} and {@code maxInFlight} ({@value
 *     EchoMqConsumer#DEFAULT_MAX_BATCH} when that is unset, a quarter of the default cap; a frame
 *     never holds more than the window's free credit). Above {@value
 *     EchoMqConsumer#MAX_BATCH_LIMIT} the sidecar refuses the subscription with INVALID_ARGUMENT.
 */
public record FlowControl(int maxInFlight, int concurrency, int maxBatch) {
  /** Every setting at its default. */
  public static final FlowControl DEFAULTS = new FlowControl(0, 0, 0);

  /**
   * Checks that no setting is negative.
   *
   * @throws IllegalArgumentException for a negative setting
   */
  public FlowControl {
    if (maxInFlight < 0 || concurrency < 0 || maxBatch < 0) {
      throw new IllegalArgumentException(
          "flow control settings are 0 (the default) or more, got " + this);
    }
  }

  /**
   * A builder starting from {@link #DEFAULTS}.
   *
   * @return a new builder
   */
  public static Builder builder() {
    return new Builder();
  }

  /** Builds a {@link FlowControl}; every setting not given stays 0, its default. */
  public static final class Builder {
    private int maxInFlight;
    private int concurrency;
    private int maxBatch;

    private Builder() {}

    /**
     * Sets {@link FlowControl#maxInFlight()}.
     *
     * @param maxInFlight the most deliveries held un-settled; 0: the sidecar's default
     * @return this builder
     */
    public Builder maxInFlight(int maxInFlight) {
      this.maxInFlight = maxInFlight;
      return this;
    }

    /**
     * Sets {@link FlowControl#concurrency()}.
     *
     * @param concurrency the most handlers at once; 0: the default
     * @return this builder
     */
    public Builder concurrency(int concurrency) {
      this.concurrency = concurrency;
      return this;
    }

    /**
     * Sets {@link FlowControl#maxBatch()}.
     *
     * @param maxBatch the most deliveries per frame; 0: the default
     * @return this builder
     */
    public Builder maxBatch(int maxBatch) {
      this.maxBatch = maxBatch;
      return this;
    }

    /**
     * The settings given.
     *
     * @return a new FlowControl
     * @throws IllegalArgumentException for a negative setting
     */
    public FlowControl build() {
      return new FlowControl(maxInFlight, concurrency, maxBatch);
    }
  }
}
