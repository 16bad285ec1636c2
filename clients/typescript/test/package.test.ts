// The npm package as a user gets it: `npm pack`, installed into a fresh
// project outside the repository, used from an ES module (import), from
// CommonJS (require) and type-checked from TypeScript against the installed
// .d.ts files; and the unpacked tarball builds by itself, outside the
// repository, from the .proto files it ships.
//
// Needs an npm cache that already holds @grpc/grpc-js and @grpc/proto-loader
// (tried first, offline), or else the npm registry. Set
// ECHOMQ_SKIP_PACKAGE_TEST=1 to skip it offline; CI must not.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { Fixture, PACKAGE_ROOT, REPO_ROOT } from './support/fixture.js';

const run = promisify(execFile);
const skip = process.env.ECHOMQ_SKIP_PACKAGE_TEST === '1';

async function sh(command: string, args: string[], cwd: string, env: Record<string, string> = {}): Promise<string> {
  try {
    const { stdout } = await run(command, args, { cwd, env: { ...process.env, ...env }, maxBuffer: 16 * 1024 * 1024, timeout: 240_000 });
    return stdout;
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string; message: string };
    throw new Error(`${command} ${args.join(' ')} (in ${cwd}) failed: ${e.message}\n${e.stdout ?? ''}\n${e.stderr ?? ''}`);
  }
}

const ESM_APP = `
import { Admin, Consumer, Streams } from '@echomq/client';
const [target, stream] = process.argv.slice(2);
const streams = new Streams({ target });
const { id } = await streams.append(stream, { via: 'esm' });
const page = await streams.read(stream);
console.log(JSON.stringify({ id, read: page.entries.map((e) => [e.id, e.text('via')]), admin: typeof Admin, consumer: typeof Consumer }));
streams.close();
`;

const CJS_APP = `
const { Streams, EchoMQError } = require('@echomq/client');
const [target, stream] = process.argv.slice(2);
(async () => {
  const streams = new Streams({ target });
  const { id } = await streams.append(stream, { via: 'cjs' });
  const entries = [];
  for await (const entry of streams.readAll(stream)) entries.push([entry.id, entry.text('via')]);
  console.log(JSON.stringify({ id, read: entries, error: typeof EchoMQError }));
  streams.close();
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
`;

// Type-checked only: the installed declarations must describe the API (a
// wrong call must be an error, so the types are not \`any\`).
const TS_ESM = `
import { Admin, Consumer, LeaseLostError, Streams, type Delivery, type GroupInfo, type ReadPage } from '@echomq/client';
const streams = new Streams({ target: '127.0.0.1:50051' });
const page: ReadPage = await streams.read('orders', { start: new Date(0), count: 10 });
const first: string | undefined = page.entries[0]?.text('sku');
const info: GroupInfo = await new Admin().describeGroup('orders', 'billing');
const lag: number | undefined = info.lag;
const consumer = new Consumer({ stream: 'orders', group: 'billing', start: 'beginning', maxDeliveries: 5, noAck: false });
for await (const delivery of consumer.deliveries()) {
  const d: Delivery = delivery;
  if (d.signal.reason instanceof LeaseLostError) continue;
  d.ack();
}
// @ts-expect-error: field values are strings or bytes
await streams.append('orders', { n: 1 });
console.log(first, lag);
`;

const TS_CJS = `
import { Consumer, type ConsumerOptions } from '@echomq/client';
const options: ConsumerOptions = { stream: 's', group: 'g', start: { afterId: '0-0' }, ackDeadlineMs: 1_000 };
export const consumer = new Consumer(options);
// @ts-expect-error: start is required
export const bad = new Consumer({ stream: 's', group: 'g' });
`;

describe('the npm package, outside the repository', { skip: skip && 'ECHOMQ_SKIP_PACKAGE_TEST=1' }, () => {
  let fixture: Fixture;
  let work: string;
  let tarball: string;

  before(async () => {
    work = mkdtempSync(join(tmpdir(), 'echomq-ts-package-'));
    assert.ok(relative(REPO_ROOT, work).startsWith('..'), 'the fresh project lies outside the repository');
    // Built by run-tests just before: pack what is there (prepack would build again).
    const out = await sh('npm', ['pack', '--ignore-scripts', '--silent', '--pack-destination', work], PACKAGE_ROOT);
    tarball = join(work, out.trim().split('\n').pop()!);
    assert.ok(existsSync(tarball), `npm pack wrote ${tarball}`);
    fixture = await Fixture.start({ consumerName: 'ts-package-tests' });
  });

  after(async () => {
    await fixture?.stop();
    if (work && !process.env.ECHOMQ_KEEP_LOGS) rmSync(work, { recursive: true, force: true });
  });

  test('the tarball carries both builds, their types and the .proto files', async () => {
    const listing = (await sh('tar', ['tzf', tarball], work)).split('\n');
    for (const file of [
      'package/dist/esm/index.js',
      'package/dist/esm/index.d.ts',
      'package/dist/cjs/index.js',
      'package/dist/cjs/index.d.ts',
      'package/dist/cjs/package.json',
      'package/proto/echomq/v1/consumer_service.proto',
      'package/proto/echomq/v1/admin_service.proto',
      'package/scripts/generate.mjs',
      'package/README.md',
    ]) {
      assert.ok(listing.includes(file), `${file} in the tarball`);
    }
    assert.ok(!listing.some((f) => f.startsWith('package/test/') || f.startsWith('package/node_modules/')), 'no tests or dependencies');
  });

  test('installed into a fresh project, it appends and reads from ESM (import) and CommonJS (require), and type-checks', async () => {
    const app = join(work, 'app');
    mkdirSync(app);
    writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'fresh-app', version: '1.0.0', private: true }, null, 2));
    // From the npm cache alone when it holds the dependencies (fast, and what
    // CI with a kept cache gets); else from the registry.
    const install = ['install', '--no-audit', '--no-fund', '--loglevel=error', tarball];
    await sh('npm', [...install, '--offline'], app).catch(() => sh('npm', [...install, '--prefer-offline'], app));
    writeFileSync(join(app, 'app.mjs'), ESM_APP);
    writeFileSync(join(app, 'app.cjs'), CJS_APP);

    const esm = JSON.parse(await sh('node', ['app.mjs', fixture.target, 'pkg:esm'], app)) as { id: string; read: [string, string][]; admin: string; consumer: string };
    assert.deepEqual(esm.read, [[esm.id, 'esm']]);
    assert.equal(esm.admin, 'function');
    const cjs = JSON.parse(await sh('node', ['app.cjs', fixture.target, 'pkg:cjs'], app)) as { id: string; read: [string, string][]; error: string };
    assert.deepEqual(cjs.read, [[cjs.id, 'cjs']]);
    assert.equal(cjs.error, 'function');

    // TypeScript against the installed declarations, ESM (.mts) and CommonJS
    // (.cts) resolution both; the compiler and @types/node come from this
    // package's dev dependencies, so the fresh project installs nothing more.
    writeFileSync(join(app, 'esm.mts'), TS_ESM);
    writeFileSync(join(app, 'cjs.cts'), TS_CJS);
    writeFileSync(
      join(app, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          target: 'ES2022',
          module: 'nodenext',
          strict: true,
          noEmit: true,
          types: ['node'],
          typeRoots: [join(PACKAGE_ROOT, 'node_modules', '@types')],
        },
        files: ['esm.mts', 'cjs.cts'],
      }),
    );
    await sh(join(PACKAGE_ROOT, 'node_modules', '.bin', 'tsc'), ['-p', 'tsconfig.json'], app);
  });

  test('the unpacked tarball builds outside the repository, from the .proto files it ships', async () => {
    const unpacked = join(work, 'unpacked');
    mkdirSync(unpacked);
    await sh('tar', ['xzf', tarball, '-C', unpacked], work);
    const pkg = join(unpacked, 'package');
    rmSync(join(pkg, 'dist'), { recursive: true, force: true });
    rmSync(join(pkg, 'src', 'gen'), { recursive: true, force: true });
    // The build's tools (tsc, proto-loader-gen-types) without a second install.
    symlinkSync(join(PACKAGE_ROOT, 'node_modules'), join(pkg, 'node_modules'), 'dir');
    await sh('npm', ['run', '--silent', 'build'], pkg);
    for (const file of ['dist/esm/index.js', 'dist/cjs/index.js', 'dist/cjs/index.d.ts', 'src/gen/descriptor.ts']) {
      assert.ok(existsSync(join(pkg, file)), `${file} built`);
    }
    assert.ok(readdirSync(join(pkg, 'proto', 'echomq', 'v1')).includes('stream_service.proto'));
  });
});
