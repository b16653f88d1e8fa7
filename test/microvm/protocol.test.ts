// The host's parser of the guest agent's frames: the guest is untrusted, so every way a frame can be
// wrong must end the connection with a typed error, never buffer without bound or misattribute data.
import { mkdtempSync, rmSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/index.js';
import { AgentConnection } from '../../src/backends/microvm/agent.js';
import type { BackendProcess } from '../../src/core/backend.js';
import {
  AGENT_VERSION,
  Frame,
  FrameDecoder,
  MAX_PAYLOAD,
  encodeExec,
  encodeFrame,
  encodeIdentity,
} from '../../src/backends/microvm/protocol.js';
import { newcArchive } from '../../src/backends/microvm/cpio.js';
import { INCOMING_FD, INCOMING_FDSET, kernelCmdline, qemuArgs } from '../../src/backends/microvm/qemu.js';

function u32(...v: number[]): Buffer {
  const b = Buffer.alloc(4 * v.length);
  v.forEach((x, i) => b.writeUInt32LE(x >>> 0, 4 * i));
  return b;
}

/** The limit counters STARTED and EXIT end with: u64 each. */
function u64(...v: number[]): Buffer {
  const b = Buffer.alloc(8 * v.length);
  v.forEach((x, i) => b.writeBigUInt64LE(BigInt(x), 8 * i));
  return b;
}

function hello(): Buffer {
  return encodeFrame(Frame.HELLO, 0, Buffer.from(AGENT_VERSION));
}

function violation(f: () => unknown): AirlockError {
  try {
    f();
  } catch (e) {
    expect(AirlockError.isInstance(e)).toBe(true);
    return e as AirlockError;
  }
  throw new Error('expected a protocol violation');
}

describe('microvm protocol: frames from the guest', () => {
  it('decodes every frame type the guest sends, split at any byte', () => {
    const stream = Buffer.concat([
      hello(),
      encodeFrame(Frame.STARTED, 7, Buffer.concat([u32(1234), u64(2, 5)])),
      encodeFrame(Frame.STDOUT, 7, Buffer.from('out')),
      encodeFrame(Frame.STDERR, 7, Buffer.from([0, 255])),
      encodeFrame(Frame.EXIT, 7, Buffer.concat([u32(3, 0), u64(3, 5)])),
      encodeFrame(Frame.EXIT, 8, Buffer.concat([u32(0xffffffff), u32(9), u64(0, Number.MAX_SAFE_INTEGER)])),
      encodeFrame(Frame.ERROR, 9, Buffer.from('no such file\x01')),
      encodeFrame(Frame.FILE_DATA, 10, Buffer.from('data')),
      encodeFrame(Frame.OK, 11),
    ]);
    for (const step of [1, 5, 12, 13, stream.length]) {
      const d = new FrameDecoder();
      const out = [];
      for (let o = 0; o < stream.length; o += step) out.push(...d.push(stream.subarray(o, o + step)));
      expect(out).toEqual([
        { type: 'hello', version: AGENT_VERSION },
        { type: 'started', id: 7, pid: 1234, counters: { oomKills: 2, pidsLimitHits: 5 } },
        { type: 'stdout', id: 7, data: Buffer.from('out') },
        { type: 'stderr', id: 7, data: Buffer.from([0, 255]) },
        { type: 'exit', id: 7, code: 3, signal: null, counters: { oomKills: 3, pidsLimitHits: 5 } },
        {
          type: 'exit',
          id: 8,
          code: null,
          signal: 9,
          counters: { oomKills: 0, pidsLimitHits: Number.MAX_SAFE_INTEGER },
        },
        { type: 'error', id: 9, message: 'no such file?' },
        { type: 'file-data', id: 10, data: Buffer.from('data') },
        { type: 'ok', id: 11 },
      ]);
    }
  });

  it('refuses a length over the bound from the header alone (nothing is buffered for it)', () => {
    const d = new FrameDecoder();
    const h = Buffer.alloc(12);
    h.writeUInt32LE(MAX_PAYLOAD + 1, 0);
    h[4] = Frame.STDOUT;
    expect(violation(() => d.push(h)).message).toMatch(/at most/);
    // Failed for good: later bytes are refused too.
    expect(violation(() => d.push(hello())).code).toBe('INTERNAL');
  });

  it.each([
    ['an unknown type', encodeFrame(200, 1, Buffer.alloc(0))],
    ['a host-only type (EXEC)', encodeFrame(Frame.EXEC, 1, Buffer.alloc(16))],
    ['a host-only type (KILL)', encodeFrame(Frame.KILL, 1, u32(9))],
    ['a wrong HELLO version', encodeFrame(Frame.HELLO, 0, Buffer.from('airlock-agent/999'))],
    ['a short STARTED', encodeFrame(Frame.STARTED, 1, Buffer.alloc(19))],
    ['a long STARTED', encodeFrame(Frame.STARTED, 1, Buffer.alloc(21))],
    ['an older STARTED (no counters)', encodeFrame(Frame.STARTED, 1, u32(1234))],
    ['an older EXIT (no counters)', encodeFrame(Frame.EXIT, 1, u32(0, 0))],
    ['a short EXIT', encodeFrame(Frame.EXIT, 1, Buffer.concat([u32(0, 0), Buffer.alloc(15)]))],
    ['an EXIT with code 256', encodeFrame(Frame.EXIT, 1, Buffer.concat([u32(256, 0), u64(0, 0)]))],
    ['an EXIT with both code and signal', encodeFrame(Frame.EXIT, 1, Buffer.concat([u32(1, 9), u64(0, 0)]))],
    [
      'an EXIT with signal 65',
      encodeFrame(Frame.EXIT, 1, Buffer.concat([u32(0xffffffff), u32(65), u64(0, 0)])),
    ],
    ['an EXIT with neither', encodeFrame(Frame.EXIT, 1, Buffer.concat([u32(0xffffffff), u32(0), u64(0, 0)]))],
    [
      'a limit counter over 2^53',
      encodeFrame(Frame.EXIT, 1, Buffer.concat([u32(0, 0), u64(Number.MAX_SAFE_INTEGER + 1, 0)])),
    ],
    ['an OK with a payload', encodeFrame(Frame.OK, 1, Buffer.from('x'))],
    ['an ERROR over 4096 bytes', encodeFrame(Frame.ERROR, 1, Buffer.alloc(4097, 'e'))],
  ])('refuses %s', (_what, frame) => {
    expect(violation(() => new FrameDecoder().push(frame)).code).toBe('INTERNAL');
  });

  it('refuses non-zero header padding', () => {
    const f = encodeFrame(Frame.STDOUT, 1, Buffer.from('x'));
    f[6] = 1;
    expect(violation(() => new FrameDecoder().push(f)).message).toMatch(/padding/);
  });

  it('waits for a whole frame before decoding it', () => {
    const d = new FrameDecoder();
    const f = encodeFrame(Frame.STDOUT, 3, Buffer.alloc(1000, 'a'));
    expect(d.push(f.subarray(0, 500))).toEqual([]);
    expect(d.push(f.subarray(500))).toHaveLength(1);
  });
});

describe('microvm protocol: frames to the guest', () => {
  it('EXEC carries uid, counts, stdin flag and NUL-terminated strings', () => {
    const f = encodeExec(5, { uid: 1000, argv: ['sh', '-c', 'é'], env: { A: '1' }, cwd: '/w', stdin: true });
    expect(f.readUInt32LE(0)).toBe(f.length - 12);
    expect(f[4]).toBe(Frame.EXEC);
    expect(f.readUInt32LE(8)).toBe(5);
    const p = f.subarray(12);
    expect([p.readUInt32LE(0), p.readUInt32LE(4), p.readUInt32LE(8), p[12]]).toEqual([1000, 3, 1, 1]);
    expect(p.subarray(16).toString('utf8')).toBe('/w\0sh\0-c\0é\0A=1\0');
  });

  it('EXEC refuses NUL bytes, empty argv and oversize requests with typed errors', () => {
    const base = { uid: 1000, env: {}, cwd: '/', stdin: false };
    expect(violation(() => encodeExec(1, { ...base, argv: ['a\0b'] })).code).toBe('INVALID_ARGUMENT');
    expect(violation(() => encodeExec(1, { ...base, argv: ['x'], env: { K: 'v\0' } })).code).toBe(
      'INVALID_ARGUMENT',
    );
    expect(violation(() => encodeExec(1, { ...base, argv: [] })).code).toBe('INVALID_ARGUMENT');
    expect(violation(() => encodeExec(1, { ...base, argv: ['x', 'y'.repeat(MAX_PAYLOAD)] })).code).toBe(
      'REQUEST_TOO_LARGE',
    );
    expect(violation(() => encodeExec(1, { ...base, argv: Array(5000).fill('a') })).code).toBe(
      'REQUEST_TOO_LARGE',
    );
  });

  it('IDENTITY carries the clock, limits, the seed and the hostname in the layout of guest/protocol.h', () => {
    const seed = Buffer.alloc(32, 7);
    const nowMs = 1_800_000_123_456;
    const f = encodeIdentity(9, { nowMs, pids: 77, memoryBytes: 5 * 2 ** 32 + 1, seed, hostname: 'airlock' });
    expect([f[4], f.readUInt32LE(8), f.readUInt32LE(0)]).toEqual([Frame.IDENTITY, 9, f.length - 12]);
    const p = f.subarray(12);
    expect(p.readBigUInt64LE(0)).toBe(1_800_000_123n);
    expect(p.readUInt32LE(8)).toBe(456_000_000);
    expect(p.readUInt32LE(12)).toBe(77);
    expect(p.readBigUInt64LE(16)).toBe(5n * 2n ** 32n + 1n);
    expect(p.subarray(24, 56)).toEqual(seed);
    expect(p.subarray(56).toString('latin1')).toBe('airlock\0');
  });

  it('IDENTITY refuses a short seed and a hostname that is not plain', () => {
    const base = { nowMs: 0, pids: 1, memoryBytes: 1, seed: Buffer.alloc(32), hostname: 'a' };
    expect(violation(() => encodeIdentity(1, { ...base, seed: Buffer.alloc(31) })).code).toBe('INTERNAL');
    for (const hostname of ['', 'a\0b', 'x'.repeat(65), 'a b', 'A/'])
      expect(violation(() => encodeIdentity(1, { ...base, hostname })).code).toBe('INTERNAL');
  });
});

describe('microvm agent connection: an exec carries its limit counters', () => {
  const req = { uid: 1000, argv: ['true'], env: {}, cwd: '/', stdin: false };
  /**
   * A connection whose guest side the test plays, over a real unix socket; start() execs and
   * answers STARTED with the given counters.
   */
  async function pair(): Promise<{
    guest: Socket;
    sent: Buffer[];
    done: () => void;
    start: (oom: number, pids: number) => Promise<{ id: number; p: BackendProcess }>;
  }> {
    const dir = mkdtempSync('/tmp/airlock-agent-test-');
    const path = join(dir, 's');
    const server = createServer();
    const accepted = new Promise<Socket>((r) => server.once('connection', r));
    await new Promise<void>((r) => server.listen(path, r));
    const host = connect(path);
    const guest = await accepted;
    const sent: Buffer[] = [];
    guest.on('data', (c: Buffer) => sent.push(c));
    const agent = new AgentConnection(host);
    guest.write(hello());
    await agent.ready();
    const start = async (oom: number, pids: number): Promise<{ id: number; p: BackendProcess }> => {
      const exec = agent.exec(req);
      while (!sent.length) await new Promise((r) => setTimeout(r, 5));
      const id = Buffer.concat(sent).readUInt32LE(8);
      guest.write(encodeFrame(Frame.STARTED, id, Buffer.concat([u32(42), u64(oom, pids)])));
      return { id, p: await exec };
    };
    return {
      guest,
      sent,
      start,
      done: () => {
        agent.close(new Error('done'));
        guest.destroy();
        server.close();
        rmSync(dir, { recursive: true, force: true });
      },
    };
  }
  const types = (bufs: Buffer[]): number[] => {
    const all = Buffer.concat(bufs);
    const out: number[] = [];
    for (let o = 0; o < all.length; o += 12 + all.readUInt32LE(o)) out.push(all[o + 4]!);
    return out;
  };

  it('takes them from STARTED and EXIT, sending nothing but the EXEC', async () => {
    const { guest, sent, done, start } = await pair();
    try {
      const { id, p } = await start(1, 2);
      expect(p.counters?.atStart).toEqual({ oomKills: 1, pidsLimitHits: 2 });
      guest.write(encodeFrame(Frame.EXIT, id, Buffer.concat([u32(0xffffffff, 9), u64(2, 2)])));
      expect(await p.exited).toEqual({ exitCode: null, signal: 'SIGKILL' });
      expect(await p.counters?.atExit).toEqual({ oomKills: 2, pidsLimitHits: 2 });
      expect(types(sent)).toEqual([Frame.EXEC]);
    } finally {
      done();
    }
  });

  it('a VM gone mid-exec reads as no change (atExit is atStart)', async () => {
    const { guest, done, start } = await pair();
    try {
      const { p } = await start(3, 4);
      guest.destroy();
      expect(await p.exited).toEqual({ exitCode: null, signal: 'SIGKILL' });
      expect(await p.counters?.atExit).toEqual({ oomKills: 3, pidsLimitHits: 4 });
    } finally {
      done();
    }
  });
});

describe('microvm: initramfs archive and QEMU command line', () => {
  it('writes newc entries the kernel can unpack (4-byte aligned, trailer last)', () => {
    const a = newcArchive([
      { name: 'init', mode: 0o100755, data: Buffer.from('abc') },
      { name: 'dev', mode: 0o40755 },
    ]);
    expect(a.length % 4).toBe(0);
    expect(a.subarray(0, 6).toString()).toBe('070701');
    const s = a.toString('latin1');
    expect(s).toContain('init\0');
    expect(s.indexOf('abc')).toBeGreaterThan(s.indexOf('init\0'));
    expect(s.lastIndexOf('TRAILER!!!')).toBeGreaterThan(s.indexOf('dev\0'));
  });

  /** A VM's config as the command-line cases take it. */
  const base = {
    accel: 'tcg' as const,
    kernel: '/k',
    initramfs: '/i',
    rootfs: '/r.erofs',
    memoryBytes: 256 * 1024 * 1024,
    pids: 100,
    vcpus: 1,
    diskBytes: 1 << 30,
    agentSocket: '/s',
  };

  it('QEMU gets no network device, its own seccomp filter and a read-only root', () => {
    const args = qemuArgs(base);
    const joined = args.join(' ');
    expect(joined).toContain('-nodefaults');
    expect(joined).toContain('-nic none');
    expect(joined).not.toMatch(/virtio-net|netdev/);
    expect(joined).toMatch(/-sandbox on,.*spawn=deny/);
    expect(joined).toContain('file=/r.erofs,format=raw,readonly=on');
    expect(joined).toContain('-m 384M'); // the limit plus the guest kernel's share
    expect(kernelCmdline({ accel: 'kvm', diskBytes: 5, memoryBytes: 7, pids: 9 })).not.toContain(
      'tsc_early_khz',
    );
  });

  it('snapshots are mapped-ram streams; a restore reads the inherited fd through an fdset, opening no path', () => {
    // Saved and loaded alike (QEMU refuses a stream of the other format).
    expect(qemuArgs(base).join(' ')).toContain('-global migration.mapped-ram=on');
    expect(qemuArgs(base).join(' ')).not.toContain('-incoming');
    const restore = qemuArgs({ ...base, incomingFd: INCOMING_FD }).join(' ');
    expect(restore).toContain('-global migration.mapped-ram=on');
    expect(restore).toContain(
      `-add-fd fd=${INCOMING_FD},set=${INCOMING_FDSET} -incoming file:/dev/fdset/${INCOMING_FDSET}`,
    );
    expect(restore.match(/-incoming /g)).toHaveLength(1);
    expect(qemuArgs({ ...base, probe: true }).join(' ')).not.toContain('migration');
  });

  it('with a network policy, one virtio-net on the inherited tap fd and the guest addresses on the command line', () => {
    const net = { fd: 4, guest: '10.0.2.2', gateway: '10.0.2.1' };
    const joined = qemuArgs({ ...base, net }).join(' ');
    expect(joined).not.toContain('-nic none');
    expect(joined.match(/-netdev /g)).toHaveLength(1);
    expect(joined).toContain('-netdev tap,id=net0,fd=4 -device virtio-net-device,netdev=net0');
    // QEMU never opens or configures a host interface itself: no ifname, no helper, no script.
    expect(joined).not.toMatch(/ifname=|helper=|script=|user,|bridge/);
    expect(kernelCmdline({ ...base, net })).toContain('airlock.ip=10.0.2.2 airlock.gw=10.0.2.1');
    expect(kernelCmdline(base)).not.toContain('airlock.ip');
    // The accelerator probe boots without devices, network or not.
    expect(qemuArgs({ ...base, net, probe: true }).join(' ')).not.toContain('netdev');
  });
});
