// AckEmit (consume → produce, exactly once) beyond the shared scenarios,
// against a real sidecar that allows only `ts:emit:*` streams and keeps the
// default lease timings (a refresh every 10 s: slower than these tests).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { InterceptingCall, type Interceptor } from '@grpc/grpc-js';
import { AckEmitError, Consumer, Streams, type Delivery, type EmittedEntry, type VerdictError } from '@echomq/client';
import { eventually, Fixture } from './support/fixture.js';

const GROUP = 'g';
let unique = 0;
const streamName = (what: string) => `ts:emit:${what}:${process.pid}:${++unique}`;

/** Counts the Ack ids, Fails and AckEmits a consumer sends. */
function wire() {
  const sent = { acks: 0, fails: 0, ackEmits: 0 };
  const interceptor: Interceptor = (options, nextCall) =>
    new InterceptingCall(nextCall(options), {
      sendMessage: (message: { ack?: { ids: string[] } | null; fail?: object | null; ackEmit?: object | null }, next) => {
        sent.acks += message.ack?.ids.length ?? 0;
        if (message.fail) sent.fails += 1;
        if (message.ackEmit) sent.ackEmits += 1;
        next(message);
      },
    });
  return { sent, interceptor };
}

describe('ackEmit against a real sidecar', () => {
  let fixture: Fixture;
  let streams: Streams;
  const consumers: Consumer[] = [];

  before(async () => {
    fixture = await Fixture.start({ consumerName: 'ts-emit-tests', args: ['--allow-streams', 'ts:emit:*'] });
    streams = new Streams({ target: fixture.target });
  });

  after(async () => {
    for (const consumer of consumers) consumer.close();
    streams?.close();
    await fixture?.stop();
  });

  test('an emit outside the allow-list is PERMISSION_DENIED, writes nothing, and the held delivery is answered again', async () => {
    const source = streamName('denied');
    const sink = `${source}:sink`;
    const appended = await streams.append(source, { n: '1' });
    const refusals: AckEmitError[] = [];
    const emitted: EmittedEntry[] = [];
    const hooked: VerdictError[] = [];
    const consumer = new Consumer({ target: fixture.target, stream: source, group: GROUP, start: 'beginning', onVerdictError: (e) => hooked.push(e) });
    consumers.push(consumer);
    const done = consumer.run(async (d: Delivery) => {
      try {
        await d.ackEmit([{ stream: 'other:sink', fields: { source: d.id } }]);
      } catch (error) {
        assert.ok(error instanceof AckEmitError, `rejected with ${String(error)}`);
        refusals.push(error);
        assert.equal(d.settled, false, 'a bad emit leaves the delivery unsettled');
      }
      emitted.push(...(await d.ackEmit([{ stream: sink, fields: { source: d.id } }])));
    });
    assert.ok(await eventually(() => emitted.length === 1, 20_000), 'the second ackEmit');
    await consumer.stop({ deadlineMs: 5_000 });
    await done;
    assert.equal(refusals.length, 1);
    assert.equal(refusals[0]!.code, 'PERMISSION_DENIED');
    assert.equal(refusals[0]!.held, true);
    assert.deepEqual(hooked.map((e) => e.code), ['PERMISSION_DENIED']);
    assert.equal(await fixture.xlen('other:sink'), 0, 'nothing written by the refused AckEmit');
    const [written] = await fixture.entries(sink);
    assert.deepEqual(emitted, [{ id: written!.fields.get('id')!.toString('utf8'), streamId: written!.streamId, stream: sink }]);
    assert.equal(written!.fields.get('source')!.toString('utf8'), appended.id);
    assert.equal(await fixture.pending(source, GROUP), 0);
  });

  test('an entry a peer took is LEASE_LOST: nothing written, and no Ack or Fail follows', async () => {
    const source = streamName('stolen');
    const sink = `${source}:sink`;
    const appended = await streams.append(source, { n: '1' });
    const recorder = wire();
    let release!: () => void;
    const stolen = new Promise<void>((resolve) => (release = resolve));
    const started: Delivery[] = [];
    const outcome: unknown[] = [];
    const consumer = new Consumer({ target: fixture.target, stream: source, group: GROUP, start: 'beginning', interceptors: [recorder.interceptor] });
    consumers.push(consumer);
    const done = consumer.run(async (d: Delivery) => {
      started.push(d);
      await stolen;
      try {
        await d.ackEmit([{ stream: sink, fields: { source: d.id } }]);
      } catch (error) {
        outcome.push(error);
        throw error;
      }
    });
    assert.ok(await eventually(() => started.length === 1, 20_000));
    await fixture.redis.command('XCLAIM', source, GROUP, 'thief', '0', appended.streamId);
    release();
    assert.ok(await eventually(() => outcome.length === 1, 20_000), 'the refusal');
    await consumer.stop({ deadlineMs: 5_000 });
    await done;
    const refused = outcome[0];
    assert.ok(refused instanceof AckEmitError, `rejected with ${String(refused)}`);
    // The sidecar's lease refresh may notice the steal before the handler answers: then the call
    // was told LEASE_LOST first and the AckEmit is never sent.
    const toldFirst = refused.code === undefined;
    if (toldFirst) assert.match(refused.message, /not sent: the lease was lost/);
    else assert.equal(refused.code, 'LEASE_LOST');
    assert.equal(refused.held, false);
    assert.equal(started[0]!.settled, true, 'a refusal other than a bad emit settles the delivery');
    assert.equal(await fixture.xlen(sink), 0, 'a call that lost its entry never writes its emits');
    assert.deepEqual(recorder.sent, { acks: 0, fails: 0, ackEmits: toldFirst ? 0 : 1 });
    const pending = (await fixture.redis.command('XPENDING', source, GROUP, '-', '+', '10')) as [Buffer, Buffer][];
    assert.deepEqual(pending.map((row) => row[1]!.toString('utf8')), ['thief']);
  });

  test('iterated: a delivery whose AckEmit was refused for a bad emit is in hand again, failed when the loop ends', async () => {
    const source = streamName('iterated');
    await streams.append(source, { n: '1' });
    const recorder = wire();
    const consumer = new Consumer({ target: fixture.target, stream: source, group: GROUP, start: 'beginning', interceptors: [recorder.interceptor] });
    consumers.push(consumer);
    let refused: unknown;
    for await (const d of consumer.deliveries()) {
      try {
        await d.ackEmit([{ stream: `${source}:sink`, fields: { id: 'the reserved field' } }]);
      } catch (error) {
        refused = error;
      }
      break; // without settling it: the loop's end must fail it
    }
    assert.ok(refused instanceof AckEmitError && refused.code === 'INVALID_ARGUMENT' && refused.held, `rejected with ${String(refused)}`);
    assert.deepEqual(recorder.sent, { acks: 0, fails: 1, ackEmits: 1 });
    assert.equal(await fixture.xlen(`${source}:sink`), 0);
  });
});
