// `airlock run` with egress flags, as a real child process inside this run's private network
// namespace. The CLI uses the system resolver and dialer (it cannot take the test ones), so these tests
// only exercise paths that need no resolution: names denied before resolving, sentinels in env.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { EgressEvent } from '../../src/egress/events.js';
import { canRunNamespaces, TEST_UID_RANGE } from '../helpers.js';
import { EGRESS_STATE_DIR } from './harness.js';
import { ALLOWED, assertPrivateNetns, DENIED, SECOND } from './net.js';

assertPrivateNetns();

const ROOT = join(import.meta.dirname, '..', '..');

function cli(
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'src/cli/main.ts', ...args], {
      cwd: ROOT,
      env: {
        PATH: process.env.PATH ?? '/usr/bin:/bin',
        AIRLOCK_STATE_DIR: EGRESS_STATE_DIR,
        AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
        ...env,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (t: string) => (stdout += t));
    child.stderr.setEncoding('utf8').on('data', (t: string) => (stderr += t));
    const timer = setTimeout(() => child.kill('SIGKILL'), 50_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

const DENY_REASON = `blocked by Airlock egress policy: host ${DENIED.name} is not in network.allow; ask the operator to allow it`;
const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

describe.skipIf(!canRunNamespaces)('airlock run with egress flags', () => {
  it('--allow allowed.test: curl to denied.test gets the 403 with the reason', async () => {
    const r = await cli([
      'run',
      '--allow',
      ALLOWED.name,
      '--',
      `curl -sS -m 10 -w '\\n%{http_code}' http://${DENIED.name}/`,
    ]);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(`${DENY_REASON}\n\n403`);
  });

  it('--json lists the deny event under "egress"', async () => {
    const r = await cli([
      'run',
      '--json',
      '--allow',
      ALLOWED.name,
      '--',
      `curl -s -m 10 http://${DENIED.name}/x`,
    ]);
    expect(r.code, r.stderr).toBe(0);
    const result = JSON.parse(r.stdout) as { exitCode: number; egress: EgressEvent[] };
    expect(result.egress).toHaveLength(1);
    expect(result.egress[0]).toMatchObject({
      protocol: 'http',
      host: DENIED.name,
      port: 80,
      decision: 'deny',
      code: 'not_allowed',
      reason: DENY_REASON,
      bytesUp: 0,
      bytesDown: 0,
    });
    expect(result.egress[0]!.sandboxId).toMatch(/^sbx-/);
  });

  it("--policy FILE with --deny on top: the deny wins over the policy's wildcard allow", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'airlock-egress-cli-'));
    dirs.push(dir);
    const file = join(dir, 'policy.yaml');
    writeFileSync(file, `network:\n  allow: ["*.allowed.test"]\n`);
    const r = await cli([
      'run',
      '--json',
      '--policy',
      file,
      '--deny',
      SECOND.name,
      '--',
      `curl -s -m 10 http://${SECOND.name}/ http://${DENIED.name}/`,
    ]);
    expect(r.code, r.stderr).toBe(0);
    const result = JSON.parse(r.stdout) as { stdout: string; egress: EgressEvent[] };
    expect(result.stdout).toContain(
      `host ${SECOND.name} is denied by network.deny entry "${SECOND.name}"; it cannot be reached`,
    );
    expect(result.egress.map((e) => [e.host, e.decision, e.code])).toEqual([
      [SECOND.name, 'deny', 'denied'],
      [DENIED.name, 'deny', 'not_allowed'],
    ]);
  });

  it('--secret NAME=env:VAR@host: the sandbox sees a sentinel, never the value (also not in --json)', async () => {
    const value = 'cli-real-secret-value-9f2c';
    const r = await cli(
      [
        'run',
        '--json',
        '--allow',
        ALLOWED.name,
        '--secret',
        `TOKEN=env:CLI_TEST_TOKEN@${ALLOWED.name}`,
        '--',
        'echo "$TOKEN"; env | grep -c cli-real-secret || true',
      ],
      { CLI_TEST_TOKEN: value },
    );
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).not.toContain(value);
    const result = JSON.parse(r.stdout) as { stdout: string };
    expect(result.stdout).toMatch(/^airlock_sentinel_token_[a-z2-7]{24}\n0\n$/);
  });

  it('without egress flags there is no network (and no "egress" in --json)', async () => {
    const r = await cli(['run', '--json', '--', `curl -sS -m 5 http://${DENIED.name}/`]);
    const result = JSON.parse(r.stdout) as { exitCode: number; egress?: unknown };
    expect(result.exitCode).not.toBe(0);
    expect(result.egress).toBeUndefined();
  });
});
