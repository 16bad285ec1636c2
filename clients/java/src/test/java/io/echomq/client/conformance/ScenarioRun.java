package io.echomq.client.conformance;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import io.echomq.client.AckEmitException;
import io.echomq.client.AppendResult;
import io.echomq.client.BatchEntry;
import io.echomq.client.DeliveryHandler;
import io.echomq.client.EchoMqConsumer;
import io.echomq.client.EchoMqException;
import io.echomq.client.EchoMqStreams;
import io.echomq.client.Emit;
import io.echomq.client.EmittedEntry;
import io.echomq.client.FailKind;
import io.echomq.client.FlowControl;
import io.echomq.client.NotScheduledException;
import io.echomq.client.PoisonException;
import io.echomq.client.StartPosition;
import io.echomq.client.TransientException;
import io.echomq.client.testing.Resp;
import io.echomq.client.testing.SidecarFixture;
import io.echomq.v1.ConsumeRequest;
import io.echomq.v1.ConsumeResponse;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.ForwardingClientCallListener;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.IntSupplier;
import java.util.function.Supplier;

import static org.junit.jupiter.api.Assertions.fail;

/** One scenario of scenarios.json, run from start to expectations. */
final class ScenarioRun {
  private static final Duration WAIT = Duration.ofSeconds(30);
  private static final Duration FINAL_STOP = Duration.ofSeconds(10);
  private static final String GROUP = "conformance";

  private static final Set<String> SCENARIO_KEYS =
      Set.of(
          "name", "description", "append", "append_after_restart", "append_generated", "append_calls", "consumer", "handler",
          "steps", "expect");

  /**
   * One handler call, as recorded when it started; {@code finishedNanos} is set when its action
   * returned or threw (or a hang began), 0 until then.
   */
  record Call(String id, String streamId, int attempts, Map<String, byte[]> payload, long startedNanos, AtomicLong finishedNanos) {}

  private final JsonObject scenario;
  private final SidecarFixture fixture;
  private final EchoMqStreams producer;
  private final String name;
  private final String stream;
  private final String deadLetters;

  private final List<Call> calls = Collections.synchronizedList(new ArrayList<>());
  /** Handler calls per branded id so far, for the handler's {@code by_call}. */
  private final Map<String, Integer> callsById = new ConcurrentHashMap<>();
  private final AtomicInteger started = new AtomicInteger();
  private final AtomicInteger finished = new AtomicInteger();
  private final Set<String> finishedIds = ConcurrentHashMap.newKeySet();
  private final AtomicInteger running = new AtomicInteger();
  private final AtomicInteger maxRunning = new AtomicInteger();
  /** The max_in_flight of each Subscribe sent on the wire. */
  private final List<Integer> sentMaxInFlight = Collections.synchronizedList(new ArrayList<>());
  /** The max_in_flight of each Subscribed received on the wire. */
  private final List<Integer> subscribedMaxInFlight = Collections.synchronizedList(new ArrayList<>());
  /** The most deliveries one call had received and sent no verdict for at once. */
  private final AtomicInteger peakUnsettled = new AtomicInteger();
  /** Handler calls that saw their delivery's lease-lost signal (wait_lease_lost). */
  private final AtomicInteger leaseLostSignalled = new AtomicInteger();
  /** Released when the scenario ends: the only way a `hang` handler returns on its own. */
  private final CountDownLatch scenarioOver = new CountDownLatch(1);
  /** Acks the client sent, per id, counted on the wire by an interceptor. */
  private final Map<String, Integer> acksSent = new ConcurrentHashMap<>();
  /** AckEmit messages the client sent, counted likewise. */
  private final AtomicInteger ackEmitsSent = new AtomicInteger();
  /** Every entry ackEmit returned. */
  private final List<EmittedEntry> emitted = Collections.synchronizedList(new ArrayList<>());
  /** The codes of the AckEmitExceptions the handler saw. */
  private final List<String> ackEmitRefusals = Collections.synchronizedList(new ArrayList<>());
  /** Release ids the client sent, per id, counted likewise. */
  private final Map<String, Integer> releasedSent = new ConcurrentHashMap<>();
  private final List<String> verdictErrors = Collections.synchronizedList(new ArrayList<>());
  /** Appended fields by stream id, for payload_equals_appended. */
  private final Map<String, Map<String, byte[]>> appended = new ConcurrentHashMap<>();
  /** Branded ids the producer's answers carried (a duplicate adds none). */
  private final Set<String> appendedIds = ConcurrentHashMap.newKeySet();
  /** The answer that wrote each dedup key of append_calls. */
  private final Map<String, AppendResult> firstByDedupKey = new HashMap<>();
  /** The answer to each `ref` of append_calls. */
  private final Map<String, AppendResult> byRef = new HashMap<>();
  /** Branded ids answered `scheduled`. */
  private final Set<String> scheduledIds = ConcurrentHashMap.newKeySet();
  private final List<EchoMqConsumer> consumers = new ArrayList<>();
  private final List<String> problems = Collections.synchronizedList(new ArrayList<>());
  private Long stopMillis;
  /** Consumers that ended by themselves (wait_consumer_error): no final stop. */
  private final Set<EchoMqConsumer> ended = new HashSet<>();
  /** What such a consumer's terminated() failed with. */
  private Throwable consumerError;

  ScenarioRun(JsonObject scenario, SidecarFixture fixture, EchoMqStreams producer, String language) {
    this.scenario = scenario;
    this.fixture = fixture;
    this.producer = producer;
    this.name = scenario.get("name").getAsString();
    this.stream = "conf:" + language + ":" + name;
    this.deadLetters = stream + ":dlq";
  }

  void run() throws Exception {
    for (String key : scenario.keySet()) {
      if (!SCENARIO_KEYS.contains(key)) {
        fail("scenario " + name + ": unknown key `" + key + "` (this runner must be taught it)");
      }
    }
    try (Resp redis = fixture.redis()) {
      redis.call("DEL", stream, deadLetters, sink());
      appendInitial();
      for (String step : steps()) {
        runStep(step);
      }
      for (EchoMqConsumer consumer : consumers) {
        if (!ended.contains(consumer)) {
          consumer.stop(FINAL_STOP).get(FINAL_STOP.toSeconds() + 5, TimeUnit.SECONDS);
        }
      }
      scenarioOver.countDown();
      check(redis);
    } finally {
      scenarioOver.countDown();
      consumers.forEach(EchoMqConsumer::abort);
    }
    if (!problems.isEmpty()) {
      fail("scenario " + name + ":\n  - " + String.join("\n  - ", problems) + "\n--- sidecar log (tail) ---\n" + fixture.sidecarLog());
    }
  }

  // ---- appending ----

  private void appendInitial() {
    if (scenario.has("append")) {
      appendEntries(scenario.get("append"), false);
    }
    if (scenario.has("append_generated")) {
      JsonObject gen = scenario.getAsJsonObject("append_generated");
      String field = gen.get("field").getAsString();
      int count = gen.get("count").getAsInt();
      List<Map<String, byte[]>> entries = new ArrayList<>();
      for (int i = 0; i < count; i++) {
        entries.add(Map.of(field, String.valueOf(i).getBytes(StandardCharsets.UTF_8)));
      }
      record(entries, producer.appendBatch(stream, entries));
    }
    if (scenario.has("append_calls")) {
      int i = 0;
      for (JsonElement call : scenario.getAsJsonArray("append_calls")) {
        appendCall(i++, call.getAsJsonObject());
      }
    }
  }

  /**
   * One of append_calls: an append or a batch whose entries may carry a dedup key. Each answer is
   * checked: duplicate as the entry says, a duplicate carrying the ids of the first answer with its
   * key, and no id answered twice otherwise.
   */
  private void appendCall(int i, JsonObject call) {
    List<JsonObject> specs = new ArrayList<>();
    List<AppendResult> results;
    if (call.size() == 1 && call.has("append")) {
      JsonObject spec = call.getAsJsonObject("append");
      specs.add(spec);
      results = List.of(producer.append(stream, keyedFields(spec), 0, null, dedupKey(spec), deliverAt(spec), delay(spec)));
    } else if (call.size() == 1 && call.has("append_batch")) {
      List<BatchEntry> entries = new ArrayList<>();
      for (JsonElement e : call.getAsJsonArray("append_batch")) {
        JsonObject spec = e.getAsJsonObject();
        specs.add(spec);
        entries.add(BatchEntry.of(keyedFields(spec), dedupKey(spec)).withDeliverAt(deliverAt(spec)).withDelay(delay(spec)));
      }
      results = producer.appendBatchEntries(stream, entries);
    } else {
      problems.add("append_calls[" + i + "]: needs exactly one of append and append_batch, got " + call.keySet());
      return;
    }
    if (results.size() != specs.size()) {
      problems.add("append_calls[" + i + "]: " + results.size() + " answers for " + specs.size() + " entries");
      return;
    }
    for (int j = 0; j < specs.size(); j++) {
      JsonObject spec = specs.get(j);
      AppendResult result = results.get(j);
      String key = dedupKey(spec);
      boolean want = spec.has("duplicate") && spec.get("duplicate").getAsBoolean();
      String where = "append_calls[" + i + "][" + j + "] (dedup key " + key + ")";
      boolean wantScheduled = spec.has("scheduled") && spec.get("scheduled").getAsBoolean();
      if (result.isScheduled() != wantScheduled) {
        problems.add(where + ": scheduled " + result.isScheduled() + ", want " + wantScheduled);
      }
      if (result.isScheduled()) {
        if (!result.streamId().isEmpty()) {
          problems.add(where + ": a scheduled entry's answer has stream id " + result.streamId());
        }
        scheduledIds.add(result.id());
      }
      if (spec.has("ref")) {
        byRef.put(spec.get("ref").getAsString(), result);
      }
      if (result.isDuplicate() != want) {
        problems.add(where + ": duplicate " + result.isDuplicate() + ", want " + want);
        continue;
      }
      if (want) {
        AppendResult first = firstByDedupKey.get(key);
        if (first == null || !first.id().equals(result.id()) || !first.streamId().equals(result.streamId())) {
          problems.add(where + ": the duplicate answered " + result + ", the first was " + first);
        }
        continue;
      }
      if (!appendedIds.add(result.id())) {
        problems.add(where + ": id " + result.id() + " answered twice without duplicate");
      }
      if (key != null && !key.isEmpty()) {
        firstByDedupKey.put(key, result);
      }
      appended.put(result.streamId(), keyedFields(spec));
    }
  }

  /** The fields of an append_calls entry, whose keys must all be known. */
  private Map<String, byte[]> keyedFields(JsonObject entry) {
    for (String key : entry.keySet()) {
      if (!Set.of("fields", "dedup_key", "duplicate", "delay_ms", "deliver_in_ms", "scheduled", "ref").contains(key)) {
        problems.add("unknown append_calls entry key `" + key + "`");
      }
    }
    Map<String, byte[]> fields = new LinkedHashMap<>();
    entry.getAsJsonObject("fields").entrySet().forEach(f -> fields.put(f.getKey(), value(f.getValue().getAsJsonObject())));
    return fields;
  }

  /** An append_calls entry's `deliver_in_ms` as the instant it names; null without. */
  private static Instant deliverAt(JsonObject entry) {
    return entry.has("deliver_in_ms") ? Instant.now().plusMillis(entry.get("deliver_in_ms").getAsLong()) : null;
  }

  /** An append_calls entry's `delay_ms`; null without. */
  private static Duration delay(JsonObject entry) {
    return entry.has("delay_ms") ? Duration.ofMillis(entry.get("delay_ms").getAsLong()) : null;
  }

  /** The answer to the append_calls entry with this `ref`. */
  private AppendResult byRef(String step, String ref) {
    AppendResult target = byRef.get(ref);
    if (target == null) {
      fail("scenario " + name + ": " + step + ": no append_calls entry has ref " + ref);
    }
    return target;
  }

  private static String dedupKey(JsonObject entry) {
    return entry.has("dedup_key") ? entry.get("dedup_key").getAsString() : null;
  }

  private void appendEntries(JsonElement spec, boolean retryWhileUnavailable) {
    List<Map<String, byte[]>> entries = new ArrayList<>();
    for (JsonElement e : spec.getAsJsonArray()) {
      JsonObject entry = e.getAsJsonObject();
      for (String key : entry.keySet()) {
        if (!key.equals("fields")) {
          problems.add("unknown append entry key `" + key + "`");
        }
      }
      Map<String, byte[]> fields = new LinkedHashMap<>();
      entry.getAsJsonObject("fields").entrySet().forEach(f -> fields.put(f.getKey(), value(f.getValue().getAsJsonObject())));
      entries.add(fields);
    }
    Supplier<List<AppendResult>> append =
        entries.size() == 1
            ? () -> List.of(producer.append(stream, entries.get(0)))
            : () -> producer.appendBatch(stream, entries);
    record(entries, retryWhileUnavailable ? retrying(append) : append.get());
  }

  private List<AppendResult> retrying(Supplier<List<AppendResult>> append) {
    long until = System.nanoTime() + WAIT.toNanos();
    while (true) {
      try {
        return append.get();
      } catch (EchoMqException e) {
        if (e.isPermanent() || System.nanoTime() > until) {
          throw e;
        }
        sleep(100);
      }
    }
  }

  private void record(List<Map<String, byte[]>> entries, List<AppendResult> results) {
    for (int i = 0; i < entries.size(); i++) {
      appended.put(results.get(i).streamId(), entries.get(i));
      appendedIds.add(results.get(i).id());
    }
  }

  /** A field value spec: utf8, base64, repeat {byte, count}, all_bytes. */
  private byte[] value(JsonObject spec) {
    if (spec.has("utf8")) {
      return spec.get("utf8").getAsString().getBytes(StandardCharsets.UTF_8);
    }
    if (spec.has("base64")) {
      return Base64.getDecoder().decode(spec.get("base64").getAsString());
    }
    if (spec.has("repeat")) {
      JsonObject r = spec.getAsJsonObject("repeat");
      byte[] out = new byte[r.get("count").getAsInt()];
      Arrays.fill(out, (byte) r.get("byte").getAsInt());
      return out;
    }
    if (spec.has("all_bytes") && spec.get("all_bytes").getAsBoolean()) {
      byte[] out = new byte[256];
      for (int i = 0; i < 256; i++) {
        out[i] = (byte) i;
      }
      return out;
    }
    throw new IllegalArgumentException("unknown field value spec " + spec);
  }

  // ---- the consumer and its handler ----

  private EchoMqConsumer startConsumer() {
    JsonObject spec = scenario.getAsJsonObject("consumer");
    for (String key : spec.keySet()) {
      if (!Set.of("max_in_flight", "concurrency", "max_deliveries", "key_field", "max_in_flight_per_key").contains(key)) {
        problems.add("unknown consumer key `" + key + "`");
      }
    }
    EchoMqConsumer.Builder builder =
        EchoMqConsumer.builder()
            .target(fixture.target())
            .stream(stream)
            .group(GROUP)
            .startPosition(StartPosition.beginning())
            .flowControl(
                FlowControl.builder()
                    .maxInFlight(spec.has("max_in_flight") ? spec.get("max_in_flight").getAsInt() : 0)
                    .concurrency(spec.has("concurrency") ? spec.get("concurrency").getAsInt() : 0)
                    .build())
            .handler(handler())
            .onVerdictError(error -> verdictErrors.add(error.code().name()))
            .intercept(new AckCounter())
            // Sidecar restarts in tests take well under a second: keep reconnects brisk.
            .reconnectBackoff(Duration.ofMillis(50), Duration.ofSeconds(1));
    if (spec.has("max_deliveries")) {
      builder.maxDeliveries(spec.get("max_deliveries").getAsInt());
    }
    if (spec.has("key_field")) {
      builder.keyField(spec.get("key_field").getAsString());
    }
    if (spec.has("max_in_flight_per_key")) {
      builder.maxInFlightPerKey(spec.get("max_in_flight_per_key").getAsInt());
    }
    EchoMqConsumer consumer = builder.build();
    consumers.add(consumer);
    consumer.start();
    return consumer;
  }

  private DeliveryHandler handler() {
    JsonObject spec = scenario.getAsJsonObject("handler");
    return delivery -> {
      Call recorded = new Call(delivery.id(), delivery.streamId(), delivery.attempts(), delivery.payload(), System.nanoTime(), new AtomicLong());
      calls.add(recorded);
      int call = callsById.merge(delivery.id(), 1, Integer::sum);
      started.incrementAndGet();
      maxRunning.accumulateAndGet(running.incrementAndGet(), Math::max);
      boolean hang = false;
      try {
        JsonObject action = actionFor(spec, call, delivery.attempts());
        String message = action.has("message") ? action.get("message").getAsString() : null;
        switch (action.get("action").getAsString()) {
          case "return" -> { }
          case "raise" -> {
            switch (action.has("kind") ? action.get("kind").getAsString() : "message") {
              case "message" -> throw new RuntimeException(message);
              case "transient" -> throw new TransientException(message);
              case "poison" -> throw new PoisonException(message);
              default -> {
                problems.add("unknown raise kind " + action);
                throw new IllegalStateException("unknown raise kind " + action);
              }
            }
          }
          case "fail" -> {
            String reason = action.get("reason").getAsString();
            Duration retryAfter = Duration.ofMillis(action.get("retry_after_ms").getAsLong());
            if (action.has("kind")) {
              delivery.fail(reason, retryAfter, FailKind.valueOf(action.get("kind").getAsString().toUpperCase(java.util.Locale.ROOT)));
            } else {
              delivery.fail(reason, retryAfter);
            }
          }
          case "dead_letter" -> delivery.deadLetter(action.get("reason").getAsString());
          case "ack_emit" -> {
            Map<String, byte[]> fields = new LinkedHashMap<>();
            action.getAsJsonObject("fields").entrySet().forEach(f -> fields.put(f.getKey(), value(f.getValue().getAsJsonObject())));
            fields.put("source", delivery.id().getBytes(StandardCharsets.UTF_8));
            try {
              emitted.addAll(delivery.ackEmit(List.of(Emit.of(sink(), fields))));
            } catch (AckEmitException refused) {
              ackEmitRefusals.add(refused.code() == null ? "CALL_ENDED" : refused.code().name());
              throw refused; // held: the consumer fails the delivery with the refusal
            }
          }
          case "sleep" -> Thread.sleep(
              action.has("ms")
                  ? action.get("ms").getAsLong()
                  : ThreadLocalRandom.current().nextLong(action.get("ms_random_max").getAsLong() + 1));
          case "wait_lease_lost" -> {
            try {
              delivery.leaseLost().get(WAIT.toMillis(), TimeUnit.MILLISECONDS);
              if (delivery.isLeaseLost() && delivery.isSettled()) {
                leaseLostSignalled.incrementAndGet();
              } else {
                problems.add("leaseLost() completed but isLeaseLost() " + delivery.isLeaseLost() + ", isSettled() " + delivery.isSettled());
              }
            } catch (java.util.concurrent.TimeoutException e) {
              problems.add("wait_lease_lost: no lease-lost signal within " + WAIT.toSeconds() + " s for " + delivery);
            }
            if (Thread.currentThread().isInterrupted()) {
              problems.add("wait_lease_lost: the handler thread was interrupted");
            }
          }
          case "hang" -> {
            // A hanging call counts as handled once it hangs: it never finishes on its own,
            // and the scenarios wait for it (wait_handled) before dropping the connection.
            hang = true;
            recorded.finishedNanos().set(System.nanoTime());
            finishedIds.add(delivery.id());
            finished.incrementAndGet();
            scenarioOver.await();
          }
          default -> {
            problems.add("unknown handler action " + action);
            throw new IllegalStateException("unknown handler action " + action);
          }
        }
      } finally {
        running.decrementAndGet();
        if (!hang) {
          recorded.finishedNanos().set(System.nanoTime());
          finishedIds.add(delivery.id());
          finished.incrementAndGet();
        }
      }
    };
  }

  /** The action for the {@code call}-th handler call for an id (by_call), else by attempts. */
  private static JsonObject actionFor(JsonObject spec, int call, int attempts) {
    if (spec.has("by_call") && spec.getAsJsonObject("by_call").has(String.valueOf(call))) {
      return spec.getAsJsonObject("by_call").getAsJsonObject(String.valueOf(call));
    }
    if (spec.has("by_attempt")) {
      JsonObject byAttempt = spec.getAsJsonObject("by_attempt");
      if (byAttempt.has(String.valueOf(attempts))) {
        return byAttempt.getAsJsonObject(String.valueOf(attempts));
      }
    }
    return spec.getAsJsonObject("default");
  }

  /**
   * Counts the Ack ids the client puts on the wire; records the {@code max_in_flight} of each
   * Subscribed received, and the most deliveries one call had received and sent no verdict for.
   */
  private final class AckCounter implements ClientInterceptor {
    @Override
    public <ReqT, RespT> ClientCall<ReqT, RespT> interceptCall(
        MethodDescriptor<ReqT, RespT> method, CallOptions options, Channel next) {
      // A verdict counts before it is sent and a delivery once it arrived, so this never exceeds
      // what the sidecar holds for the call.
      AtomicInteger unsettled = new AtomicInteger();
      return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
        @Override
        public void start(Listener<RespT> listener, Metadata headers) {
          super.start(
              new ForwardingClientCallListener.SimpleForwardingClientCallListener<>(listener) {
                @Override
                public void onMessage(RespT message) {
                  if (message instanceof ConsumeResponse response) {
                    if (response.hasSubscribed()) {
                      subscribedMaxInFlight.add(response.getSubscribed().getMaxInFlight());
                    }
                    int received =
                        response.hasDelivery() ? 1 : response.hasBatch() ? response.getBatch().getDeliveriesCount() : 0;
                    if (received > 0) {
                      peakUnsettled.accumulateAndGet(unsettled.addAndGet(received), Math::max);
                    }
                  }
                  super.onMessage(message);
                }
              },
              headers);
        }

        @Override
        public void sendMessage(ReqT message) {
          if (message instanceof ConsumeRequest request && request.hasAck()) {
            request.getAck().getIdsList().forEach(id -> acksSent.merge(id, 1, Integer::sum));
            unsettled.addAndGet(-request.getAck().getIdsCount());
          }
          if (message instanceof ConsumeRequest request && request.hasFail()) {
            unsettled.decrementAndGet();
          }
          if (message instanceof ConsumeRequest request && request.hasAckEmit()) {
            ackEmitsSent.incrementAndGet();
            unsettled.decrementAndGet();
          }
          if (message instanceof ConsumeRequest request && request.hasRelease()) {
            request.getRelease().getIdsList().forEach(id -> releasedSent.merge(id, 1, Integer::sum));
            unsettled.addAndGet(-request.getRelease().getIdsCount());
          }
          if (message instanceof ConsumeRequest request && request.hasSubscribe()) {
            sentMaxInFlight.add(request.getSubscribe().getMaxInFlight());
          }
          super.sendMessage(message);
        }
      };
    }
  }

  // ---- steps ----

  private List<String> steps() {
    if (scenario.has("steps")) {
      List<String> steps = new ArrayList<>();
      scenario.getAsJsonArray("steps").forEach(s -> steps.add(s.getAsString()));
      return steps;
    }
    JsonObject expect = scenario.getAsJsonObject("expect");
    int n = expect.has("handled") ? expect.get("handled").getAsInt() : expect.get("distinct_handled").getAsInt();
    return List.of("start_consumer", "wait_handled:" + n);
  }

  private void runStep(String step) throws Exception {
    String[] parts = step.split(":", 2);
    String arg = parts.length > 1 ? parts[1] : null;
    switch (parts[0]) {
      case "start_consumer", "start_second_consumer" -> startConsumer();
      case "wait_handled" -> waitFor(step, handledCount(), Integer.parseInt(arg));
      case "wait_started" -> waitFor(step, () -> started.get(), Integer.parseInt(arg));
      case "drop_connection" -> consumers.get(consumers.size() - 1).abort();
      case "stop" -> {
        long t0 = System.nanoTime();
        for (EchoMqConsumer consumer : consumers) {
          consumer.stop(Duration.ofMillis(Long.parseLong(arg))).get(Long.parseLong(arg) + 5000, TimeUnit.MILLISECONDS);
        }
        stopMillis = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
      }
      case "stop_first" -> {
        long ms = Long.parseLong(arg);
        if (!consumers.get(0).stop(Duration.ofMillis(ms)).get(ms + 5000, TimeUnit.MILLISECONDS)) {
          problems.add("stop_first: the first consumer did not stop cleanly within " + ms + " ms");
        }
      }
      case "kill_sidecar" -> fixture.killSidecar();
      case "restart_sidecar" -> fixture.restartSidecar();
      case "append_after_restart" -> appendEntries(scenario.get("append_after_restart"), true);
      case "append_more" -> {
        int n = Integer.parseInt(arg);
        List<Map<String, byte[]>> entries = new ArrayList<>();
        for (int i = 0; i < n; i++) {
          entries.add(Map.of("n", String.valueOf(i).getBytes(StandardCharsets.UTF_8)));
        }
        record(entries, n == 1 ? List.of(producer.append(stream, entries.get(0))) : producer.appendBatch(stream, entries));
      }
      case "ack_unknown" -> {
        EchoMqConsumer consumer = consumers.get(consumers.size() - 1);
        waitFor("a subscribed call for " + step, () -> consumer.isConnected() ? 1 : 0, 1);
        if (!consumer.rawAck(arg)) {
          problems.add(step + ": the raw ack was not sent (no open call)");
        }
      }
      case "steal" -> {
        Call last;
        synchronized (calls) {
          last = calls.stream().max(java.util.Comparator.comparingLong(Call::startedNanos)).orElse(null);
        }
        if (last == null) {
          fail("scenario " + name + ": steal: no handler has started");
        }
        try (Resp redis = fixture.redis()) {
          List<?> claimed = (List<?>) redis.call("XCLAIM", stream, GROUP, "thief", "0", last.streamId());
          if (claimed.size() != 1) {
            problems.add("steal: XCLAIM of " + last.streamId() + " claimed " + claimed.size() + " entries");
          }
        }
      }
      case "wait_consumer_error" -> {
        EchoMqConsumer consumer = consumers.get(consumers.size() - 1);
        try {
          consumer.terminated().get(WAIT.toMillis(), TimeUnit.MILLISECONDS);
          fail("scenario " + name + ": the consumer terminated without an error");
        } catch (java.util.concurrent.ExecutionException e) {
          consumerError = e.getCause();
        } catch (java.util.concurrent.TimeoutException e) {
          fail("scenario " + name + ": the consumer did not end by itself within " + WAIT.toSeconds() + " s");
        }
        ended.add(consumer);
      }
      case "wait_verdict_error" -> waitFor(step, () -> verdictErrors.contains(arg) ? 1 : 0, 1);
      case "sleep" -> Thread.sleep(Long.parseLong(arg));
      case "assert_handled" -> {
        int got = calls.size();
        if (got != Integer.parseInt(arg)) {
          fail("scenario " + name + ": " + step + ": " + got + " handler calls so far");
        }
      }
      case "assert_scheduled" -> {
        List<String> listed;
        try (var entries = producer.scheduled(stream)) {
          listed = entries.map(e -> e.id()).toList();
        }
        if (listed.size() != Integer.parseInt(arg) || !scheduledIds.containsAll(listed)) {
          fail("scenario " + name + ": " + step + ": listed " + listed + ", scheduled " + scheduledIds);
        }
      }
      case "cancel_scheduled" -> {
        AppendResult target = byRef(step, arg);
        Instant due = producer.cancelScheduled(target.stream(), target.id());
        if (due.isBefore(Instant.now().minusSeconds(1))) {
          fail("scenario " + name + ": " + step + ": the cancelled entry was due at " + due);
        }
        appendedIds.remove(target.id()); // never to be handled
      }
      case "cancel_scheduled_not_found" -> {
        AppendResult target = byRef(step, arg);
        try {
          Instant due = producer.cancelScheduled(target.stream(), target.id());
          fail("scenario " + name + ": " + step + ": cancelled an entry due at " + due + ", want NotScheduledException");
        } catch (NotScheduledException expected) {
          if (expected.code() != io.grpc.Status.Code.NOT_FOUND) {
            fail("scenario " + name + ": " + step + ": code " + expected.code());
          }
        }
      }
      default -> fail("scenario " + name + ": unknown step `" + step + "` (this runner must be taught it)");
    }
  }

  /**
   * What wait_handled counts: finished handler calls; or, in a scenario whose expectation is
   * `distinct_handled` (not `handled`), distinct ids whose handler call finished, because there a
   * redelivery (an ack lost to a killed sidecar) is allowed and must not end the wait early.
   */
  private IntSupplier handledCount() {
    JsonObject expect = scenario.getAsJsonObject("expect");
    if (expect.has("distinct_handled") && !expect.has("handled")) {
      return () -> finishedIds.size();
    }
    return finished::get;
  }

  private void waitFor(String what, IntSupplier value, int atLeast) {
    long until = System.nanoTime() + WAIT.toNanos();
    while (value.getAsInt() < atLeast) {
      if (System.nanoTime() > until) {
        fail("scenario " + name + ": " + what + " not reached within " + WAIT.toSeconds() + " s (at " + value.getAsInt()
            + "); handler calls: " + calls.size() + ", verdict errors: " + verdictErrors
            + "\n--- sidecar log (tail) ---\n" + fixture.sidecarLog());
      }
      sleep(10);
    }
  }

  // ---- expectations ----

  private void check(Resp redis) throws Exception {
    JsonObject expect = scenario.getAsJsonObject("expect");
    List<Call> calls = List.copyOf(this.calls);
    for (Map.Entry<String, JsonElement> e : expect.entrySet()) {
      JsonElement want = e.getValue();
      switch (e.getKey()) {
        case "handled" -> same("handled", want.getAsInt(), calls.size());
        case "distinct_handled" -> same("distinct_handled", want.getAsInt(), (int) calls.stream().map(Call::id).distinct().count());
        case "attempts" -> {
          Map<String, Integer> wanted = new TreeMap<>();
          want.getAsJsonObject().entrySet().forEach(a -> wanted.put(a.getKey(), a.getValue().getAsInt()));
          Map<String, Integer> got = new TreeMap<>();
          calls.forEach(c -> got.merge(String.valueOf(c.attempts()), 1, Integer::sum));
          same("attempts histogram", wanted, got);
        }
        case "min_redelivery_gap_ms" -> {
          Map<String, List<Call>> byId = new HashMap<>();
          calls.forEach(c -> byId.computeIfAbsent(c.id(), k -> new ArrayList<>()).add(c));
          boolean any = false;
          for (List<Call> list : byId.values()) {
            if (list.size() >= 2) {
              any = true;
              long gap = TimeUnit.NANOSECONDS.toMillis(list.get(1).startedNanos() - list.get(0).startedNanos());
              if (gap < want.getAsLong()) {
                problems.add("redelivery gap " + gap + " ms < " + want.getAsLong() + " ms");
              }
            }
          }
          if (!any) {
            problems.add("min_redelivery_gap_ms: no id was delivered twice");
          }
        }
        case "pending_after" -> {
          List<?> summary = (List<?>) redis.call("XPENDING", stream, GROUP);
          if (want.getAsLong() != (Long) summary.get(0)) {
            problems.add("pending_after (XPENDING count): expected " + want.getAsLong() + ", got " + summary.get(0)
                + "; pending entries [stream id, consumer, idle ms, deliveries]: " + pendingDetail(redis));
          }
        }
        case "stream_length" -> same("stream_length (XLEN " + stream + ")", want.getAsLong(), redis.callLong("XLEN", stream));
        case "handled_ids_equal_appended" -> {
          Set<String> handled = calls.stream().map(Call::id).collect(java.util.stream.Collectors.toSet());
          if (handled.equals(appendedIds) != want.getAsBoolean()) {
            problems.add("handled_ids_equal_appended: handled " + handled + ", appended " + appendedIds);
          }
        }
        case "dead_letters" -> same("dead_letters (XLEN " + deadLetters + ")", want.getAsLong(), redis.callLong("XLEN", deadLetters));
        case "dead_letter_fields" -> {
          Map<String, String> fields = firstDeadLetter(redis);
          want.getAsJsonObject().entrySet().forEach(f -> same("dead letter field " + f.getKey(), f.getValue().getAsString(), fields.get(f.getKey())));
        }
        case "dead_letter_keeps_branded_id" -> {
          if (want.getAsBoolean()) {
            Map<String, String> fields = firstDeadLetter(redis);
            same("dead letter `id` field", calls.isEmpty() ? null : calls.get(0).id(), fields.get("id"));
          }
        }
        case "each_acked_once" -> {
          if (want.getAsBoolean()) {
            Map<String, Integer> expected = new HashMap<>();
            calls.forEach(c -> expected.put(c.id(), 1));
            if (!expected.equals(acksSent)) {
              Map<String, Integer> wrong = new TreeMap<>();
              expected.keySet().forEach(id -> { if (acksSent.getOrDefault(id, 0) != 1) wrong.put(id, acksSent.getOrDefault(id, 0)); });
              acksSent.keySet().forEach(id -> { if (!expected.containsKey(id)) wrong.put(id, acksSent.get(id)); });
              problems.add("each_acked_once: acks sent per id differ for " + wrong.size() + " ids: " + first(wrong, 10));
            }
          }
        }
        case "released" -> {
          releasedSent.forEach((id, n) -> {
            if (n != 1) {
              problems.add("released: " + id + " released " + n + " times");
            }
          });
          same("released (ids sent in Release messages)", want.getAsInt(), releasedSent.size());
        }
        case "payload_equals_appended" -> {
          if (want.getAsBoolean()) {
            if (calls.isEmpty()) {
              problems.add("payload_equals_appended: no handler call");
            }
            for (Call c : calls) {
              Map<String, byte[]> sent = appended.get(c.streamId());
              if (sent == null) {
                problems.add("payload_equals_appended: no appended entry with stream id " + c.streamId());
              } else if (!sent.keySet().equals(c.payload().keySet())
                  || sent.keySet().stream().anyMatch(k -> !Arrays.equals(sent.get(k), c.payload().get(k)))) {
                problems.add("payload_equals_appended: delivered fields " + describe(c.payload()) + " != appended " + describe(sent));
              }
            }
          }
        }
        case "sink_length" -> same("sink_length (XLEN " + sink() + ")", want.getAsLong(), redis.callLong("XLEN", sink()));
        case "sink_sources_equal_appended" -> {
          List<String> sources = entries(redis, sink()).stream().map(entry -> entry.get("source")).toList();
          boolean equal = sources.size() == Set.copyOf(sources).size() && Set.copyOf(sources).equals(appendedIds);
          same("sink_sources_equal_appended (sources " + sources + ", appended " + appendedIds + ")", want.getAsBoolean(), equal);
        }
        case "emitted_equal_sink" -> {
          List<String> inSink = new ArrayList<>(entries(redis, sink()).stream().map(entry -> entry.get("id") + " " + entry.get("") + " " + sink()).toList());
          List<String> got = new ArrayList<>(List.copyOf(emitted).stream().map(entry -> entry.id() + " " + entry.streamId() + " " + entry.stream()).toList());
          Collections.sort(inSink);
          Collections.sort(got);
          same("emitted_equal_sink (emitted " + got + ", sink " + inSink + ")", want.getAsBoolean(), inSink.equals(got));
        }
        case "ack_emit_refusals" -> {
          List<String> wanted = new ArrayList<>();
          want.getAsJsonArray().forEach(v -> wanted.add(v.getAsString()));
          same("ack_emit_refusals", wanted, List.copyOf(ackEmitRefusals));
        }
        case "ack_emits_sent" -> same("ack_emits_sent", want.getAsInt(), ackEmitsSent.get());
        case "acks_sent" -> same("acks_sent (ids in Ack messages)", want.getAsInt(), acksSent.values().stream().mapToInt(Integer::intValue).sum());
        case "verdict_errors" -> {
          List<String> wanted = new ArrayList<>();
          want.getAsJsonArray().forEach(v -> wanted.add(v.getAsString()));
          same("verdict_errors", wanted, List.copyOf(verdictErrors));
        }
        case "lease_lost_signalled" -> same("lease_lost_signalled", want.getAsInt(), leaseLostSignalled.get());
        case "max_concurrent_handlers" -> {
          if (maxRunning.get() > want.getAsInt()) {
            problems.add("max_concurrent_handlers: " + maxRunning.get() + " > " + want.getAsInt());
          }
        }
        case "sent_max_in_flight" -> {
          List<Integer> sent = List.copyOf(sentMaxInFlight);
          if (sent.isEmpty() || sent.stream().anyMatch(m -> m != want.getAsInt())) {
            problems.add("sent_max_in_flight: Subscribe carried " + sent + ", want " + want.getAsInt());
          }
        }
        case "subscribed_max_in_flight" -> {
          List<Integer> got = List.copyOf(subscribedMaxInFlight);
          if (got.isEmpty() || got.stream().anyMatch(m -> m != want.getAsInt())) {
            problems.add("subscribed_max_in_flight: Subscribed reported " + got + ", want " + want.getAsInt());
          }
        }
        case "peak_unsettled_at_least" -> {
          if (peakUnsettled.get() < want.getAsInt()) {
            problems.add("peak_unsettled_at_least: at most " + peakUnsettled.get() + " deliveries were un-settled at once, want at least " + want.getAsInt());
          }
        }
        case "stop_returned_within_ms" -> {
          if (stopMillis == null) {
            problems.add("stop_returned_within_ms: no stop step ran");
          } else if (stopMillis > want.getAsLong()) {
            problems.add("stop returned after " + stopMillis + " ms > " + want.getAsLong() + " ms");
          }
        }
        case "per_key_serial" -> checkPerKeySerial(calls, want.getAsJsonObject().get("key_field").getAsString(),
            want.getAsJsonObject().get("seq_field").getAsString());
        case "max_concurrent_keys_at_least" -> {
          int most = maxConcurrentKeys(calls, expect.getAsJsonObject("per_key_serial").get("key_field").getAsString());
          if (most < want.getAsInt()) {
            problems.add("max_concurrent_keys_at_least: calls of at most " + most + " keys ran at once, want at least " + want.getAsInt());
          }
        }
        case "consumer_error" -> {
          String code = want.getAsJsonObject().get("code").getAsString();
          String contains = want.getAsJsonObject().get("message_contains").getAsString();
          if (!(consumerError instanceof EchoMqException refused)) {
            problems.add("consumer_error: terminated() failed with " + consumerError + ", want an EchoMqException");
          } else if (!refused.isPermanent() || !refused.code().name().equals(code)) {
            problems.add("consumer_error: " + refused + " (permanent " + refused.isPermanent() + "), want permanent " + code);
          } else if (!refused.getMessage().contains(contains) || !refused.details().contains(contains)) {
            problems.add("consumer_error: " + refused.getMessage() + " does not name " + contains);
          }
        }
        default -> problems.add("unknown expectation `" + e.getKey() + "` (this runner must be taught it)");
      }
    }
  }

  private String pendingDetail(Resp redis) throws Exception {
    List<String> out = new ArrayList<>();
    for (Object row : (List<?>) redis.call("XPENDING", stream, GROUP, "-", "+", "10")) {
      List<?> r = (List<?>) row;
      out.add("[" + new String((byte[]) r.get(0), StandardCharsets.UTF_8) + ", " + new String((byte[]) r.get(1), StandardCharsets.UTF_8)
          + ", " + r.get(2) + ", " + r.get(3) + "]");
    }
    return out + "; handler calls (stream id, attempts): "
        + calls.stream().map(c -> c.streamId() + "/" + c.attempts()).toList() + "; acks sent: " + acksSent;
  }

  /** The calls of entries with {@code keyField}, by its value, in the order they started. */
  private static Map<String, List<Call>> keyedCalls(List<Call> calls, String keyField) {
    Map<String, List<Call>> byKey = new TreeMap<>();
    calls.stream()
        .filter(c -> c.payload().containsKey(keyField))
        .sorted(java.util.Comparator.comparingLong(Call::startedNanos))
        .forEach(c -> byKey.computeIfAbsent(new String(c.payload().get(keyField), StandardCharsets.ISO_8859_1), k -> new ArrayList<>()).add(c));
    return byKey;
  }

  /** Within a key no two calls overlap, and their {@code seqField} values never decrease. */
  private void checkPerKeySerial(List<Call> calls, String keyField, String seqField) {
    Map<String, List<Call>> byKey = keyedCalls(calls, keyField);
    if (byKey.isEmpty()) {
      problems.add("per_key_serial: no handler call had the field " + keyField);
    }
    byKey.forEach((key, runs) -> {
      List<Integer> seqs = new ArrayList<>();
      for (int i = 0; i < runs.size(); i++) {
        Call c = runs.get(i);
        seqs.add(Integer.parseInt(new String(c.payload().get(seqField), StandardCharsets.UTF_8)));
        if (i > 0) {
          long finishedBefore = runs.get(i - 1).finishedNanos().get();
          if (finishedBefore == 0 || c.startedNanos() < finishedBefore) {
            problems.add("per_key_serial: key " + key + ": " + c.streamId() + " started "
                + TimeUnit.NANOSECONDS.toMicros(finishedBefore - c.startedNanos()) + " us before " + runs.get(i - 1).streamId() + " finished");
          }
        }
      }
      if (!seqs.equals(seqs.stream().sorted().toList())) {
        problems.add("per_key_serial: key " + key + ": seq in start order " + seqs);
      }
    });
  }

  /** The most distinct keys with calls running at the start of some call. */
  private static int maxConcurrentKeys(List<Call> calls, String keyField) {
    List<Call> keyed = calls.stream().filter(c -> c.payload().containsKey(keyField) && c.finishedNanos().get() != 0).toList();
    int most = 0;
    for (Call c : keyed) {
      Set<String> keys = new HashSet<>();
      for (Call o : keyed) {
        if (o.startedNanos() <= c.startedNanos() && c.startedNanos() < o.finishedNanos().get()) {
          keys.add(new String(o.payload().get(keyField), StandardCharsets.ISO_8859_1));
        }
      }
      most = Math.max(most, keys.size());
    }
    return most;
  }

  private Map<String, String> firstDeadLetter(Resp redis) throws Exception {
    List<Map<String, String>> entries = entries(redis, deadLetters);
    if (entries.isEmpty()) {
      problems.add("no entry in " + deadLetters);
      return new HashMap<>();
    }
    return entries.get(0);
  }

  /** The stream the ack_emit action emits to. */
  private String sink() {
    return stream + ":sink";
  }

  /** Every entry of {@code key} as its fields (UTF-8), with its stream id under the key "". */
  private static List<Map<String, String>> entries(Resp redis, String key) throws Exception {
    List<Map<String, String>> out = new ArrayList<>();
    for (Object raw : (List<?>) redis.call("XRANGE", key, "-", "+")) {
      List<?> entry = (List<?>) raw;
      Map<String, String> fields = new HashMap<>();
      fields.put("", new String((byte[]) entry.get(0), StandardCharsets.UTF_8));
      List<?> kv = (List<?>) entry.get(1);
      for (int i = 0; i + 1 < kv.size(); i += 2) {
        fields.put(new String((byte[]) kv.get(i), StandardCharsets.UTF_8), new String((byte[]) kv.get(i + 1), StandardCharsets.UTF_8));
      }
      out.add(fields);
    }
    return out;
  }

  private void same(String what, Object want, Object got) {
    if (!java.util.Objects.equals(want, got)) {
      problems.add(what + ": expected " + want + ", got " + got);
    }
  }

  private static String describe(Map<String, byte[]> fields) {
    Map<String, String> out = new TreeMap<>();
    fields.forEach((k, v) -> out.put(k, v.length > 32 ? v.length + " bytes" : Arrays.toString(v)));
    return out.toString();
  }

  private static <K, V> String first(Map<K, V> map, int n) {
    return map.entrySet().stream().limit(n).toList().toString();
  }

  private static void sleep(long ms) {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(e);
    }
  }

}
