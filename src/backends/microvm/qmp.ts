// A minimal QMP client (QEMU's JSON monitor) for one VM's control socket: the snapshot and restore
// steps (stop, migrate, cont, query-migrate). QEMU runs jailed as the sandbox's uid and is treated as
// a peer that may be hostile after a guest escape: every line is bounded and checked with zod, and a
// reply that does not parse ends the session with an error instead of being trusted.
import { connect, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { z } from 'zod';
import { AirlockError } from '../../core/errors.js';

/** The longest line QMP sends us (replies here are tiny; events are small too). */
const MAX_LINE_BYTES = 64 * 1024;

const Reply = z
  .object({
    return: z.unknown().optional(),
    error: z.object({ class: z.string(), desc: z.string() }).loose().optional(),
    event: z.string().optional(),
    QMP: z.unknown().optional(),
  })
  .loose();
type Reply = z.output<typeof Reply>;

const MigrateStatus = z.object({ status: z.string().optional() }).loose();

export class Qmp {
  private buf = '';
  private readonly waiting: Array<{ resolve: (r: Reply) => void; reject: (e: Error) => void }> = [];
  private failed: Error | undefined;

  private constructor(private readonly sock: Socket) {
    sock.setEncoding('utf8');
    sock.on('data', (chunk: string) => this.onData(chunk));
    sock.on('error', (e) => this.fail(e));
    sock.on('close', () => this.fail(new AirlockError('SANDBOX_GONE', 'the VM monitor closed')));
  }

  /** Connect to `path` (retrying while QEMU has not made it yet) and enter command mode. */
  static async open(path: string, timeoutMs: number, signal?: AbortSignal): Promise<Qmp> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (signal?.aborted) throw new AirlockError('ABORTED', 'aborted while connecting to the VM monitor');
      const sock = await new Promise<Socket | undefined>((resolve) => {
        const s = connect(path);
        s.once('connect', () => resolve(s));
        s.once('error', () => resolve(undefined));
      });
      if (sock) {
        const q = new Qmp(sock);
        try {
          await q.next(); // the greeting
          await q.execute('qmp_capabilities');
          return q;
        } catch (e) {
          q.close();
          throw e;
        }
      }
      if (Date.now() > deadline)
        throw new AirlockError('INTERNAL', `the VM monitor at ${path} did not open in ${timeoutMs} ms`);
      await sleep(20);
    }
  }

  private onData(chunk: string): void {
    this.buf += chunk;
    let nl: number;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      const line = this.buf.slice(0, nl).trim();
      this.buf = this.buf.slice(nl + 1);
      if (!line) continue;
      let r: Reply;
      try {
        r = Reply.parse(JSON.parse(line));
      } catch {
        return this.fail(new AirlockError('INTERNAL', 'the VM monitor sent a line that is not QMP'));
      }
      if (r.event !== undefined) continue; // events are polled for through query commands instead
      const w = this.waiting.shift();
      if (!w) return this.fail(new AirlockError('INTERNAL', 'the VM monitor sent an unasked reply'));
      w.resolve(r);
    }
    if (this.buf.length > MAX_LINE_BYTES)
      this.fail(new AirlockError('INTERNAL', 'the VM monitor sent an overlong line'));
  }

  private fail(e: Error): void {
    if (this.failed) return;
    this.failed = e;
    this.sock.destroy();
    for (const w of this.waiting.splice(0)) w.reject(e);
  }

  private next(): Promise<Reply> {
    if (this.failed) return Promise.reject(this.failed);
    return new Promise((resolve, reject) => this.waiting.push({ resolve, reject }));
  }

  /** Run one command; its `return` value, or INTERNAL with QEMU's error description. */
  async execute(command: string, args?: Record<string, unknown>): Promise<unknown> {
    const reply = this.next();
    this.sock.write(
      JSON.stringify(args ? { execute: command, arguments: args } : { execute: command }) + '\n',
    );
    const r = await reply;
    if (r.error) throw new AirlockError('INTERNAL', `QEMU ${command}: ${r.error.desc}`);
    if (!('return' in r)) throw new AirlockError('INTERNAL', `QEMU ${command}: no return value`);
    return r.return;
  }

  /** Poll query-migrate until the migration is `completed` (else INTERNAL naming the status). */
  async migrated(timeoutMs: number, signal?: AbortSignal): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const s = MigrateStatus.parse(await this.execute('query-migrate')).status;
      if (s === 'completed') return;
      if (s === 'failed' || s === 'cancelled') throw new AirlockError('INTERNAL', `the VM's migration ${s}`);
      if (signal?.aborted) throw new AirlockError('ABORTED', 'aborted during the VM migration');
      if (Date.now() > deadline)
        throw new AirlockError('INTERNAL', `the VM's migration did not finish in ${timeoutMs} ms (${s})`);
      await sleep(20);
    }
  }

  close(): void {
    this.fail(new AirlockError('INTERNAL', 'the VM monitor session was closed'));
  }
}
