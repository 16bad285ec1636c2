import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  brandedIdFromStreamId,
  MemorySeenStore,
  NewerWins,
  SeenSet,
  type BrandedId,
  type NewerWinsStore,
} from '@echomq/client';

const id = (ms: number, seq = 0): BrandedId => brandedIdFromStreamId(`${ms}-${seq}`);

test('SeenSet.once runs an effect once per branded id', async () => {
  const seen = new SeenSet();
  let runs = 0;
  assert.equal(await seen.once(id(1), () => void runs++), true);
  assert.equal(await seen.once(id(1), () => void runs++), false);
  assert.equal(await seen.once(id(2), () => void runs++), true);
  assert.equal(runs, 2);
  assert.equal(await seen.has(id(1)), true);
});

test('SeenSet.once records nothing when the effect throws, so a redelivery runs it again', async () => {
  const seen = new SeenSet();
  await assert.rejects(seen.once(id(1), () => Promise.reject(new Error('down'))), /down/);
  assert.equal(await seen.has(id(1)), false);
  assert.equal(await seen.once(id(1), () => undefined), true);
});

test('SeenSet.once serializes concurrent copies of one id', async () => {
  const seen = new SeenSet();
  let runs = 0;
  const effect = async () => {
    await sleep(10);
    runs++;
  };
  const results = await Promise.all([seen.once(id(7), effect), seen.once(id(7), effect)]);
  assert.deepEqual(results.sort(), [false, true]);
  assert.equal(runs, 1);
});

test('MemorySeenStore forgets the oldest ids beyond its capacity', () => {
  const store = new MemorySeenStore({ capacity: 2 });
  store.add(id(1));
  store.add(id(2));
  store.add(id(3));
  assert.equal(store.size, 2);
  assert.equal(store.has(id(1)), false);
  assert.equal(store.has(id(3)), true);
});

test('NewerWins applies newer ids per key and skips older or equal ones', async () => {
  const latest = new NewerWins();
  const applied: string[] = [];
  const apply = (key: string, at: BrandedId) => latest.apply(key, at, () => void applied.push(`${key}@${at.slice(-4)}`));
  assert.equal(await apply('order-1', id(10)), true);
  assert.equal(await apply('order-1', id(10)), false, 'equal: a duplicate');
  assert.equal(await apply('order-1', id(9, 5)), false, 'older: a stale replay');
  assert.equal(await apply('order-1', id(10, 1)), true);
  assert.equal(await apply('order-2', id(1)), true, 'keys are independent');
  assert.equal(applied.length, 3);
  assert.equal(await latest.isNewer('order-1', id(10, 1)), false);
  assert.equal(await latest.isNewer('order-3', id(1)), true);
});

test('NewerWins takes a pluggable async store', async () => {
  const data = new Map<string, BrandedId>();
  const store: NewerWinsStore = {
    get: async (key) => data.get(key),
    setIfNewer: async (key, at) => {
      const current = data.get(key);
      if (current !== undefined && current >= at) return false;
      data.set(key, at);
      return true;
    },
  };
  const latest = new NewerWins(store);
  assert.equal(await latest.apply('k', id(5), () => undefined), true);
  assert.equal(await latest.apply('k', id(4), () => undefined), false);
  assert.equal(data.get('k'), id(5));
});
