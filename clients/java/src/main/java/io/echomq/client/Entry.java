package io.echomq.client;

import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * One stream entry outside any group, as {@link EchoMqStreams#read} and the dead letters of
 * {@link EchoMqAdmin} return it.
 *
 * @param id the branded id, 28 lowercase hex characters (from the reserved field, else derived
 *     from the stream id): the idempotency key, kept by dead-letter and replayed copies
 * @param streamId the entry's id in the stream it was read from, {@code <ms>-<seq>}
 * @param payload the fields, name to value bytes, without the reserved branded-id field (field
 *     names that are not UTF-8 are in {@code rawFields}); unmodifiable
 * @param mintedAt when the branded id was minted (its milliseconds)
 * @param traceparent the W3C trace context stored with the entry, or empty
 * @param rawFields fields whose names are not valid UTF-8, or repeated names, byte for byte, in
 *     stream order; usually empty; unmodifiable
 */
public record Entry(
    String id, String streamId, Map<String, byte[]> payload, Instant mintedAt, String traceparent,
    List<Delivery.RawField> rawFields) {

  static Entry of(io.echomq.v1.Entry proto) {
    Map<String, byte[]> fields = new LinkedHashMap<>();
    proto.getPayloadMap().forEach((name, value) -> fields.put(name, value.toByteArray()));
    List<Delivery.RawField> raw = new ArrayList<>(proto.getRawFieldsCount());
    proto.getRawFieldsList()
        .forEach(f -> raw.add(new Delivery.RawField(f.getName().toByteArray(), f.getValue().toByteArray())));
    return new Entry(
        proto.getId(), proto.getStreamId(), Collections.unmodifiableMap(fields), Rpc.toJava(proto.getMintedAt()),
        proto.getTraceparent(), Collections.unmodifiableList(raw));
  }

  /** A payload field decoded as UTF-8, or null when absent. */
  public String payloadText(String name) {
    byte[] value = payload.get(name);
    return value == null ? null : new String(value, StandardCharsets.UTF_8);
  }
}
