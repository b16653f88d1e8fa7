// Credentials that never enter the sandbox: three secrets (env, file, command) bound to secrets.test.
// Their real values must appear nowhere inside — not in env, /proc/*/environ or cmdline, any file under
// /etc, /tmp, /workspace, /home/user — nor in any exec output, except where the test server echoes the
// Authorization it received (deliberately). The values are handed to the in-sandbox scanners on stdin,
// never in argv or env, so the scan itself cannot plant them.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ExecResult, Sandbox } from '../../src/index.js';
import { canRunNamespaces } from '../helpers.js';
import { EGRESS_STATE_DIR, startEgressWorld, until, type EgressWorld } from './harness.js';
import { ALLOWED, assertPrivateNetns, SECRET_HOST } from './net.js';

assertPrivateNetns();

const nonce = randomBytes(8).toString('hex');
const VALUES = {
  ENV_TOKEN: `env-secret-${nonce}`,
  FILE_TOKEN: `file-secret-${nonce}`,
  CMD_TOKEN: `cmd-secret-${nonce}`,
};

let world: EgressWorld;
let sbx: Sandbox;
let hostDir: string;
/** Every ExecResult of this file, with whether it may contain a real value (the server's echo). */
const results: Array<{ r: ExecResult; echoes: boolean }> = [];

async function exec(
  cmd: string | string[],
  o: { stdin?: string; echoes?: boolean; env?: Record<string, string> } = {},
): Promise<ExecResult> {
  const r = await sbx.exec(cmd, {
    ...(o.stdin !== undefined ? { stdin: o.stdin } : {}),
    ...(o.env ? { env: o.env } : {}),
    maxOutputBytes: 4_000_000,
  });
  results.push({ r, echoes: o.echoes ?? false });
  return r;
}

/** The real values (and, if it exists yet, a line of the egress CA's private key) to look for. */
function needles(): string[] {
  const out = Object.values(VALUES);
  try {
    const key = readFileSync(join(EGRESS_STATE_DIR, 'ca', 'ca.key'), 'utf8').split('\n');
    out.push(key[Math.floor(key.length / 2)]!); // a full base64 line from the middle of the PEM
  } catch {
    /* no CA yet */
  }
  return out;
}

const SCAN_PY = String.raw`
import json, os, sys
needles = [n.encode() for n in sys.stdin.read().split('\n') if n]
hits, scanned = [], []
def check(path, data):
    for n in needles:
        if n in data:
            hits.append(path)
for pid in os.listdir('/proc'):
    if pid.isdigit():
        for f in ('environ', 'cmdline'):
            try:
                with open('/proc/%s/%s' % (pid, f), 'rb') as fh:
                    check('/proc/%s/%s' % (pid, f), fh.read())
                scanned.append('/proc/%s/%s' % (pid, f))
            except OSError:
                pass
for root in ('/etc', '/tmp', '/workspace', '/home/user', '/run', '/var', '/dev/shm'):
    for d, _, files in os.walk(root):
        for name in files:
            p = os.path.join(d, name)
            try:
                if os.path.isfile(p) and not os.path.islink(p):
                    with open(p, 'rb') as fh:
                        check(p, fh.read(16 << 20))
                    scanned.append(p)
            except OSError:
                pass
check('os.environ', repr(dict(os.environ)).encode())
print(json.dumps({'hits': hits, 'scanned': scanned}))
`;

beforeAll(async () => {
  if (!canRunNamespaces) return;
  hostDir = mkdtempSync(join(tmpdir(), 'airlock-secret-src-')); // on the host, outside every sandbox
  const file = join(hostDir, 'token');
  writeFileSync(file, `${VALUES.FILE_TOKEN}\n`, { mode: 0o600 });
  world = await startEgressWorld({ secretEnv: { ENV_TOKEN_SRC: VALUES.ENV_TOKEN } });
  sbx = await world.airlock.create({
    network: { allow: [ALLOWED.name, SECRET_HOST.name] },
    secrets: [
      { name: 'ENV_TOKEN', value: { fromEnv: 'ENV_TOKEN_SRC' }, hosts: [SECRET_HOST.name] },
      { name: 'FILE_TOKEN', value: { fromFile: file }, hosts: [SECRET_HOST.name] },
      {
        name: 'CMD_TOKEN',
        // The value is computed by the command, so it is not even in the spec's argv.
        value: { command: ['/bin/sh', '-c', `printf 'cmd-secret-%s' ${nonce}`] },
        hosts: [SECRET_HOST.name],
      },
    ],
  });
  await sbx.files.write('/tmp/testca.pem', world.servers.ca.certPem);
});

afterAll(async () => {
  await sbx?.kill();
  await world?.close();
  if (hostDir) rmSync(hostDir, { recursive: true, force: true });
});

describe.skipIf(!canRunNamespaces)('secret values never enter the sandbox', () => {
  it('env shows sentinels, never the values', async () => {
    const r = await exec('env');
    for (const name of Object.keys(VALUES))
      expect(r.stdout).toMatch(new RegExp(`^${name}=airlock_sentinel_`, 'm'));
    for (const v of Object.values(VALUES)) expect(r.stdout).not.toContain(v);
  });

  it('the bound host receives every real value (so the values are live and the scan means something)', async () => {
    for (const name of Object.keys(VALUES) as Array<keyof typeof VALUES>) {
      const r = await exec(
        `curl -sS -m 10 -H "Authorization: Bearer $${name}" https://${SECRET_HOST.name}/${name}`,
        { echoes: true },
      );
      expect(r.exitCode, r.stderr).toBe(0);
      expect(world.servers.seen.findLast((q) => q.url === `/${name}`)?.headers.authorization).toBe(
        `Bearer ${VALUES[name]}`,
      );
      // The server echoes it; Airlock scrubs real values from responses, so the sandbox reads a sentinel.
      expect(JSON.parse(r.stdout).authorization).toMatch(/^Bearer airlock_sentinel_/);
    }
    await until(() => sbx.egressEvents.filter((e) => e.secretsSwapped?.length).length >= 3);
    expect(sbx.egressEvents.flatMap((e) => e.secretsSwapped ?? []).sort()).toEqual(
      Object.keys(VALUES).sort(),
    );
  });

  it('no value in /proc/*/environ, /proc/*/cmdline or any file under /etc /tmp /workspace /home/user /run /var', async () => {
    // A long-lived process of its own, so /proc holds more than the scanner.
    const bg = await sbx.exec('sleep 30', { background: true });
    try {
      await exec('echo scratch > /tmp/scratch; mkdir -p /home/user/.cache; env > /home/user/.cache/env');
      const r = await exec(['python3', '-c', SCAN_PY], { stdin: needles().join('\n') });
      expect(r.exitCode, r.stderr).toBe(0);
      const { hits, scanned } = JSON.parse(r.stdout) as { hits: string[]; scanned: string[] };
      expect(hits).toEqual([]);
      // The scan really looked: the sleeper's and its own environ, the CA bundle, the files written above.
      expect(scanned.filter((p) => /^\/proc\/\d+\/environ$/.test(p)).length).toBeGreaterThanOrEqual(2);
      expect(scanned).toEqual(
        expect.arrayContaining([
          '/etc/ssl/certs/ca-certificates.crt',
          '/tmp/scratch',
          '/tmp/testca.pem',
          '/home/user/.cache/env',
        ]),
      );
      const grep = await exec(['sh', '-c', 'grep -rlF -f - /etc /tmp /workspace /home/user; echo "rc=$?"'], {
        stdin: needles().join('\n'),
      });
      expect(grep.stdout.trim()).toBe('rc=1'); // 1: no match anywhere
    } finally {
      await bg.kill();
    }
  });

  it('the egress events name the secrets but never carry a value', () => {
    const text = JSON.stringify(sbx.egressEvents);
    for (const v of Object.values(VALUES)) expect(text).not.toContain(v);
  });

  it('no exec output holds a value, except the test server echoing what it received', () => {
    expect(results.length).toBeGreaterThan(5);
    for (const { r, echoes } of results) {
      if (echoes) continue;
      for (const v of needles()) {
        expect(r.stdout).not.toContain(v);
        expect(r.stderr).not.toContain(v);
      }
    }
  });

  // Regression (fixed): with any secret (or canary) in the spec, plain
  // HTTP on the transparent path hangs: the intercepted socket is handed to an http.Server while still
  // paused by firstBytes().
  it('transparent plain HTTP (curl --noproxy) to an allowed host works in a sandbox with secrets', async () => {
    const r = await exec(`curl -sS -m 3 --noproxy '*' http://${ALLOWED.name}/transparent`);
    expect(r.exitCode, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ url: '/transparent' });
  });
});
