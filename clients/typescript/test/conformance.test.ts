// The conformance runner: reads ../../tests/conformance/scenarios.json and runs
// every scenario (see tests/conformance/README.md) against a real redis-server
// and sidecar. A scenario with a key, step or action this runner does not know
// fails; nothing is skipped.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { InterceptingCall, status, type Interceptor } from '@grpc/grpc-js';
import { AckEmitError, Consumer, EchoMQError, LeaseLostError, NotScheduledError, PoisonError, Streams, TransientError, type AppendResult, type Delivery, type EmittedEntry, type FailKind, type VerdictError } from '@echomq/client';
import { eventually, Fixture, REPO_ROOT } from './support/fixture.js';

const LANGUAGE = 'typescript';
const GROUP = 'conformance';
const WAIT_MS = 30_000;

type FieldSpec =
  | { utf8: string }
  | { base64: string }
  | { repeat: { byte: number; count: number } }
  | { all_bytes: true };

interface Action {
  action: 'return' | 'raise' | 'fail' | 'dead_letter' | 'sleep' | 'hang' | 'wait_lease_lost' | 'ack_emit';
  /** The ack_emit action's emit's fields (the runner adds `source`, the delivery's branded id). */
  fields?: Record<string, FieldSpec>;
  kind?: FailKind;
  message?: string;
  reason?: string;
  retry_after_ms?: number;
  ms?: number;
  ms_random_max?: number;
}

interface Scenario {
  name: string;
  description: string;
  append?: { fields: Record<string, FieldSpec> }[];
  append_after_restart?: { fields: Record<string, FieldSpec> }[];
  append_generated?: { count: number; field: string };
  append_calls?: AppendCall[];
  consumer: { max_in_flight?: number; concurrency?: number; max_deliveries?: number; key_field?: string; max_in_flight_per_key?: number };
  handler: { default?: Action; by_attempt?: Record<string, Action>; by_call?: Record<string, Action> };
  steps?: string[];
  expect: Record<string, unknown>;
}

/**
 * An entry of `append_calls`: maybe a dedup key, whether its answer must be a
 * duplicate, a schedule (`delay_ms`, or `deliver_in_ms` from now), whether its
 * answer must say scheduled, and a `ref` the cancel steps name it by.
 */
interface KeyedEntrySpec {
  fields: Record<string, FieldSpec>;
  dedup_key?: string;
  duplicate?: boolean;
  delay_ms?: number;
  deliver_in_ms?: number;
  scheduled?: boolean;
  ref?: string;
}

/** A spec's schedule as the client's options. */
function scheduleOf(spec: KeyedEntrySpec): { deliverAt?: Date; delayMs?: number } {
  return {
    ...(spec.deliver_in_ms === undefined ? {} : { deliverAt: new Date(Date.now() + spec.deliver_in_ms) }),
    ...(spec.delay_ms === undefined ? {} : { delayMs: spec.delay_ms }),
  };
}

type AppendCall = { append: KeyedEntrySpec } | { append_batch: KeyedEntrySpec[] };

interface Suite {
  version: number;
  sidecar_args: string[];
  scenarios: Scenario[];
}

const KNOWN_SCENARIO_KEYS = new Set([
  'name', 'description', 'append', 'append_after_restart', 'append_generated', 'append_calls', 'consumer', 'handler', 'steps',
  'expect',
]);
const KNOWN_EXPECT_KEYS = new Set([
  'handled', 'distinct_handled', 'attempts', 'min_redelivery_gap_ms', 'pending_after', 'dead_letters',
  'dead_letter_fields', 'dead_letter_keeps_branded_id', 'each_acked_once', 'payload_equals_appended',
  'verdict_errors', 'max_concurrent_handlers', 'stop_returned_within_ms', 'lease_lost_signalled', 'stream_length',
  'handled_ids_equal_appended', 'sent_max_in_flight', 'subscribed_max_in_flight', 'peak_unsettled_at_least', 'released',
  'sink_length', 'sink_sources_equal_appended', 'emitted_equal_sink', 'ack_emit_refusals', 'ack_emits_sent', 'acks_sent',
  'per_key_serial', 'max_concurrent_keys_at_least', 'consumer_error',
]);

/** The parts of a ConsumeResponse the interceptor reads. */
interface WireResponse {
  subscribed?: { maxInFlight: number } | null;
  delivery?: object | null;
  batch?: { deliveries: object[] } | null;
}

const suite = JSON.parse(readFileSync(join(REPO_ROOT, 'tests', 'conformance', 'scenarios.json'), 'utf8')) as Suite;

function fieldValue(spec: FieldSpec): Buffer {
  if ('utf8' in spec) return Buffer.from(spec.utf8, 'utf8');
  if ('base64' in spec) return Buffer.from(spec.base64, 'base64');
  if ('repeat' in spec) return Buffer.alloc(spec.repeat.count, spec.repeat.byte);
  if ('all_bytes' in spec && spec.all_bytes) return Buffer.from(Array.from({ length: 256 }, (_, i) => i));
  throw new Error(`unknown field value ${JSON.stringify(spec)}`);
}

function fieldsOf(entry: { fields: Record<string, FieldSpec> }): Map<string, Buffer> {
  return new Map(Object.entries(entry.fields).map(([name, spec]) => [name, fieldValue(spec)]));
}

/** One handler call, as the README asks the handler to record it. */
interface Call {
  id: string;
  streamId: string;
  attempts: number;
  payload: Readonly<Record<string, Buffer>>;
  /** When it started and finished (its action returned or threw, or a hang began): `performance.now()`, ms. */
  startedAt: number;
  finishedAt?: number;
}

/** Everything one scenario run observes. */
class Run {
  readonly calls: Call[] = [];
  /** Calls that finished (for `hang`: that reached the hang, which by design never finishes). */
  finished = 0;
  running = 0;
  maxRunning = 0;
  readonly verdictErrors: VerdictError[] = [];
  /** Ack ids the client sent, counted in an interceptor on the wire side. */
  readonly acksSent = new Map<string, number>();
  /** AckEmit messages the client sent, counted likewise. */
  ackEmitsSent = 0;
  /** Every entry `ackEmit` resolved with. */
  readonly emitted: EmittedEntry[] = [];
  /** The codes of the AckEmitErrors the handler saw. */
  readonly ackEmitRefusals: string[] = [];
  /** Release ids the client sent, counted likewise. */
  readonly releasedSent = new Map<string, number>();
  subscribedCalls = 0;
  stopMs: number | undefined;
  /** What a consumer's `run()` rejected with (`wait_consumer_error`). */
  consumerError: unknown;
  /** Handler calls that saw their delivery's signal abort with a LeaseLostError. */
  leaseLostSignalled = 0;
  /** Appended entries by branded id. */
  readonly appended = new Map<string, Map<string, Buffer>>();
  /** The answer that wrote each dedup key of `append_calls`. */
  readonly firstByDedupKey = new Map<string, AppendResult>();
  /** The answer to each `ref` of `append_calls`. */
  readonly byRef = new Map<string, AppendResult>();
  /** Branded ids answered `scheduled`. */
  readonly scheduledIds = new Set<string>();
  /** Ends hanging handlers when the scenario is over. */
  readonly over = new AbortController();

  /** The `maxInFlight` of each Subscribe sent on the wire. */
  readonly sentMaxInFlight: number[] = [];
  /** The `maxInFlight` of each Subscribed received on the wire. */
  readonly subscribedMaxInFlight: number[] = [];
  /** The most deliveries one call had received and sent no verdict for at once. */
  peakUnsettled = 0;

  // A verdict counts before it is sent and a delivery once it arrived, so a
  // call's `unsettled` never exceeds what the sidecar holds for it.
  readonly interceptor: Interceptor = (options, nextCall) => {
    let unsettled = 0;
    return new InterceptingCall(nextCall(options), {
      start: (metadata, _listener, next) => {
        next(metadata, {
          onReceiveMessage: (message: WireResponse, nextMessage) => {
            if (message.subscribed) this.subscribedMaxInFlight.push(Number(message.subscribed.maxInFlight));
            const received = message.delivery ? 1 : (message.batch?.deliveries.length ?? 0);
            if (received > 0) {
              unsettled += received;
              this.peakUnsettled = Math.max(this.peakUnsettled, unsettled);
            }
            nextMessage(message);
          },
        });
      },
      sendMessage: (
        message: {
          ack?: { ids: string[] } | null;
          fail?: object | null;
          release?: { ids: string[] } | null;
          ackEmit?: object | null;
          subscribe?: { maxInFlight?: number } | null;
        },
        next,
      ) => {
        if (message.subscribe) this.sentMaxInFlight.push(Number(message.subscribe.maxInFlight ?? 0));
        for (const id of message.ack?.ids ?? []) this.acksSent.set(id, (this.acksSent.get(id) ?? 0) + 1);
        for (const id of message.release?.ids ?? []) this.releasedSent.set(id, (this.releasedSent.get(id) ?? 0) + 1);
        if (message.ackEmit) this.ackEmitsSent += 1;
        unsettled -= (message.ack?.ids.length ?? 0) + (message.release?.ids.length ?? 0) + (message.fail ? 1 : 0) + (message.ackEmit ? 1 : 0);
        next(message);
      },
    });
  };

  constructor(readonly scenario: Scenario) {}

  /** Handler calls per branded id so far, for `by_call`. */
  readonly callsById = new Map<string, number>();

  action(id: string, attempts: number): Action {
    const call = this.callsById.get(id) ?? 0; // this call counted already
    const handler = this.scenario.handler;
    const action = handler.by_call?.[String(call)] ?? handler.by_attempt?.[String(attempts)] ?? handler.default;
    if (!action) throw new Error(`scenario ${this.scenario.name} has no handler action for attempts ${attempts}`);
    return action;
  }

  readonly handler = async (delivery: Delivery): Promise<void> => {
    this.calls.push({
      id: delivery.id,
      streamId: delivery.streamId,
      attempts: delivery.attempts,
      payload: delivery.payload,
      startedAt: performance.now(),
    });
    const call = this.calls[this.calls.length - 1]!;
    this.callsById.set(delivery.id, (this.callsById.get(delivery.id) ?? 0) + 1);
    this.running += 1;
    this.maxRunning = Math.max(this.maxRunning, this.running);
    let hung = false;
    try {
      const action = this.action(delivery.id, delivery.attempts);
      switch (action.action) {
        case 'return':
          return;
        case 'raise':
          switch (action.kind ?? 'message') {
            case 'message':
              throw new Error(action.message ?? 'raised');
            case 'transient':
              throw new TransientError(action.message ?? 'raised');
            case 'poison':
              throw new PoisonError(action.message ?? 'raised');
          }
          throw new Error(`unknown raise kind ${action.kind}`);
        case 'fail':
          delivery.fail(action.reason ?? '', {
            ...(action.retry_after_ms === undefined ? {} : { retryAfterMs: action.retry_after_ms }),
            ...(action.kind === undefined ? {} : { kind: action.kind }),
          });
          return;
        case 'dead_letter':
          delivery.deadLetter(action.reason ?? '');
          return;
        case 'ack_emit': {
          const fields = fieldsOf({ fields: action.fields ?? {} });
          fields.set('source', Buffer.from(delivery.id, 'utf8'));
          try {
            this.emitted.push(...(await delivery.ackEmit([{ stream: `${delivery.stream}:sink`, fields }])));
          } catch (error) {
            if (error instanceof AckEmitError) this.ackEmitRefusals.push(error.code ?? 'CALL_ENDED');
            throw error; // held: the consumer fails the delivery with the refusal
          }
          return;
        }
        case 'sleep': {
          const ms = action.ms ?? Math.floor(Math.random() * ((action.ms_random_max ?? 0) + 1));
          await sleep(ms);
          return;
        }
        case 'wait_lease_lost': {
          // The contract's TypeScript form: the delivery's signal aborts, its
          // reason a LeaseLostError. Then return normally: the client must
          // send no verdict (an Ack would be answered NOT_PENDING, which
          // `verdict_errors` would show).
          const signal = delivery.signal;
          const lost = await new Promise<boolean>((resolve) => {
            const timer = setTimeout(() => resolve(false), WAIT_MS);
            const seen = () => {
              clearTimeout(timer);
              resolve(signal.reason instanceof LeaseLostError && delivery.leaseLost);
            };
            if (signal.aborted) seen();
            else signal.addEventListener('abort', seen, { once: true });
          });
          if (lost) this.leaseLostSignalled += 1;
          return;
        }
        case 'hang': {
          hung = true;
          this.finished += 1;
          call.finishedAt = performance.now();
          const signal = AbortSignal.any([delivery.signal, this.over.signal]);
          await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
          throw new Error('hung handler released');
        }
        default:
          throw new Error(`unknown handler action ${JSON.stringify(action)}`);
      }
    } finally {
      this.running -= 1;
      if (!hung) {
        this.finished += 1;
        call.finishedAt = performance.now();
      }
    }
  };
}

function histogram(values: number[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const value of values) out[String(value)] = (out[String(value)] ?? 0) + 1;
  return out;
}

describe(`conformance (${suite.scenarios.length} scenarios from tests/conformance/scenarios.json)`, () => {
  let fixture: Fixture;

  before(async () => {
    assert.equal(suite.version, 1, 'this runner knows scenarios.json version 1');
    fixture = await Fixture.start({ consumerName: `conformance-${LANGUAGE}`, args: suite.sidecar_args });
  });

  after(async () => {
    await fixture?.stop();
  });

  for (const scenario of suite.scenarios) {
    test(scenario.name, { timeout: 120_000 }, async (t) => {
      t.diagnostic(scenario.description);
      for (const key of Object.keys(scenario)) assert.ok(KNOWN_SCENARIO_KEYS.has(key), `unknown scenario key ${key}`);
      for (const key of Object.keys(scenario.expect)) assert.ok(KNOWN_EXPECT_KEYS.has(key), `unknown expect key ${key}`);
      await runScenario(fixture, scenario);
    });
  }
});

async function appendAll(producer: Streams, stream: string, entries: Map<string, Buffer>[], run: Run, options = {}): Promise<void> {
  if (entries.length === 0) return;
  const results: AppendResult[] =
    entries.length === 1
      ? [await producer.append(stream, entries[0]!, options)]
      : await producer.appendBatch(stream, entries, options);
  results.forEach((result, i) => run.appended.set(result.id, entries[i]!));
}

/**
 * Makes one of `append_calls` and checks each answer: `duplicate` as the entry
 * says, a duplicate carrying the ids of the first answer with its key, and no
 * id answered twice otherwise.
 */
async function appendCall(producer: Streams, stream: string, call: AppendCall, run: Run): Promise<void> {
  let specs: KeyedEntrySpec[];
  let results: AppendResult[];
  if ('append' in call && !('append_batch' in call)) {
    specs = [call.append];
    const options = { ...(call.append.dedup_key === undefined ? {} : { dedupKey: call.append.dedup_key }), ...scheduleOf(call.append) };
    results = [await producer.append(stream, fieldsOf(call.append), options)];
  } else if ('append_batch' in call && !('append' in call)) {
    specs = call.append_batch;
    results = await producer.appendBatch(
      stream,
      specs.map((spec) => ({
        fields: fieldsOf(spec),
        ...(spec.dedup_key === undefined ? {} : { dedupKey: spec.dedup_key }),
        ...scheduleOf(spec),
      })),
    );
  } else {
    assert.fail(`append_calls: ${JSON.stringify(call)} needs exactly one of append and append_batch`);
  }
  assert.equal(results.length, specs.length, 'one answer per entry');
  results.forEach((result, i) => {
    const spec = specs[i]!;
    assert.equal(result.scheduled, spec.scheduled ?? false, `scheduled of the answer to ${JSON.stringify(spec)}`);
    if (result.scheduled) {
      assert.equal(result.streamId, '', 'a scheduled entry has no stream id yet');
      run.scheduledIds.add(result.id);
    }
    if (spec.ref !== undefined) run.byRef.set(spec.ref, result);
    const want = spec.duplicate ?? false;
    assert.equal(result.duplicate, want, `duplicate of the answer to ${JSON.stringify(spec)}`);
    if (want) {
      const first = run.firstByDedupKey.get(spec.dedup_key ?? '');
      assert.ok(first, `a duplicate of ${spec.dedup_key}, which no earlier answer wrote`);
      assert.deepEqual([result.id, result.streamId], [first.id, first.streamId], `the duplicate of ${spec.dedup_key} answers the first ids`);
      return;
    }
    assert.ok(!run.appended.has(result.id), `${result.id} answered twice without duplicate`);
    if (spec.dedup_key) run.firstByDedupKey.set(spec.dedup_key, result);
    run.appended.set(result.id, fieldsOf(spec));
  });
}

async function runScenario(fixture: Fixture, scenario: Scenario): Promise<void> {
  const stream = `conf:${LANGUAGE}:${scenario.name}`;
  const run = new Run(scenario);
  const producer = new Streams({ target: fixture.target });
  const consumers: { consumer: Consumer; done: Promise<unknown>; ended?: boolean }[] = [];

  const startConsumer = () => {
    const consumer = new Consumer({
      target: fixture.target,
      stream,
      group: GROUP,
      start: 'beginning',
      flowControl: { maxInFlight: scenario.consumer.max_in_flight, concurrency: scenario.consumer.concurrency },
      ...(scenario.consumer.max_deliveries === undefined ? {} : { maxDeliveries: scenario.consumer.max_deliveries }),
      ...(scenario.consumer.key_field === undefined ? {} : { keyField: scenario.consumer.key_field }),
      ...(scenario.consumer.max_in_flight_per_key === undefined ? {} : { maxInFlightPerKey: scenario.consumer.max_in_flight_per_key }),
      interceptors: [run.interceptor],
      onVerdictError: (error) => run.verdictErrors.push(error),
      onSubscribed: () => {
        run.subscribedCalls += 1;
      },
    });
    const done = consumer.run(run.handler).then(
      () => undefined,
      (error: unknown) => error,
    );
    consumers.push({ consumer, done });
  };

  const waitFor = async (what: string, check: () => boolean) => {
    assert.ok(await eventually(check, WAIT_MS), `timed out waiting for ${what}`);
  };

  try {
    const initial = [
      ...(scenario.append ?? []).map(fieldsOf),
      ...Array.from({ length: scenario.append_generated?.count ?? 0 }, (_, i) => new Map([[scenario.append_generated!.field, Buffer.from(String(i))]])),
    ];
    await appendAll(producer, stream, initial, run);
    for (const call of scenario.append_calls ?? []) await appendCall(producer, stream, call, run);

    const target = (scenario.expect.handled ?? scenario.expect.distinct_handled) as number | undefined;
    const steps = scenario.steps ?? ['start_consumer', `wait_handled:${target}`];
    for (const step of steps) {
      const [name, arg = ''] = step.split(/:(.*)/s) as [string, string?];
      switch (name) {
        case 'start_consumer':
        case 'start_second_consumer':
          startConsumer();
          break;
        case 'wait_handled':
          await waitFor(`${arg} finished handler calls (have ${run.finished})`, () => run.finished >= Number(arg));
          break;
        case 'wait_started':
          await waitFor(`${arg} started handler calls`, () => run.calls.length >= Number(arg));
          break;
        case 'drop_connection':
          consumers[0]!.consumer.close();
          await consumers[0]!.done;
          break;
        case 'stop': {
          const started = Date.now();
          await consumers[0]!.consumer.stop({ deadlineMs: Number(arg) });
          run.stopMs = Date.now() - started;
          break;
        }
        case 'stop_first': {
          await consumers[0]!.consumer.stop({ deadlineMs: Number(arg) });
          assert.equal(await consumers[0]!.done, undefined, 'the first consumer stopped cleanly');
          break;
        }
        case 'kill_sidecar':
          await fixture.killSidecar();
          break;
        case 'restart_sidecar':
          await fixture.startSidecar();
          break;
        case 'append_after_restart': {
          const entries = (scenario.append_after_restart ?? []).map(fieldsOf);
          const until = Date.now() + WAIT_MS;
          for (;;) {
            try {
              await appendAll(producer, stream, entries, run, { waitForReady: true, deadlineMs: 5_000 });
              break;
            } catch (error) {
              if (Date.now() > until) throw error;
              await sleep(100);
            }
          }
          break;
        }
        case 'append_more': {
          const entries = Array.from({ length: Number(arg) }, (_, i) => new Map([['n', Buffer.from(String(i))]]));
          await appendAll(producer, stream, entries, run);
          break;
        }
        case 'steal': {
          const last = run.calls.reduce<Call | undefined>((latest, call) => (latest && latest.startedAt > call.startedAt ? latest : call), undefined);
          assert.ok(last, 'steal: no handler has started');
          await fixture.redis.command('XCLAIM', stream, GROUP, 'thief', '0', last.streamId);
          break;
        }
        case 'ack_unknown':
          await waitFor('the consumer to subscribe', () => run.subscribedCalls > 0);
          assert.ok(consumers[0]!.consumer.rawAck([arg]), 'rawAck found no open call');
          break;
        case 'wait_consumer_error': {
          const current = consumers[consumers.length - 1]!;
          const outcome = await Promise.race([current.done, sleep(WAIT_MS).then(() => 'timed out')]);
          assert.notEqual(outcome, 'timed out', `the consumer's run() did not end by itself within ${WAIT_MS} ms`);
          assert.notEqual(outcome, undefined, "the consumer's run() resolved, want a rejection");
          run.consumerError = outcome;
          current.ended = true;
          break;
        }
        case 'wait_verdict_error':
          await waitFor(`a verdict error ${arg}`, () => run.verdictErrors.some((e) => e.code === arg));
          break;
        case 'sleep':
          await sleep(Number(arg));
          break;
        case 'assert_handled':
          assert.equal(run.calls.length, Number(arg), `${step}: handler calls so far`);
          break;
        case 'assert_scheduled': {
          const listed: string[] = [];
          for await (const entry of producer.scheduled(stream)) listed.push(entry.id);
          assert.equal(listed.length, Number(arg), `${step}: listed ${listed}`);
          for (const id of listed) assert.ok(run.scheduledIds.has(id), `${step}: listed ${id}, which no append answered scheduled`);
          break;
        }
        case 'cancel_scheduled': {
          const target = run.byRef.get(arg);
          assert.ok(target, `${step}: no append_calls entry has ref ${arg}`);
          const due = await producer.cancelScheduled(target.stream, target.id);
          assert.ok(due.getTime() > Date.now() - 1_000, `${step}: the cancelled entry was due at ${due.toISOString()}`);
          run.appended.delete(target.id); // never to be handled
          break;
        }
        case 'cancel_scheduled_not_found': {
          const target = run.byRef.get(arg);
          assert.ok(target, `${step}: no append_calls entry has ref ${arg}`);
          await assert.rejects(producer.cancelScheduled(target.stream, target.id), (error: unknown) => {
            assert.ok(error instanceof NotScheduledError, `${step}: rejected with ${String(error)}`);
            assert.equal(error.code, status.NOT_FOUND);
            return true;
          });
          break;
        }
        default:
          assert.fail(`unknown step ${JSON.stringify(step)}`);
      }
    }

    // A graceful stop of whatever still runs, then the checks.
    const live = consumers.filter((c) => !c.ended);
    for (const { consumer } of live) await consumer.stop({ deadlineMs: 10_000 });
    for (const { done } of live) {
      const outcome = await done;
      assert.equal(outcome, undefined, `a consumer's run() rejected: ${String(outcome)}`);
    }
    await check(fixture, scenario, stream, run);
  } finally {
    run.over.abort();
    for (const { consumer } of consumers) consumer.close();
    producer.close();
  }
}

async function check(fixture: Fixture, scenario: Scenario, stream: string, run: Run): Promise<void> {
  const expect = scenario.expect;
  const ids = run.calls.map((call) => call.id);
  const distinct = new Set(ids);

  if (expect.handled !== undefined) assert.equal(run.calls.length, expect.handled, 'handled');
  if (expect.distinct_handled !== undefined) assert.equal(distinct.size, expect.distinct_handled, 'distinct_handled');
  if (expect.attempts !== undefined) {
    assert.deepEqual(histogram(run.calls.map((call) => call.attempts)), expect.attempts, 'attempts histogram');
  }
  if (expect.min_redelivery_gap_ms !== undefined) {
    let checked = 0;
    for (const id of distinct) {
      const calls = run.calls.filter((call) => call.id === id);
      if (calls.length < 2) continue;
      checked += 1;
      const gap = calls[1]!.startedAt - calls[0]!.startedAt;
      assert.ok(gap >= (expect.min_redelivery_gap_ms as number), `redelivery of ${id} after ${gap} ms`);
    }
    assert.ok(checked > 0, 'min_redelivery_gap_ms: no entry was delivered twice');
  }
  if (expect.pending_after !== undefined) {
    const want = expect.pending_after as number;
    await eventually(async () => (await fixture.pending(stream, GROUP)) === want, 5_000, 50);
    assert.equal(await fixture.pending(stream, GROUP), want, 'pending_after (XPENDING count)');
  }
  if (expect.stream_length !== undefined) {
    assert.equal(await fixture.xlen(stream), expect.stream_length, 'stream_length (XLEN of the stream)');
  }
  if (expect.handled_ids_equal_appended !== undefined) {
    const same = distinct.size === run.appended.size && [...distinct].every((id) => run.appended.has(id));
    assert.equal(same, expect.handled_ids_equal_appended, `handled ${[...distinct]}, appended ${[...run.appended.keys()]}`);
  }
  const dlq = `${stream}:dlq`;
  if (expect.dead_letters !== undefined) {
    const want = expect.dead_letters as number;
    await eventually(async () => (await fixture.xlen(dlq)) === want, 5_000, 50);
    assert.equal(await fixture.xlen(dlq), want, 'dead_letters (XLEN of the dead-letter stream)');
  }
  if (expect.dead_letter_fields !== undefined || expect.dead_letter_keeps_branded_id) {
    const [dead] = await fixture.entries(dlq);
    assert.ok(dead, 'a dead-letter entry');
    for (const [name, value] of Object.entries((expect.dead_letter_fields ?? {}) as Record<string, string>)) {
      assert.equal(dead.fields.get(name)?.toString('utf8'), value, `dead-letter field ${name}`);
    }
    if (expect.dead_letter_keeps_branded_id) {
      assert.equal(dead.fields.get('id')?.toString('utf8'), run.calls[0]?.id, 'dead letter keeps the branded id');
    }
  }
  if (expect.each_acked_once) {
    for (const id of distinct) assert.equal(run.acksSent.get(id) ?? 0, 1, `acks sent for ${id}`);
    assert.equal(run.acksSent.size, distinct.size, 'acks sent only for handled ids');
  }
  if (expect.released !== undefined) {
    for (const [id, n] of run.releasedSent) assert.equal(n, 1, `releases sent for ${id}`);
    assert.equal(run.releasedSent.size, expect.released, 'ids released');
  }
  if (expect.payload_equals_appended) {
    assert.ok(run.calls.length > 0, 'payload_equals_appended: nothing handled');
    for (const call of run.calls) {
      const appended = run.appended.get(call.id);
      assert.ok(appended, `handled ${call.id}, which this run did not append`);
      assert.deepEqual(Object.keys(call.payload).sort(), [...appended.keys()].sort(), 'payload field names');
      for (const [name, value] of appended) {
        assert.ok(Buffer.compare(call.payload[name]!, value) === 0, `payload field ${name} differs (${call.payload[name]!.length} vs ${value.length} bytes)`);
      }
    }
  }
  const sink = `${stream}:sink`;
  if (expect.sink_length !== undefined) {
    assert.equal(await fixture.xlen(sink), expect.sink_length, 'sink_length (XLEN of the sink)');
  }
  if (expect.sink_sources_equal_appended !== undefined) {
    const sources = (await fixture.entries(sink)).map((e) => e.fields.get('source')?.toString('utf8') ?? '');
    const same = sources.length === new Set(sources).size && sources.length === run.appended.size && sources.every((id) => run.appended.has(id));
    assert.equal(same, expect.sink_sources_equal_appended, `sink sources ${sources}, appended ${[...run.appended.keys()]}`);
  }
  if (expect.emitted_equal_sink !== undefined) {
    const inSink = (await fixture.entries(sink)).map((e) => `${e.fields.get('id')?.toString('utf8')} ${e.streamId} ${sink}`).sort();
    const emitted = run.emitted.map((e) => `${e.id} ${e.streamId} ${e.stream}`).sort();
    assert.equal(JSON.stringify(emitted) === JSON.stringify(inSink), expect.emitted_equal_sink, `emitted ${emitted}, sink ${inSink}`);
  }
  if (expect.ack_emit_refusals !== undefined) {
    assert.deepEqual(run.ackEmitRefusals, expect.ack_emit_refusals, 'ackEmit refusals the handler saw');
  }
  if (expect.ack_emits_sent !== undefined) {
    assert.equal(run.ackEmitsSent, expect.ack_emits_sent, 'AckEmit messages sent');
  }
  if (expect.acks_sent !== undefined) {
    const sent = [...run.acksSent.values()].reduce((a, b) => a + b, 0);
    assert.equal(sent, expect.acks_sent, 'ids sent in Ack messages');
  }
  if (expect.verdict_errors !== undefined) {
    assert.deepEqual(run.verdictErrors.map((e) => e.code), expect.verdict_errors, 'verdict errors surfaced');
  }
  if (expect.lease_lost_signalled !== undefined) {
    assert.equal(run.leaseLostSignalled, expect.lease_lost_signalled, 'handler calls that saw the lease-lost signal');
  }
  if (expect.max_concurrent_handlers !== undefined) {
    assert.ok(run.maxRunning <= (expect.max_concurrent_handlers as number), `${run.maxRunning} handlers ran at once`);
  }
  if (expect.sent_max_in_flight !== undefined) {
    const want = expect.sent_max_in_flight as number;
    const sent = run.sentMaxInFlight;
    assert.ok(sent.length > 0 && sent.every((m) => m === want), `Subscribe carried ${JSON.stringify(sent)}, want ${want}`);
  }
  if (expect.subscribed_max_in_flight !== undefined) {
    const want = expect.subscribed_max_in_flight as number;
    const got = run.subscribedMaxInFlight;
    assert.ok(got.length > 0 && got.every((m) => m === want), `Subscribed reported ${JSON.stringify(got)}, want ${want}`);
  }
  if (expect.peak_unsettled_at_least !== undefined) {
    const want = expect.peak_unsettled_at_least as number;
    assert.ok(run.peakUnsettled >= want, `at most ${run.peakUnsettled} deliveries were un-settled at once, want at least ${want}`);
  }
  if (expect.per_key_serial !== undefined) {
    const { key_field: keyField, seq_field: seqField } = expect.per_key_serial as { key_field: string; seq_field: string };
    const byKey = keyedCalls(run.calls, keyField);
    assert.ok(byKey.size > 0, `per_key_serial: no handler call had the field ${keyField}`);
    for (const [key, calls] of byKey) {
      calls.forEach((call, i) => {
        const before = calls[i - 1];
        if (!before) return;
        assert.ok(before.finishedAt !== undefined && call.startedAt >= before.finishedAt,
          `key ${key}: ${call.streamId} started ${(before.finishedAt ?? 0) - call.startedAt} ms before ${before.streamId} finished`);
      });
      const seqs = calls.map((call) => Number(call.payload[seqField]!.toString('utf8')));
      assert.deepEqual(seqs, [...seqs].sort((a, b) => a - b), `key ${key}: seq in start order ${seqs}`);
    }
  }
  if (expect.max_concurrent_keys_at_least !== undefined) {
    const { key_field: keyField } = expect.per_key_serial as { key_field: string };
    const keyed = run.calls.filter((call) => call.payload[keyField] !== undefined && call.finishedAt !== undefined);
    const most = Math.max(0, ...keyed.map((call) => new Set(
      keyed.filter((o) => o.startedAt <= call.startedAt && call.startedAt < o.finishedAt!).map((o) => o.payload[keyField]!.toString('latin1')),
    ).size));
    const want = expect.max_concurrent_keys_at_least as number;
    assert.ok(most >= want, `calls of at most ${most} keys ran at once, want at least ${want}`);
  }
  if (expect.consumer_error !== undefined) {
    const want = expect.consumer_error as { code: string; message_contains: string };
    const error = run.consumerError;
    assert.ok(error instanceof EchoMQError, `the consumer's run() rejected with ${String(error)}, want an EchoMQError`);
    assert.ok(error.permanent, `${error.message}: not permanent`);
    assert.equal(error.codeName, want.code, error.message);
    assert.ok(error.message.includes(want.message_contains) && error.details.includes(want.message_contains),
      `${JSON.stringify(error.message)} does not name ${want.message_contains}`);
  }
  if (expect.stop_returned_within_ms !== undefined) {
    assert.ok(run.stopMs !== undefined, 'stop_returned_within_ms without a stop step');
    assert.ok(run.stopMs <= (expect.stop_returned_within_ms as number), `stop took ${run.stopMs} ms`);
  }
}

/** The calls of entries with `keyField`, by its value (latin1), in the order they started. */
function keyedCalls(calls: readonly Call[], keyField: string): Map<string, Call[]> {
  const byKey = new Map<string, Call[]>();
  for (const call of [...calls].sort((a, b) => a.startedAt - b.startedAt)) {
    const key = call.payload[keyField];
    if (key === undefined) continue;
    const name = key.toString('latin1');
    byKey.set(name, [...(byKey.get(name) ?? []), call]);
  }
  return byKey;
}
