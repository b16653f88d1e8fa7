// The guest agent's frame format (guest/protocol.h is the other half; docs/microvm.md describes it).
// Every frame: a 12-byte header — u32 payload length (LE) | u8 type | 3 zero bytes | u32 id (LE) —
// then the payload. The guest is untrusted: every frame it sends is checked here (size bound, known
// type, zero padding, exact payload shape per type) and anything else ends the connection, so a
// hostile guest can make its own sandbox fail but never make Airlock buffer without bound or
// misattribute output.
import type { LimitCounters } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';

export const AGENT_VERSION = 'airlock-agent/2';
export const AGENT_PORT_NAME = 'airlock.agent';
export const HEADER_BYTES = 12;
/** Largest payload either side sends (guest/protocol.h AGENT_MAX_PAYLOAD). */
export const MAX_PAYLOAD = 1024 * 1024;
/** Largest file a FILE_READ / FILE_WRITE carries (guest/protocol.h AGENT_MAX_FILE_BYTES). */
export const MAX_FILE_BYTES = MAX_PAYLOAD - 64;
/** Most strings (argv + env) one EXEC carries (guest/protocol.h AGENT_MAX_STRINGS). */
export const MAX_STRINGS = 4096;

export const Frame = {
  HELLO: 1,
  EXEC: 2,
  STARTED: 3,
  STDOUT: 4,
  STDERR: 5,
  STDIN: 6,
  STDIN_EOF: 7,
  EXIT: 8,
  KILL: 9,
  ERROR: 10,
  FILE_READ: 11,
  FILE_DATA: 12,
  FILE_WRITE: 13,
  OK: 14,
  SHUTDOWN: 15,
  IDENTITY: 16,
} as const;

/** Bytes of host entropy an IDENTITY frame carries (guest/protocol.h AGENT_SEED_BYTES). */
export const SEED_BYTES = 32;

/** What makes a started (booted or restored) VM one sandbox: see guest/agent.c do_identity. */
export interface Identity {
  /** The host's wall clock, ms since the epoch. */
  readonly nowMs: number;
  readonly pids: number;
  readonly memoryBytes: number;
  /** SEED_BYTES fresh random bytes from the host. */
  readonly seed: Buffer;
  readonly hostname: string;
}

/** A frame the guest may send, decoded and checked. */
export type GuestFrame =
  | { readonly type: 'hello'; readonly version: string }
  | {
      readonly type: 'started';
      readonly id: number;
      readonly pid: number;
      /** The sandbox cgroup's counters before the process started. */
      readonly counters: LimitCounters;
    }
  | { readonly type: 'stdout' | 'stderr' | 'file-data'; readonly id: number; readonly data: Buffer }
  | {
      readonly type: 'exit';
      readonly id: number;
      readonly code: number | null;
      readonly signal: number | null;
      /** The sandbox cgroup's counters once every process of the exec was gone. */
      readonly counters: LimitCounters;
    }
  | { readonly type: 'error'; readonly id: number; readonly message: string }
  | { readonly type: 'ok'; readonly id: number };

function violation(what: string): AirlockError {
  return new AirlockError('INTERNAL', `the microVM guest agent broke the protocol: ${what}`);
}

export function encodeFrame(type: number, id: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  if (payload.length > MAX_PAYLOAD)
    throw new AirlockError('INTERNAL', `frame payload over ${MAX_PAYLOAD} bytes`);
  const h = Buffer.alloc(HEADER_BYTES);
  h.writeUInt32LE(payload.length, 0);
  h.writeUInt8(type, 4);
  h.writeUInt32LE(id >>> 0, 8);
  return Buffer.concat([h, payload]);
}

/** A process to start: strings may not hold NUL (the guest splits on it). */
export interface ExecRequest {
  readonly uid: number;
  readonly argv: readonly string[];
  readonly env: Readonly<Record<string, string>>;
  readonly cwd: string;
  readonly stdin: boolean;
}

/** EXEC payload: u32 uid, u32 argc, u32 envc, u8 stdin, 3 zero bytes, then cwd, argv, env ("K=V"), each NUL-terminated. */
export function encodeExec(id: number, r: ExecRequest): Buffer {
  const env = Object.entries(r.env).map(([k, v]) => `${k}=${v}`);
  const strings = [r.cwd, ...r.argv, ...env];
  if (r.argv.length < 1)
    throw new AirlockError('INVALID_ARGUMENT', 'argv must not be empty', { field: 'argv' });
  if (r.argv.length + env.length > MAX_STRINGS) {
    throw new AirlockError(
      'REQUEST_TOO_LARGE',
      `an exec on the microvm tier carries at most ${MAX_STRINGS} argv and env entries together`,
    );
  }
  for (const s of strings) {
    if (s.includes('\0')) {
      throw new AirlockError('INVALID_ARGUMENT', 'argv, env and cwd must not contain NUL bytes', {
        field: 'argv',
      });
    }
  }
  const head = Buffer.alloc(16);
  head.writeUInt32LE(r.uid, 0);
  head.writeUInt32LE(r.argv.length, 4);
  head.writeUInt32LE(env.length, 8);
  head.writeUInt8(r.stdin ? 1 : 0, 12);
  const body = Buffer.from(strings.map((s) => `${s}\0`).join(''), 'utf8');
  if (head.length + body.length > MAX_PAYLOAD) {
    throw new AirlockError(
      'REQUEST_TOO_LARGE',
      `an exec's argv, env and cwd on the microvm tier total at most ${MAX_PAYLOAD - 16} bytes`,
    );
  }
  return encodeFrame(Frame.EXEC, id, Buffer.concat([head, body]));
}

export function encodeFileWrite(id: number, path: string, mode: number, data: Buffer): Buffer {
  const head = Buffer.alloc(4);
  head.writeUInt32LE(mode & 0o7777, 0);
  return encodeFrame(Frame.FILE_WRITE, id, Buffer.concat([head, Buffer.from(`${path}\0`), data]));
}

/**
 * IDENTITY payload: u64 seconds, u32 nanoseconds, u32 pids.max, u64 memory.max, the seed, then the
 * hostname NUL-terminated (guest/protocol.h).
 */
export function encodeIdentity(id: number, x: Identity): Buffer {
  // At most 64 bytes: guest/protocol.h AGENT_MAX_HOSTNAME.
  if (x.seed.length !== SEED_BYTES || !/^[a-z0-9.-]{1,64}$/.test(x.hostname))
    throw new AirlockError('INTERNAL', 'a VM identity needs a 32-byte seed and a plain hostname');
  const head = Buffer.alloc(24);
  const ms = Math.floor(x.nowMs);
  head.writeBigUInt64LE(BigInt(Math.floor(ms / 1000)), 0);
  head.writeUInt32LE((ms % 1000) * 1_000_000, 8);
  head.writeUInt32LE(Math.min(0xffff_ffff, Math.floor(x.pids)), 12);
  head.writeBigUInt64LE(BigInt(Math.floor(x.memoryBytes)), 16);
  return encodeFrame(Frame.IDENTITY, id, Buffer.concat([head, x.seed, Buffer.from(`${x.hostname}\0`)]));
}

/** Splits the guest's byte stream into checked frames. Throws (and stays failed) on the first violation. */
export class FrameDecoder {
  private buf: Buffer = Buffer.alloc(0);
  private failed: AirlockError | undefined;

  push(chunk: Buffer): GuestFrame[] {
    if (this.failed) throw this.failed;
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    const out: GuestFrame[] = [];
    try {
      while (this.buf.length >= HEADER_BYTES) {
        const len = this.buf.readUInt32LE(0);
        if (len > MAX_PAYLOAD) throw violation(`frame of ${len} bytes (at most ${MAX_PAYLOAD})`);
        if (this.buf[5] !== 0 || this.buf[6] !== 0 || this.buf[7] !== 0)
          throw violation('non-zero header padding');
        if (this.buf.length < HEADER_BYTES + len) break;
        const type = this.buf[4]!;
        const id = this.buf.readUInt32LE(8);
        const p = this.buf.subarray(HEADER_BYTES, HEADER_BYTES + len);
        this.buf = this.buf.subarray(HEADER_BYTES + len);
        out.push(decode(type, id, Buffer.from(p)));
      }
    } catch (e) {
      this.failed = e as AirlockError;
      throw e;
    }
    return out;
  }
}

function decode(type: number, id: number, p: Buffer): GuestFrame {
  const size = (n: number): void => {
    if (p.length !== n) throw violation(`frame type ${type} with a ${p.length}-byte payload (want ${n})`);
  };
  /** STARTED and EXIT end with u64 oom kills, u64 pids.max hits (guest/agent.c put_counters). */
  const counters = (at: number): LimitCounters => {
    const [oomKills, pidsLimitHits] = [p.readBigUInt64LE(at), p.readBigUInt64LE(at + 8)].map((n) => {
      if (n > BigInt(Number.MAX_SAFE_INTEGER)) throw violation(`a limit counter of ${n}`);
      return Number(n);
    });
    return { oomKills: oomKills!, pidsLimitHits: pidsLimitHits! };
  };
  switch (type) {
    case Frame.HELLO:
      if (p.toString('latin1') !== AGENT_VERSION) throw violation('unknown agent version');
      return { type: 'hello', version: AGENT_VERSION };
    case Frame.STARTED:
      size(20);
      return { type: 'started', id, pid: p.readUInt32LE(0), counters: counters(4) };
    case Frame.STDOUT:
      return { type: 'stdout', id, data: p };
    case Frame.STDERR:
      return { type: 'stderr', id, data: p };
    case Frame.FILE_DATA:
      if (p.length > MAX_FILE_BYTES) throw violation('file data over the bound');
      return { type: 'file-data', id, data: p };
    case Frame.EXIT: {
      size(24);
      const code = p.readInt32LE(0);
      const signal = p.readUInt32LE(4);
      const exited = code >= 0 && code <= 255 && signal === 0;
      const signalled = code === -1 && signal >= 1 && signal <= 64;
      if (!exited && !signalled) throw violation(`exit with code ${code} and signal ${signal}`);
      const c = counters(8);
      return exited
        ? { type: 'exit', id, code, signal: null, counters: c }
        : { type: 'exit', id, code: null, signal, counters: c };
    }
    case Frame.ERROR:
      if (p.length > 4096) throw violation('error message over 4096 bytes');
      return { type: 'error', id, message: p.toString('utf8').replace(/[^\x20-\x7e]/g, '?') };
    case Frame.OK:
      size(0);
      return { type: 'ok', id };
    default:
      throw violation(`frame type ${type} is not one the guest sends`);
  }
}
