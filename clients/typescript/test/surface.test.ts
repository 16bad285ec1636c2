// The client surface of clients/CONTRACT.md ("Surface"): one Streams class
// that appends, reads and trims; flow settings grouped in `flowControl`; and
// the deprecated old names (`Producer`, `GroupStart`, `Admin.allDeadLetters`, `NewerWinsStore`,
// `MemoryNewerWinsStore`, the flat `maxInFlight`, `concurrency` and
// `maxBatch`) still working for a release.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import {
  Admin,
  Consumer,
  MemoryNewerWinsStore,
  MemoryVersionStore,
  NewerWins,
  parseBrandedId,
  Producer,
  Streams,
  type Delivery,
  type FlowControl,
  type GroupStart,
  type Start,
  type NewerWinsStore,
  type VersionStore,
} from '@echomq/client';
import { Fixture } from './support/fixture.js';

let unique = 0;
const streamName = (what: string) => `ts:surface:${what}:${process.pid}:${++unique}`;

async function until(what: string, ok: () => boolean | Promise<boolean>, limitMs = 20_000): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (!(await ok())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

describe('surface', () => {
  let fixture: Fixture;
  let streams: Streams;

  before(async () => {
    fixture = await Fixture.start({ consumerName: 'ts-surface-tests', args: [] });
    streams = new Streams({ target: fixture.target });
  });

  after(async () => {
    streams?.close();
    await fixture?.stop();
  });

  test('one Streams class appends, reads and trims', async () => {
    const stream = streamName('streams');
    const one = await streams.append(stream, { n: '0' }, { dedupKey: 'k0' });
    const batch = await streams.appendBatch(stream, [{ fields: { n: '1' }, dedupKey: 'k1' }, { n: '2' }]);
    const page = await streams.read(stream);
    assert.deepEqual(page.entries.map((e) => e.id), [one.id, ...batch.map((a) => a.id)]);
    const trimmed = await streams.trim(stream, { maxLen: 1 }, { ignoreGroups: true });
    assert.equal(trimmed.trimmed, 2);
    assert.equal(await fixture.xlen(stream), 1);
  });

  test('flowControl bounds what the call holds and how many handlers run', async () => {
    const stream = streamName('flow');
    await streams.appendBatch(stream, Array.from({ length: 6 }, (_, i) => ({ n: String(i) })));
    const flowControl: FlowControl = { maxInFlight: 3, concurrency: 2, maxBatch: 2 };
    let subscribedMaxInFlight = 0;
    const consumer = new Consumer({
      target: fixture.target,
      stream,
      group: 'g',
      start: 'beginning',
      flowControl,
      onSubscribed: (s) => (subscribedMaxInFlight = s.maxInFlight),
    });
    let running = 0;
    let most = 0;
    let handled = 0;
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const done = consumer.run(async (_delivery: Delivery) => {
      running++;
      most = Math.max(most, running);
      await released;
      running--;
      handled++;
    });
    await until('two handlers', () => running === 2);
    await new Promise((resolve) => setTimeout(resolve, 300));
    assert.equal(most, 2);
    assert.equal(await fixture.pending(stream, 'g'), 3);
    assert.equal(subscribedMaxInFlight, 3);
    release();
    await until('every entry handled', async () => handled === 6 && (await fixture.pending(stream, 'g')) === 0);
    await consumer.stop({ deadlineMs: 5_000 });
    await done;
  });

  test('a flow setting given both ways throws', () => {
    assert.throws(
      () => new Consumer({ target: fixture.target, stream: 's', group: 'g', start: 'new', flowControl: { maxInFlight: 2 }, maxInFlight: 2 }),
      /deprecated spelling of flowControl\.maxInFlight/,
    );
  });

  test('the deprecated Admin.allDeadLetters is deadLetters', async () => {
    const admin = new Admin({ target: fixture.target });
    try {
      const stream = streamName('dead');
      const all = [];
      for await (const d of admin.allDeadLetters(stream)) all.push(d);
      assert.deepEqual(all, []);
    } finally {
      admin.close();
    }
  });

  test('the deprecated type GroupStart is Start', () => {
    const old: GroupStart = { afterId: '0-0' };
    const start: Start = old;
    assert.deepEqual(start, { afterId: '0-0' });
  });

  test('the deprecated store names are the new ones', async () => {
    assert.equal(MemoryNewerWinsStore, MemoryVersionStore);
    const store: NewerWinsStore = new MemoryNewerWinsStore();
    const same: VersionStore = store;
    const latest = new NewerWins(same);
    assert.equal(await latest.apply('k', parseBrandedId('01'.repeat(14)), () => undefined), true);
  });

  test('the deprecated names still work', async () => {
    const stream = streamName('deprecated');
    const producer = new Producer({ target: fixture.target });
    try {
      assert.ok(producer instanceof Streams);
      const appended = await producer.append(stream, { n: '0' });
      assert.equal((await producer.read(stream)).entries[0]?.id, appended.id);
    } finally {
      producer.close();
    }
    let handled = 0;
    const consumer = new Consumer({ target: fixture.target, stream, group: 'g', start: 'beginning', maxInFlight: 1, concurrency: 1, maxBatch: 1 });
    const done = consumer.run(async () => {
      handled++;
    });
    await until('the entry', () => handled === 1);
    await consumer.stop({ deadlineMs: 5_000 });
    await done;
  });
});
