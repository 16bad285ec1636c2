// clients/CONTRACT.md fixes what the four clients share. These checks read it,
// so a change there that this client does not follow fails here.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { status } from '@grpc/grpc-js';
import {
  DEFAULT_ACK_BATCH,
  DEFAULT_ACK_LINGER_MS,
  DEFAULT_CONCURRENCY,
  DEFAULT_MAX_BATCH,
  DEFAULT_MAX_IN_FLIGHT,
  EchoMQError,
  PERMANENT_CODES,
} from '@echomq/client';
import { REPO_ROOT } from './support/fixture.js';

const contract = readFileSync(join(REPO_ROOT, 'clients', 'CONTRACT.md'), 'utf8');

function section(title: string): string[] {
  const start = contract.indexOf(`## ${title}\n`);
  assert.ok(start >= 0, `CONTRACT.md has a section "${title}"`);
  const end = contract.indexOf('\n## ', start + 1);
  return contract
    .slice(start, end < 0 ? undefined : end)
    .split(/\n\s*\n/)
    .map((paragraph) => paragraph.replace(/\s+/g, ' ').trim());
}

const codesIn = (text: string) => [...text.matchAll(/`([A-Z][A-Z_]+)`/g)].map((m) => m[1]!);

test("the permanent status codes are CONTRACT.md's, and the transient ones it names are not permanent", () => {
  const paragraphs = section('Permanent status codes');
  const list = paragraphs.find((p) => /^(`[A-Z_]+`,? ?)+\.?$/.test(p));
  assert.ok(list, 'the list of permanent codes');
  const want = codesIn(list).map((name) => status[name as keyof typeof status]).sort();
  assert.ok(want.every((code) => typeof code === 'number'), `known gRPC codes: ${codesIn(list)}`);
  assert.deepEqual([...PERMANENT_CODES].sort(), want);
  for (const code of want) assert.equal(new EchoMQError('x', code as status, '').permanent, true);

  const transient = paragraphs.find((p) => p.startsWith('Every other code'));
  assert.ok(transient, 'the paragraph on transient codes');
  for (const name of codesIn(transient)) {
    assert.equal(new EchoMQError('x', status[name as keyof typeof status] as status, '').permanent, false, `${name} is transient`);
  }
});

test("the consumer's batching and ack-coalescing defaults are CONTRACT.md's", () => {
  const defaults = section('Defaults').join('\n');
  assert.match(defaults, /`max_batch` \| min\(256, `max_in_flight`\)/);
  assert.equal(DEFAULT_MAX_BATCH, 256);
  assert.match(defaults, /ack coalescing \| 1 ms linger, at most 256 ids and at most a quarter of `max_in_flight`/);
  assert.equal(DEFAULT_ACK_LINGER_MS, 1);
  assert.equal(DEFAULT_ACK_BATCH, 256);
});

test("the flow-control defaults are CONTRACT.md's: an adaptive window up to 1024, 64 handlers", () => {
  const defaults = section('Defaults').join('\n');
  assert.match(defaults, /`max_in_flight` \| unset: an adaptive window of 64 up to the sidecar's cap \(1024 by default\)/);
  assert.equal(DEFAULT_MAX_IN_FLIGHT, 1024);
  assert.match(defaults, /handler concurrency \| `max_in_flight` when set; 64 when unset/);
  assert.equal(DEFAULT_CONCURRENCY, 64);
});
