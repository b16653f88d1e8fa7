// Files (list, stat, remove, mkdir, uploads over the cap, watch), lifecycle (timeout, pause/resume)
// and snapshots with forks, through the real REST API and RemoteSandboxApi.
import { readFileSync, readdirSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/index.js';
import type { FsEvent } from '../../src/server/contract.js';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, settledResidue, testAirlock } from '../helpers.js';
import { MAX_WATCHES_PER_SANDBOX } from '../../src/server/local.js';
import { CALLER, bytesOf, collectExec, startServer, streamOf, type TestServer } from './native-support.js';

const airlock = testAirlock();
const MAX_UPLOAD = 256 * 1024;

async function until(cond: () => boolean, what: string, maxMs = 15_000): Promise<void> {
  for (let waited = 0; !cond(); waited += 50) {
    if (waited > maxMs) throw new Error(`gave up waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Host pids whose command line is exactly argv (the host sees every sandbox process). */
function hostPids(argv: string[]): number[] {
  const want = argv.join('\0') + '\0';
  return readdirSync('/proc')
    .filter((p) => /^\d+$/.test(p))
    .filter((p) => {
      try {
        return readFileSync(`/proc/${p}/cmdline`, 'utf8') === want;
      } catch {
        return false;
      }
    })
    .map(Number);
}

const errOf = (p: Promise<unknown>): Promise<unknown> =>
  p.then(
    () => undefined,
    (e: unknown) => e,
  );

describe.skipIf(!canRunNamespaces)(`native REST API: files, lifecycle, snapshots (${SKIP_REASON})`, () => {
  let srv: TestServer;
  let id: string;
  beforeAll(async () => {
    srv = await startServer(airlock, {
      routes: { maxUploadBytes: MAX_UPLOAD },
      local: { watchIntervalMs: 100 },
    });
    id = (await srv.api.create({ ttlMs: 300_000 }, CALLER)).id;
  });
  afterAll(async () => {
    await srv.api.kill(id, CALLER).catch(() => {});
    await srv.close();
    await airlock.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });

  it('lists, stats, makes dirs and removes', async () => {
    const api = srv.api;
    const d = await api.makeDir(id, '/workspace/a/b', CALLER);
    expect(d).toMatchObject({ path: '/workspace/a/b', type: 'dir', name: 'b' });
    await api.writeFile(id, '/workspace/a/f.txt', streamOf(Buffer.from('12345')), CALLER);
    await api.writeFile(id, '/workspace/a/we ird\nname', streamOf(Buffer.from('x')), CALLER);
    const list = await api.listDir(id, '/workspace/a', CALLER);
    expect(list.map((e) => [e.name, e.type])).toEqual([
      ['b', 'dir'],
      ['f.txt', 'file'],
      ['we ird\nname', 'file'],
    ]);
    const st = await api.stat(id, 'a/f.txt', CALLER);
    expect(st).toMatchObject({ path: '/workspace/a/f.txt', size: 5, type: 'file' });
    expect(st.mode & 0o777).toBeGreaterThan(0);
    await collectExec(api.exec(id, { cmd: 'ln -s /etc/passwd /workspace/a/link' }, CALLER));
    expect(await api.stat(id, '/workspace/a/link', CALLER)).toMatchObject({ type: 'symlink' });
    await api.remove(id, '/workspace/a', CALLER);
    expect(AirlockError.is(await errOf(api.stat(id, '/workspace/a', CALLER)), 'FILE_NOT_FOUND')).toBe(true);
    expect(AirlockError.is(await errOf(api.remove(id, '/workspace/a', CALLER)), 'FILE_NOT_FOUND')).toBe(true);
    expect(AirlockError.is(await errOf(api.listDir(id, '/nope', CALLER)), 'FILE_NOT_FOUND')).toBe(true);
    // a file cannot be written over a directory, and the directory survives
    await api.makeDir(id, '/tmp/dir', CALLER);
    const over = await errOf(api.writeFile(id, '/tmp/dir', streamOf(Buffer.from('x')), CALLER));
    expect(AirlockError.isInstance(over)).toBe(true);
    expect((await api.stat(id, '/tmp/dir', CALLER)).type).toBe('dir');
    // a read-only place is PERMISSION_DENIED
    const ro = await errOf(api.writeFile(id, '/usr/x', streamOf(Buffer.from('x')), CALLER));
    expect(AirlockError.is(ro, 'PERMISSION_DENIED')).toBe(true);
  });

  it('refuses an upload over the cap with 413 and leaves the old file whole', async () => {
    const api = srv.api;
    await api.writeFile(id, '/tmp/keep', streamOf(Buffer.from('old')), CALLER);
    // streamed (chunked, no length): cut as it streams
    const chunk = Buffer.alloc(64 * 1024, 1);
    const e1 = await errOf(api.writeFile(id, '/tmp/keep', streamOf(...Array(8).fill(chunk)), CALLER));
    expect(AirlockError.is(e1, 'REQUEST_TOO_LARGE')).toBe(true);
    // with a Content-Length over the cap: refused before any byte is read
    const e2 = await errOf(api.writeFile(id, '/tmp/keep', Buffer.alloc(MAX_UPLOAD + 1), CALLER));
    expect(AirlockError.is(e2, 'REQUEST_TOO_LARGE')).toBe(true);
    expect((await bytesOf(await api.readFile(id, '/tmp/keep', CALLER))).toString()).toBe('old');
    const names = (await api.listDir(id, '/tmp', CALLER)).map((e) => e.name);
    expect(names.filter((n) => n.startsWith('.airlock-upload'))).toEqual([]);
    // exactly the cap is fine
    await api.writeFile(id, '/tmp/cap', Buffer.alloc(MAX_UPLOAD, 7), CALLER);
    expect((await api.stat(id, '/tmp/cap', CALLER)).size).toBe(MAX_UPLOAD);
  });

  it('watches a directory: create, write, chmod, remove; a gone client stops the polling', async () => {
    const api = srv.api;
    await api.makeDir(id, '/tmp/w', CALLER);
    const ctl = new AbortController();
    const w = api.watch(id, '/tmp/w', CALLER, ctl.signal);
    await w.ready;
    const seen: FsEvent[] = [];
    const reading = (async () => {
      for await (const e of w) seen.push(e);
    })().catch((e: unknown) => e);
    const has = (type: FsEvent['type'], path: string) => () =>
      seen.some((e) => e.type === type && e.path === path);
    await api.writeFile(id, '/tmp/w/a', streamOf(Buffer.from('1')), CALLER);
    await until(has('create', '/tmp/w/a'), 'create');
    await api.writeFile(id, '/tmp/w/a', streamOf(Buffer.from('12345')), CALLER);
    await until(has('write', '/tmp/w/a'), 'write');
    await collectExec(api.exec(id, { cmd: 'chmod 600 /tmp/w/a' }, CALLER));
    await until(has('chmod', '/tmp/w/a'), 'chmod');
    await api.remove(id, '/tmp/w/a', CALLER);
    await until(has('remove', '/tmp/w/a'), 'remove');
    expect(srv.local.activeWatches).toBe(1);
    ctl.abort();
    expect(AirlockError.is(await reading, 'ABORTED')).toBe(true);
    await until(() => srv.local.activeWatches === 0, 'the watch to stop');
    // errors come before the stream: a missing dir, a file, an unknown sandbox
    expect(AirlockError.is(await errOf(api.watch(id, '/tmp/none', CALLER).ready), 'FILE_NOT_FOUND')).toBe(
      true,
    );
    expect(AirlockError.is(await errOf(api.watch(id, '/tmp/keep', CALLER).ready), 'INVALID_ARGUMENT')).toBe(
      true,
    );
    expect(AirlockError.is(await errOf(api.watch('nope', '/tmp', CALLER).ready), 'SANDBOX_NOT_FOUND')).toBe(
      true,
    );
    await until(() => srv.local.activeWatches === 0, 'failed watches to stop');
  });

  it('kills the reader of a download whose client went away (even one waiting on a FIFO)', async () => {
    const api = srv.api;
    await collectExec(api.exec(id, { cmd: 'mkfifo /tmp/fifo' }, CALLER));
    const ctl = new AbortController();
    const pending = api.readFile(id, '/tmp/fifo', CALLER, ctl.signal).catch((e: unknown) => e);
    await until(() => hostPids(['/bin/cat', '--', '/tmp/fifo']).length === 1, 'the reader');
    ctl.abort();
    expect(AirlockError.is(await pending, 'ABORTED')).toBe(true);
    await until(() => hostPids(['/bin/cat', '--', '/tmp/fifo']).length === 0, 'the reader to be killed');
    // mid-stream: cancel after the first bytes
    await collectExec(api.exec(id, { cmd: 'head -c 20000000 /dev/zero > /tmp/zeros' }, CALLER));
    const stream = await api.readFile(id, '/tmp/zeros', CALLER);
    const reader = stream.getReader();
    expect((await reader.read()).done).toBe(false);
    await reader.cancel();
    await until(
      () => hostPids(['/bin/cat', '--', '/tmp/zeros']).length === 0,
      'the second reader to be killed',
    );
  });

  it('refuses more than the most watches on one sandbox (CAPACITY_EXHAUSTED), and frees the room', async () => {
    const ctl = new AbortController();
    const open = Array.from({ length: MAX_WATCHES_PER_SANDBOX }, () =>
      srv.api.watch(id, '/tmp', CALLER, ctl.signal),
    );
    await Promise.all(open.map((w) => w.ready));
    const over = srv.api.watch(id, '/tmp', CALLER);
    expect(AirlockError.is(await errOf(over.ready), 'CAPACITY_EXHAUSTED')).toBe(true);
    ctl.abort();
    await until(() => srv.local.activeWatches === 0, 'the watches to stop');
    const again = new AbortController();
    await srv.api.watch(id, '/tmp', CALLER, again.signal).ready;
    again.abort();
    await until(() => srv.local.activeWatches === 0, 'the last watch to stop');
  });

  it('ends a watch when its sandbox dies', async () => {
    const other = await srv.api.create({}, CALLER);
    const w = srv.api.watch(other.id, '/tmp', CALLER);
    await w.ready;
    const reading = (async () => {
      for await (const _ of w) void _;
    })();
    await srv.api.kill(other.id, CALLER);
    await reading;
    await until(() => srv.local.activeWatches === 0, 'the watch to stop');
  });

  it('sets the TTL, pauses and resumes', async () => {
    const api = srv.api;
    const before = await api.get(id, CALLER);
    const after = await api.setTimeout(id, 3_600_000, CALLER);
    expect(Date.parse(after.expiresAt!)).toBeGreaterThan(Date.parse(before.expiresAt!));
    expect((await api.pause(id, CALLER)).state).toBe('paused');
    const refused = await errOf(collectExec(api.exec(id, { cmd: 'true' }, CALLER)));
    expect(AirlockError.is(refused, 'SANDBOX_PAUSED')).toBe(true);
    expect((await api.resume(id, CALLER)).state).toBe('running');
    expect((await collectExec(api.exec(id, { cmd: 'echo ok' }, CALLER))).stdout.toString()).toBe('ok\n');
  });

  it('snapshots a sandbox and forks it; a snapshot in use cannot be removed', async () => {
    const api = srv.api;
    await api.writeFile(id, '/workspace/state.txt', streamOf(Buffer.from('from parent')), CALLER);
    const snap = await api.snapshot(id, CALLER);
    expect(snap.id).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect((await api.listSnapshots(CALLER)).map((s) => s.id)).toContain(snap.id);
    const fork = await api.create({ snapshot: snap.id, metadata: { role: 'fork' } }, CALLER);
    try {
      expect(fork.metadata).toEqual({ role: 'fork' });
      const text = await bytesOf(await api.readFile(fork.id, '/workspace/state.txt', CALLER));
      expect(text.toString()).toBe('from parent');
      const busy = await errOf(api.removeSnapshot(snap.id, CALLER));
      expect(AirlockError.is(busy, 'SNAPSHOT_IN_USE')).toBe(true);
    } finally {
      await api.kill(fork.id, CALLER);
    }
    await api.removeSnapshot(snap.id, CALLER);
    expect((await api.listSnapshots(CALLER)).map((s) => s.id)).not.toContain(snap.id);
    const missing = await errOf(api.create({ snapshot: `sha256:${'0'.repeat(64)}` }, CALLER));
    expect(AirlockError.is(missing, 'SNAPSHOT_NOT_FOUND')).toBe(true);
    expect((missing as AirlockError).field).toBe('snapshot');
    const both = await errOf(api.create({ snapshot: snap.id, template: 'x' }, CALLER));
    expect(AirlockError.is(both, 'INVALID_ARGUMENT')).toBe(true);
  });
});
