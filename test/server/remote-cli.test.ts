// The CLI against a server, through the real `airlock` CLI (runCli) and a real native-API server on
// loopback: ps, create, exec (streams, exit status), exec --background + logs, cp both ways, kill.
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, runCli, settledResidue } from '../helpers.js';
import { hostProcesses, startTestServer, until, type TestServer } from './remote-support.js';

const ROOT = join(import.meta.dirname, '..', '..');

/** The CLI with piped stdin (runCli gives it none) and a handle to signal it. */
function cli(args: string[]): { child: ChildProcess; stdout: () => string; exit: Promise<number | null> } {
  const tsx = pathToFileURL(join(ROOT, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
  const child = spawn(process.execPath, ['--import', tsx, join(ROOT, 'src', 'cli', 'main.ts'), ...args], {
    env: process.env,
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  let out = '';
  child.stdout!.setEncoding('utf8').on('data', (t: string) => (out += t));
  const exit = new Promise<number | null>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`airlock ${args.join(' ')} did not exit in time`));
    }, 120_000);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve(code);
    });
  });
  return { child, stdout: () => out, exit };
}

describe('CLI server commands without a server', () => {
  it('each says it needs one (exit 2) and how to name it', async () => {
    const saved = process.env.AIRLOCK_API_URL;
    delete process.env.AIRLOCK_API_URL;
    try {
      for (const args of [
        ['ps'],
        ['create'],
        ['exec', 'sbx-1', '--', 'true'],
        ['kill', 'sbx-1'],
        ['logs', 'sbx-1', 'p1'],
        ['cp', 'a', 'sbx-1:/b'],
      ]) {
        const r = await runCli(args);
        expect({ args, code: r.code }).toEqual({ args, code: 2 });
        expect(r.stderr).toContain('needs a server');
        expect(r.stderr).toContain('AIRLOCK_API_URL');
      }
    } finally {
      if (saved !== undefined) process.env.AIRLOCK_API_URL = saved;
    }
  });
});

describe.skipIf(!canRunNamespaces)(`CLI against a server (${SKIP_REASON})`, () => {
  let server: TestServer;
  let dir: string;
  const saved = process.env.AIRLOCK_API_URL;
  beforeAll(async () => {
    server = await startTestServer();
    process.env.AIRLOCK_API_URL = server.url; // runCli passes the test's environment on
    dir = mkdtempSync(join(tmpdir(), 'airlock-cli-remote-'));
  });
  afterAll(async () => {
    if (saved === undefined) delete process.env.AIRLOCK_API_URL;
    else process.env.AIRLOCK_API_URL = saved;
    await server?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('create, ps, exec with streams and exit status, kill', async () => {
    const tag = randomBytes(4).toString('hex');
    const c = await runCli(['create', '--ttl', '2m', '--metadata', `run=${tag}`, '-e', 'GREETING=hi there']);
    expect(c.stderr).toBe('');
    expect(c.code).toBe(0);
    const id = c.stdout.trim();
    expect(id).toMatch(/^[A-Za-z0-9_-]+$/);
    expect(server.airlock.get(id).info.metadata).toEqual({ run: tag });

    const ps = await runCli(['ps', '--metadata', `run=${tag}`]);
    expect(ps.code).toBe(0);
    expect(ps.stdout).toContain(id);
    expect(ps.stdout).toContain('running');
    const json = JSON.parse((await runCli(['ps', '--json', '--metadata', `run=${tag}`])).stdout) as Array<{
      id: string;
    }>;
    expect(json.map((v) => v.id)).toEqual([id]);

    const r = await runCli(['exec', id, '--', 'sh', '-c', 'echo "$GREETING"; echo err >&2; exit 7']);
    expect(r).toEqual({ code: 7, stdout: 'hi there\n', stderr: 'err\n' });
    // One argument with shell syntax runs with /bin/sh -c, as for airlock run.
    const sh = await runCli(['exec', id, '--', 'echo a | tr a b; printf "%s" "é😀"']);
    expect([sh.code, sh.stdout]).toEqual([0, 'b\né😀']);
    // A signal's exit status is 128 + its number.
    expect((await runCli(['exec', id, '--', 'sh', '-c', 'kill -9 $$'])).code).toBe(137);
    const t = await runCli(['exec', '--timeout', '1s', id, '--', 'sleep', '30']);
    expect(t.code).toBe(137);
    expect(t.stderr).toContain('timeout');

    const k = await runCli(['kill', id]);
    expect(k.code).toBe(0);
    expect(server.airlock.list().map((s) => s.id)).not.toContain(id);
    expect((await runCli(['ps', '--metadata', `run=${tag}`])).stdout).not.toContain(id);
    // A sandbox that is not there (killed, or never was): exit 3, named.
    const gone = await runCli(['exec', id, '--', 'true']);
    expect(gone.code).toBe(3);
    expect(gone.stderr).toContain(id);
    expect((await runCli(['kill', `sbx-${randomBytes(8).toString('hex')}`])).code).toBe(3);
  });

  it('exec --background prints a pid; logs replays its output and returns its status', async () => {
    const id = (await runCli(['create'])).stdout.trim();
    try {
      const bg = await runCli([
        'exec',
        '--background',
        id,
        '--',
        'sh',
        '-c',
        'echo one; echo two >&2; exit 5',
      ]);
      expect(bg.code).toBe(0);
      const pid = bg.stdout.trim();
      expect(pid).not.toBe('');
      const logs = await runCli(['logs', id, pid]);
      expect(logs).toEqual({ code: 5, stdout: 'one\n', stderr: 'two\n' });
      expect((await runCli(['logs', id, 'no-such-pid'])).code).not.toBe(0);
    } finally {
      await runCli(['kill', id]);
    }
  });

  it('cp copies bytes both ways, and refuses two local or two sandbox paths', async () => {
    const id = (await runCli(['create', '--api', server.url])).stdout.trim();
    try {
      const data = randomBytes(300_000);
      writeFileSync(join(dir, 'up.bin'), data);
      const up = await runCli(['cp', join(dir, 'up.bin'), `${id}:/workspace/sub/up.bin`]);
      expect([up.code, up.stderr]).toEqual([0, `/workspace/sub/up.bin: ${data.length} bytes\n`]);
      const sum = await runCli(['exec', id, '--', 'sha256sum', '/workspace/sub/up.bin']);
      expect(sum.stdout.split(' ')[0]).toBe(createHash('sha256').update(data).digest('hex'));
      const down = await runCli(['cp', `${id}:/workspace/sub/up.bin`, join(dir, 'down.bin')]);
      expect(down.code).toBe(0);
      expect(readFileSync(join(dir, 'down.bin')).equals(data)).toBe(true);
      const missing = await runCli(['cp', `${id}:/workspace/nope`, join(dir, 'x')]);
      expect(missing.code).toBe(1); // FILE_NOT_FOUND
      expect((await runCli(['cp', join(dir, 'up.bin'), join(dir, 'y')])).code).toBe(2);
      expect((await runCli(['cp', join(dir, 'nope.bin'), `${id}:/workspace/z`])).code).toBe(1);
    } finally {
      await runCli(['kill', id]);
    }
  });

  it('exec -i forwards stdin byte for byte; Ctrl-C exits 130 and the command dies on the server', async () => {
    const id = (await runCli(['create'])).stdout.trim();
    try {
      const data = randomBytes(200_000);
      const fed = cli(['exec', '-i', id, '--', 'sha256sum']);
      fed.child.stdin!.end(data);
      expect(await fed.exit).toBe(0);
      expect(fed.stdout().split(' ')[0]).toBe(createHash('sha256').update(data).digest('hex'));

      const run = cli(['exec', id, '--', 'sh', '-c', 'echo started; exec sleep 34.5']);
      run.child.stdin!.end();
      for (let i = 0; i < 600 && !run.stdout().includes('started'); i++) await sleep(50);
      expect(run.stdout()).toBe('started\n');
      expect(hostProcesses('sleep 34.5').length).toBeGreaterThan(0); // the check can see it
      run.child.kill('SIGINT');
      expect(await run.exit).toBe(130);
      expect(await until(() => hostProcesses('sleep 34.5').length === 0)).toBe(true);
    } finally {
      await runCli(['kill', id]);
    }
  });

  it('leaves no residue on the host', async () => {
    await server.airlock.killAll();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });
});
