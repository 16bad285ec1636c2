import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  brandedIdFromStreamId,
  brandedIdTime,
  brandedIdToStreamId,
  compareBrandedIds,
  isBrandedId,
  parseBrandedId,
} from '@echomq/client';

test('a stream id becomes 12 hex of ms then 16 hex of sequence, and back', () => {
  const id = brandedIdFromStreamId('1718000000000-3');
  assert.equal(id, (1718000000000).toString(16).padStart(12, '0') + '0000000000000003');
  assert.equal(id.length, 28);
  assert.equal(brandedIdToStreamId(id), '1718000000000-3');
  assert.equal(brandedIdTime(id).getTime(), 1718000000000);
});

test('text order of branded ids is stream order', () => {
  const ids = ['5-0', '10-0', '10-2', '10-10', '99999999999-0'].map(brandedIdFromStreamId);
  const shuffled = [ids[3]!, ids[0]!, ids[4]!, ids[2]!, ids[1]!];
  assert.deepEqual([...shuffled].sort(), ids);
  assert.deepEqual([...shuffled].sort(compareBrandedIds), ids);
  assert.ok(compareBrandedIds(ids[0]!, ids[1]!) < 0);
  assert.equal(compareBrandedIds(ids[1]!, ids[1]!), 0);
});

test('only 28 lowercase hex characters are branded ids', () => {
  assert.ok(isBrandedId('0000000000010000000000000001'));
  for (const bad of ['', '0000000000010000000000000001a', '000000000001000000000000000', 'ABCDEF0000010000000000000001', '1-1']) {
    assert.equal(isBrandedId(bad), false, bad);
    assert.throws(() => parseBrandedId(bad), TypeError);
  }
});

test('stream ids that do not fit 6 + 8 bytes are refused', () => {
  assert.throws(() => brandedIdFromStreamId(`${2 ** 48}-0`), RangeError);
  assert.throws(() => brandedIdFromStreamId(`1-${2n ** 64n}`), RangeError);
  assert.throws(() => brandedIdFromStreamId('nonsense'), TypeError);
  assert.equal(brandedIdFromStreamId(`${2 ** 48 - 1}-${2n ** 64n - 1n}`), 'f'.repeat(28));
});
