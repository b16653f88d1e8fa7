// spawnDirect (posix_spawn instead of forking Airlock): the child gets exactly the identity, fds,
// signal state, env and cwd asked for, and nothing of Airlock's; the calling thread is root again
// afterwards with its own groups; failures leave no fd, process or zombie behind.
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import type { Socket } from 'node:net';
import { describe, expect, it } from 'vitest';
import { killAndReap, reaped, spawnDirect } from '../../src/backends/host/spawn.privileged.js';
import { canRunNamespaces, SKIP_REASON, TEST_UID_RANGE } from '../helpers.js';

// A uid of the test range that no sandbox of the test runs gets (the range has 4096).
const UID = TEST_UID_RANGE.first + TEST_UID_RANGE.count - 7;

const field = (status: string, name: string): string =>
  new RegExp(`^${name}:[ \\t]*(.*)$`, 'm').exec(status)?.[1]?.trim() ?? '';

const readAll = (s: Socket): Promise<string> =>
  new Promise((resolve) => {
    let out = '';
    s.on('data', (d: Buffer) => (out += d.toString()));
    s.on('close', () => resolve(out));
  });

const ownFds = (): string[] => readdirSync('/proc/self/fd').sort();
const zombies = (): string[] =>
  readdirSync('/proc')
    .filter((p) => /^\d+$/.test(p))
    .filter((p) => {
      try {
        const s = readFileSync(`/proc/${p}/status`, 'utf8');
        return field(s, 'State').startsWith('Z') && field(s, 'PPid') === String(process.pid);
      } catch {
        return false;
      }
    });

describe.skipIf(!canRunNamespaces)(`spawnDirect (${SKIP_REASON})`, () => {
  it('starts the child as the given uid/gid with no groups, no capabilities, default signals, empty env, cwd /, and only its fds', async () => {
    const before = readFileSync('/proc/thread-self/status', 'utf8');
    // cat blocks reading its stdin (our pipe): inspect it from here while it is alive.
    const child = spawnDirect('/bin/cat', ['/bin/cat'], [], ['read', 'write', 'write'], {
      uid: UID,
      gid: UID,
    });
    const out = readAll(child.pipes[1]!);
    try {
      // Once exec'd (not our copy any more), every id is the new one, saved ids included.
      const status = (): string => readFileSync(`/proc/${child.pid}/status`, 'utf8');
      for (let i = 0; i < 20 && field(status(), 'Name') !== 'cat'; i++)
        await new Promise((r) => setTimeout(r, 5));
      const st = status();
      expect(field(st, 'Name')).toBe('cat');
      expect(field(st, 'Uid').split(/\s+/)).toEqual(Array(4).fill(String(UID)));
      expect(field(st, 'Gid').split(/\s+/)).toEqual(Array(4).fill(String(UID)));
      expect(field(st, 'Groups')).toBe('');
      expect(field(st, 'CapPrm')).toBe('0000000000000000');
      expect(field(st, 'CapEff')).toBe('0000000000000000');
      expect(field(st, 'SigIgn')).toBe('0000000000000000'); // Node ignores SIGPIPE; the child must not
      expect(field(st, 'SigBlk')).toBe('0000000000000000');
      expect(readFileSync(`/proc/${child.pid}/environ`, 'utf8')).toBe('');
      expect(readlinkSync(`/proc/${child.pid}/cwd`)).toBe('/');
      expect(readdirSync(`/proc/${child.pid}/fd`).sort()).toEqual(['0', '1', '2']);
      // The calling thread is root again, with exactly its former groups and capabilities.
      const after = readFileSync('/proc/thread-self/status', 'utf8');
      for (const f of ['Uid', 'Gid', 'Groups', 'CapPrm', 'CapEff'])
        expect(field(after, f)).toBe(field(before, f));
      expect(process.getuid!()).toBe(0);
      await child.capOpenFiles(123);
      const limits = readFileSync(`/proc/${child.pid}/limits`, 'utf8');
      expect(limits).toMatch(/Max open files\s+123\s+123\s/);
      expect(field(readFileSync('/proc/thread-self/status', 'utf8'), 'Uid')).toBe(field(before, 'Uid'));
      // The pipes work both ways.
      child.pipes[0]!.end('hello\n');
      expect(await out).toBe('hello\n');
      expect(await reaped(child)).toEqual({ exitCode: 0, signal: null });
    } finally {
      await killAndReap(child);
    }
  });

  it('feeds are read whole, and a feed never written reads as EOF', async () => {
    const child = spawnDirect(
      '/bin/sh',
      ['/bin/sh', '-c', 'cat <&3; echo "|"; cat <&4; echo "|$(cat <&5 | wc -c)"'],
      [],
      ['null', 'write', 'write', 'feed', 'feed', 'feed'],
    );
    const out = readAll(child.pipes[1]!);
    const big = Buffer.alloc(200_000, 'x'); // more than a default pipe holds: resized first
    child.feed(4, big);
    child.feed(3, Buffer.from('options'));
    child.closeFeeds(); // fd 5
    expect(() => child.feed(3, Buffer.from('again'))).toThrow(/not an open feed/);
    expect(await out).toBe(`options|\n${'x'.repeat(200_000)}|0\n`);
    expect(await reaped(child)).toEqual({ exitCode: 0, signal: null });
  });

  it('many fds: each of 37 feeds arrives on its own fd', async () => {
    const n = 40;
    const child = spawnDirect(
      '/bin/sh',
      ['/bin/sh', '-c', `i=3; while [ $i -lt ${n} ]; do cat /proc/self/fd/$i; i=$((i+1)); done`],
      [],
      ['null', 'write', 'write', ...Array<'feed'>(n - 3).fill('feed')],
    );
    const out = readAll(child.pipes[1]!);
    for (let i = 3; i < n; i++) child.feed(i, Buffer.from(`${i};`));
    expect(await out).toBe(Array.from({ length: n - 3 }, (_, k) => `${k + 3};`).join(''));
    expect(await reaped(child)).toEqual({ exitCode: 0, signal: null });
  });

  it("a program that cannot be exec'd throws ENOENT and leaves no fd open", () => {
    const fds = ownFds();
    expect(() => spawnDirect('/nonexistent/prog', ['prog'], [], ['read', 'write', 'write', 'feed'])).toThrow(
      expect.objectContaining({ code: 'ENOENT' }),
    );
    expect(ownFds()).toEqual(fds);
  });

  it('kill and reap: the exit is a signal, and no zombie is left', async () => {
    const child = spawnDirect('/usr/bin/sleep', ['/usr/bin/sleep', '60'], [], ['null', 'null', 'null']);
    expect(child.reap()).toBeUndefined(); // still running
    expect(await killAndReap(child)).toEqual({ exitCode: null, signal: 'SIGKILL' });
    expect(zombies()).toEqual([]);
    // A reaped child's pid may be reused: kill() is a no-op now.
    expect(() => child.kill()).not.toThrow();
    expect(child.reap()).toEqual({ exitCode: null, signal: 'SIGKILL' });
  });
});
