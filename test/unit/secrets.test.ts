// Secrets: resolving real values (env, file, command), sentinels swapped only for bound hosts, the
// exfiltration detectors (sentinels and canaries in raw and encoded forms), revocation, and redaction.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { inspect } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import type { SecretSpec } from '../../src/policy/network.js';
import { resolveSecretValue } from '../../src/secrets/resolve.js';
import { SecretLease } from '../../src/secrets/sentinels.js';

const VALUE = 'ghp_realRealRealValue0123456789abcdefXYZ';
const OTHER = 'npm_otherValue_9876543210';
const SENTINEL_RE = /^airlock_sentinel_github_token_[a-z2-7]{24}$/;

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'airlock-secrets-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The error a promise rejects with (fails the test if it resolves). */
async function rejection(p: Promise<unknown>): Promise<AirlockError> {
  const e: unknown = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(AirlockError.isInstance(e), `expected an AirlockError, got ${String(e)}`).toBe(true);
  return e as AirlockError;
}

function expectNoValue(e: AirlockError, value: string): void {
  const all = [
    e.message,
    JSON.stringify(e),
    inspect(e, { depth: 5, showHidden: true }),
    String(e.cause ?? ''),
  ];
  for (const text of all) expect(text).not.toContain(value);
}

function specs(): Array<Pick<SecretSpec, 'name' | 'value' | 'hosts'>> {
  return [
    { name: 'GITHUB_TOKEN', value: { fromEnv: 'GH_REAL' }, hosts: ['api.github.com'] },
    { name: 'NPM_TOKEN', value: { fromEnv: 'NPM_REAL' }, hosts: ['registry.npm.example.com'] },
  ];
}
const env = { GH_REAL: VALUE, NPM_REAL: OTHER };

describe('resolveSecretValue', () => {
  it('reads fromEnv from the given environment', async () => {
    expect(await resolveSecretValue({ fromEnv: 'GH_REAL' }, { env })).toBe(VALUE);
  });

  it('names the field and the fix when the variable is missing', async () => {
    const e = await rejection(resolveSecretValue({ fromEnv: 'NOPE' }, { env, name: 'GITHUB_TOKEN' }));
    expect(e.code).toBe('INVALID_SPEC');
    expect(e.field).toBe('secrets.GITHUB_TOKEN.value.fromEnv');
    expect(e.message).toContain('secrets.GITHUB_TOKEN.value.fromEnv');
    expect(e.message).toMatch(/NOPE is not set; export NOPE/);
  });

  it('reads fromFile and trims the trailing newline', async () => {
    const p = join(dir, 'token');
    writeFileSync(p, `${VALUE}\n`, { mode: 0o600 });
    expect(await resolveSecretValue({ fromFile: p })).toBe(VALUE);
    writeFileSync(p, `  ${VALUE}\r\n\n`);
    expect(await resolveSecretValue({ fromFile: p })).toBe(`  ${VALUE}`);
  });

  it('refuses relative, missing, oversized and non-regular files without echoing contents', async () => {
    const rel = await rejection(resolveSecretValue({ fromFile: 'token' }, { name: 'T' }));
    expect([rel.code, rel.field]).toEqual(['INVALID_SPEC', 'secrets.T.value.fromFile']);
    expect(rel.message).toContain('absolute');

    expect((await rejection(resolveSecretValue({ fromFile: join(dir, 'missing') }))).code).toBe(
      'FILE_NOT_FOUND',
    );

    const big = join(dir, 'big');
    writeFileSync(big, VALUE + 'x'.repeat(64 * 1024));
    const tooBig = await rejection(resolveSecretValue({ fromFile: big }, { name: 'T' }));
    expect(tooBig.code).toBe('FILE_TOO_LARGE');
    expectNoValue(tooBig, VALUE);

    const sub = join(dir, 'subdir');
    mkdirSync(sub);
    expect((await rejection(resolveSecretValue({ fromFile: sub }))).message).toContain('not a regular file');

    const empty = join(dir, 'empty');
    writeFileSync(empty, '\n');
    expect((await rejection(resolveSecretValue({ fromFile: empty }))).message).toContain('empty');
  });

  it('runs a command without a shell and trims stdout', async () => {
    expect(await resolveSecretValue({ command: ['/bin/echo', VALUE] })).toBe(VALUE);
    // No shell: metacharacters are plain arguments.
    expect(await resolveSecretValue({ command: ['/bin/echo', '$HOME;', '`id`'] })).toBe('$HOME; `id`');
  });

  it('reports a failing command by its stderr first line, never its output', async () => {
    const script = `echo ${VALUE}; echo "vault: permission denied ${VALUE}" >&2; echo second line >&2; exit 3`;
    const e = await rejection(
      resolveSecretValue({ command: ['/bin/sh', '-c', script] }, { name: 'GITHUB_TOKEN' }),
    );
    expect(e.code).toBe('INVALID_SPEC');
    expect(e.field).toBe('secrets.GITHUB_TOKEN.value.command');
    expect(e.message).toContain('exited with code 3');
    expect(e.message).toContain('vault: permission denied [redacted]');
    expect(e.message).not.toContain('second line');
    expect(e.message).not.toContain('-c'); // only the program is named: arguments may hold credentials
    expectNoValue(e, VALUE);
  });

  it('times out, and reports missing programs and empty output', async () => {
    const slow = await rejection(resolveSecretValue({ command: ['/bin/sleep', '5'] }, { timeoutMs: 100 }));
    expect(slow.message).toContain('did not finish within 100 ms');
    const missing = await rejection(resolveSecretValue({ command: ['/nonexistent/vault'] }));
    expect(missing.message).toContain('not found');
    const silent = await rejection(resolveSecretValue({ command: ['/bin/true'] }));
    expect(silent.message).toContain('printed nothing');
  });

  it('returns a literal value as is (the server API form) and never echoes it in an error', async () => {
    expect(await resolveSecretValue({ literal: VALUE })).toBe(VALUE);
    const bad = await rejection(
      SecretLease.create(
        [{ name: 'T', value: { literal: `${VALUE}\r\nX-Injected: 1` }, hosts: ['a.test'] }],
        {},
      ),
    );
    expect(bad.code).toBe('INVALID_SPEC');
    expect(bad.message).not.toContain(VALUE);
  });

  it('honours an abort signal', async () => {
    const ac = new AbortController();
    const p = resolveSecretValue({ command: ['/bin/sleep', '5'] }, { signal: ac.signal });
    ac.abort();
    expect((await rejection(p)).code).toBe('ABORTED');
  });
});

describe('SecretLease: sentinels', () => {
  it('gives the sandbox sentinels, never values', async () => {
    const lease = await SecretLease.create(specs(), { env });
    const e = lease.env();
    expect(Object.keys(e).sort()).toEqual(['GITHUB_TOKEN', 'NPM_TOKEN']);
    expect(e.GITHUB_TOKEN).toMatch(SENTINEL_RE);
    expect(e.NPM_TOKEN).toMatch(/^airlock_sentinel_npm_token_[a-z2-7]{24}$/);
    // Nothing a shell, URL or header would mangle.
    expect(encodeURIComponent(e.GITHUB_TOKEN!)).toBe(e.GITHUB_TOKEN);
    expect(e.GITHUB_TOKEN).toMatch(/^[a-z0-9_]+$/);
    expect(JSON.stringify(e)).not.toContain(VALUE);
    expect(JSON.stringify(e)).not.toContain(OTHER);
    // Fresh randomness per lease.
    const again = await SecretLease.create(specs(), { env });
    expect(again.env().GITHUB_TOKEN).not.toBe(e.GITHUB_TOKEN);
    expect([...lease.boundHosts()].sort()).toEqual(['api.github.com', 'registry.npm.example.com']);
  });

  it('swaps only for the bound host, in any case or with a trailing dot', async () => {
    const lease = await SecretLease.create(specs(), { env });
    const s = lease.env().GITHUB_TOKEN!;
    const headers: Array<[string, string]> = [
      ['Authorization', `Bearer ${s}`],
      ['X-Both', `${s},${s}`],
      ['Accept', 'application/json'],
    ];
    for (const host of ['api.github.com', 'API.GitHub.COM', 'api.github.com.']) {
      const r = lease.swapHeaders(host, headers);
      expect(r.swapped).toEqual(['GITHUB_TOKEN']);
      expect(r.unbound).toEqual([]);
      expect(r.revoked).toBe(false);
      expect(r.headers).toEqual([
        ['Authorization', `Bearer ${VALUE}`],
        ['X-Both', `${VALUE},${VALUE}`],
        ['Accept', 'application/json'],
      ]);
    }
    expect(headers[0]![1]).toBe(`Bearer ${s}`); // input untouched

    for (const host of [
      'api.github.com.evil.test',
      'evil.test',
      'github.com',
      'xapi.github.com',
      '140.82.112.6',
    ]) {
      const r = lease.swapHeaders(host, headers);
      expect(r.swapped).toEqual([]);
      expect(r.unbound).toEqual(['GITHUB_TOKEN']);
      expect(r.headers).toEqual(headers);
      expect(JSON.stringify(r)).not.toContain(VALUE);
    }
    expect(lease.secretsForHost('api.github.com.evil.test')).toEqual([]);
    expect(lease.secretsForHost('Api.Github.Com')).toEqual([
      { name: 'GITHUB_TOKEN', sentinel: s, value: VALUE },
    ]);
  });

  it("reports another secret's sentinel sent to this host as unbound", async () => {
    const lease = await SecretLease.create(specs(), { env });
    const { GITHUB_TOKEN: gh, NPM_TOKEN: npm } = lease.env();
    const r = lease.swapHeaders('api.github.com', [
      ['Authorization', `token ${gh}`],
      ['X-Npm', npm!],
    ]);
    expect(r.swapped).toEqual(['GITHUB_TOKEN']);
    expect(r.unbound).toEqual(['NPM_TOKEN']);
    expect(r.headers[1]).toEqual(['X-Npm', npm]);
  });

  it('swaps a sentinel inside Basic credentials', async () => {
    const lease = await SecretLease.create(specs(), { env });
    const s = lease.env().GITHUB_TOKEN!;
    const basic = (creds: string): string => Buffer.from(creds, 'utf8').toString('base64');
    const r = lease.swapHeaders('api.github.com', [
      ['authorization', `Basic ${basic(`x-access-token:${s}`)}`],
    ]);
    expect(r.swapped).toEqual(['GITHUB_TOKEN']);
    expect(r.headers[0]).toEqual(['authorization', `Basic ${basic(`x-access-token:${VALUE}`)}`]);

    const away = lease.swapHeaders('gist.github.com', [['Authorization', `BASIC ${basic(`${s}:x`)}`]]);
    expect(away.swapped).toEqual([]);
    expect(away.unbound).toEqual(['GITHUB_TOKEN']);
  });

  it('finds sentinels raw, in any case, base64 at every alignment, percent-encoded and hex', async () => {
    const lease = await SecretLease.create(specs(), { env });
    const s = lease.env().GITHUB_TOKEN!;
    const b64 = (t: string): string => Buffer.from(t).toString('base64');
    const pct = (t: string): string => [...t].map((ch) => `%${ch.charCodeAt(0).toString(16)}`).join('');
    const forms = [
      `token=${s}&x=1`,
      s.toUpperCase(),
      b64(s),
      b64(`a${s}`),
      b64(`ab${s}`),
      b64(`{"user":"me","token":"${s}"}`),
      b64(`??>${s}`).replace(/\+/g, '-').replace(/\//g, '_'), // base64url
      b64(`${'x'.repeat(50)}${s}`).replace(/(.{76})/g, '$1\r\n'), // MIME line wrapping
      `q=${pct(s)}`,
      `q=${pct(s).toUpperCase()}`,
      `q=${pct(pct(s))}`, // double-encoded
      `q=${encodeURIComponent(b64(`:${s}`))}`,
      Buffer.from(s).toString('hex'),
    ];
    for (const text of forms) expect(lease.findSentinels(text), text).toEqual(['GITHUB_TOKEN']);
    expect(lease.findSentinels(Buffer.from(`POST / HTTP/1.1\r\n\r\n${b64(s)}`))).toEqual(['GITHUB_TOKEN']);
    expect(lease.findSentinels(`${s} ${lease.env().NPM_TOKEN}`)).toEqual(['GITHUB_TOKEN', 'NPM_TOKEN']);
    expect(lease.findSentinels('airlock_sentinel_github_token_' + 'a'.repeat(24))).toEqual([]);
    expect(lease.findSentinels('nothing to see')).toEqual([]);
  });

  it('rejects a value that could inject headers, without echoing it', async () => {
    const e = await rejection(
      SecretLease.create([{ name: 'T', value: { fromEnv: 'V' }, hosts: ['a.test'] }], {
        env: { V: 'abc\r\nX-Evil: 1' },
      }),
    );
    expect(e.code).toBe('INVALID_SPEC');
    expect(e.message).toContain('line break');
    expectNoValue(e, 'X-Evil');
  });

  it('rejects hosts that are not names', async () => {
    const e = await rejection(
      SecretLease.create([{ name: 'T', value: { fromEnv: 'V' }, hosts: ['10.0.0.1'] }], { env: { V: 'v' } }),
    );
    expect(e.field).toBe('secrets.T.hosts.0');
  });
});

describe('SecretLease: canaries', () => {
  it('plants realistic fake tokens and detects them in egress', async () => {
    const lease = await SecretLease.create(specs(), {
      env,
      canaries: [
        { name: 'GH_PAT', kind: 'env' },
        { name: 'AWS_ACCESS_KEY_ID', kind: 'env' },
        { name: 'OPENAI_API_KEY', kind: 'file', path: '/home/user/.config/openai/key' },
      ],
    });
    const byName = Object.fromEntries(lease.canaries.map((c) => [c.name, c]));
    expect(byName.GH_PAT!.token).toMatch(/^ghp_[0-9A-Za-z]{36}$/);
    expect(byName.AWS_ACCESS_KEY_ID!.token).toMatch(/^AKIA[A-Z2-7]{16}$/);
    expect(byName.OPENAI_API_KEY!.token).toMatch(/^sk-[0-9A-Za-z]{48}$/);

    const e = lease.env();
    expect(e.GH_PAT).toBe(byName.GH_PAT!.token);
    expect(e.AWS_ACCESS_KEY_ID).toBe(byName.AWS_ACCESS_KEY_ID!.token);
    expect(e.OPENAI_API_KEY).toBeUndefined();
    expect(lease.canaryFiles()).toEqual([
      {
        name: 'OPENAI_API_KEY',
        path: '/home/user/.config/openai/key',
        content: `${byName.OPENAI_API_KEY!.token}\n`,
      },
    ]);

    const aws = byName.AWS_ACCESS_KEY_ID!.token;
    expect(lease.findCanaries(`GET /?key=${aws} HTTP/1.1`)).toEqual(['AWS_ACCESS_KEY_ID']);
    expect(
      lease.findCanaries(Buffer.from(Buffer.from(`k:${byName.GH_PAT!.token}`).toString('base64'))),
    ).toEqual(['GH_PAT']);
    expect(lease.findCanaries(encodeURIComponent(`a b ${byName.OPENAI_API_KEY!.token}`))).toEqual([
      'OPENAI_API_KEY',
    ]);
    expect(lease.findCanaries('AKIAIOSFODNN7EXAMPLE')).toEqual([]);
    // Canaries are not sentinels.
    expect(lease.findSentinels(aws)).toEqual([]);
  });

  it('needs an absolute path for a file canary and unique names', async () => {
    const noPath = await rejection(SecretLease.create([], { canaries: [{ name: 'K', kind: 'file' }] }));
    expect(noPath.field).toBe('canaries.0.path');
    const clash = await rejection(
      SecretLease.create(specs(), { env, canaries: [{ name: 'GITHUB_TOKEN', kind: 'env' }] }),
    );
    expect(clash.message).toContain('used twice');
  });
});

describe('SecretLease: lifetime and redaction', () => {
  it('stops swapping after revoke but still detects sentinels', async () => {
    const lease = await SecretLease.create(specs(), { env });
    const s = lease.env().GITHUB_TOKEN!;
    const headers: Array<[string, string]> = [['Authorization', `Bearer ${s}`]];
    expect(lease.swapHeaders('api.github.com', headers).swapped).toEqual(['GITHUB_TOKEN']);

    lease.revoke();
    const r = lease.swapHeaders('api.github.com', headers);
    expect(r).toEqual({
      headers,
      swapped: [],
      unbound: ['GITHUB_TOKEN'],
      revoked: true,
      cleartext: [],
      inserted: [],
    });
    expect(lease.revoked).toBe(true);
    expect(lease.secretsForHost('api.github.com')).toEqual([]);
    expect(lease.findSentinels(s)).toEqual(['GITHUB_TOKEN']);
  });

  it('revokes on dispose', async () => {
    const lease = await SecretLease.create(specs(), { env });
    {
      using held = lease;
      expect(held.revoked).toBe(false);
    }
    expect(lease.revoked).toBe(true);
  });

  it('never shows a value in JSON, toString or inspect', async () => {
    const lease = await SecretLease.create(specs(), {
      env,
      canaries: [{ name: 'CANARY_KEY', kind: 'env' }],
    });
    const shown = [
      JSON.stringify(lease),
      String(lease),
      inspect(lease, { depth: 10, showHidden: true }),
      JSON.stringify(Object.entries(lease)),
    ];
    for (const text of shown) {
      expect(text).not.toContain(VALUE);
      expect(text).not.toContain(OTHER);
    }
    expect(JSON.parse(JSON.stringify(lease))).toEqual({
      secrets: [
        { name: 'GITHUB_TOKEN', hosts: ['api.github.com'] },
        { name: 'NPM_TOKEN', hosts: ['registry.npm.example.com'] },
      ],
      canaries: [{ name: 'CANARY_KEY', kind: 'env' }],
      revoked: false,
    });
    expect(String(lease)).toBe('SecretLease(GITHUB_TOKEN, NPM_TOKEN)');
  });

  it('fails creation with the field of the first unresolvable secret', async () => {
    const e = await rejection(
      SecretLease.create(
        [
          { name: 'A', value: { fromEnv: 'GH_REAL' }, hosts: ['a.test'] },
          { name: 'B', value: { fromEnv: 'MISSING' }, hosts: ['b.test'] },
        ],
        { env },
      ),
    );
    expect(e.field).toBe('secrets.B.value.fromEnv');
    expectNoValue(e, VALUE);
  });
});
