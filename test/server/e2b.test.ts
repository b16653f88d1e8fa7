// The official `e2b` SDK, unchanged, against e2bRoutes with real sandboxes (test/server/e2b-harness.ts):
// every feature of docs/e2b.md, twice: over LocalSandboxApi and over RemoteSandboxApi + the native REST
// API. The wire-level attacks (malformed calls, disconnects, caps, credentials) are in e2b-wire.test.ts.
import {
  CommandExitError,
  FileNotFoundError,
  RateLimitError,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  TimeoutError,
  type CommandHandle,
} from 'e2b';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { canRunNamespaces, NO_RESIDUE, settledResidue, SKIP_REASON } from '../helpers.js';
import { collector, DOMAIN, startE2bHarness, type E2bHarness } from './e2b-harness.js';

let h: E2bHarness;
let base = '';

beforeAll(async () => {
  if (!canRunNamespaces) return;
  h = await startE2bHarness();
  base = h.base;
});

afterAll(async () => {
  if (canRunNamespaces) await h.close();
});

for (const [variant, prefix] of [
  ['over LocalSandboxApi', 'e2b'],
  ['over RemoteSandboxApi and the native REST API', 'e2b-remote'],
] as const)
  describe.skipIf(!canRunNamespaces)(
    `e2b SDK against e2bRoutes ${variant}${canRunNamespaces ? '' : ` [skipped: ${SKIP_REASON}]`}`,
    () => {
      let sbx: Sandbox;

      beforeAll(async () => {
        process.env.E2B_API_URL = `${base}/${prefix}`;
        process.env.E2B_SANDBOX_URL = `${base}/${prefix}/envd`;
        sbx = await Sandbox.create({
          timeoutMs: 600_000,
          metadata: { suite: 'e2b', run: 'one' },
          envs: { FOO: 'bar baz' },
        });
      }, 60_000);

      it('create: envs, metadata, getHost, getInfo, list by metadata', async () => {
        expect(sbx.sandboxId).toMatch(/^[A-Za-z0-9_-]+$/);
        expect(sbx.getHost(3000)).toBe(`3000-${sbx.sandboxId}.${DOMAIN}`);
        const r = await sbx.commands.run('echo "$FOO"; pwd; id -un');
        expect(r.stdout).toBe('bar baz\n/home/user\nuser\n');
        const info = await sbx.getInfo();
        expect(info.metadata).toEqual({ suite: 'e2b', run: 'one' });
        expect(info.state).toBe('running');
        const found = await Sandbox.list({ query: { metadata: { suite: 'e2b', run: 'one' } } }).nextItems();
        expect(found.map((s) => s.sandboxId)).toEqual([sbx.sandboxId]);
        const odd = await Sandbox.create({
          timeoutMs: 60_000,
          metadata: { 'k&=%': 'v=&%ü +', suite: 'e2b' },
        });
        try {
          const hit = await Sandbox.list({ query: { metadata: { 'k&=%': 'v=&%ü +' } } }).nextItems();
          expect(hit.map((s) => [s.sandboxId, s.metadata])).toEqual([
            [odd.sandboxId, { 'k&=%': 'v=&%ü +', suite: 'e2b' }],
          ]);
          // Pages of one: two pages, then no more.
          const pages = Sandbox.list({ query: { metadata: { suite: 'e2b' } }, limit: 1 });
          const p1 = await pages.nextItems();
          expect(pages.hasNext).toBe(true);
          const p2 = await pages.nextItems();
          expect(pages.hasNext).toBe(false);
          expect([...p1, ...p2].map((x) => x.sandboxId).sort()).toEqual(
            [sbx.sandboxId, odd.sandboxId].sort(),
          );
          const miss = await Sandbox.list({ query: { metadata: { 'k&=%': 'v=&%ü' } } }).nextItems();
          expect(miss).toEqual([]);
        } finally {
          await odd.kill();
        }
        const none = await Sandbox.list({ query: { metadata: { suite: 'e2b', run: 'other' } } }).nextItems();
        expect(none).toEqual([]);
      });

      it('commands.run streams stdout and stderr live, in order, with stdin', async () => {
        const out: string[] = [];
        const got = collector();
        const h: CommandHandle = await sbx.commands.run(
          'read a; echo "o1 $a"; read b; echo "e1 $b" >&2; read c; echo "o2 $c"; exit 0',
          {
            background: true,
            stdin: true,
            onStdout: (d) => (out.push(`out:${d}`), got.push(d)),
            onStderr: (d) => (out.push(`err:${d}`), got.push(d)),
          },
        );
        // Each line is written only after the previous one arrived: output is live, and in order.
        await sbx.commands.sendStdin(h.pid, 'x\n');
        await got.until((t) => t.includes('o1 x'));
        await h.sendStdin('y\n');
        await got.until((t) => t.includes('e1 y'));
        await h.sendStdin('z\n');
        const r = await h.wait();
        expect(r.exitCode).toBe(0);
        expect(out).toEqual(['out:o1 x\n', 'err:e1 y\n', 'out:o2 z\n']);
      });

      it('a non-zero exit is a CommandExitError with the exit code and output', async () => {
        const e = await sbx.commands.run('echo oops >&2; exit 3').catch((x: unknown) => x);
        expect(e).toBeInstanceOf(CommandExitError);
        expect((e as CommandExitError).exitCode).toBe(3);
        expect((e as CommandExitError).stderr).toBe('oops\n');
      });

      it('without stdin: true a command reads an empty stdin', async () => {
        expect((await sbx.commands.run('cat; echo done')).stdout).toBe('done\n');
      });

      it('closeStdin ends the input of a running command', async () => {
        const h = await sbx.commands.run('wc -c', { background: true, stdin: true });
        await h.sendStdin(new Uint8Array([0, 1, 2, 255]));
        await h.closeStdin();
        expect((await h.wait()).stdout.trim()).toBe('4');
      });

      it('background command: list, connect from another client, kill', async () => {
        const h = await sbx.commands.run('echo hello; sleep 600', { background: true, timeoutMs: 0 });
        expect((await sbx.commands.list()).map((p) => p.pid)).toContain(h.pid);
        const listed = (await sbx.commands.list()).find((p) => p.pid === h.pid)!;
        expect(listed.cmd).toBe('/bin/bash');
        expect(listed.args).toEqual(['-l', '-c', 'echo hello; sleep 600']);
        // A second client (its own Sandbox object) replays the output so far.
        const other = await Sandbox.connect(sbx.sandboxId);
        const got = collector();
        const h2 = await other.commands.connect(h.pid, { onStdout: (d) => got.push(d), timeoutMs: 0 });
        await got.until((t) => t === 'hello\n');
        expect(await h.kill()).toBe(true);
        const e = await h2.wait().catch((x: unknown) => x);
        expect(e).toBeInstanceOf(CommandExitError);
        expect((e as CommandExitError).exitCode).toBe(-1);
        expect((await sbx.commands.list()).map((p) => p.pid)).not.toContain(h.pid);
        expect(await sbx.commands.kill(h.pid)).toBe(false);
        expect(await sbx.commands.kill(999_999)).toBe(false);
        await expect(sbx.commands.connect(999_999)).rejects.toThrow(/999999/);
      });

      it('concurrent commands up to the cap run; one more is refused as a rate limit, not a dead sandbox', async () => {
        const running = (await sbx.commands.list()).length;
        const hs = await Promise.all(
          Array.from({ length: 32 - running }, () =>
            sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 }),
          ),
        );
        try {
          expect(new Set(hs.map((h) => h.pid)).size).toBe(hs.length);
          await expect(sbx.commands.run('true')).rejects.toBeInstanceOf(RateLimitError);
          expect(await sbx.isRunning()).toBe(true);
        } finally {
          await Promise.all(hs.map((h) => h.kill()));
        }
        await vi.waitFor(async () => expect((await sbx.commands.run('echo ok')).stdout).toBe('ok\n'), {
          timeout: 10_000,
          interval: 100,
        });
      }, 60_000);

      it('a command past its timeoutMs is killed: TimeoutError, and it is gone', async () => {
        const e = await sbx.commands
          .run('echo started; sleep 300', { timeoutMs: 1500 })
          .catch((x: unknown) => x);
        expect(e).toBeInstanceOf(TimeoutError);
        // The client gives up at its deadline; the server kills the command at the same deadline.
        await vi.waitFor(
          async () => {
            const running = await sbx.commands.list();
            expect(running.filter((p) => p.args.join(' ').includes('sleep 300'))).toEqual([]);
          },
          { timeout: 20_000, interval: 200 },
        );
      });

      it('files: text and binary round trips, streams, gzip, many files', async () => {
        await sbx.files.write('notes/a.txt', 'hello ünïcode\n');
        expect(await sbx.files.read('/home/user/notes/a.txt')).toBe('hello ünïcode\n');
        const bin = new Uint8Array(512).map((_, i) => (i * 7) % 256);
        await sbx.files.write('/home/user/bin.dat', bin.buffer);
        expect(await sbx.files.read('/home/user/bin.dat', { format: 'bytes' })).toEqual(bin);
        const stream = new ReadableStream<Uint8Array>({
          start(c) {
            c.enqueue(new Uint8Array([0, 0, 1]));
            c.enqueue(new Uint8Array([0xff, 0xfe]));
            c.close();
          },
        });
        const w = await sbx.files.write('streamed.bin', stream);
        expect(w.path).toBe('/home/user/streamed.bin');
        expect(await sbx.files.read('streamed.bin', { format: 'bytes' })).toEqual(
          new Uint8Array([0, 0, 1, 0xff, 0xfe]),
        );
        await sbx.files.write('gz.txt', 'compressed '.repeat(1000), { gzip: true });
        expect(await sbx.files.read('gz.txt')).toBe('compressed '.repeat(1000));
        const many = await sbx.files.write([
          { path: 'm/one.txt', data: '1' },
          { path: '/home/user/m/two.txt', data: '2' },
        ]);
        expect(many.map((f) => f.path)).toEqual(['/home/user/m/one.txt', '/home/user/m/two.txt']);
        expect(await sbx.files.read('m/two.txt')).toBe('2');
        const empty = await sbx.files.write('empty.txt', '');
        expect(empty.name).toBe('empty.txt');
        expect(await sbx.files.read('empty.txt')).toBe('');
      });

      it('commands take a cwd (relative to the home) and envs', async () => {
        await sbx.files.makeDir('wd');
        const r = await sbx.commands.run('pwd; echo "$X"', { cwd: 'wd', envs: { X: 'y z' } });
        expect(r.stdout).toBe('/home/user/wd\ny z\n');
      });

      it('an unknown template is a clear error', async () => {
        await expect(Sandbox.create('no-such-template', { timeoutMs: 10_000 })).rejects.toThrow(
          /no-such-template/,
        );
      });

      it('files: list, exists, getInfo, makeDir, rename, remove, not found', async () => {
        expect(await sbx.files.makeDir('d1/d2')).toBe(true);
        expect(await sbx.files.makeDir('d1/d2')).toBe(false);
        await sbx.files.write('d1/f.txt', 'abc');
        const entries = await sbx.files.list('d1');
        expect(entries.map((e) => [e.name, e.type]).sort()).toEqual([
          ['d2', 'dir'],
          ['f.txt', 'file'],
        ]);
        expect((await sbx.files.list('d1', { depth: 2 })).map((e) => e.path).sort()).toEqual([
          '/home/user/d1/d2',
          '/home/user/d1/f.txt',
        ]);
        const info = await sbx.files.getInfo('d1/f.txt');
        expect(info).toMatchObject({ name: 'f.txt', type: 'file', size: 3, path: '/home/user/d1/f.txt' });
        expect(info.permissions).toMatch(/^-[rwx-]{9}$/);
        expect(await sbx.files.exists('d1/f.txt')).toBe(true);
        expect(await sbx.files.exists('d1/nope')).toBe(false);
        const moved = await sbx.files.rename('d1/f.txt', 'd1/g.txt');
        expect(moved.path).toBe('/home/user/d1/g.txt');
        expect(await sbx.files.exists('d1/f.txt')).toBe(false);
        await sbx.files.remove('d1/g.txt');
        expect(await sbx.files.exists('d1/g.txt')).toBe(false);
        await expect(sbx.files.read('d1/g.txt')).rejects.toBeInstanceOf(FileNotFoundError);
        await expect(sbx.files.getInfo('d1/g.txt')).rejects.toBeInstanceOf(FileNotFoundError);
        await expect(sbx.files.rename('d1/none', 'd1/x')).rejects.toBeInstanceOf(FileNotFoundError);
      });

      it('watchDir reports creates, writes and removes, named relative to the directory', async () => {
        await sbx.files.makeDir('w');
        const events: string[] = [];
        const got = collector();
        const handle = await sbx.files.watchDir('w', (e) => {
          events.push(`${e.type}:${e.name}`);
          got.push(`${e.type}:${e.name};`);
        });
        await sbx.files.write('w/a.txt', '1');
        await got.until((t) => t.includes('create:a.txt'));
        await sbx.files.remove('w/a.txt');
        await got.until((t) => t.includes('remove:a.txt'));
        await handle.stop();
        // A poller may also see a write or attribute change in between; the story is create … remove.
        expect(events[0]).toBe('create:a.txt');
        expect(events.at(-1)).toBe('remove:a.txt');
        expect(events.filter((e) => !e.endsWith(':a.txt'))).toEqual([]);
      });

      it('setTimeout moves the deadline', async () => {
        const before = Date.now();
        await sbx.setTimeout(120_000);
        const end = (await sbx.getInfo()).endAt.getTime();
        expect(end).toBeGreaterThanOrEqual(before + 119_000);
        expect(end).toBeLessThanOrEqual(Date.now() + 121_000);
        await sbx.setTimeout(600_000);
      });

      it('unsupported features fail with an error that names them', async () => {
        await expect(sbx.commands.run('id', { user: 'root' })).rejects.toThrow(
          /user "root" is not supported/,
        );
        await expect(sbx.files.read('/etc/hostname', { user: 'root' })).rejects.toThrow(
          /user "root" is not supported/,
        );
        await expect(sbx.files.write('meta.txt', 'x', { metadata: { k: 'v' } })).rejects.toThrow(/metadata/);
        await expect(sbx.getMetrics()).rejects.toThrow(/metrics is not supported/);
        await expect(sbx.pty.create({ cols: 80, rows: 24, onData: () => undefined })).rejects.toThrow(/PTY/);
        await expect(sbx.files.watchDir('w', () => undefined, { recursive: true })).rejects.toThrow(
          /recursive/,
        );
        await expect(Sandbox.create({ mcp: { exa: { apiKey: 'x' } } as never })).rejects.toThrow(/mcp/);
        await expect(Sandbox.create({ allowInternetAccess: true })).rejects.toThrow(/allowInternetAccess/);
        await expect(sbx.fork()).rejects.toThrow(/fork/);
      });

      it('pause, then connect resumes', async () => {
        expect(await sbx.pause()).toBe(true);
        expect(await sbx.pause()).toBe(false);
        expect((await sbx.getInfo()).state).toBe('paused');
        await expect(sbx.commands.run('true')).rejects.toThrow(/paused/);
        const again = await Sandbox.connect(sbx.sandboxId);
        expect((await again.getInfo()).state).toBe('running');
        expect((await again.commands.run('echo back')).stdout).toBe('back\n');
      });

      it('snapshot, then create from it', async () => {
        await sbx.files.write('snap.txt', 'kept');
        const snap = await sbx.createSnapshot();
        const fork = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 });
        try {
          expect(await fork.files.read('snap.txt')).toBe('kept');
        } finally {
          await fork.kill();
        }
      }, 120_000);

      it('kill, then everything about the sandbox says so', async () => {
        const id = sbx.sandboxId;
        expect(await sbx.kill()).toBe(true);
        expect(await Sandbox.kill(id)).toBe(false);
        expect(await sbx.isRunning()).toBe(false);
        await expect(Sandbox.getInfo(id)).rejects.toBeInstanceOf(SandboxNotFoundError);
        await expect(Sandbox.connect(id)).rejects.toBeInstanceOf(SandboxNotFoundError);
        await expect(sbx.setTimeout(10_000)).rejects.toBeInstanceOf(SandboxNotFoundError);
        await expect(sbx.commands.run('true')).rejects.toBeInstanceOf(SandboxError);
        await expect(sbx.files.read('/etc/hostname')).rejects.toBeInstanceOf(TimeoutError);
      });

      it('unknown sandbox ids are NotFound', async () => {
        await expect(Sandbox.connect('nosuchsandbox')).rejects.toBeInstanceOf(SandboxNotFoundError);
        await expect(Sandbox.getInfo('nosuchsandbox')).rejects.toBeInstanceOf(SandboxNotFoundError);
        expect(await Sandbox.kill('nosuchsandbox')).toBe(false);
      });
    },
  );

describe.skipIf(!canRunNamespaces)(`after both variants (${SKIP_REASON})`, () => {
  it('every request went to the test server on 127.0.0.1, and nothing leaked', async () => {
    expect([...h.origins]).toEqual([base]);
    expect(h.served()).toBeGreaterThan(100);
    await h.airlock.close();
    expect(await settledResidue(5000)).toEqual(NO_RESIDUE);
  }, 60_000);
});
