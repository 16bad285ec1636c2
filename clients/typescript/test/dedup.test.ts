// Idempotent appends against a real redis-server and sidecar: a dedup key on
// append (AppendOptions.dedupKey) and per batch entry (BatchEntry), and the
// answer's `duplicate` (clients/CONTRACT.md, "Idempotent appends").
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { status } from '@grpc/grpc-js';
import { EchoMQError, Streams, type AppendOptions, type BatchEntry } from '@echomq/client';
import { Fixture } from './support/fixture.js';

let unique = 0;
const streamName = (what: string) => `ts:dedup:${what}:${process.pid}:${++unique}`;

describe('dedup keys', () => {
  let fixture: Fixture;
  let streams: Streams;

  before(async () => {
    fixture = await Fixture.start({ consumerName: 'ts-dedup-tests', args: [] });
    streams = new Streams({ target: fixture.target });
  });

  after(async () => {
    streams?.close();
    await fixture?.stop();
  });

  test('a retried append with the same dedupKey answers the first one, duplicate, and writes nothing', async () => {
    const stream = streamName('append');
    const first = await streams.append(stream, { n: '1' }, { dedupKey: 'order-1' });
    const retried = await streams.append(stream, { n: '1, again' }, { dedupKey: 'order-1' });
    assert.equal(first.duplicate, false);
    assert.equal(retried.duplicate, true);
    assert.deepEqual({ ...retried, duplicate: false }, first);
    const plain = [
      await streams.append(stream, { n: '2' }),
      await streams.append(stream, { n: '2' }, { dedupKey: '' }),
      await streams.append(stream, { n: '2' }, { dedupKey: undefined }),
    ];
    assert.deepEqual(plain.map((r) => r.duplicate), [false, false, false]);
    assert.equal(new Set(plain.map((r) => r.id)).size, 3);
    assert.equal(await fixture.xlen(stream), 4);
    const [oldest] = await fixture.entries(stream);
    assert.equal(oldest?.fields.get('n')?.toString(), '1');
  });

  test('batch entries carry their own keys: repeated, reused and keyless entries, and a Fields record with a field named `fields`', async () => {
    const stream = streamName('batch');
    const single = await streams.append(stream, { n: '0' }, { dedupKey: 'k0' });
    const entries: (BatchEntry | Record<string, string>)[] = [
      { fields: { n: '1' }, dedupKey: 'k1' },
      { fields: new Map([['n', '1']]), dedupKey: 'k1' },
      { fields: { n: '0' }, dedupKey: 'k0' },
      { n: '2' },
      { fields: { n: '3' } },
      { fields: 'a field named fields', dedupKey: 'not a key: a field' },
    ];
    const batch = await streams.appendBatch(stream, entries);
    assert.deepEqual(batch.map((r) => r.duplicate), [false, true, true, false, false, false]);
    assert.equal(batch[1]!.id, batch[0]!.id);
    assert.equal(batch[1]!.streamId, batch[0]!.streamId);
    assert.equal(batch[2]!.id, single.id);
    const again = await streams.appendBatch(stream, [{ fields: { n: '1' }, dedupKey: 'k1' }]);
    assert.equal(again[0]!.duplicate, true);
    assert.equal(again[0]!.id, batch[0]!.id);
    assert.equal(await fixture.xlen(stream), 5);
    const last = (await fixture.entries(stream)).at(-1)!;
    assert.equal(last.fields.get('fields')?.toString(), 'a field named fields');
    assert.equal(last.fields.get('dedupKey')?.toString(), 'not a key: a field');
  });

  test('a dedupKey over --max-name-bytes is INVALID_ARGUMENT, permanent, and writes nothing', async () => {
    const stream = streamName('long');
    const long = 'k'.repeat(1025);
    for (const attempt of [
      () => streams.append(stream, { n: '1' }, { dedupKey: long }),
      () => streams.appendBatch(stream, [{ fields: { n: '1' }, dedupKey: long }]),
    ]) {
      await assert.rejects(attempt, (error: unknown) => {
        assert.ok(error instanceof EchoMQError);
        assert.equal(error.code, status.INVALID_ARGUMENT);
        assert.equal(error.permanent, true);
        return true;
      });
    }
    assert.equal(await fixture.xlen(stream), 0);
    const fits = await streams.append(stream, { n: '1' }, { dedupKey: long.slice(0, 1024) });
    assert.equal(fits.duplicate, false);
  });

  test('appendBatch refuses a dedupKey in its options: the keys are per entry', async () => {
    const stream = streamName('batch-option');
    const options: AppendOptions = { dedupKey: 'k' };
    assert.throws(() => streams.appendBatch(stream, [{ n: '1' }], options), TypeError);
    assert.equal(await fixture.xlen(stream), 0);
  });
});
