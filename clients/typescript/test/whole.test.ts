// The whole client beyond the consumer's core (clients/CONTRACT.md, "Whole
// clients"): Read with paging, Trim, the Admin calls, every subscription
// setting reaching the sidecar with an effect Redis shows, and LEASE_LOST.
// Each test runs against a real redis-server and sidecar.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { InterceptingCall, status, type Interceptor } from '@grpc/grpc-js';
import {
  Admin,
  Consumer,
  EchoMQError,
  LeaseLostError,
  Streams,
  type ConsumerOptions,
  type Delivery,
  type GroupInfo,
  type VerdictError,
} from '@echomq/client';
import { eventually, Fixture } from './support/fixture.js';

const GROUP = 'g';
const CONSUMER_NAME = 'ts-whole-tests';
let unique = 0;
const streamName = (what: string) => `ts:whole:${what}:${process.pid}:${++unique}`;

/** Records the Subscribe, Ack and Fail frames a consumer sends. */
function wire() {
  const subscribes: Record<string, unknown>[] = [];
  const acked: string[] = [];
  const failed: string[] = [];
  const interceptor: Interceptor = (options, nextCall) =>
    new InterceptingCall(nextCall(options), {
      sendMessage: (message: { subscribe?: Record<string, unknown> | null; ack?: { ids: string[] } | null; fail?: { id: string } | null }, next) => {
        if (message.subscribe) subscribes.push({ ...message.subscribe });
        if (message.ack) acked.push(...message.ack.ids);
        if (message.fail) failed.push(message.fail.id);
        next(message);
      },
    });
  return { subscribes, acked, failed, interceptor };
}

describe('the whole client: read, trim, admin, settings, LEASE_LOST', () => {
  let fixture: Fixture;
  let streams: Streams;
  let admin: Admin;
  const consumers: Consumer[] = [];

  before(async () => {
    fixture = await Fixture.start({
      consumerName: CONSUMER_NAME,
      args: [
        '--retry-backoff-initial-ms', '100',
        '--retry-backoff-max-ms', '200',
        '--reclaim-min-idle-ms', '2000',
        '--reclaim-interval-ms', '500',
        '--shutdown-grace-ms', '1000',
      ],
    });
    streams = new Streams({ target: fixture.target });
    admin = new Admin({ target: fixture.target });
  });

  after(async () => {
    for (const consumer of consumers) consumer.close();
    streams?.close();
    admin?.close();
    await fixture?.stop();
  });

  function consumerOf(stream: string, options: Partial<ConsumerOptions> = {}): Consumer {
    const consumer = new Consumer({ target: fixture.target, stream, group: GROUP, start: 'beginning', ...options });
    consumers.push(consumer);
    return consumer;
  }

  async function appendN(stream: string, n: number): Promise<{ id: string; streamId: string }[]> {
    return await streams.appendBatch(stream, Array.from({ length: n }, (_, i) => ({ n: String(i) })));
  }

  // --- Read -----------------------------------------------------------------

  test('read returns one page and its nextStartId; readAll pages through every entry in order', async () => {
    const stream = streamName('read');
    const appended = await appendN(stream, 25);
    const first = await streams.read(stream, { count: 10 });
    assert.deepEqual(first.entries.map((e) => e.id), appended.slice(0, 10).map((a) => a.id));
    assert.equal(first.nextStartId, appended[10]!.streamId, 'the next page starts at the 11th entry');
    assert.equal(first.entries[3]!.text('n'), '3');
    assert.ok(first.entries[0]!.mintedAt instanceof Date && first.entries[0]!.mintedAt.getTime() > 0);
    const second = await streams.read(stream, { start: first.nextStartId, count: 10 });
    assert.equal(second.entries[0]!.id, appended[10]!.id);

    const all: string[] = [];
    for await (const entry of streams.readAll(stream, { count: 7 })) all.push(entry.id);
    assert.deepEqual(all, appended.map((a) => a.id), 'readAll: every entry, once, in order, across 4 pages');

    const bounded: string[] = [];
    for await (const entry of streams.readAll(stream, { start: appended[5]!.streamId, end: appended[9]!.streamId, count: 2 })) bounded.push(entry.id);
    assert.deepEqual(bounded, appended.slice(5, 10).map((a) => a.id), 'both bounds inclusive, kept across pages');

    let taken = 0;
    for await (const _ of streams.readAll(stream, { count: 5 })) if (++taken === 3) break;
    assert.equal(taken, 3);
  });

  test('read by instant: a Date bound selects by append time', async () => {
    const stream = streamName('read-instant');
    const before = await appendN(stream, 3);
    await sleep(20);
    const since = new Date();
    await sleep(20);
    const afterIt = await appendN(stream, 2);
    const page = await streams.read(stream, { start: since });
    assert.deepEqual(page.entries.map((e) => e.id), afterIt.map((a) => a.id));
    const until = await streams.read(stream, { end: since });
    assert.deepEqual(until.entries.map((e) => e.id), before.map((a) => a.id));
  });

  test('read of a bad id is INVALID_ARGUMENT, permanent', async () => {
    await assert.rejects(streams.read(streamName('read-bad'), { start: 'not-an-id' }), (error: unknown) => {
      assert.ok(error instanceof EchoMQError);
      assert.equal(error.code, status.INVALID_ARGUMENT);
      assert.equal(error.permanent, true);
      return true;
    });
  });

  // --- Trim -----------------------------------------------------------------

  test('trim is safe by default: it stops at what a group has not settled; ignoreGroups trims as asked', async () => {
    const stream = streamName('trim');
    const appended = await appendN(stream, 10);
    // A group that has read (and acked) the first 4: entries 4.. are undelivered.
    let handled = 0;
    const consumer = consumerOf(stream, { maxInFlight: 1, concurrency: 1 });
    const done = consumer.run(async () => {
      handled += 1;
      if (handled === 4) void consumer.stop();
    });
    await done;
    assert.equal(await fixture.pending(stream, GROUP), 0);

    const safe = await streams.trim(stream, { maxLen: 2 });
    assert.equal(safe.heldBackByGroups, true, 'held back by the group');
    assert.equal(safe.trimmed, 4, 'only the 4 acknowledged entries go');
    assert.equal(safe.appliedMinId, appended[4]!.streamId);
    assert.equal(await fixture.xlen(stream), 6);

    const forced = await streams.trim(stream, { minId: appended[8]!.streamId }, { ignoreGroups: true });
    assert.equal(forced.trimmed, 4);
    assert.equal(forced.heldBackByGroups, false);
    assert.equal(await fixture.xlen(stream), 2);

    await assert.rejects(streams.trim(stream, { maxLen: 0 }), (e: unknown) => e instanceof EchoMQError && e.code === status.INVALID_ARGUMENT);
  });

  test('trim before an instant removes what was appended earlier', async () => {
    const stream = streamName('trim-before');
    await appendN(stream, 3);
    await sleep(20);
    const cut = new Date();
    await sleep(20);
    await appendN(stream, 2);
    const result = await streams.trim(stream, { before: cut });
    assert.equal(result.trimmed, 3);
    assert.equal(await fixture.xlen(stream), 2);
  });

  // --- Admin ----------------------------------------------------------------

  test('describeGroup reports pending, consumers, the oldest pending entry and the stream length', async () => {
    const stream = streamName('describe');
    const appended = await appendN(stream, 5);
    const hold = new AbortController();
    let started = 0;
    const consumer = consumerOf(stream, { maxInFlight: 2, concurrency: 2 });
    const done = consumer.run(async () => {
      started += 1;
      await new Promise((resolve) => hold.signal.addEventListener('abort', resolve, { once: true }));
    });
    assert.ok(await eventually(() => started === 2));
    const info = await admin.describeGroup(stream, GROUP);
    assert.equal(info.stream, stream);
    assert.equal(info.group, GROUP);
    assert.equal(info.pending, 2);
    assert.equal(info.streamLength, 5);
    assert.equal(info.lag, 3);
    assert.equal(info.oldestPendingId, appended[0]!.streamId);
    assert.equal(typeof info.oldestPendingAgeMs, 'number');
    assert.equal(info.maxDeliveryCount, 1);
    assert.equal(info.lastDeliveredId, appended[1]!.streamId);
    const me = info.consumers.find((c) => c.name === CONSUMER_NAME);
    assert.ok(me, `our consumer among ${JSON.stringify(info.consumers)}`);
    assert.equal(me.pending, 2);
    assert.equal(typeof me.idleMs, 'number');
    assert.deepEqual(info.shards, []);
    hold.abort();
    await consumer.stop({ deadlineMs: 5_000 });
    await done;

    await assert.rejects(admin.describeGroup(stream, 'no-such-group'), (e: unknown) => e instanceof EchoMQError && e.code === status.NOT_FOUND && e.permanent);
  });

  test('describeGroup reports the keyed entries and busy keys of a group with per-key limits', async () => {
    const stream = streamName('busy-keys');
    const appended = await streams.appendBatch(stream, ['c0', 'c0', 'c1', 'c0'].map((customer) => ({ customer })));
    const hold = new AbortController();
    const consumer = consumerOf(stream, { flowControl: { maxInFlight: 8 }, keyField: 'customer', maxInFlightPerKey: 1 });
    const done = consumer.run(async () => {
      await new Promise((resolve) => hold.signal.addEventListener('abort', resolve, { once: true }));
    });
    let info: GroupInfo | undefined;
    assert.ok(
      await eventually(async () => {
        info = await admin.describeGroup(stream, GROUP).catch(() => undefined); // NOT_FOUND until subscribed
        return info?.keyedEntries === 4 && info.busyKeys.length === 2;
      }),
      `4 keyed entries over 2 busy keys: ${JSON.stringify(info)}`,
    );
    const [c0, c1] = info!.busyKeys;
    assert.deepEqual({ ...c0!, key: c0!.key.toString() }, { key: 'c0', entries: 3, headId: appended[0]!.streamId, headConsumer: CONSUMER_NAME });
    assert.deepEqual({ ...c1!, key: c1!.key.toString() }, { key: 'c1', entries: 1, headId: appended[2]!.streamId, headConsumer: CONSUMER_NAME });
    hold.abort();
    await consumer.stop({ deadlineMs: 5_000 });
    await done;
  });

  test('dead letters: listed page by page with their metadata, then replayed to the stream with their branded ids', async () => {
    const stream = streamName('dlq');
    const appended = await appendN(stream, 3);
    const consumer = consumerOf(stream);
    let n = 0;
    const done = consumer.run((d) => {
      d.deadLetter(`bad ${d.text('n')}`);
      if (++n === 3) void consumer.stop();
    });
    await done;
    assert.ok(await eventually(async () => (await fixture.xlen(`${stream}:dlq`)) === 3, 5_000));

    const page = await admin.listDeadLetters(stream, { count: 2 });
    assert.equal(page.deadLetters.length, 2);
    assert.notEqual(page.nextStartId, '');
    const first = page.deadLetters[0]!;
    assert.equal(first.entry.id, appended[0]!.id, 'the dead letter keeps its branded id');
    assert.equal(first.entry.text('n'), '0');
    assert.equal(first.sourceStream, stream);
    assert.equal(first.sourceId, appended[0]!.streamId);
    assert.equal(first.group, GROUP);
    assert.equal(first.attempts, 1);
    assert.equal(first.reason, 'bad 0');
    assert.ok(first.deadLetteredAt.getTime() > Date.now() - 60_000);
    const rest = await admin.listDeadLetters(stream, { startId: page.nextStartId, count: 2 });
    assert.deepEqual(rest.deadLetters.map((d) => d.entry.id), [appended[2]!.id]);
    assert.equal(rest.nextStartId, '');
    const all = [];
    for await (const d of admin.deadLetters(stream, { count: 1 })) all.push(d.entry.id);
    assert.deepEqual(all, appended.map((a) => a.id));

    const one = await admin.replayDeadLetters(stream, { ids: [first.entry.streamId, '1-1'] });
    assert.deepEqual(one.replayed.map((r) => r.id), [appended[0]!.id]);
    assert.equal(one.replayed[0]!.deadLetterId, first.entry.streamId);
    assert.deepEqual(one.notFoundIds, ['1-1']);
    const others = await admin.replayDeadLetters(stream);
    assert.equal(others.replayed.length, 2);
    assert.equal(await fixture.xlen(`${stream}:dlq`), 0);

    // The group reads the replayed copies: new stream ids, the same branded ids.
    const seen: Delivery[] = [];
    const again = consumerOf(stream);
    const doneAgain = again.run((d) => {
      seen.push(d);
      if (seen.length === 3) void again.stop();
    });
    await doneAgain;
    assert.deepEqual(seen.map((d) => d.id).sort(), appended.map((a) => a.id).sort());
    const replayedStreamIds = new Set([...one.replayed, ...others.replayed].map((r) => r.streamId));
    for (const d of seen) assert.ok(replayedStreamIds.has(d.streamId), `${d.streamId} is a replayed copy`);
  });

  // --- Subscription settings --------------------------------------------------

  test('maxDeliveries: an entry that keeps failing is dead-lettered after that many deliveries', async () => {
    const stream = streamName('max-deliveries');
    await appendN(stream, 1);
    const recorder = wire();
    const attempts: number[] = [];
    const consumer = consumerOf(stream, { maxDeliveries: 2, interceptors: [recorder.interceptor] });
    const done = consumer.run((d) => {
      attempts.push(d.attempts);
      throw new Error('always');
    });
    assert.ok(await eventually(async () => (await fixture.xlen(`${stream}:dlq`)) === 1, 10_000), 'dead-lettered');
    await sleep(500);
    await consumer.stop({ deadlineMs: 5_000 });
    await done;
    assert.deepEqual(attempts, [1, 2], 'handed out twice, never a third time');
    assert.equal(recorder.subscribes[0]!.maxDeliveries, 2);
    const [dead] = (await admin.listDeadLetters(stream)).deadLetters;
    assert.equal(dead!.reason, 'always');
    assert.equal(dead!.attempts, 2);
  });

  test('deadLetterStream: deadLetter() moves the entry to the stream named', async () => {
    const stream = streamName('dls');
    const dls = `${stream}:poison`;
    await appendN(stream, 1);
    const consumer = consumerOf(stream, { deadLetterStream: dls });
    const done = consumer.run((d) => {
      d.deadLetter('no');
      void consumer.stop();
    });
    await done;
    assert.ok(await eventually(async () => (await fixture.xlen(dls)) === 1, 5_000));
    assert.equal(await fixture.xlen(`${stream}:dlq`), 0);
    const page = await admin.listDeadLetters(stream, { deadLetterStream: dls });
    assert.equal(page.deadLetters[0]!.reason, 'no');
  });

  test('noAck: entries are never pending, and a failing handler loses its entry (at most once)', async () => {
    const stream = streamName('no-ack');
    await appendN(stream, 2);
    const recorder = wire();
    const errors: VerdictError[] = [];
    const release = new AbortController();
    const calls: number[] = [];
    const consumer = consumerOf(stream, { noAck: true, concurrency: 2, interceptors: [recorder.interceptor], onVerdictError: (e) => errors.push(e) });
    const done = consumer.run(async (d) => {
      calls.push(d.attempts);
      await new Promise((resolve) => release.signal.addEventListener('abort', resolve, { once: true }));
      if (d.text('n') === '0') throw new Error('lost on purpose');
    });
    assert.ok(await eventually(() => calls.length === 2));
    assert.equal(await fixture.pending(stream, GROUP), 0, 'nothing pending while the handlers run');
    release.abort();
    await sleep(600);
    await consumer.stop({ deadlineMs: 5_000 });
    await done;
    assert.deepEqual(calls, [1, 1], 'the failed entry never came back');
    assert.equal(recorder.subscribes[0]!.noAck, true);
    assert.deepEqual(recorder.failed, [], 'no Fail sent (the sidecar refuses one on a noAck call)');
    assert.equal(recorder.acked.length, 2, 'both slots freed with an Ack');
    assert.deepEqual(errors, []);
  });

  test('retry backoff: a fail without a delay comes back after the subscription\'s backoff, not the sidecar\'s', async () => {
    const stream = streamName('backoff');
    await appendN(stream, 1);
    const recorder = wire();
    const starts: number[] = [];
    const consumer = consumerOf(stream, { retryBackoffInitialMs: 1_200, retryBackoffMaxMs: 1_200, interceptors: [recorder.interceptor] });
    const done = consumer.run((d) => {
      starts.push(Date.now());
      if (d.attempts === 1) throw new Error('later');
      void consumer.stop();
    });
    await done;
    const gap = starts[1]! - starts[0]!;
    // The sidecar's own backoff here is 100 to 200 ms; 1.2 s jittered into its upper half is >= 600 ms.
    assert.ok(gap >= 550, `redelivered after ${gap} ms`);
    assert.deepEqual(recorder.subscribes[0]!.retryBackoffInitial, { seconds: '1', nanos: 200_000_000 });
  });

  test('ackDeadlineMs: a delivery not settled in time is delivered again while its handler still runs', async () => {
    const stream = streamName('ack-deadline');
    await appendN(stream, 1);
    const errors: VerdictError[] = [];
    const attempts: number[] = [];
    const release = new AbortController();
    const consumer = consumerOf(stream, { ackDeadlineMs: 300, concurrency: 2, onVerdictError: (e) => errors.push(e) });
    const done = consumer.run(async (d) => {
      attempts.push(d.attempts);
      if (d.attempts === 1) await new Promise((resolve) => release.signal.addEventListener('abort', resolve, { once: true }));
    });
    assert.ok(await eventually(() => attempts.length === 2, 10_000), `attempts so far: ${attempts}`);
    assert.deepEqual(attempts, [1, 2]);
    release.abort();
    await sleep(200);
    await consumer.stop({ deadlineMs: 5_000 });
    await done;
    assert.equal(await fixture.pending(stream, GROUP), 0);
    assert.deepEqual(errors.map((e) => e.code), ['UNKNOWN_ID'], 'the late ack of the expired delivery is not applied');
  });

  // --- LEASE_LOST -------------------------------------------------------------

  test('LEASE_LOST: the signal aborts with a LeaseLostError, a handler that then throws sends no Fail, the hook sees it', async () => {
    const stream = streamName('lease');
    const [entry] = await appendN(stream, 1);
    const recorder = wire();
    const errors: VerdictError[] = [];
    const seen: { attempts: number; reason?: unknown; leaseLost?: boolean }[] = [];
    const consumer = consumerOf(stream, { interceptors: [recorder.interceptor], onVerdictError: (e) => errors.push(e) });
    const done = consumer.run(async (d) => {
      const record: (typeof seen)[number] = { attempts: d.attempts };
      seen.push(record);
      if (d.attempts > 1) return;
      await new Promise((resolve) => d.signal.addEventListener('abort', resolve, { once: true }));
      record.reason = d.signal.reason;
      record.leaseLost = d.leaseLost;
      assert.equal(d.settled, true);
      assert.equal(d.ack(), false, 'settling after LEASE_LOST does nothing');
      throw new Error('gave up');
    });
    assert.ok(await eventually(() => seen.length === 1));
    await fixture.redis.command('XCLAIM', stream, GROUP, 'thief', '0', entry!.streamId);
    assert.ok(await eventually(() => errors.some((e) => e.code === 'LEASE_LOST'), 10_000), 'LEASE_LOST surfaced');
    assert.ok(await eventually(() => seen.length === 2, 15_000), 'reclaimed from the idle thief and delivered again');
    await consumer.stop({ deadlineMs: 5_000 });
    await done;
    assert.ok(seen[0]!.reason instanceof LeaseLostError, `aborted with ${String(seen[0]!.reason)}`);
    assert.equal((seen[0]!.reason as LeaseLostError).id, entry!.id);
    assert.equal(seen[0]!.leaseLost, true);
    assert.deepEqual(recorder.failed, [], 'no Fail for the lost delivery');
    assert.deepEqual(recorder.acked, [entry!.id], 'one Ack: the redelivery');
    assert.deepEqual(errors.map((e) => e.code), ['LEASE_LOST']);
    assert.equal(await fixture.pending(stream, GROUP), 0);
  });
});
