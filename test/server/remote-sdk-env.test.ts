// Library code run unchanged against a server: one script (test/fixtures/library-script.ts, the
// package entry's Sandbox with no runtime) run locally and with AIRLOCK_API_URL/AIRLOCK_API_KEY at a
// real `airlock serve` (front server + supervisor) prints the same observations. Beside it: what
// `new Airlock({ apiUrl })` makes, that an Airlock without apiUrl stays local under AIRLOCK_API_URL,
// and every bad apiUrl / option / spec failing with a typed error that names what to fix.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  Airlock,
  LocalAirlock,
  RemoteAirlock,
  RemoteSandbox,
  Sandbox,
  type SandboxSpecInput,
} from '../../src/index.js';
import { expectError } from '../contract/support.js';
import { extractBlocks } from '../docs/blocks.js';
import {
  NO_RESIDUE,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  canRunNamespaces,
  residue,
  settledResidue,
} from '../helpers.js';
import { get } from './serve-api.js';
import { CLI, cliEnv, newKey, startServe, stopServe, stopSupervisor, type Served } from './serve-helpers.js';

const ROOT = join(import.meta.dirname, '..', '..');
const SCRIPT = join(ROOT, 'test', 'fixtures', 'library-script.ts');
const DOC = 'docs/guides/remote-sdk.md';
const LOCAL_DIR = `${TEST_STATE_DIR}-local-sdk`;

/** Run a TypeScript file in a fresh Node (tsx) with `env`; its stdout. */
function runTs(file: string, env: NodeJS.ProcessEnv): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(CLI[0]!, [CLI[1]!, CLI[2]!, file], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.setEncoding('utf8').on('data', (t: string) => (out += t));
    child.stderr.setEncoding('utf8').on('data', (t: string) => (err += t));
    child.on('exit', (code) => {
      if (code !== 0) reject(new Error(`${file} exited ${code}: ${err}`));
      else resolve(out);
    });
  });
}

/** Run the library script with `env`; its one JSON line. */
async function runScript(env: NodeJS.ProcessEnv): Promise<Record<string, unknown>> {
  const out = await runTs(SCRIPT, env);
  return JSON.parse(out.trim().split('\n').pop()!) as Record<string, unknown>;
}

/** The environment without any server setting (what a local run sees). */
function withoutServer(): NodeJS.ProcessEnv {
  const env = { ...cliEnv() };
  delete env.AIRLOCK_API_URL;
  delete env.AIRLOCK_API_KEY;
  return env;
}

/** Run `f` with AIRLOCK_API_URL / AIRLOCK_API_KEY set (or deleted when undefined), then restore them. */
async function withEnv<T>(vars: { url?: string; key?: string }, f: () => Promise<T>): Promise<T> {
  const saved = [process.env.AIRLOCK_API_URL, process.env.AIRLOCK_API_KEY];
  const set = (k: string, v: string | undefined): void => {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  };
  set('AIRLOCK_API_URL', vars.url);
  set('AIRLOCK_API_KEY', vars.key);
  try {
    return await f();
  } finally {
    set('AIRLOCK_API_URL', saved[0]);
    set('AIRLOCK_API_KEY', saved[1]);
  }
}

/** The server's count of successful creates (its Prometheus /metrics). */
async function createsOk(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = /^airlock_creates_total\{outcome="ok"\} (\d+)$/m.exec(text);
  return m ? Number(m[1]) : 0;
}

/** A loopback port nothing listens on. */
async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address() as AddressInfo;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

describe.skipIf(!canRunNamespaces)(`library code against a server (${SKIP_REASON})`, () => {
  let served: Served | undefined;
  let key: string;
  let local: Record<string, unknown>;

  beforeAll(async () => {
    // The local run first, on the test state dir, before a supervisor owns it.
    local = await runScript(withoutServer());
    served = await startServe();
    key = newKey('sdk-env').key;
  }, 180_000);

  afterAll(async () => {
    if (served) await stopServe(served);
    await stopSupervisor();
  }, 60_000);

  it('one library script, run locally and with AIRLOCK_API_URL set, observes the same', async () => {
    const remote = await runScript({
      ...withoutServer(),
      AIRLOCK_API_URL: served!.url,
      AIRLOCK_API_KEY: key,
    });
    const { local: wasLocal, id: localId, ...here } = local;
    const { local: wasRemote, id: remoteId, ...there } = remote;
    // The same observations, whatever they are (and they are what the library promises).
    expect(there).toEqual(here);
    expect(here).toMatchObject({
      exec: { exitCode: 3, stdout: 'hi from user in /workspace\n', stderr: 'oops\n' },
      streamed: 'one\ntwo\n',
      stdin: '6',
      timeout: 'timeout',
      background: { killedBy: 'killed', stdout: 'started\n' },
      read: 'written by the script\n',
      bytes: [0, 255, 10, 13],
      cat: 'written by the script\n',
      exists: [true, false],
      removed: false,
      missing: 'FILE_NOT_FOUND',
      badExec: 'INVALID_ARGUMENT',
      info: { backend: 'namespaces', persistent: false, metadata: { run: 'script' } },
      alive: false,
      afterKill: 'SANDBOX_GONE',
      spec: 'INVALID_SPEC',
    });
    // Where each ran: here a library Sandbox; there a RemoteSandbox the server made (and killed).
    expect([wasLocal, wasRemote]).toEqual([true, false]);
    expect(localId).not.toBe(remoteId);
    expect((await get(served!.url, key, remoteId as string)).state).toBe('killed');
  }, 180_000);

  it('new Airlock({ apiUrl, apiKey }) is a runtime on the server', async () => {
    const airlock = new Airlock({ apiUrl: served!.url, apiKey: key });
    expect(airlock).toBeInstanceOf(RemoteAirlock);
    const sbx = await airlock.create({ metadata: { via: 'constructor' } });
    try {
      expect(sbx).toBeInstanceOf(RemoteSandbox);
      expect((await sbx.exec('echo remote')).stdout).toBe('remote\n');
      expect(await get(served!.url, key, sbx.id)).toMatchObject({
        state: 'running',
        metadata: { via: 'constructor' },
      });
      // The generic entry point takes it as it takes a local runtime.
      const other = await Sandbox.create({}, { airlock });
      expect(
        airlock
          .list()
          .map((s) => s.id)
          .sort(),
      ).toEqual([sbx.id, other.id].sort());
    } finally {
      await airlock.close();
    }
    expect((await get(served!.url, key, sbx.id)).state).toBe('killed');
  });

  it('an Airlock without apiUrl runs here even while AIRLOCK_API_URL is set', async () => {
    await withEnv({ url: served!.url, key }, async () => {
      const here = new Airlock({ stateDir: LOCAL_DIR, uidRange: TEST_UID_RANGE, warmPool: 0 });
      expect(here).toBeInstanceOf(LocalAirlock);
      expect(here).not.toBeInstanceOf(RemoteAirlock);
      try {
        const sbx = await here.create();
        expect(sbx).toBeInstanceOf(Sandbox);
        expect(residue(LOCAL_DIR).sandboxDirs).toEqual([sbx.id]); // on this host's state dir
        const r = await fetch(`${served!.url}/v1/sandboxes/${sbx.id}`, {
          headers: { authorization: `Bearer ${key}` },
        });
        expect(r.status).toBe(404); // unknown to the server
        // Only Sandbox.create without a runtime follows the variable.
        const there = await Sandbox.create();
        expect(there).toBeInstanceOf(RemoteSandbox);
        expect((await get(served!.url, key, there.id)).state).toBe('running');
        await there.kill();
      } finally {
        await here.close();
      }
      // (Leases are host-wide: the server's warm slot holds one of the same range.)
      const left = residue(LOCAL_DIR);
      expect([left.sandboxDirs, left.mounts]).toEqual([[], []]);
    });
  });

  it('a bad AIRLOCK_API_URL or apiUrl gets a typed error saying what to fix', async () => {
    for (const url of ['not a url', 'ftp://127.0.0.1:21/']) {
      const e = await withEnv({ url }, () => expectError(Sandbox.create(), 'INVALID_ARGUMENT'));
      expect({ url, field: e.field }).toEqual({ url, field: 'AIRLOCK_API_URL' });
      expect(e.message).toMatch(/^AIRLOCK_API_URL: /);
      expect(e.message).toMatch(/http/);
      await expectError(() => new Airlock({ apiUrl: url }), 'INVALID_ARGUMENT', 'apiUrl');
    }
    await expectError(() => new Airlock({ apiUrl: 42 } as never), 'INVALID_ARGUMENT', 'apiUrl');
    const port = await closedPort();
    const dead = `http://127.0.0.1:${port}`;
    const viaEnv = await withEnv({ url: dead, key }, () =>
      expectError(Sandbox.create(), 'BACKEND_UNAVAILABLE', 'apiUrl'),
    );
    expect(viaEnv.message).toContain(`cannot reach the Airlock server at ${dead}`);
    expect(viaEnv.message).toContain('airlock serve');
    expect(viaEnv.message).toContain('AIRLOCK_API_URL');
    await expectError(new Airlock({ apiUrl: dead }).create(), 'BACKEND_UNAVAILABLE', 'apiUrl');
    // A server that does not know the key.
    await withEnv({ url: served!.url, key: 'ak_wrong' }, () => expectError(Sandbox.create(), 'UNAUTHORIZED'));
    await withEnv({ url: served!.url }, () => expectError(Sandbox.create(), 'UNAUTHORIZED'));
  });

  it('options only this host could honour are refused beside apiUrl, naming the option', async () => {
    const url = served!.url;
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ apiUrl: url, stateDir: '/var/lib/airlock' }, 'stateDir'],
      [{ apiUrl: url, uidRange: TEST_UID_RANGE }, 'uidRange'],
      [{ apiUrl: url, warmPool: 2 }, 'warmPool'],
      [{ apiUrl: url, secretEnv: { TOKEN: 'x' } }, 'secretEnv'],
      [{ apiUrl: url, egress: {} }, 'egress'],
      [{ apiUrl: url, uidLeaseDir: '/tmp' }, 'uidLeaseDir'],
      [{ apiKey: key }, 'apiKey'],
    ];
    for (const [opts, field] of cases) {
      const e = await expectError(() => new Airlock(opts as never), 'INVALID_ARGUMENT');
      expect({ opts, field: e.field }).toEqual({ opts, field });
    }
  });

  it("a spec that would act on the server's host is refused before any request, via the env too", async () => {
    const cases: Array<[SandboxSpecInput, string]> = [
      [{ mounts: [{ hostPath: '/etc' }] }, 'mounts'],
      [{ workspace: { mode: 'cow', hostDir: '/root' } }, 'workspace.hostDir'],
      [
        {
          network: { allow: ['api.example.com'] },
          secrets: [{ name: 'T', value: { fromEnv: 'HOME' }, hosts: ['api.example.com'] }],
        },
        'secrets.0.value',
      ],
      [
        {
          network: { allow: ['api.example.com'] },
          secrets: [{ name: 'T', value: { command: ['id'] }, hosts: ['api.example.com'] }],
        },
        'secrets.0.value',
      ],
    ];
    const before = (await new RemoteAirlock({ apiUrl: served!.url, apiKey: key }).query()).length;
    await withEnv({ url: served!.url, key }, async () => {
      for (const [spec, field] of cases) {
        const e = await expectError(Sandbox.create(spec), 'INVALID_SPEC');
        expect({ spec, field: e.field }).toEqual({ spec, field });
      }
    });
    expect((await new RemoteAirlock({ apiUrl: served!.url, apiKey: key }).query()).length).toBe(before);
  });

  it(`the examples of ${DOC} run against the server`, async () => {
    // The docs test typechecks them (they need a server: flag `typecheck`); here they run, with
    // `airlock-sandbox` as this checkout's package entry and AIRLOCK_API_URL/KEY at the server.
    const blocks = extractBlocks(ROOT, DOC).filter((b) => b.lang === 'ts');
    expect(blocks.length).toBeGreaterThanOrEqual(2);
    const dir = mkdtempSync(join(tmpdir(), 'airlock-remote-docs-'));
    const live = async (): Promise<number> =>
      (await new RemoteAirlock({ apiUrl: served!.url, apiKey: key }).query()).length;
    const before = { live: await live(), creates: await createsOk(served!.url) };
    try {
      for (const b of blocks) {
        const file = join(dir, `block-${b.line}.mts`);
        const entry = JSON.stringify(join(ROOT, 'src', 'index.ts'));
        writeFileSync(file, b.code.replaceAll("'airlock-sandbox'", entry));
        const out = await runTs(file, {
          ...withoutServer(),
          AIRLOCK_API_URL: served!.url,
          AIRLOCK_API_KEY: key,
        });
        expect(out, `${DOC}:${b.line}`).not.toBe('');
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    // They ran there (one create each, counted by the server) and killed what they made.
    expect(await createsOk(served!.url)).toBe(before.creates + blocks.length);
    expect(await live()).toBe(before.live);
  }, 180_000);

  it('leaves no residue on the host', async () => {
    await stopServe(served!);
    await stopSupervisor();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  }, 60_000);
});
