// Real `airlock serve` processes for the server tests: the CLI through tsx (as runCli), on the test
// state dir and uid range, on 127.0.0.1 with a kernel-chosen port. The supervisor it starts is a
// detached process of its own: stopSupervisor() ends it (tests must not leak it).
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Store } from '../../src/server/store.js';
import { supervisorInfo, supervisorPaths } from '../../src/server/supervisor-client.js';
import { TEST_STATE_DIR, TEST_UID_RANGE } from '../helpers.js';

const ROOT = join(import.meta.dirname, '..', '..');
const TSX = pathToFileURL(join(ROOT, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
export const CLI = [process.execPath, '--import', TSX, join(ROOT, 'src', 'cli', 'main.ts')];
export const cliEnv = (): NodeJS.ProcessEnv => ({
  ...process.env,
  AIRLOCK_STATE_DIR: TEST_STATE_DIR,
  AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
});

export interface Served {
  readonly child: ChildProcess;
  readonly url: string;
  /** stderr so far (for failure messages). */
  stderr(): string;
  /** Resolves with the exit code (or signal name) once the process has exited. */
  readonly exited: Promise<number | string>;
}

/** Start `airlock serve` with a config (JSON) and wait until it prints its URL. */
export function startServe(config: Record<string, unknown> = {}, extraArgs: string[] = []): Promise<Served> {
  mkdirSync(TEST_STATE_DIR, { recursive: true, mode: 0o711 });
  const cfgPath = join(TEST_STATE_DIR, 'serve-test-config.json');
  writeFileSync(cfgPath, JSON.stringify({ supervisorCheckMs: 200, ...config }));
  const child = spawn(
    CLI[0]!,
    [
      ...CLI.slice(1),
      'serve',
      '--listen',
      '127.0.0.1:0',
      '--state-dir',
      TEST_STATE_DIR,
      '--config',
      cfgPath,
      ...extraArgs,
    ],
    { env: cliEnv(), stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  let err = '';
  const exited = new Promise<number | string>((r) => child.on('exit', (code, sig) => r(code ?? sig ?? -1)));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`airlock serve did not start; stderr: ${err}`));
    }, 60_000);
    child.stderr!.setEncoding('utf8').on('data', (t: string) => (err += t));
    child.stdout!.setEncoding('utf8').on('data', (t: string) => {
      out += t;
      const m = /listening on (http\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve({ child, url: m[1]!, stderr: () => err, exited });
      }
    });
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`airlock serve exited ${code} before listening; stderr: ${err}`));
    });
  });
}

/** Kill the server (SIGTERM or SIGKILL) and wait for it to exit. */
export async function stopServe(s: Served, sig: NodeJS.Signals = 'SIGTERM'): Promise<number | string> {
  if (s.child.exitCode === null && s.child.signalCode === null) s.child.kill(sig);
  // Bounded: a server that does not exit fails here with its stderr, not as a whole-test timeout.
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      s.child.kill('SIGKILL'); // leak nothing, then report
      reject(
        new Error(`airlock serve did not exit within 30 s of ${sig}; stderr: ${s.stderr().slice(-2000)}`),
      );
    }, 30_000);
  });
  try {
    return await Promise.race([s.exited, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Every test request is bounded, so a hang fails with the request it was, not a test timeout. */
export const REQUEST_TIMEOUT_MS = 90_000;

export async function waitFor<T>(
  f: () => Promise<T | undefined> | T | undefined,
  what: string,
  ms = 30_000,
): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/** Stop the state dir's supervisor (SIGTERM: it kills its sandboxes) and wait until it is gone. */
export async function stopSupervisor(sig: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  const info = await supervisorInfo(supervisorPaths(TEST_STATE_DIR).socket);
  if (!info) return;
  process.kill(info.pid, sig);
  await waitFor(() => !alive(info.pid) || undefined, `supervisor ${info.pid} to exit`);
}

/** A fresh API key for `tenant` (straight into the server's store, as `airlock keys create` does). */
export function newKey(tenant: string): { id: string; key: string } {
  const store = new Store(join(TEST_STATE_DIR, 'server.db'));
  try {
    return store.createKey(tenant);
  } finally {
    store.close();
  }
}

/** fetch with the key; JSON body when given. */
export function call(
  url: string,
  key: string | undefined,
  method: string,
  path: string,
  body?: unknown,
): Promise<Response> {
  return fetch(url + path, {
    method,
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    headers: {
      ...(key ? { authorization: `Bearer ${key}` } : {}),
      ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
    },
    ...(body !== undefined ? { body: typeof body === 'string' ? body : JSON.stringify(body) } : {}),
  });
}
