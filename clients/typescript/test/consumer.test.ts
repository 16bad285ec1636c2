// Behaviours of the client beyond the shared conformance scenarios, each
// against a real redis-server and sidecar.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { InterceptingCall, status, type Interceptor } from '@grpc/grpc-js';
import { Consumer, EchoMQError, PoisonError, Producer, TransientError, type AppendResult, type Delivery, type ReconnectInfo } from '@echomq/client';
import { eventually, Fixture } from './support/fixture.js';

const GROUP = 'g';
let unique = 0;
const streamName = (what: string) => `ts:${what}:${process.pid}:${++unique}`;

/** Counts the Ack ids and Fail frames a consumer sends, and logs the kind of every frame in order. */
function frameCounter() {
  const acks = new Map<string, number>();
  const fails: { id: string; reason: string; deadLetter: boolean }[] = [];
  const failKinds = new Map<string, string>(); // id → the wire kind of its Fail
  const kinds: string[] = [];
  type Sent = { ack?: { ids: string[] } | null; fail?: { id: string; reason: string; deadLetter: boolean; kind?: string } | null };
  const interceptor: Interceptor = (options, nextCall) =>
    new InterceptingCall(nextCall(options), {
      sendMessage: (message: Sent, next) => {
        kinds.push(Object.entries(message).find(([, value]) => value != null)?.[0] ?? '?');
        for (const id of message.ack?.ids ?? []) acks.set(id, (acks.get(id) ?? 0) + 1);
        if (message.fail) {
          fails.push({ id: message.fail.id, reason: message.fail.reason, deadLetter: message.fail.deadLetter });
          failKinds.set(message.fail.id, `${message.fail.kind ?? 'unset'}${message.fail.deadLetter ? '+dead_letter' : ''}`);
        }
        next(message);
      },
    });
  return { acks, fails, failKinds, kinds, interceptor };
}

/** XINFO GROUPS <stream>, the named group's fields (`last-delivered-id`, `entries-read`, …). */
async function groupInfo(fixture: Fixture, stream: string, group: string): Promise<Map<string, unknown>> {
  const groups = (await fixture.redis.command('XINFO', 'GROUPS', stream)) as unknown[][];
  for (const flat of groups) {
    const info = new Map<string, unknown>();
    for (let i = 0; i + 1 < flat.length; i += 2) {
      const value = flat[i + 1];
      info.set(String(flat[i]), Buffer.isBuffer(value) ? value.toString('utf8') : value);
    }
    if (info.get('name') === group) return info;
  }
  throw new Error(`no group ${group} on ${stream}`);
}

describe('consumer and producer against a sidecar', () => {
  let fixture: Fixture;
  let producer: Producer;

  before(async () => {
    fixture = await Fixture.start({
      consumerName: 'ts-client-tests',
      args: ['--retry-backoff-initial-ms', '100', '--retry-backoff-max-ms', '1000', '--shutdown-grace-ms', '1000'],
    });
    producer = new Producer({ target: fixture.target });
  });

  after(async () => {
    producer?.close();
    await fixture?.stop();
  });

  test('a group start is required, checked before any call', () => {
    assert.throws(
      () => new Consumer({ target: fixture.target, stream: 's', group: GROUP } as never),
      /start is required/,
    );
  });

  test('a subscribe the sidecar refuses rejects run() with INVALID_ARGUMENT and is not retried', async () => {
    const reconnects: ReconnectInfo[] = [];
    const consumer = new Consumer({
      target: fixture.target,
      stream: streamName('invalid'),
      group: GROUP,
      start: 'beginning',
      maxInFlight: 1_000_000,
      onReconnect: (info) => reconnects.push(info),
    });
    const error = await consumer.run(() => undefined).then(
      () => assert.fail('run() resolved'),
      (e: unknown) => e,
    );
    assert.ok(error instanceof EchoMQError, String(error));
    assert.equal(error.code, status.INVALID_ARGUMENT);
    assert.equal(error.permanent, true);
    assert.match(error.message, /max_in_flight/);
    assert.equal(reconnects.length, 0);
  });

  test('a stream key holding another type rejects run() with FAILED_PRECONDITION', async () => {
    const stream = streamName('wrongtype');
    await fixture.redis.command('SET', stream, 'not a stream');
    const consumer = new Consumer({ target: fixture.target, stream, group: GROUP, start: 'new' });
    await assert.rejects(consumer.run(() => undefined), (e: unknown) => e instanceof EchoMQError && e.code === status.FAILED_PRECONDITION);
  });

  test('an append naming the reserved field is INVALID_ARGUMENT; a batch keeps request order', async () => {
    const stream = streamName('append');
    await assert.rejects(producer.append(stream, { id: 'mine' }), (e: unknown) => e instanceof EchoMQError && e.code === status.INVALID_ARGUMENT);
    const results = await producer.appendBatch(stream, [{ n: '1' }, { n: '2' }, new Map([['n', Buffer.from('3')]])], { maxLen: 1000 });
    assert.equal(results.length, 3);
    assert.deepEqual([...results].sort((a, b) => (a.id < b.id ? -1 : 1)), results, 'ids ascend in request order');
    const stored = await fixture.entries(stream);
    assert.deepEqual(stored.map((e) => e.streamId), results.map((r) => r.streamId));
    assert.deepEqual(stored.map((e) => e.fields.get('n')?.toString()), ['1', '2', '3']);
  });

  test('an explicit fail wins over the handler throwing afterwards: one Fail, then one Ack on redelivery', async () => {
    const stream = streamName('explicit');
    const { id } = await producer.append(stream, { n: '1' });
    const frames = frameCounter();
    const attempts: number[] = [];
    const consumer = new Consumer({ target: fixture.target, stream, group: GROUP, start: 'beginning', interceptors: [frames.interceptor] });
    const running = consumer.run((d) => {
      attempts.push(d.attempts);
      if (d.attempts === 1) {
        assert.equal(d.fail('explicit', { retryAfterMs: 50 }), true);
        assert.equal(d.ack(), false, 'a settled delivery is not settled again');
        throw new Error('thrown after settling');
      }
    });
    assert.ok(await eventually(() => attempts.length >= 2, 10_000));
    await consumer.stop({ deadlineMs: 5_000 });
    await running;
    assert.deepEqual(frames.fails, [{ id, reason: 'explicit', deadLetter: false }]);
    assert.equal(frames.acks.get(id), 1);
    assert.ok(await eventually(async () => (await fixture.pending(stream, GROUP)) === 0, 5_000));
  });

  test('every fail carries the kind it means: by the error class thrown, or the explicit option', async () => {
    const stream = streamName('kinds');
    const cases: Record<string, { act: (d: Delivery) => unknown; wire: string }> = {
      error: { act: () => { throw new Error('bad row'); }, wire: 'FAIL_KIND_MESSAGE' },
      transient: { act: () => { throw new TransientError('the database is down'); }, wire: 'FAIL_KIND_TRANSIENT' },
      poison: { act: () => { throw new PoisonError('cannot parse'); }, wire: 'FAIL_KIND_POISON' },
      failPlain: { act: (d) => d.fail('later', { retryAfterMs: 50 }), wire: 'FAIL_KIND_MESSAGE' },
      failTransient: { act: (d) => d.fail('rate limited', { retryAfterMs: 50, kind: 'transient' }), wire: 'FAIL_KIND_TRANSIENT' },
      failPoison: { act: (d) => d.fail('cannot parse', { kind: 'poison' }), wire: 'FAIL_KIND_POISON' },
      deadLetter: { act: (d) => d.deadLetter('rule broken'), wire: 'FAIL_KIND_POISON+dead_letter' },
    };
    const ids = new Map<string, string>();
    for (const name of Object.keys(cases)) ids.set((await producer.append(stream, { case: name })).id, name);
    const frames = frameCounter();
    const seen = new Set<string>();
    const consumer = new Consumer({ target: fixture.target, stream, group: GROUP, start: 'beginning', interceptors: [frames.interceptor] });
    const running = consumer.run((d) => {
      if (seen.has(d.id)) return; // the retried ones are acked the second time
      seen.add(d.id);
      return cases[d.text('case')!]!.act(d);
    });
    assert.ok(await eventually(() => frames.failKinds.size === ids.size, 10_000));
    await consumer.stop({ deadlineMs: 5_000 });
    await running;
    for (const [id, name] of ids) assert.equal(frames.failKinds.get(id), cases[name]!.wire, name);
  });

  test('stop past its deadline abandons a hanging handler: its signal aborts and the entry stays pending', async () => {
    const stream = streamName('deadline');
    await producer.append(stream, { n: '1' });
    let held: Delivery | undefined;
    const consumer = new Consumer({ target: fixture.target, stream, group: GROUP, start: 'beginning' });
    const running = consumer.run(async (d) => {
      held = d;
      await new Promise((resolve) => d.signal.addEventListener('abort', resolve, { once: true }));
    });
    assert.ok(await eventually(() => held !== undefined, 10_000));
    const started = Date.now();
    await consumer.stop({ deadlineMs: 300 });
    const took = Date.now() - started;
    await running;
    assert.ok(took >= 280 && took < 2_000, `stop took ${took} ms`);
    assert.equal(held!.signal.aborted, true);
    assert.equal(held!.ack(), false, 'the call is gone: nothing to ack on');
    assert.equal(await fixture.pending(stream, GROUP), 1, 'the entry stays pending for redelivery');
  });

  test('a consumer runs once; stop() and close() before run() are harmless', async () => {
    const idle = new Consumer({ target: fixture.target, stream: streamName('idle'), group: GROUP, start: 'new' });
    await idle.stop();
    idle.close();
    await assert.rejects(idle.run(() => undefined), /runs once/);
  });

  test('run({ signal }) stops gracefully when the signal aborts', async () => {
    const stream = streamName('signal');
    const controller = new AbortController();
    let subscribed = false;
    const consumer = new Consumer({ target: fixture.target, stream, group: GROUP, start: 'new', onSubscribed: () => (subscribed = true) });
    const running = consumer.run(() => undefined, { signal: controller.signal });
    assert.ok(await eventually(() => subscribed, 10_000));
    controller.abort();
    await running;
  });

  test('stop() drains first: the credit its last ack frees reads nothing more into the PEL', async () => {
    // Without a Drain, the ack of the running handler frees credit and the
    // sidecar reads the next entry (XREADGROUP >) before the call closes: it
    // then stays pending, never handed to a handler. The handler acks
    // explicitly and returns a little later, so the ack travels well before
    // the half-close (an automatic ack goes out in the same tick as the
    // half-close, which narrows the window but does not close it).
    const stream = streamName('drain');
    const appended = await producer.appendBatch(stream, [{ n: '1' }, { n: '2' }, { n: '3' }]);
    const frames = frameCounter();
    const calls: string[] = [];
    const consumer = new Consumer({
      target: fixture.target,
      stream,
      group: GROUP,
      start: 'beginning',
      maxInFlight: 1,
      interceptors: [frames.interceptor],
    });
    const running = consumer.run(async (d) => {
      calls.push(d.streamId);
      await sleep(300);
      d.ack();
      await sleep(200);
    });
    assert.ok(await eventually(() => calls.length === 1, 10_000));
    await consumer.stop({ deadlineMs: 5_000 });
    await running;
    await sleep(300); // a read the last ack would have started has landed by now
    assert.deepEqual(calls, [appended[0]!.streamId], 'exactly one handler call');
    assert.deepEqual(frames.kinds, ['subscribe', 'drain', 'ack'], 'Drain goes out before the verdict');
    assert.ok(await eventually(async () => (await fixture.pending(stream, GROUP)) === 0, 5_000), 'XPENDING 0');
    const info = await groupInfo(fixture, stream, GROUP);
    assert.equal(info.get('last-delivered-id'), appended[0]!.streamId, 'the other entries were never read');
    assert.equal(info.get('entries-read'), 1);
  });

  for (const how of ['stop()', "run's signal"] as const) {
    test(`a handler that triggers a stop via ${how} before its first await still has its ack sent`, async () => {
      // The handler must count as in flight before it is called: otherwise
      // stop() finds nothing running, half-closes at once, and the ack queued
      // when the handler returns is refused, leaving the entry pending.
      const stream = streamName('stop-in-handler');
      const appended = await producer.appendBatch(stream, [{ n: '1' }, { n: '2' }, { n: '3' }]);
      const frames = frameCounter();
      const calls: string[] = [];
      const controller = new AbortController();
      const consumer = new Consumer({
        target: fixture.target,
        stream,
        group: GROUP,
        start: 'beginning',
        maxInFlight: 1,
        concurrency: 1,
        stopDeadlineMs: 5_000,
        interceptors: [frames.interceptor],
      });
      const running = consumer.run(
        (d) => {
          calls.push(d.streamId);
          if (calls.length === 1) {
            if (how === 'stop()') void consumer.stop({ deadlineMs: 5_000 });
            else controller.abort();
          }
        },
        { signal: controller.signal },
      );
      await running;
      assert.deepEqual(calls, [appended[0]!.streamId], 'exactly one handler call');
      assert.equal(frames.acks.get(appended[0]!.id), 1, 'the ack went out');
      assert.ok(await eventually(async () => (await fixture.pending(stream, GROUP)) === 0, 2_000), 'XPENDING 0');
    });
  }

  // Last in this suite: it kills and restarts the sidecar.
  test('after a reconnect, a delivery of the broken call is not acked on the new call; its redelivery is', async () => {
    const stream = streamName('reconnect');
    const { id } = await producer.append(stream, { n: '1' });
    const frames = frameCounter();
    let subscriptions = 0;
    const reconnects: ReconnectInfo[] = [];
    const seen: { attempts: number; ackSent: boolean; aborted: boolean }[] = [];
    let firstStarted = false;
    const consumer = new Consumer({
      target: fixture.target,
      stream,
      group: GROUP,
      start: 'beginning',
      concurrency: 2,
      interceptors: [frames.interceptor],
      onSubscribed: () => void subscriptions++,
      onReconnect: (info) => reconnects.push(info),
    });
    const running = consumer.run(async (d) => {
      if (d.attempts === 1) {
        firstStarted = true;
        // Hold the first delivery across the sidecar's restart, then try to settle it.
        await eventually(() => subscriptions >= 2, 30_000);
        seen.push({ attempts: d.attempts, aborted: d.signal.aborted, ackSent: d.ack() });
        return;
      }
      seen.push({ attempts: d.attempts, aborted: d.signal.aborted, ackSent: true });
    });
    assert.ok(await eventually(() => subscriptions === 1, 10_000));
    // The handler holds it (not merely the PEL: a kill between XREADGROUP and
    // the delivery's hand-over would leave the client nothing to hold).
    assert.ok(await eventually(() => firstStarted, 10_000));
    assert.equal(await fixture.pending(stream, GROUP), 1);
    await fixture.killSidecar();
    await fixture.startSidecar();
    assert.ok(await eventually(() => seen.length >= 2, 30_000), JSON.stringify(seen));
    await consumer.stop({ deadlineMs: 5_000 });
    await running;
    const first = seen.find((s) => s.attempts === 1)!;
    assert.deepEqual(first, { attempts: 1, aborted: true, ackSent: false });
    assert.ok(seen.some((s) => s.attempts === 2), 'redelivered with attempts 2');
    assert.equal(frames.acks.get(id), 1, 'exactly one ack: the redelivery on the new call');
    assert.ok(reconnects.length >= 1);
    assert.equal(reconnects[0]!.error.code, status.UNAVAILABLE);
    assert.ok(await eventually(async () => (await fixture.pending(stream, GROUP)) === 0, 5_000));
  });
});

describe('a sidecar on a unix socket', () => {
  let fixture: Fixture;

  before(async () => {
    fixture = await Fixture.start({ consumerName: 'ts-unix', unixSocket: true });
  });

  after(async () => {
    await fixture?.stop();
  });

  test('producer and consumer connect with a unix:/path target', async () => {
    assert.match(fixture.target, /^unix:\//);
    const producer = new Producer({ target: fixture.target });
    const stream = streamName('unix');
    const { id } = await producer.append(stream, { greeting: 'hello' });
    const got: string[] = [];
    const consumer = new Consumer({ target: fixture.target, stream, group: GROUP, start: 'beginning' });
    const running = consumer.run((d) => void got.push(`${d.id} ${d.text('greeting')}`));
    assert.ok(await eventually(() => got.length === 1, 10_000));
    await consumer.stop({ deadlineMs: 5_000 });
    await running;
    producer.close();
    assert.deepEqual(got, [`${id} hello`]);
  });
});

describe('a sharded stream (--sharded-streams <stream>=3)', () => {
  const stream = streamName('sharded');
  const shards = [0, 1, 2].map((k) => `${stream}:{${stream}:${k}}`);
  let fixture: Fixture;

  before(async () => {
    fixture = await Fixture.start({ consumerName: 'ts-sharded', args: ['--sharded-streams', `${stream}=3`] });
  });

  after(async () => {
    await fixture?.stop();
  });

  test('a partition key keeps its entries on one shard, consumed in append order', async () => {
    const producer = new Producer({ target: fixture.target });
    const byKey = new Map<string, AppendResult[]>([['a', []], ['b', []]]);
    for (let n = 0; n < 4; n++) {
      for (const [key, results] of byKey) {
        results.push(await producer.append(stream, { key, n: String(n) }, { partitionKey: key }));
      }
    }
    for (const [key, results] of byKey) {
      results.push(...(await producer.appendBatch(stream, [{ key, n: '4' }, { key, n: '5' }], { partitionKey: key })));
    }
    producer.close();
    for (const [key, results] of byKey) {
      assert.equal(new Set(results.map((r) => r.stream)).size, 1, `key ${key} spread over ${results.map((r) => r.stream)}`);
      assert.ok(shards.includes(results[0]!.stream), results[0]!.stream);
    }

    // One handler at a time, started in arrival order: `got` is the hand-out order.
    const got: Delivery[] = [];
    const consumer = new Consumer({ target: fixture.target, stream, group: GROUP, start: 'beginning', concurrency: 1 });
    const running = consumer.run((d) => void got.push(d));
    assert.ok(await eventually(() => got.length >= 12, 10_000), `${got.length} of 12 deliveries`);
    const pendingOnShards = async () => (await Promise.all(shards.map((s) => fixture.pending(s, GROUP)))).reduce((a, b) => a + b, 0);
    assert.ok(await eventually(async () => (await pendingOnShards()) === 0, 5_000), 'every delivery acked');
    await consumer.stop({ deadlineMs: 5_000 });
    await running;

    assert.equal(got.length, 12);
    for (const [key, results] of byKey) {
      const delivered = got.filter((d) => d.text('key') === key);
      assert.deepEqual(delivered.map((d) => d.id), results.map((r) => r.id), `key ${key} in append order`);
      assert.deepEqual(new Set(delivered.map((d) => d.stream)), new Set([results[0]!.stream]));
      assert.ok(delivered.every((d) => d.attempts === 1));
    }
  });
});
