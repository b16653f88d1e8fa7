// Airlock's file-descriptor budget: a few sandboxes opening thousands of egress connections (CONNECT,
// SOCKS5, transparent) get denials of their own, with the reason in their egress events and
// responses, while another sandbox's exec and a new create keep working; once they are gone the
// budget is free again and nothing is left (fds of Airlock's process, host state).
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { Airlock, type Sandbox } from '../../src/index.js';
import { countOpenFds } from '../../src/backends/host/nofile.privileged.js';
import type { EgressEvent } from '../../src/egress/events.js';
import {
  canRunNamespaces,
  NO_RESIDUE,
  settledResidue,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
} from '../helpers.js';
import {
  ALLOWED,
  assertPrivateNetns,
  guardedDialer,
  startTestServers,
  testResolver,
  type TestServers,
} from './net.js';

assertPrivateNetns();

const HOLDER = readFileSync(join(import.meta.dirname, '..', 'fixtures', 'conn-holder.py'), 'utf8');
const ECHO_PORT = 5432;
const ATTEMPTS = 1000;
/** What egress may hold beyond the fds open when the runtime starts (the rest is the reserve). */
const HEADROOM_FDS = 1300;
const RESERVE_FDS = 400;
const SHARE_FDS = 500;

describe.skipIf(!canRunNamespaces)(`fd budget (${SKIP_REASON})`, () => {
  let servers: TestServers;
  let airlock: Airlock;
  let baseFds = 0;
  beforeAll(async () => {
    servers = await startTestServers();
    baseFds = countOpenFds();
    airlock = new Airlock({
      stateDir: TEST_STATE_DIR,
      uidRange: TEST_UID_RANGE,
      egress: { resolver: testResolver(), dialer: guardedDialer(), upstreamCa: [servers.ca.certPem] },
      fdBudget: { maxFds: baseFds + HEADROOM_FDS, reserveFds: RESERVE_FDS, perSandboxMaxFds: SHARE_FDS },
    });
  });
  afterAll(async () => {
    await airlock?.close();
    await servers?.close();
  });

  const spec = { network: { allow: [`${ALLOWED.name}:${ECHO_PORT}`] } };

  /** Start the holder in `sbx`; resolves with its counts once every attempt is made. */
  async function hold(sbx: Sandbox, mode: string, count: number): Promise<{ ok: number; refused: number }> {
    await sbx.files.write('/tmp/holder.py', HOLDER);
    const p = await sbx.spawn([
      'python3',
      '/tmp/holder.py',
      mode,
      ALLOWED.name,
      String(ECHO_PORT),
      String(count),
    ]);
    let out = '';
    let err = '';
    p.stderr.on('data', (d: Buffer) => (err += d.toString()));
    return new Promise((resolve, reject) => {
      p.stdout.on('data', (d: Buffer) => {
        out += d.toString();
        const m = /^(\d+) (\d+)\n/.exec(out);
        if (m) resolve({ ok: Number(m[1]), refused: Number(m[2]) });
      });
      void p.exited.then(() => reject(new Error(`holder exited: ${out} ${err}`)));
    });
  }

  const budgetDenials = (s: Sandbox): EgressEvent[] => s.egressEvents.filter((e) => e.code === 'fd_budget');

  it('sandboxes flooding egress get their own denials; others keep exec, create; nothing leaks', async () => {
    const bystander = await airlock.create(spec);
    const floods = await Promise.all([airlock.create(spec), airlock.create(spec), airlock.create(spec)]);
    // One after the other, so the first one reaches its share and the others the process's limit.
    const counts = [];
    for (const [i, mode] of (['connect', 'transparent', 'socks'] as const).entries())
      counts.push(await hold(floods[i]!, mode, ATTEMPTS));
    // Each got some through and was refused the rest: no flood got all it asked for.
    for (const c of counts) {
      expect(c.ok + c.refused).toBe(ATTEMPTS);
      expect(c.refused).toBeGreaterThan(0);
    }
    expect(counts[0]!.ok).toBeGreaterThan(0);
    expect(counts[0]!.ok * 2).toBeLessThanOrEqual(SHARE_FDS); // its fair share, no more
    // Every refusal is in the flooding sandbox's own events, with its reason.
    for (const [i, s] of floods.entries()) {
      const d = budgetDenials(s);
      expect(d.length, `sandbox ${i}`).toBeGreaterThanOrEqual(counts[i]!.refused);
      for (const e of d) expect(e.decision).toBe('deny');
    }
    expect(budgetDenials(floods[0]!)[0]!.reason).toMatch(/its share of 500/);
    expect(budgetDenials(floods[2]!).at(-1)!.reason).toMatch(
      /near its file-descriptor limit .* kept for exec and create/,
    );
    // The process stayed within its budget (the reserve untouched by egress).
    expect(countOpenFds()).toBeLessThanOrEqual(baseFds + HEADROOM_FDS - RESERVE_FDS + 64);

    // Meanwhile: the bystander's exec works, and so does a new create and its exec.
    expect((await bystander.exec('echo still here')).stdout).toBe('still here\n');
    const fresh = await airlock.create(spec);
    expect((await fresh.exec(['sh', '-c', 'echo $((6 * 7))'])).stdout).toBe('42\n');
    // A new connection of the bystander is refused too (the process is at its limit), with the
    // reason in the 503 the proxy answers and in the bystander's own event.
    const refused = await bystander.exec([
      'python3',
      '-c',
      `import socket; s = socket.create_connection(('127.0.0.1', 3128)); s.sendall(b'CONNECT ${ALLOWED.name}:${ECHO_PORT} HTTP/1.1\\r\\n\\r\\n'); print(s.recv(400).decode())`,
    ]);
    expect(refused.stdout).toMatch(/^HTTP\/1.1 503[\s\S]*near its file-descriptor limit/);
    expect(budgetDenials(bystander)).toHaveLength(1);
    expect(budgetDenials(fresh)).toHaveLength(0);

    // The floods gone, the budget is free again: the bystander connects.
    await Promise.all(floods.map((s) => s.kill()));
    await bystander.files.write('/tmp/holder.py', HOLDER);
    const after = await bystander.exec([
      'python3',
      '/tmp/holder.py',
      'connect',
      ALLOWED.name,
      String(ECHO_PORT),
      '3',
      'once',
    ]);
    expect(after.stdout, after.stderr).toBe('3 0\n');
    await Promise.all([bystander.kill(), fresh.kill()]);
    await airlock.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
    expect(countOpenFds()).toBeLessThanOrEqual(baseFds + 16);
  }, 180_000);
});

describe.skipIf(!canRunNamespaces)(`fd budget at a real RLIMIT_NOFILE (${SKIP_REASON})`, () => {
  // 1024: below the sandboxes' own cap (4096), which must then follow Airlock's hard limit.
  it.each([1024, 5000])(
    'four floods under a %i-fd process: denied by the default budget; exec and create still work',
    async (nofile) => {
      const child = spawn(
        'prlimit',
        [
          `--nofile=${nofile}:${nofile}`,
          '--',
          process.execPath,
          '--import',
          'tsx',
          'test/fixtures/fd-flood.ts',
        ],
        {
          env: {
            ...process.env,
            AIRLOCK_STATE_DIR: TEST_STATE_DIR,
            AIRLOCK_UID_FIRST: String(TEST_UID_RANGE.first),
            AIRLOCK_UID_COUNT: String(TEST_UID_RANGE.count),
          },
          stdio: ['ignore', 'pipe', 'pipe'],
        },
      );
      onTestFinished(() => void child.kill('SIGKILL'));
      let out = '';
      let err = '';
      child.stdout.setEncoding('utf8').on('data', (t: string) => (out += t));
      child.stderr.setEncoding('utf8').on('data', (t: string) => (err += t));
      await new Promise((r) => child.once('close', r));
      const r = JSON.parse(out.trim().split('\n').at(-1) ?? '{}') as {
        floods?: string[];
        exec?: string;
        create?: string;
        reasons?: string[];
      };
      expect(r.exec, err).toBe('still here\n');
      expect(r.create, err).toBe('created\n');
      for (const f of r.floods ?? []) {
        const [ok, refused] = f.split(' ').map(Number);
        expect(ok! + refused!, f).toBe(1500);
        expect(refused).toBeGreaterThan(0);
      }
      expect(r.reasons?.length).toBeGreaterThan(0);
      for (const reason of r.reasons ?? []) expect(reason).toMatch(/file descriptors|file-descriptor limit/);
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    },
    300_000,
  );
});
