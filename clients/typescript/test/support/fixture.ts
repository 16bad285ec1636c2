// Test fixtures: a real redis-server and a real echomq-sidecar on free loopback
// ports, each in a temporary directory, always cleaned up (after the suite, and
// on process exit if the suite itself dies).
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync } from 'node:fs';
import { get } from 'node:http';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { Resp } from './resp.js';

/** clients/typescript (this file is compiled to build/test/support/). */
export const PACKAGE_ROOT = resolve(fileURLToPath(new URL('.', import.meta.url)), '..', '..', '..');
export const REPO_ROOT = resolve(PACKAGE_ROOT, '..', '..');

const live = new Set<ChildProcess>();
process.on('exit', () => {
  for (const child of live) child.kill('SIGKILL');
});

export async function freePort(): Promise<number> {
  return await new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolvePort(port));
    });
  });
}

/** Waits until `check` is true, polling; false after `timeoutMs`. */
export async function eventually(check: () => boolean | Promise<boolean>, timeoutMs = 30_000, everyMs = 20): Promise<boolean> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() >= until) return false;
    await sleep(everyMs);
  }
}

function startChild(command: string, args: string[], log: string): ChildProcess {
  const fd = openSync(log, 'a');
  const child = spawn(command, args, { stdio: ['ignore', fd, fd] });
  closeSync(fd);
  live.add(child);
  child.once('exit', () => live.delete(child));
  return child;
}

async function stopChild(child: ChildProcess | undefined, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((done) => child.once('exit', done));
  child.kill(signal);
  await exited;
}

function tail(path: string, lines = 40): string {
  try {
    return readFileSync(path, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

function httpStatus(port: number, path: string): Promise<number | undefined> {
  return new Promise((done) => {
    const request = get({ host: '127.0.0.1', port, path, timeout: 1000 }, (response) => {
      response.resume();
      done(response.statusCode);
    });
    request.on('error', () => done(undefined));
    request.on('timeout', () => {
      request.destroy();
      done(undefined);
    });
  });
}

export interface SidecarSettings {
  /** `--consumer-name`. */
  consumerName: string;
  /** Extra flags (the scenarios' `sidecar_args`). */
  args?: string[];
  /** Listen on a unix socket in the fixture's directory instead of a TCP port. */
  unixSocket?: boolean;
}

/** redis-server plus one echomq-sidecar, started together and stopped together. */
export class Fixture {
  readonly dir: string;
  readonly redisPort: number;
  readonly grpcPort: number;
  readonly adminPort: number;
  readonly settings: SidecarSettings;
  redis!: Resp;
  #redisChild: ChildProcess | undefined;
  #sidecar: ChildProcess | undefined;

  private constructor(settings: SidecarSettings, ports: number[]) {
    this.dir = mkdtempSync(join(tmpdir(), 'echomq-ts-'));
    this.settings = settings;
    [this.redisPort, this.grpcPort, this.adminPort] = ports as [number, number, number];
  }

  static async start(settings: SidecarSettings): Promise<Fixture> {
    const fixture = new Fixture(settings, [await freePort(), await freePort(), await freePort()]);
    try {
      await fixture.#startRedis();
      await fixture.startSidecar();
    } catch (error) {
      await fixture.stop();
      throw error;
    }
    return fixture;
  }

  /** The gRPC target clients connect to. */
  get target(): string {
    return this.settings.unixSocket ? `unix:${join(this.dir, 'sidecar.sock')}` : `127.0.0.1:${this.grpcPort}`;
  }

  get sidecarLog(): string {
    return join(this.dir, 'sidecar.log');
  }

  async #startRedis(): Promise<void> {
    const log = join(this.dir, 'redis.log');
    this.#redisChild = startChild(
      'redis-server',
      ['--port', String(this.redisPort), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', this.dir],
      log,
    );
    const up = await eventually(async () => {
      if (this.#redisChild?.exitCode !== null) return true;
      try {
        this.redis = await Resp.connect(this.redisPort);
        return (await this.redis.command('PING')) === 'PONG';
      } catch {
        return false;
      }
    }, 10_000, 50);
    if (!up || this.#redisChild?.exitCode !== null) throw new Error(`redis-server did not start:\n${tail(log)}`);
  }

  /** Starts (or restarts) the sidecar on the fixture's ports and waits for /readyz. */
  async startSidecar(): Promise<void> {
    const bin = process.env.ECHOMQ_SIDECAR_BIN ?? join(REPO_ROOT, 'target', 'debug', 'echomq-sidecar');
    if (!existsSync(bin)) throw new Error(`no sidecar binary at ${bin}: run \`cargo build --bin echomq-sidecar\` first`);
    const listen = this.settings.unixSocket ? this.target : `127.0.0.1:${this.grpcPort}`;
    if (this.settings.unixSocket) rmSync(join(this.dir, 'sidecar.sock'), { force: true });
    const child = startChild(
      bin,
      [
        '--redis-url',
        `redis://127.0.0.1:${this.redisPort}`,
        '--listen',
        listen,
        '--admin-listen',
        `127.0.0.1:${this.adminPort}`,
        '--consumer-name',
        this.settings.consumerName,
        ...(this.settings.args ?? []),
      ],
      this.sidecarLog,
    );
    this.#sidecar = child;
    const ready = await eventually(
      async () => child.exitCode !== null || child.signalCode !== null || (await httpStatus(this.adminPort, '/readyz')) === 200,
      30_000,
      50,
    );
    if (!ready || child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`the sidecar did not become ready (exit ${child.exitCode}):\n${tail(this.sidecarLog)}`);
    }
  }

  /** SIGKILLs the sidecar and waits for it to be gone. */
  async killSidecar(): Promise<void> {
    await stopChild(this.#sidecar, 'SIGKILL');
  }

  /** Stops everything and removes the directory. Safe to call twice. */
  async stop(): Promise<void> {
    this.redis?.close();
    await stopChild(this.#sidecar);
    await stopChild(this.#redisChild);
    if (process.env.ECHOMQ_KEEP_LOGS) {
      process.stderr.write(`fixture logs kept in ${this.dir}\n`);
    } else {
      rmSync(this.dir, { recursive: true, force: true });
    }
  }

  /** XPENDING <stream> <group>: the count of pending entries (0 when the group is missing). */
  async pending(stream: string, group: string): Promise<number> {
    try {
      const reply = (await this.redis.command('XPENDING', stream, group)) as unknown[];
      return Number(reply[0]);
    } catch {
      return 0;
    }
  }

  async xlen(stream: string): Promise<number> {
    return Number(await this.redis.command('XLEN', stream));
  }

  /** XRANGE <stream> - +, as [stream id, field name → value] pairs. */
  async entries(stream: string): Promise<{ streamId: string; fields: Map<string, Buffer> }[]> {
    const reply = (await this.redis.command('XRANGE', stream, '-', '+')) as [Buffer, Buffer[]][];
    return reply.map(([id, flat]) => {
      const fields = new Map<string, Buffer>();
      for (let i = 0; i + 1 < flat.length; i += 2) fields.set(flat[i]!.toString('utf8'), flat[i + 1]!);
      return { streamId: id.toString('utf8'), fields };
    });
  }
}
