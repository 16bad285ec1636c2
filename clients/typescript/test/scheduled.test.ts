// Scheduled entries against a real redis-server and sidecar: `deliverAt` and
// `delayMs` on append and on batch entries, the answer's `scheduled`,
// listScheduled / scheduled paging and cancelScheduled with its not-found
// error. The deliveries themselves are the conformance scenarios
// scheduled_delivery and scheduled_cancel.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { status } from '@grpc/grpc-js';
import { EchoMQError, NotScheduledError, Streams, type ScheduledEntry } from '@echomq/client';
import { Fixture } from './support/fixture.js';

let unique = 0;
const streamName = (what: string) => `ts:scheduled:${what}:${process.pid}:${++unique}`;

describe('scheduled entries', () => {
  let fixture: Fixture;
  let streams: Streams;

  before(async () => {
    fixture = await Fixture.start({ consumerName: 'ts-scheduled-tests', args: [] });
    streams = new Streams({ target: fixture.target });
  });

  after(async () => {
    streams?.close();
    await fixture?.stop();
  });

  test('a scheduled append is listed, not read, then enters the stream with its id', async () => {
    const stream = streamName('enters');
    const due = new Date(Date.now() + 1_000);
    const later = await streams.append(stream, { n: '1' }, { deliverAt: due });
    assert.equal(later.scheduled, true);
    assert.equal(later.streamId, '');
    const now = await streams.append(stream, { n: '0' });
    assert.equal(now.scheduled, false);
    assert.notEqual(now.streamId, '');

    const page = await streams.listScheduled(stream);
    assert.equal(page.total, 1);
    assert.equal(page.nextPageToken, '');
    assert.equal(page.entries.length, 1);
    assert.equal(page.entries[0]!.id, later.id);
    assert.equal(page.entries[0]!.deliverAt.getTime(), due.getTime());
    assert.equal(Buffer.from(page.entries[0]!.fields.n!).toString(), '1');
    assert.deepEqual((await streams.read(stream)).entries.map((e) => e.id), [now.id]);

    const deadline = Date.now() + 10_000;
    while ((await streams.read(stream)).entries.length < 2) {
      assert.ok(Date.now() < deadline, 'the scheduled entry never entered the stream');
      await sleep(50);
    }
    assert.ok(Date.now() >= due.getTime() - 5, 'entered the stream before it was due');
    assert.deepEqual((await streams.read(stream)).entries.map((e) => e.id), [now.id, later.id]);
    assert.equal((await streams.listScheduled(stream)).total, 0);
  });

  test('listScheduled pages by due time; cancelScheduled answers the due time, then NotScheduledError', async () => {
    const stream = streamName('pages');
    const results = await streams.appendBatch(stream, [
      { fields: { n: '3' }, delayMs: 180_000 },
      { n: 'now' },
      { fields: { n: '1' }, delayMs: 60_000 },
      { fields: { n: '2' }, deliverAt: new Date(Date.now() + 120_000) },
    ]);
    assert.deepEqual(results.map((r) => r.scheduled), [true, false, true, true]);
    const first = await streams.listScheduled(stream, { count: 2 });
    assert.equal(first.total, 3);
    assert.notEqual(first.nextPageToken, '');
    assert.deepEqual(first.entries.map((e) => e.id), [results[2]!.id, results[3]!.id]);
    const all: ScheduledEntry[] = [];
    for await (const entry of streams.scheduled(stream, { count: 1 })) all.push(entry);
    assert.deepEqual(all.map((e) => e.id), [results[2]!.id, results[3]!.id, results[0]!.id]);

    const due = await streams.cancelScheduled(stream, results[0]!.id);
    assert.equal(due.getTime(), all[2]!.deliverAt.getTime());
    for (const id of [results[0]!.id, results[1]!.id]) {
      await assert.rejects(streams.cancelScheduled(stream, id), (error: unknown) => {
        assert.ok(error instanceof NotScheduledError);
        assert.ok(error instanceof EchoMQError);
        assert.equal(error.code, status.NOT_FOUND);
        assert.equal(error.permanent, true);
        assert.equal(error.name, 'NotScheduledError');
        return true;
      });
    }
    assert.equal((await streams.listScheduled(stream)).total, 2);
  });

  test("the sidecar's refusals are EchoMQErrors; a batch-wide schedule is refused by the client", async () => {
    const stream = streamName('refused');
    const invalid = (error: unknown) => {
      assert.ok(error instanceof EchoMQError && !(error instanceof NotScheduledError), String(error));
      assert.equal(error.code, status.INVALID_ARGUMENT);
      return true;
    };
    await assert.rejects(streams.append(stream, { n: '1' }, { deliverAt: new Date(Date.now() + 60_000), delayMs: 60_000 }), invalid);
    await assert.rejects(streams.appendBatch(stream, [{ fields: { n: '1' }, delayMs: -1_000 }]), invalid);
    await assert.rejects(streams.cancelScheduled(stream, 'not-a-branded-id'), invalid);
    assert.throws(() => streams.appendBatch(stream, [{ n: '1' }], { delayMs: 1_000 } as never), TypeError);
    assert.equal((await streams.listScheduled(stream)).total, 0);
  });
});
