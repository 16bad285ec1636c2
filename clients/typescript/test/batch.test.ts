// Batched frames, coalesced acks and the batch handler, against a real
// redis-server and sidecar: what the wire carries is recorded by an
// interceptor, what Redis holds by XPENDING.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { InterceptingCall, status, type Interceptor } from '@grpc/grpc-js';
import { CallEndedError, Consumer, EchoMQError, Producer, type ConsumerOptions, type Delivery, type Verdict } from '@echomq/client';
import { eventually, Fixture } from './support/fixture.js';

const GROUP = 'g';
let unique = 0;
const streamName = (what: string) => `ts:batch:${what}:${process.pid}:${++unique}`;

interface DeliveryMessage {
  id: string;
}
interface ResponseMessage {
  delivery?: DeliveryMessage | null;
  batch?: { deliveries: DeliveryMessage[] } | null;
}
interface RequestMessage {
  subscribe?: { maxBatch?: number; maxInFlight?: number } | null;
  ack?: { ids: string[] } | null;
  fail?: { id: string; reason: string; deadLetter: boolean } | null;
}

/**
 * Records the Consume frames a consumer receives (the ids of each, and whether
 * it was a DeliveryBatch) and the Subscribe, Ack and Fail messages it sends,
 * over every call of the consumer.
 */
function wire() {
  const frames: { batch: boolean; ids: string[] }[] = [];
  const subscribes: { maxBatch?: number; maxInFlight?: number }[] = [];
  const ackMessages: string[][] = [];
  const fails: { id: string; reason: string; deadLetter: boolean }[] = [];
  const interceptor: Interceptor = (options, nextCall) =>
    new InterceptingCall(nextCall(options), {
      start: (metadata, _listener, next) =>
        next(metadata, {
          onReceiveMessage: (message: ResponseMessage, nextMessage) => {
            if (message.delivery) frames.push({ batch: false, ids: [message.delivery.id] });
            if (message.batch) frames.push({ batch: true, ids: message.batch.deliveries.map((d) => d.id) });
            nextMessage(message);
          },
        }),
      sendMessage: (message: RequestMessage, next) => {
        if (message.subscribe) subscribes.push({ ...message.subscribe });
        if (message.ack) ackMessages.push([...message.ack.ids]);
        if (message.fail) fails.push({ id: message.fail.id, reason: message.fail.reason, deadLetter: message.fail.deadLetter });
        next(message);
      },
    });
  const received = () => frames.reduce((n, f) => n + f.ids.length, 0);
  const acked = () => {
    const counts = new Map<string, number>();
    for (const ids of ackMessages) for (const id of ids) counts.set(id, (counts.get(id) ?? 0) + 1);
    return counts;
  };
  return { frames, subscribes, ackMessages, fails, interceptor, received, acked };
}

describe('batched frames and coalesced acks', () => {
  let fixture: Fixture;
  let producer: Producer;

  before(async () => {
    fixture = await Fixture.start({
      consumerName: 'ts-batch-tests',
      args: ['--retry-backoff-initial-ms', '100', '--retry-backoff-max-ms', '1000', '--shutdown-grace-ms', '1000'],
    });
    producer = new Producer({ target: fixture.target });
  });

  after(async () => {
    producer?.close();
    await fixture?.stop();
  });

  /** Appends n entries (field n = 0…n-1) to a fresh stream; their branded ids in order. */
  async function setup(what: string, n: number): Promise<{ stream: string; ids: string[] }> {
    const stream = streamName(what);
    const ids: string[] = [];
    for (let from = 0; from < n; from += 500) {
      const fields = Array.from({ length: Math.min(500, n - from) }, (_, i) => ({ n: String(from + i) }));
      ids.push(...(await producer.appendBatch(stream, fields)).map((r) => r.id));
    }
    return { stream, ids };
  }

  /** The branded ids of the group's pending entries. */
  async function pendingIds(stream: string): Promise<Set<string>> {
    const byStreamId = new Map((await fixture.entries(stream)).map((e) => [e.streamId, e.fields.get('id')!.toString()]));
    const rows = (await fixture.redis.command('XPENDING', stream, GROUP, '-', '+', '10000')) as Buffer[][];
    return new Set(rows.map((row) => byStreamId.get(row[0]!.toString())!));
  }

  function consumerOf(stream: string, recorder: ReturnType<typeof wire>, options: Partial<ConsumerOptions> = {}): Consumer {
    return new Consumer({ target: fixture.target, stream, group: GROUP, start: 'beginning', interceptors: [recorder.interceptor], ...options });
  }

  test('only DeliveryBatch frames of at most maxBatch arrive; each entry is handled and acked once, many ids per Ack', async () => {
    const n = 600;
    const maxBatch = 64;
    const { stream, ids } = await setup('frames', n);
    const w = wire();
    const handled = new Map<string, number>();
    const consumer = consumerOf(stream, w, { maxInFlight: 256, maxBatch });
    const running = consumer.run((d) => void handled.set(d.id, (handled.get(d.id) ?? 0) + 1));
    assert.ok(
      await eventually(async () => w.received() >= n && (await fixture.pending(stream, GROUP)) === 0, 30_000),
      `received ${w.received()} of ${n}`,
    );
    await consumer.stop({ deadlineMs: 5_000 });
    await running;

    assert.equal(w.subscribes[0]?.maxBatch, maxBatch);
    assert.ok(w.frames.length > 0);
    for (const [i, frame] of w.frames.entries()) {
      assert.ok(frame.batch, `frame ${i} is a single Delivery: the consumer must ask for batches`);
      assert.ok(frame.ids.length >= 1 && frame.ids.length <= maxBatch, `frame ${i} holds ${frame.ids.length} deliveries`);
    }
    assert.ok(Math.max(...w.frames.map((f) => f.ids.length)) >= 2, 'some frame holds more than one delivery');
    for (const id of ids) assert.equal(handled.get(id), 1, `${id} handled once`);
    const acked = w.acked();
    for (const id of ids) assert.equal(acked.get(id), 1, `${id} acked once`);
    assert.equal(w.ackMessages.reduce((sum, m) => sum + m.length, 0), n, 'no id acked twice');
    // One Ack per delivery would be 600 messages; coalesced, one carries up to
    // a quarter of the 256 credit.
    const largest = Math.max(...w.ackMessages.map((m) => m.length));
    assert.ok(w.ackMessages.length <= n / 8 && largest >= 8, `${w.ackMessages.length} Ack messages (largest ${largest} ids) for ${n} acks`);
    assert.ok(largest <= 256 / 4, `an Ack message of ${largest} ids, above a quarter of max_in_flight`);
  });

  test('the subscribe asks for 256 per frame by default, maxInFlight when smaller; maxBatch 1 gets single deliveries; above 4096 is refused', async () => {
    const asked: (number | undefined)[] = [];
    for (const options of [{}, { maxInFlight: 16 }, { maxInFlight: 1000, maxBatch: 300 }] as Partial<ConsumerOptions>[]) {
      const w = wire();
      let subscribed = false;
      const consumer = consumerOf(streamName('defaults'), w, { ...options, start: 'new', onSubscribed: () => (subscribed = true) });
      const running = consumer.run(() => undefined);
      assert.ok(await eventually(() => subscribed, 10_000));
      await consumer.stop({ deadlineMs: 5_000 });
      await running;
      asked.push(w.subscribes[0]?.maxBatch);
    }
    assert.deepEqual(asked, [256, 16, 300]);

    const n = 20;
    const { stream } = await setup('single', n);
    const w = wire();
    const consumer = consumerOf(stream, w, { maxBatch: 1 });
    const running = consumer.run(() => undefined);
    assert.ok(await eventually(async () => w.received() >= n && (await fixture.pending(stream, GROUP)) === 0, 20_000));
    await consumer.stop({ deadlineMs: 5_000 });
    await running;
    assert.deepEqual(new Set(w.frames.map((f) => f.batch)), new Set([false]), 'maxBatch 1: single Delivery frames only');

    const tooBig = consumerOf(streamName('too-big'), wire(), { maxBatch: 5000, start: 'new' });
    await assert.rejects(tooBig.run(() => undefined), (e: unknown) => e instanceof EchoMQError && e.code === status.INVALID_ARGUMENT);
    assert.throws(() => consumerOf('s', wire(), { maxBatch: 0 }), RangeError);
  });

  test('a graceful stop flushes the coalesced acks before it completes', async () => {
    // With an hour-long linger and more deliveries held than acked, nothing but
    // the stop sends the acks.
    const n = 20;
    const handledBeforeStop = 10;
    const { stream, ids } = await setup('stop-flush', n);
    const w = wire();
    const handled: string[] = [];
    let acksBeforeStop = -1;
    let pendingBeforeStop = -1;
    const consumer = consumerOf(stream, w, { maxInFlight: 400, concurrency: 1, ackLingerMs: 3_600_000 });
    const running = consumer.run(async (d) => {
      if (!(await eventually(() => w.received() >= n, 10_000))) throw new Error('not every entry arrived');
      handled.push(d.id);
      if (handled.length === handledBeforeStop) {
        await sleep(100); // time for anything that would go out early to go out
        acksBeforeStop = w.ackMessages.length;
        pendingBeforeStop = await fixture.pending(stream, GROUP);
        void consumer.stop({ deadlineMs: 10_000 });
      }
    });
    await running;
    assert.equal(acksBeforeStop, 0, 'the acks wait for the linger');
    assert.equal(pendingBeforeStop, n);
    assert.equal(handled.length, handledBeforeStop, 'the stop starts no new handler');
    const pending = await pendingIds(stream);
    assert.equal(pending.size, n - handledBeforeStop, 'the handled entries were acked by the stop');
    for (const id of handled) assert.ok(!pending.has(id), `${id} was handled before the stop and is still pending`);
    const acked = w.acked();
    for (const id of ids) assert.equal(acked.get(id) ?? 0, handled.includes(id) ? 1 : 0, id);
    assert.equal(w.ackMessages.length, 1, 'one Ack message carries them all');
  });

  test('a disconnect with a partly acked batch delivers again exactly the unacked entries', async () => {
    const n = 10;
    const { stream, ids } = await setup('partly-acked', n);
    const w = wire();
    const first = consumerOf(stream, w);
    const firstRun = first.run(async (d) => {
      if (Number(d.text('n')) % 2 === 0) return; // acked
      // The odd ones are held when the call breaks.
      await new Promise((resolve) => d.signal.addEventListener('abort', resolve, { once: true }));
      throw new Error('the call ended');
    });
    assert.ok(
      await eventually(async () => (await fixture.pending(stream, GROUP)) === n / 2, 20_000),
      `XPENDING ${await fixture.pending(stream, GROUP)}, want ${n / 2}: the even entries' acks (one linger window)`,
    );
    first.close(); // an abrupt end: the call breaks with the odd entries held
    await firstRun;
    const firstAcks = w.acked();
    assert.ok(
      w.frames.some((f) => f.batch && f.ids.some((id) => firstAcks.has(id)) && f.ids.some((id) => !firstAcks.has(id))),
      'some batch was partly acked',
    );

    const again = new Map<string, number>();
    const second = consumerOf(stream, wire());
    const secondRun = second.run((d) => void again.set(d.id, d.attempts));
    assert.ok(await eventually(async () => (await fixture.pending(stream, GROUP)) === 0, 20_000), 'the unacked entries came back and were acked');
    await sleep(300); // room for a wrong extra delivery
    await second.stop({ deadlineMs: 5_000 });
    await secondRun;
    for (const [i, id] of ids.entries()) {
      assert.equal(again.has(id), i % 2 === 1, `entry ${i}: redelivered ${again.has(id)}, want only the unacked (odd) ones`);
      if (i % 2 === 1) assert.equal(again.get(id), 2, `entry ${i}: attempts`);
      assert.ok((firstAcks.get(id) ?? 0) <= 1, `entry ${i} acked twice on the first call`);
    }
  });

  test('a batch handler gets arrays of at most maxBatch and each entry is settled by its verdict', async () => {
    const n = 60;
    const maxBatch = 32;
    const { stream, ids } = await setup('batch-handler', n);
    const w = wire();
    const sizes: number[] = [];
    const attempts = new Map<string, number[]>();
    const consumer = consumerOf(stream, w, { maxBatch });
    const running = consumer.runBatch(async (batch) => {
      sizes.push(batch.length);
      await sleep(5);
      return batch.map((d): Verdict => {
        attempts.set(d.id, [...(attempts.get(d.id) ?? []), d.attempts]);
        const k = Number(d.text('n'));
        if (k === 59) return { deadLetter: 'poison' };
        if (d.attempts > 1) return 'ack';
        if (k === 58) return { fail: 'later', retryAfterMs: 50 };
        if (k % 3 === 0) return new Error('every third fails once');
        return undefined;
      });
    });
    assert.ok(
      await eventually(async () => attempts.size === n && (await fixture.pending(stream, GROUP)) === 0, 20_000),
      `${attempts.size} of ${n} seen, XPENDING ${await fixture.pending(stream, GROUP)}`,
    );
    await consumer.stop({ deadlineMs: 5_000 });
    await running;

    assert.ok(Math.max(...sizes) >= 2 && Math.max(...sizes) <= maxBatch, `batch sizes ${sizes}`);
    const acked = w.acked();
    for (const [k, id] of ids.entries()) {
      const failsOnce = k === 58 || (k % 3 === 0 && k !== 59);
      assert.deepEqual(attempts.get(id), failsOnce ? [1, 2] : [1], `entry ${k}: attempts`);
      assert.equal(acked.get(id) ?? 0, k === 59 ? 0 : 1, `entry ${k}: acks`);
    }
    const failed = (k: number) => w.fails.filter((f) => f.id === ids[k]);
    assert.deepEqual(failed(3), [{ id: ids[3], reason: 'every third fails once', deadLetter: false }]);
    assert.deepEqual(failed(58), [{ id: ids[58], reason: 'later', deadLetter: false }]);
    assert.deepEqual(failed(59), [{ id: ids[59], reason: 'poison', deadLetter: true }]);
    assert.equal(await fixture.xlen(`${stream}:dlq`), 1);
    // Every Fail goes out after the acks given before it, so the 22 fails and
    // dead letters interleaved with the acks split them; still not one per id.
    const ackIds = w.ackMessages.reduce((sum, m) => sum + m.length, 0);
    assert.ok(
      w.ackMessages.length < ackIds && Math.max(...w.ackMessages.map((m) => m.length)) >= 2,
      `${w.ackMessages.length} Ack messages for ${ackIds} acks: not coalesced`,
    );
  });

  test('a batch handler that throws, or answers the wrong number of verdicts, fails every entry it did not settle', async () => {
    const { stream, ids } = await setup('batch-throws', 6);
    const w = wire();
    let calls = 0;
    const consumer = consumerOf(stream, w, { retryBackoffInitialMs: 50, retryBackoffMaxMs: 50 });
    const running = consumer.runBatch((batch) => {
      calls++;
      if (batch.some((d) => d.attempts === 1)) {
        batch[0]!.ack(); // settled by the handler itself: keeps its ack
        if (calls === 1) throw new Error('bulk write failed');
        return [];
      }
      return undefined;
    });
    assert.ok(await eventually(async () => w.acked().size === ids.length && (await fixture.pending(stream, GROUP)) === 0, 20_000));
    await consumer.stop({ deadlineMs: 5_000 });
    await running;
    const acked = w.acked();
    for (const id of ids) assert.equal(acked.get(id), 1, id);
    assert.ok(w.fails.some((f) => f.reason === 'bulk write failed'));
    assert.ok(w.fails.every((f) => f.id !== ids[0]), 'the entry the handler acked itself was not failed');
  });

  test('a stop past its deadline still sends the acks waiting in the window; only the stuck handler loses its verdict', async () => {
    // 100 in flight and a 30 s linger: an Ack carries at most 25 ids, so of
    // the 49 acks given, 24 still wait in the window when stop() is called.
    const n = 50;
    const { stream, ids } = await setup('stop-deadline-flush', n);
    const w = wire();
    let returned = 0;
    let stuck: Delivery | undefined;
    let stuckReason: unknown;
    let stuckReturned = false;
    const consumer = consumerOf(stream, w, { maxInFlight: 100, ackLingerMs: 30_000 });
    const running = consumer.run(async (d) => {
      if (d.text('n') === '0') {
        stuck = d;
        await new Promise((resolve) => d.signal.addEventListener('abort', resolve, { once: true }));
        stuckReason = d.signal.reason;
        stuckReturned = true;
        return; // gave up on the aborted signal: this must not ack it
      }
      returned++;
    });
    assert.ok(await eventually(() => returned === n - 1 && stuck !== undefined, 20_000), `${returned} handlers returned, want ${n - 1}`);
    await sleep(1_500);
    const before = await fixture.pending(stream, GROUP);
    assert.ok(before > 1, `XPENDING ${before} before the stop: the test needs acks waiting in the window`);
    const started = Date.now();
    await consumer.stop({ deadlineMs: 2_000 });
    const took = Date.now() - started;
    await running;
    assert.ok(took >= 1_900 && took < 4_000, `stop took ${took} ms with a 2 s deadline`);
    assert.ok(await eventually(() => stuckReturned, 2_000), 'the stuck handler saw its signal abort');
    assert.ok(stuckReason instanceof CallEndedError, `the stuck handler's signal aborted with ${String(stuckReason)}`);
    // stop() has resolved: what the sidecar applied is in Redis already.
    const pending = await pendingIds(stream);
    assert.equal(pending.size, 1, `XPENDING ${pending.size} after the stop (${before} before), want 1: the acks already given were dropped`);
    assert.ok(pending.has(stuck!.id), 'the stuck entry stays pending');
    const acked = w.acked();
    for (const id of ids) assert.equal(acked.get(id) ?? 0, id === stuck!.id ? 0 : 1, id);
    assert.equal(stuck!.ack(), false, 'the stuck delivery can no longer be acked');
  });

  // Last in this suite: it kills and restarts the sidecar.
  test("a broken call's waiting acks are dropped, never sent on the next call", async () => {
    const n = 4;
    const { stream, ids } = await setup('broken-acks', n);
    const w = wire();
    let subscriptions = 0;
    const seen: { id: string; attempts: number }[] = [];
    const consumer = consumerOf(stream, w, {
      maxInFlight: 400,
      ackLingerMs: 3_600_000,
      onSubscribed: () => void subscriptions++,
    });
    const running = consumer.run(async (d) => {
      seen.push({ id: d.id, attempts: d.attempts });
      // On the first call, two return (their acks wait in the window: 4 held)
      // and two hang until the call breaks.
      if (d.attempts === 1 && Number(d.text('n')) >= 2) {
        await new Promise((resolve) => d.signal.addEventListener('abort', resolve, { once: true }));
        throw new Error('the call ended');
      }
    });
    assert.ok(await eventually(() => seen.length === n, 10_000));
    await sleep(100);
    assert.equal(w.ackMessages.length, 0, 'the acks wait for the linger');
    await fixture.killSidecar();
    await fixture.startSidecar();
    assert.ok(await eventually(() => subscriptions >= 2 && seen.length === 2 * n, 30_000), JSON.stringify(seen));
    assert.ok(await eventually(async () => (await fixture.pending(stream, GROUP)) === 0, 10_000), 'the redeliveries were acked');
    await consumer.stop({ deadlineMs: 5_000 });
    await running;
    const acked = w.acked();
    for (const id of ids) assert.equal(acked.get(id), 1, `${id}: acked once, on the new call`);
    assert.deepEqual(
      seen.filter((s) => s.attempts === 2).map((s) => s.id).sort(),
      [...ids].sort(),
      'every entry came back, the ones acked in the broken window included',
    );
  });
});
