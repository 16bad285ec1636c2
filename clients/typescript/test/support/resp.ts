// A minimal Redis (RESP2) client for the tests' direct checks (XPENDING, XLEN,
// XRANGE, SET): the client library itself never talks to Redis, and a full
// Redis client would be one more dependency for four commands.
import { connect, type Socket } from 'node:net';

export type Reply = null | number | string | Buffer | Reply[] | RedisReplyError;

export class RedisReplyError extends Error {
  override readonly name = 'RedisReplyError';
}

export class Resp {
  readonly #socket: Socket;
  #buffer = Buffer.alloc(0);
  readonly #waiting: { resolve: (reply: Reply) => void; reject: (error: Error) => void }[] = [];

  private constructor(socket: Socket) {
    this.#socket = socket;
    socket.on('data', (chunk: Buffer) => {
      this.#buffer = Buffer.concat([this.#buffer, chunk]);
      for (;;) {
        const parsed = parse(this.#buffer, 0);
        if (!parsed) break;
        this.#buffer = this.#buffer.subarray(parsed.end);
        this.#waiting.shift()?.resolve(parsed.value);
      }
    });
    const fail = (error: Error) => {
      for (const waiter of this.#waiting.splice(0)) waiter.reject(error);
    };
    socket.on('error', fail);
    socket.on('close', () => fail(new Error('redis connection closed')));
  }

  static connect(port: number): Promise<Resp> {
    return new Promise((resolve, reject) => {
      const socket = connect({ host: '127.0.0.1', port }, () => {
        socket.off('error', reject);
        resolve(new Resp(socket));
      });
      socket.once('error', reject);
    });
  }

  /** Sends one command; rejects on a Redis error reply. */
  async command(...args: (string | number | Buffer)[]): Promise<Reply> {
    const parts: Buffer[] = [Buffer.from(`*${args.length}\r\n`)];
    for (const arg of args) {
      const bytes = Buffer.isBuffer(arg) ? arg : Buffer.from(String(arg));
      parts.push(Buffer.from(`$${bytes.length}\r\n`), bytes, Buffer.from('\r\n'));
    }
    const reply = await new Promise<Reply>((resolve, reject) => {
      this.#waiting.push({ resolve, reject });
      this.#socket.write(Buffer.concat(parts));
    });
    if (reply instanceof RedisReplyError) throw reply;
    return reply;
  }

  close(): void {
    this.#socket.destroy();
  }
}

function parse(buffer: Buffer, start: number): { value: Reply; end: number } | undefined {
  const lineEnd = buffer.indexOf('\r\n', start);
  if (lineEnd < 0) return undefined;
  const type = String.fromCharCode(buffer[start]!);
  const line = buffer.toString('utf8', start + 1, lineEnd);
  const next = lineEnd + 2;
  switch (type) {
    case '+':
      return { value: line, end: next };
    case '-':
      return { value: new RedisReplyError(line), end: next };
    case ':':
      return { value: Number(line), end: next };
    case '$': {
      const length = Number(line);
      if (length < 0) return { value: null, end: next };
      if (buffer.length < next + length + 2) return undefined;
      return { value: Buffer.from(buffer.subarray(next, next + length)), end: next + length + 2 };
    }
    case '*': {
      const count = Number(line);
      if (count < 0) return { value: null, end: next };
      const items: Reply[] = [];
      let at = next;
      for (let i = 0; i < count; i++) {
        const item = parse(buffer, at);
        if (!item) return undefined;
        items.push(item.value);
        at = item.end;
      }
      return { value: items, end: at };
    }
    default:
      throw new Error(`unexpected RESP type ${JSON.stringify(type)}`);
  }
}
