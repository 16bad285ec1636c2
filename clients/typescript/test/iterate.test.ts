// The iteration form, `for await (const delivery of consumer.deliveries())`,
// against a real redis-server and sidecar: explicit settlement, and what
// `break`, a throw, stop() and a permanent error do.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { InterceptingCall, status, type Interceptor } from '@grpc/grpc-js';
import { Consumer, EchoMQError, Streams, type ConsumerOptions, type Delivery } from '@echomq/client';
import { eventually, Fixture } from './support/fixture.js';

const GROUP = 'g';
let unique = 0;
const streamName = (what: string) => `ts:iterate:${what}:${process.pid}:${++unique}`;

function wire() {
  const acked: string[] = [];
  const fails: { id: string; reason: string }[] = [];
  const interceptor: Interceptor = (options, nextCall) =>
    new InterceptingCall(nextCall(options), {
      sendMessage: (message: { ack?: { ids: string[] } | null; fail?: { id: string; reason: string } | null }, next) => {
        if (message.ack) acked.push(...message.ack.ids);
        if (message.fail) fails.push({ id: message.fail.id, reason: message.fail.reason });
        next(message);
      },
    });
  return { acked, fails, interceptor };
}

describe('for await (const delivery of consumer.deliveries())', () => {
  let fixture: Fixture;
  let streams: Streams;
  const consumers: Consumer[] = [];

  before(async () => {
    fixture = await Fixture.start({
      consumerName: 'ts-iterate-tests',
      args: ['--retry-backoff-initial-ms', '100', '--retry-backoff-max-ms', '200', '--shutdown-grace-ms', '1000'],
    });
    streams = new Streams({ target: fixture.target });
  });

  after(async () => {
    for (const consumer of consumers) consumer.close();
    streams?.close();
    await fixture?.stop();
  });

  function consumerOf(stream: string, options: Partial<ConsumerOptions> = {}): Consumer {
    const consumer = new Consumer({ target: fixture.target, stream, group: GROUP, start: 'beginning', ...options });
    consumers.push(consumer);
    return consumer;
  }

  async function appendN(stream: string, n: number): Promise<string[]> {
    return (await streams.appendBatch(stream, Array.from({ length: n }, (_, i) => ({ n: String(i) })))).map((r) => r.id);
  }

  /** Everything a fresh consumer of the group gets within `ms`: the redeliveries and what was never delivered. */
  async function drainGroup(stream: string, want: number): Promise<Delivery[]> {
    const seen: Delivery[] = [];
    const consumer = consumerOf(stream);
    const done = consumer.run((d) => {
      seen.push(d);
      if (seen.length === want) void consumer.stop();
    });
    await done;
    return seen;
  }

  test('each delivery settled in the loop is acknowledged once; break stops the consumer before the loop completes', async () => {
    const stream = streamName('ack');
    const ids = await appendN(stream, 5);
    const recorder = wire();
    const consumer = consumerOf(stream, { interceptors: [recorder.interceptor] });
    const got: string[] = [];
    for await (const delivery of consumer.deliveries()) {
      got.push(delivery.id);
      assert.equal(delivery.ack(), true);
      if (got.length === 5) break;
    }
    // The loop statement awaited the graceful stop: every ack is applied already.
    assert.deepEqual(got, ids);
    assert.equal(await fixture.pending(stream, GROUP), 0);
    assert.deepEqual(recorder.acked.sort(), [...ids].sort());
    assert.deepEqual(recorder.fails, []);
    await assert.rejects(consumer.run(() => undefined), /runs once/);
  });

  test('break with a delivery unsettled fails it; it and the entries never handed out come back to the group', async () => {
    const stream = streamName('break');
    const ids = await appendN(stream, 3);
    const recorder = wire();
    const consumer = consumerOf(stream, { interceptors: [recorder.interceptor] });
    let taken = 0;
    for await (const delivery of consumer.deliveries()) {
      taken += 1;
      if (taken === 1) {
        delivery.ack();
        continue;
      }
      break; // the second, unsettled
    }
    assert.deepEqual(recorder.acked, [ids[0]]);
    assert.equal(recorder.fails.length, 1);
    assert.equal(recorder.fails[0]!.id, ids[1]);
    assert.match(recorder.fails[0]!.reason, /loop .* ended before settling/);
    const again = await drainGroup(stream, 2);
    assert.deepEqual(again.map((d) => d.id).sort(), [ids[1], ids[2]].sort(), 'the failed one and the one never handed out');
    assert.equal(again.find((d) => d.id === ids[1])!.attempts, 2);
    assert.equal(await fixture.pending(stream, GROUP), 0);
  });

  test('a throw in the loop body propagates, fails the delivery in hand and stops the consumer', async () => {
    const stream = streamName('throw');
    const ids = await appendN(stream, 1);
    const recorder = wire();
    const consumer = consumerOf(stream, { interceptors: [recorder.interceptor] });
    await assert.rejects(
      (async () => {
        for await (const delivery of consumer.deliveries()) {
          if (delivery.attempts === 1) throw new Error('body failed');
        }
      })(),
      /body failed/,
    );
    assert.deepEqual(recorder.fails.map((f) => f.id), ids);
    const again = await drainGroup(stream, 1);
    assert.equal(again[0]!.attempts, 2);
  });

  test('stop() ends the loop; a delivery in hand may still be settled before the deadline', async () => {
    const stream = streamName('stop');
    const ids = await appendN(stream, 2);
    const recorder = wire();
    const consumer = consumerOf(stream, { maxInFlight: 1, interceptors: [recorder.interceptor] });
    let stopping: Promise<void> | undefined;
    const got: string[] = [];
    for await (const delivery of consumer.deliveries()) {
      got.push(delivery.id);
      stopping = consumer.stop({ deadlineMs: 5_000 });
      await new Promise((resolve) => setTimeout(resolve, 100));
      delivery.ack(); // after stop() began, before its deadline: still applied
    }
    await stopping;
    assert.deepEqual(got, [ids[0]], 'nothing more is handed out once stopping');
    assert.deepEqual(recorder.acked, [ids[0]]);
    assert.ok(await eventually(async () => (await fixture.pending(stream, GROUP)) === 0, 5_000));
  });

  test('aborting the signal ends the loop gracefully', async () => {
    const stream = streamName('signal');
    await appendN(stream, 1);
    const controller = new AbortController();
    const consumer = consumerOf(stream);
    let n = 0;
    for await (const delivery of consumer.deliveries({ signal: controller.signal })) {
      n += 1;
      delivery.ack();
      controller.abort();
    }
    assert.equal(n, 1);
    assert.equal(await fixture.pending(stream, GROUP), 0);
  });

  test('a permanent error is thrown from the loop', async () => {
    const consumer = consumerOf(streamName('permanent'), { maxBatch: 5_000 });
    await assert.rejects(
      (async () => {
        for await (const _ of consumer.deliveries()) assert.fail('no delivery expected');
      })(),
      (error: unknown) => error instanceof EchoMQError && error.code === status.INVALID_ARGUMENT && error.permanent,
    );
  });
});
