// `airlock serve` as a real process with its real supervisor: API keys (airlock keys), tenant
// scoping (another tenant's id answers exactly like an unknown one), body limits, the listen rule,
// health/metrics, and a non-root user using sandboxes through the server with a key.
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { request as httpsRequest } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { supervisorInfo, supervisorPaths } from '../../src/server/supervisor-client.js';
import {
  canRunNamespaces,
  NO_RESIDUE,
  residue,
  runCli,
  settledResidue,
  SKIP_REASON,
  TEST_STATE_DIR,
} from '../helpers.js';
import { create, errorOf, exec, kill, writeFile } from './serve-api.js';
import {
  call,
  newKey,
  startServe,
  stopServe,
  stopSupervisor,
  waitFor,
  type Served,
} from './serve-helpers.js';

const run = promisify(execFile);

describe.skipIf(!canRunNamespaces)(`airlock serve: keys, tenants, limits (${SKIP_REASON})`, () => {
  let s: Served;
  let keyA: string;
  let keyB: string;
  beforeAll(async () => {
    await stopSupervisor();
    s = await startServe({ maxBodyBytes: 4096, maxUploadBytes: 65_536 });
    keyA = newKey('tenant-a').key;
    keyB = newKey('tenant-b').key;
  }, 120_000);
  afterAll(async () => {
    if (s) expect(await stopServe(s)).toBe(0); // SIGTERM is a clean stop
    await stopSupervisor();
    expect(await settledResidue(5000)).toEqual(NO_RESIDUE);
  }, 120_000);

  it('the supervisor socket is 0600 root, and it names its boot; a second supervisor is refused', async () => {
    const { socket } = supervisorPaths(TEST_STATE_DIR);
    const st = statSync(socket);
    expect(st.isSocket()).toBe(true);
    expect(st.mode & 0o777).toBe(0o600);
    expect(st.uid).toBe(0);
    const info = await supervisorInfo(socket);
    expect(info?.bootId).toMatch(/^[0-9a-f-]{36}$/);
    const second = await runCli(['supervisor', '--state-dir', TEST_STATE_DIR], { timeoutMs: 60_000 });
    expect(second.code).not.toBe(0);
    expect(second.stderr).toMatch(/another airlock supervisor already serves/);
    expect((await supervisorInfo(socket))?.bootId).toBe(info?.bootId); // untouched
  });

  it('no key, a malformed key, an unknown key: the same 401; health and metrics need none', async () => {
    for (const key of [undefined, 'nope', `alk_${'0'.repeat(16)}_${'A'.repeat(43)}`]) {
      const r = await call(s.url, key, 'GET', '/v1/sandboxes');
      expect(r.status).toBe(401);
      expect(r.headers.get('www-authenticate')).toBe('Bearer');
      expect((await errorOf(r)).code).toBe('UNAUTHORIZED');
    }
    expect((await call(s.url, undefined, 'GET', '/healthz')).status).toBe(200);
    const ready = await call(s.url, undefined, 'GET', '/readyz');
    expect(ready.status).toBe(200);
    expect(((await ready.json()) as { supervisor: { bootId: string } }).supervisor.bootId).toMatch(/-/);
  });

  it('airlock keys: create prints the key once; list never shows it; revoke → 401 from the next request', async () => {
    const made = await runCli(['keys', 'create', '--tenant', 'cli-tenant', '--state-dir', TEST_STATE_DIR]);
    expect(made.code).toBe(0);
    const key = made.stdout.trim();
    expect(key).toMatch(/^alk_[0-9a-f]{16}_\S+$/);
    expect(made.stderr).toMatch(/shown only now/);
    const id = key.split('_')[1]!;
    expect((await call(s.url, key, 'GET', '/v1/sandboxes')).status).toBe(200);
    const list = await runCli(['keys', 'list', '--state-dir', TEST_STATE_DIR]);
    expect(list.stdout).toContain(id);
    expect(list.stdout).not.toContain(key.split('_')[2]!);
    const revoked = await runCli(['keys', 'revoke', id, '--state-dir', TEST_STATE_DIR]);
    expect(revoked.code).toBe(0);
    expect((await call(s.url, key, 'GET', '/v1/sandboxes')).status).toBe(401);
    const unknown = await runCli(['keys', 'revoke', 'ffffffffffffffff', '--state-dir', TEST_STATE_DIR]);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/no API key with id/);
  });

  it("tenant B gets exactly an unknown id's 404 for every route on tenant A's sandbox; A is unaffected", async () => {
    const a = await create(s.url, keyA, { metadata: { owner: 'a' } });
    const aid = encodeURIComponent(a.id);
    const unknownId = `${a.id.slice(0, -4)}zzzz`;
    const routes: Array<[string, string, unknown?]> = [
      ['GET', ''],
      ['DELETE', ''],
      ['POST', '/timeout', { ttlMs: 60_000 }],
      ['POST', '/pause'],
      ['POST', '/resume'],
      ['POST', '/exec', { cmd: 'echo pwned > /tmp/x' }],
      ['POST', '/processes', { cmd: ['sleep', '100'] }],
      ['POST', '/processes/stream', { cmd: ['sleep', '100'] }],
      ['GET', '/processes'],
      ['GET', '/files?path=/etc/hostname'],
      ['GET', '/files/list?path=/'],
      ['GET', '/files/stat?path=/'],
      ['DELETE', '/files?path=/tmp'],
      ['POST', '/files/mkdir?path=/tmp/b'],
      ['POST', '/snapshot'],
      ['GET', '/egress'],
    ];
    for (const [method, suffix, body] of routes) {
      const theirs = await errorOf(await call(s.url, keyB, method, `/v1/sandboxes/${aid}${suffix}`, body));
      const none = await errorOf(
        await call(s.url, keyB, method, `/v1/sandboxes/${unknownId}${suffix}`, body),
      );
      expect([theirs.status, theirs.code], `${method} ${suffix}`).toEqual([404, 'SANDBOX_NOT_FOUND']);
      // Same answer modulo the id itself: nothing tells B that A's id exists.
      expect(theirs.message.replace(a.id, 'ID')).toBe(none.message.replace(unknownId, 'ID'));
    }
    const put = await writeFile(s.url, keyB, a.id, '/tmp/x', 'pwned');
    expect([put.status, (await errorOf(put)).code]).toEqual([404, 'SANDBOX_NOT_FOUND']);
    // B's list is empty, also with A's metadata as the filter.
    for (const q of ['', '?metadata.owner=a']) {
      const r = await call(s.url, keyB, 'GET', `/v1/sandboxes${q}`);
      expect(await r.json()).toEqual([]);
    }
    // Encodings of A's id do not reach it either.
    for (const variant of [a.id.toUpperCase(), `${a.id}%00`, `${a.id}/`, `./${a.id}`, `%2e%2e%2f${a.id}`]) {
      const r = await call(s.url, keyB, 'GET', `/v1/sandboxes/${variant}`);
      expect(r.status, variant).toBe(404);
    }
    // A still owns a running sandbox nobody else touched.
    expect((await exec(s.url, keyA, a.id, 'test ! -e /tmp/x && echo clean')).stdout).toBe('clean\n');
    const mine = (await (await call(s.url, keyA, 'GET', '/v1/sandboxes?metadata.owner=a')).json()) as Array<{
      id: string;
    }>;
    expect(mine.map((v) => v.id)).toEqual([a.id]);
    await kill(s.url, keyA, a.id);
    // Killed: A now gets a clear "ended", not a sandbox.
    const after = await call(s.url, keyA, 'POST', `/v1/sandboxes/${aid}/exec`, { cmd: 'true' });
    expect(after.status).toBe(410);
  });

  it('a client that disconnects mid-exec through the front server leaves no process in the sandbox', async () => {
    const sb = await create(s.url, keyA);
    const ac = new AbortController();
    const r = await fetch(`${s.url}/v1/sandboxes/${sb.id}/exec`, {
      method: 'POST',
      headers: { authorization: `Bearer ${keyA}`, 'content-type': 'application/json' },
      body: JSON.stringify({ cmd: ['sh', '-c', 'echo started; exec sleep 1000'] }),
      signal: ac.signal,
    });
    const reader = r.body!.getReader();
    // Read until the command has printed: it is running in the sandbox now.
    let seen = '';
    while (!seen.includes('"stdout"')) seen += new TextDecoder().decode((await reader.read()).value);
    expect(residue().processes.length).toBeGreaterThan(0);
    ac.abort(); // front server → supervisor → the exec is killed
    await waitFor(() => residue().processes.length === 0 || undefined, 'the exec to be killed');
    // The sandbox itself is fine.
    expect((await exec(s.url, keyA, sb.id, 'echo still here')).stdout).toBe('still here\n');
    await kill(s.url, keyA, sb.id);
  });

  it('bodies and uploads over the caps are 413; a malformed create is 400 naming the field', async () => {
    const big = await call(s.url, keyA, 'POST', '/v1/sandboxes', { metadata: { pad: 'x'.repeat(8192) } });
    expect(big.status).toBe(413);
    const bad = await call(s.url, keyA, 'POST', '/v1/sandboxes', { ttlMs: 'soon' });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { field?: string } }).error.field).toBe('ttlMs');
    for (const hostile of [
      { mounts: [{ host: '/etc', path: '/x' }] },
      { layers: ['sha256:' + '0'.repeat(64)] },
      { secrets: [{ name: 'K', value: { fromEnv: 'HOME' }, hosts: ['example.com'] }] },
      { network: { allow: ['example.com'], allowPrivate: ['10.0.0.0/8'] } },
    ]) {
      const r = await call(s.url, keyA, 'POST', '/v1/sandboxes', hostile);
      expect([400, 403], JSON.stringify(hostile)).toContain(r.status);
    }
    const sb = await create(s.url, keyA);
    const over = await writeFile(s.url, keyA, sb.id, '/tmp/big', new Uint8Array(100_000));
    expect(over.status).toBe(413);
    const ok = await writeFile(s.url, keyA, sb.id, '/tmp/ok', new Uint8Array(60_000).fill(7));
    expect(ok.status).toBe(200);
    expect((await exec(s.url, keyA, sb.id, 'wc -c < /tmp/ok')).stdout.trim()).toBe('60000');
    await kill(s.url, keyA, sb.id);
  });

  it('a non-root user on the host creates, execs and kills a sandbox through the server with a key', async () => {
    const script = `
      const [url, key] = process.argv.slice(1);
      const h = { authorization: 'Bearer ' + key, 'content-type': 'application/json' };
      const sb = await (await fetch(url + '/v1/sandboxes', { method: 'POST', headers: h, body: '{}' })).json();
      const out = await (await fetch(url + '/v1/sandboxes/' + sb.id + '/exec', { method: 'POST', headers: h, body: JSON.stringify({ cmd: 'echo hi from $(id -u)' }) })).text();
      const line = out.split('\\n').map((l) => l && JSON.parse(l)).find((e) => e && e.type === 'stdout');
      process.stdout.write(process.getuid() + ' ' + Buffer.from(line.data, 'base64').toString());
      const del = await fetch(url + '/v1/sandboxes/' + sb.id, { method: 'DELETE', headers: h });
      process.stdout.write('deleted ' + del.status + '\\n');
    `;
    const { stdout } = await run(
      'setpriv',
      [
        '--reuid',
        '65534',
        '--regid',
        '65534',
        '--clear-groups',
        process.execPath,
        '--input-type=module',
        '-e',
        script,
        s.url,
        keyA,
      ],
      { timeout: 60_000 },
    );
    expect(stdout).toMatch(/^65534 hi from \d+\ndeleted 204\n$/);
    expect(stdout).not.toMatch(/^65534 hi from 0\n/);
  });

  it('a non-loopback --listen is refused without TLS or --insecure-listen; half a TLS pair is refused', async () => {
    const r = await runCli(['serve', '--listen', '0.0.0.0:0', '--state-dir', TEST_STATE_DIR], {
      timeoutMs: 60_000,
    });
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/not loopback, without TLS.*--tls-cert/);
    const half = await runCli(
      ['serve', '--listen', '127.0.0.1:0', '--tls-cert', '/nonexistent', '--state-dir', TEST_STATE_DIR],
      {
        timeoutMs: 60_000,
      },
    );
    expect(half.code).toBe(2);
    expect(half.stderr).toMatch(/both --tls-cert and --tls-key/);
  });

  it('with --tls-cert/--tls-key it serves HTTPS (the API key never crosses the wire in clear)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'airlock-tls-'));
    try {
      await run('openssl', [
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:P-256',
        '-nodes',
        '-days',
        '1',
        '-subj',
        '/CN=127.0.0.1',
        '-addext',
        'subjectAltName=IP:127.0.0.1',
        '-keyout',
        join(dir, 'key.pem'),
        '-out',
        join(dir, 'cert.pem'),
      ]);
      // A second server on the same state dir and supervisor: it shares the store, so keyA works.
      const tls = await startServe({}, [
        '--tls-cert',
        join(dir, 'cert.pem'),
        '--tls-key',
        join(dir, 'key.pem'),
      ]);
      try {
        expect(tls.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
        const ca = readFileSync(join(dir, 'cert.pem'), 'utf8');
        const get = (path: string): Promise<{ status: number; body: string }> =>
          new Promise((resolve, reject) => {
            const req = httpsRequest(
              `${tls.url}${path}`,
              { ca, headers: { authorization: `Bearer ${keyA}` } },
              (res) => {
                let body = '';
                res.setEncoding('utf8').on('data', (t: string) => (body += t));
                res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
              },
            );
            req.on('error', reject);
            req.end();
          });
        expect(await get('/v1/sandboxes')).toEqual({ status: 200, body: '[]' });
        // Plain HTTP on the TLS port is not served.
        await expect(fetch(tls.url.replace('https:', 'http:') + '/healthz')).rejects.toThrow();
      } finally {
        expect(await stopServe(tls)).toBe(0);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('/metrics counts creates and exec latency; /openapi.json needs no key', async () => {
    const sb = await create(s.url, keyA);
    await exec(s.url, keyA, sb.id, 'true');
    const text = await (await call(s.url, undefined, 'GET', '/metrics')).text();
    expect(text).toMatch(/^airlock_live_sandboxes \d+$/m);
    expect(text).toMatch(/^airlock_creates_total\{outcome="ok"\} [1-9]\d*$/m);
    expect(text).toMatch(/^airlock_exec_seconds_count [1-9]\d*$/m);
    expect(text).toMatch(/^airlock_supervisor_up 1$/m);
    await kill(s.url, keyA, sb.id);
    const doc = (await (await call(s.url, undefined, 'GET', '/openapi.json')).json()) as {
      openapi: string;
      paths: object;
    };
    expect(doc.openapi).toMatch(/^3\.1/);
    expect(Object.keys(doc.paths)).toContain('/v1/sandboxes');
  });
});
