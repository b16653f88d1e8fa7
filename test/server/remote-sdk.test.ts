// The remote SDK beyond the shared contract: what it refuses before any request, several clients of
// one server, sandboxes that go away under a client, streamed stdin and files, snapshots and forks,
// and a client that gives up mid-exec leaving nothing running. Real server (nativeRoutes over the
// library) on loopback.
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  Airlock,
  RemoteAirlock,
  RemoteSandbox,
  Sandbox,
  airlockFromEnv,
  type SandboxSpecInput,
} from '../../src/index.js';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, settledResidue } from '../helpers.js';
import { expectError } from '../contract/support.js';
import { hostProcesses, startTestServer, until, type TestServer } from './remote-support.js';

describe.skipIf(!canRunNamespaces)(`remote SDK (${SKIP_REASON})`, () => {
  let server: TestServer;
  let remote: RemoteAirlock;
  beforeAll(async () => {
    server = await startTestServer();
    remote = new RemoteAirlock({ apiUrl: server.url });
  });
  afterEach(async () => {
    await remote.killAll();
  });
  afterAll(async () => {
    await remote?.close();
    await server?.close();
  });

  it('needs a server URL, and says how to give one', async () => {
    const saved = process.env.AIRLOCK_API_URL;
    delete process.env.AIRLOCK_API_URL;
    try {
      const e = await expectError(() => new RemoteAirlock(), 'INVALID_ARGUMENT', 'apiUrl');
      expect(e.message).toContain('AIRLOCK_API_URL');
      await expectError(() => new RemoteAirlock({ apiUrl: 'not a url' }), 'INVALID_ARGUMENT', 'apiUrl');
      await expectError(
        () => new RemoteAirlock({ apiUrl: 'file:///etc/passwd' }),
        'INVALID_ARGUMENT',
        'apiUrl',
      );
      // Without AIRLOCK_API_URL the environment asks for the local library.
      expect(airlockFromEnv({})).toBeInstanceOf(Airlock);
      // What was meant for a server runs there (never quietly here): an Airlock given apiUrl, and
      // Sandbox.create without a runtime while AIRLOCK_API_URL is set (more: remote-sdk-env.test.ts).
      expect(new Airlock({ apiUrl: server.url })).toBeInstanceOf(RemoteAirlock);
      process.env.AIRLOCK_API_URL = server.url;
      const sbx = await Sandbox.create({});
      expect(sbx).toBeInstanceOf(RemoteSandbox);
      expect(server.airlock.list().map((s) => s.id)).toEqual([sbx.id]);
      await sbx.kill();
    } finally {
      if (saved === undefined) delete process.env.AIRLOCK_API_URL;
      else process.env.AIRLOCK_API_URL = saved;
    }
  });

  it('AIRLOCK_API_URL makes library code run against the server unchanged', async () => {
    const airlock = airlockFromEnv({ AIRLOCK_API_URL: server.url });
    expect(airlock).toBeInstanceOf(RemoteAirlock);
    // The library's entry point, with the runtime the environment chose.
    const sbx = await Sandbox.create({ metadata: { via: 'env' } }, { airlock: airlock as RemoteAirlock });
    try {
      expect(sbx).toBeInstanceOf(RemoteSandbox);
      expect((await sbx.exec('echo hi')).stdout).toBe('hi\n');
      // It lives on the server.
      expect(server.airlock.get(sbx.id).info.metadata).toEqual({ via: 'env' });
    } finally {
      await sbx.kill();
    }
    expect(server.airlock.list().map((s) => s.id)).not.toContain(sbx.id);
  });

  it("refuses, before any request, what would act on the server's host", async () => {
    const cases: Array<[string, SandboxSpecInput, string]> = [
      ['a host mount', { mounts: [{ hostPath: '/var/tmp' }] }, 'mounts'],
      ['a cow workspace', { workspace: { mode: 'cow', hostDir: '/var/tmp' } }, 'workspace.hostDir'],
      ['a ro workspace', { workspace: { mode: 'ro', hostDir: '/var/tmp' } }, 'workspace.hostDir'],
      [
        'a secret from the environment',
        {
          network: { allow: ['api.example.com'] },
          secrets: [{ name: 'T', value: { fromEnv: 'HOME' }, hosts: ['api.example.com'] }],
        },
        'secrets.0.value',
      ],
      [
        'a secret from a file',
        {
          network: { allow: ['api.example.com'] },
          secrets: [{ name: 'T', value: { fromFile: '/etc/shadow' }, hosts: ['api.example.com'] }],
        },
        'secrets.0.value',
      ],
      [
        'a secret from a program',
        {
          network: { allow: ['api.example.com'] },
          secrets: [{ name: 'T', value: { command: ['id'] }, hosts: ['api.example.com'] }],
        },
        'secrets.0.value',
      ],
      ['canaries', { network: { allow: [] }, canaries: [{ name: 'AWS_KEY', kind: 'env' }] }, 'canaries'],
      ['a persistent sandbox', { persistent: true }, 'persistent'],
      ['internal layers', { layers: [`sha256:${'a'.repeat(64)}`] }, 'layers'],
    ];
    for (const [what, spec, field] of cases) {
      const e = await expectError(remote.create(spec), 'INVALID_SPEC');
      expect({ what, field: e.field }).toEqual({ what, field });
      expect(e.message).toContain('remote Airlock');
    }
    expect(server.airlock.list()).toEqual([]); // nothing reached the server
  });

  it('a second client connects by id; a kill by one is SANDBOX_GONE for the other', async () => {
    const other = new RemoteAirlock({ apiUrl: server.url });
    const sbx = await remote.create({ ttlMs: 60_000 });
    await sbx.files.write('shared.txt', 'from the first client\n');
    const seen = await other.connect(sbx.id);
    expect(seen.spec).toBeUndefined();
    expect(seen.info.expiresAt?.getTime()).toBe(sbx.info.expiresAt?.getTime());
    expect(await seen.files.read('shared.txt')).toBe('from the first client\n');
    expect((await seen.exec('cat shared.txt')).stdout).toBe('from the first client\n');
    await sbx.kill();
    const e = await expectError(seen.exec('true'), 'SANDBOX_GONE');
    expect(e.message).toContain(sbx.id);
    expect(seen.alive).toBe(false);
    await expectError(() => other.get(sbx.id), 'SANDBOX_NOT_FOUND');
    await expectError(other.connect(sbx.id), 'SANDBOX_NOT_FOUND');
    await expectError(other.connect(`sbx-${randomBytes(8).toString('hex')}`), 'SANDBOX_NOT_FOUND');
    await seen.kill(); // harmless: already gone
  });

  it('a sandbox the server lost answers SANDBOX_GONE on every call, and its handle is dead', async () => {
    const sbx = await remote.create();
    await server.airlock.get(sbx.id).kill(); // gone on the server, behind the client's back
    await expectError(sbx.exec('true'), 'SANDBOX_GONE');
    expect(sbx.alive).toBe(false);
    await expectError(sbx.files.read('/etc/hostname'), 'SANDBOX_GONE');
    await expectError(sbx.setTimeout(60_000), 'SANDBOX_GONE');
    await expectError(sbx.pause(), 'SANDBOX_GONE');
    await expectError(() => remote.get(sbx.id), 'SANDBOX_NOT_FOUND');
    expect(remote.list()).not.toContain(sbx);
  });

  it('stdin that is not UTF-8, or a stream, reaches the command byte for byte', async () => {
    const sbx = await remote.create();
    const bytes = Buffer.from([0xff, 0xfe, 0x00, 0xc3, 0x28, 0x80, 0x0a]);
    const r = await sbx.exec(['od', '-An', '-tx1'], { stdin: bytes });
    expect(r.stdout.trim().split(/\s+/)).toEqual(['ff', 'fe', '00', 'c3', '28', '80', '0a']);
    // A background command with stdin, killed before it reads it all.
    let read!: () => void;
    const seen = new Promise<void>((r) => (read = r));
    const h = await sbx.exec('head -c 3; sleep 30', {
      background: true,
      stdin: 'abcdef',
      onStdout: (t) => t.includes('abc') && read(),
    });
    await seen;
    await h.kill();
    const done = await h.wait();
    expect([done.stdout, done.killedBy]).toEqual(['abc', 'killed']);
  });

  it('a client that aborts mid-exec leaves nothing running in the sandbox', async () => {
    const sbx = await remote.create();
    const tag = randomBytes(4).toString('hex');
    const ac = new AbortController();
    const marker = `sleep 33.${parseInt(tag, 16) % 1000}`;
    const running = sbx.exec(`echo begun; exec ${marker}`, { signal: ac.signal, timeoutMs: 50_000 });
    // Running on the host (so the check below can see it), then the client goes.
    expect(await until(() => hostProcesses(marker).length > 0)).toBe(true);
    ac.abort();
    const r = await running;
    expect(r.killedBy).toBe('killed');
    // The server killed the command when the stream went (bounded wait).
    expect(await until(() => hostProcesses(marker).length === 0)).toBe(true);
  });

  it('files: upload and download bytes, stat, makeDir, exists, a watch that sees a write', async () => {
    const sbx = await remote.create();
    const big = randomBytes(5 * 1024 * 1024);
    await sbx.files.write('/workspace/big.bin', big);
    expect(Buffer.from(await sbx.files.read('/workspace/big.bin', { format: 'bytes' })).equals(big)).toBe(
      true,
    );
    expect((await sbx.files.stat('big.bin')).size).toBe(big.length);
    await expectError(sbx.files.read('big.bin', { maxBytes: 1024 }), 'FILE_TOO_LARGE');
    expect((await sbx.files.makeDir('a/b/c')).type).toBe('dir');
    expect(await sbx.files.exists('a/b/c')).toBe(true);
    expect(await sbx.files.exists('a/b/nope')).toBe(false);
    await expectError(sbx.files.stat('a/b/nope'), 'FILE_NOT_FOUND', 'path');
    await expectError(sbx.files.read('a/../../etc/\0'), 'INVALID_ARGUMENT', 'path');
    const ac = new AbortController();
    const events: string[] = [];
    const watching = (async () => {
      for await (const e of sbx.files.watch('/workspace/a', { signal: ac.signal })) {
        events.push(`${e.type} ${e.path}`);
        if (e.path.endsWith('new.txt')) ac.abort();
      }
    })().catch(() => {});
    for (let i = 0; i < 100 && !events.some((e) => e.endsWith('new.txt')); i++) {
      await sbx.files.write(`/workspace/a/new.txt`, `${i}`);
      await sleep(100);
    }
    ac.abort();
    await watching;
    expect(events.some((e) => e.endsWith('/workspace/a/new.txt'))).toBe(true);
  });

  it('pause refuses commands until resume; setTimeout moves the deadline on the server', async () => {
    const sbx = await remote.create({ ttlMs: 30_000 });
    await sbx.pause();
    expect(sbx.paused).toBe(true);
    await expectError(sbx.exec('true'), 'SANDBOX_PAUSED');
    // A handle that does not know it is paused gets the server's answer.
    const other = await new RemoteAirlock({ apiUrl: server.url }).connect(sbx.id);
    expect(other.paused).toBe(true);
    await sbx.resume();
    expect((await other.exec('echo thawed')).stdout).toBe('thawed\n');
    await sbx.setTimeout(120_000);
    const deadline = server.airlock.get(sbx.id).info.expiresAt!.getTime();
    expect(deadline).toBeGreaterThan(Date.now() + 100_000);
    expect(sbx.info.expiresAt!.getTime()).toBe(deadline);
    await expectError(sbx.setTimeout(10), 'INVALID_ARGUMENT', 'ttlMs');
  });

  it('snapshot and fork on the server', async () => {
    const sbx = await remote.create();
    await sbx.files.write('state.txt', 'before');
    const snap = await sbx.snapshot();
    expect(snap.id).toMatch(/^sha256:[0-9a-f]{64}$/);
    await sbx.files.write('state.txt', 'after');
    const [a, b] = await snap.fork({ count: 2 });
    expect(await a!.files.read('state.txt')).toBe('before');
    await b!.files.write('state.txt', 'b');
    expect(await a!.files.read('state.txt')).toBe('before');
    expect((await remote.snapshots.list()).map((s) => s.id)).toContain(snap.id);
    await expectError(remote.snapshots.remove(snap.id), 'SNAPSHOT_IN_USE');
    await Promise.all([a!.kill(), b!.kill()]);
    await remote.snapshots.remove(snap.id);
    await expectError(remote.snapshots.inspect(snap.id), 'SNAPSHOT_NOT_FOUND');
  });

  it('query lists the server’s sandboxes by metadata', async () => {
    const tag = randomBytes(4).toString('hex');
    const a = await remote.create({ metadata: { run: tag, n: '1' } });
    await remote.create({ metadata: { run: 'other' } });
    const found = await remote.query({ metadata: { run: tag } });
    expect(found.map((v) => v.id)).toEqual([a.id]);
    expect(found[0]).toMatchObject({ state: 'running', metadata: { run: tag, n: '1' } });
  });

  it('spills truncated output only into a private dir of this user', async () => {
    const shared = mkdtempSync(join(tmpdir(), 'airlock-spill-shared-'));
    try {
      chmodSync(shared, 0o777); // e.g. made first by another user under /tmp
      const r = new RemoteAirlock({ apiUrl: server.url, spillDir: shared });
      const sbx = await r.create();
      // Refused before the command runs (whether or not it would spill): no output lands there.
      await expectError(sbx.exec('echo small > /tmp/ran'), 'PERMISSION_DENIED', 'spillDir');
      expect(await sbx.files.exists('/tmp/ran')).toBe(false);
      await expectError(sbx.exec('seq 1 100000', { maxOutputBytes: 1000 }), 'PERMISSION_DENIED', 'spillDir');
      expect(readdirSync(shared)).toEqual([]);
      await r.killAll();
      // The default dir is private and gets the whole stream.
      const own = await remote.create();
      const big = await own.exec('seq 1 100000', { maxOutputBytes: 1000 });
      expect(big.truncated.stdout).toBe(true);
      expect((statSync(join(big.spillPath!, '..')).mode & 0o777).toString(8)).toBe('700');
      rmSync(big.spillPath!, { force: true });
    } finally {
      rmSync(shared, { recursive: true, force: true });
    }
  });

  it("egress streams (the library's onEgress / watchEgress) end with the sandbox", async () => {
    const sbx = await remote.create();
    const seen: unknown[] = [];
    const off = sbx.onEgress((e) => seen.push(e));
    const watched: unknown[] = [];
    const watching = (async () => {
      for await (const e of sbx.watchEgress()) watched.push(e);
    })();
    await sbx.exec('true');
    await sbx.kill();
    await watching; // ends (no error) when the sandbox is gone
    off();
    expect([seen, watched]).toEqual([[], []]); // no network policy: no attempts
    await expectError(
      (async () => {
        for await (const _ of sbx.watchEgress()) void _;
      })(),
      'SANDBOX_GONE',
    );
  });

  it('leaves no residue on the host', async () => {
    await remote.killAll();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });
});
