// Credential reflection and cleartext credentials, end to end: a real sandbox runs curl through the real
// proxy (CONNECT, SOCKS5) and the transparent path to a real upstream on this run's own network
// namespace that reflects the credential it received — the whole Authorization header, the token inside
// it, the decoded Basic credentials — in every encoding a client can trivially undo, in the status
// line, a header value, a header name and a chunked body that cuts each copy at every offset, also
// gzip / deflate / br-compressed against the client's wishes. The sandbox must read back a sentinel or
// a redaction marker, never the real value in any of those forms. And a secret goes only into TLS to
// its bound host: plain HTTP carrying its sentinel is refused with the reason (proxy, transparent,
// Basic, API-key header, body), unless the secret opts in with insecureHttp.
import { randomBytes } from 'node:crypto';
import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { Server } from 'node:net';
import { createBrotliCompress, createDeflate, createGzip, type Gzip } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EgressEvent, Sandbox } from '../../src/index.js';
import { ENCODINGS } from '../encodings.js';
import { canRunNamespaces } from '../helpers.js';
import { startEgressWorld, until, type EgressWorld } from './harness.js';
import { assertPrivateNetns, SECRET_HOST } from './net.js';

assertPrivateNetns();

const nonce = randomBytes(6).toString('hex');
/** Characters that every escaping scheme treats differently: + / = & " */
const VALUE = `Tok+en/=&"-${nonce}-Zq9`;
const BODY_VALUE = `body-${randomBytes(6).toString('hex')}-secret`;
const INSECURE_VALUE = `plain-ok-${randomBytes(6).toString('hex')}-secret`;
const TLS_PORT = 8443;
const PLAIN_PORT = 8080;
const HOST = SECRET_HOST.name;

interface Seen {
  readonly secure: boolean;
  readonly url: string;
  readonly headers: IncomingMessage['headers'];
  readonly body: string;
}
/** What the reflector received, and per request id what it sent back (the encoded real value). */
const seen: Seen[] = [];
const emitted = new Map<string, { text: string; carried: boolean }>();
const servers: Server[] = [];

/** Reflect the credential: ?id, src (auth | token | decoded | body), enc (an ENCODINGS key), coding. */
function reflect(secure: boolean) {
  return (req: IncomingMessage, res: ServerResponse): void => {
    const chunks: Buffer[] = [];
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      seen.push({ secure, url: req.url ?? '', headers: req.headers, body });
      const u = new URL(req.url ?? '/', 'http://x');
      const auth = req.headers.authorization ?? '';
      const token = auth.replace(/^\S+\s+/, '');
      const src = u.searchParams.get('src') ?? 'auth';
      const item =
        src === 'auth'
          ? auth
          : src === 'token'
            ? token
            : src === 'decoded'
              ? Buffer.from(token, 'base64').toString('utf8')
              : body;
      const e = ENCODINGS[u.searchParams.get('enc') ?? 'verbatim']!(item);
      const carried =
        [VALUE, INSECURE_VALUE, BODY_VALUE].some((v) => item.includes(v)) ||
        Buffer.from(item.replace(/^Basic\s+/i, ''), 'base64')
          .toString('utf8')
          .includes(VALUE);
      emitted.set(u.searchParams.get('id') ?? '', { text: e, carried });
      const printable = /^[\x20-\x7e]*$/.test(e);
      const headers: Array<[string, string]> = [['content-type', 'text/plain']];
      if (printable) headers.push(['x-echo', e]);
      if (/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(e)) headers.push([`x-${e}`, '1']);
      const coding = u.searchParams.get('coding');
      if (coding) headers.push(['content-encoding', coding]);
      res.writeHead(200, printable ? e : 'OK', headers.flat());
      // Every copy of the reflection is cut in two chunks, at each offset in turn.
      const pieces: string[] = [];
      for (let i = 0; i <= e.length; i++) pieces.push(`<${i}>${e.slice(0, i)}`, `${e.slice(i)}\n`);
      const z: Gzip | undefined =
        coding === 'gzip'
          ? createGzip()
          : coding === 'deflate'
            ? createDeflate()
            : coding === 'br'
              ? (createBrotliCompress() as unknown as Gzip)
              : undefined;
      if (z) {
        z.pipe(res);
        for (const p of pieces) {
          z.write(p);
          z.flush();
        }
        z.end();
      } else {
        // charset: the body as UTF-16 (either byte order) instead of UTF-8.
        const charset = u.searchParams.get('charset');
        const bytes = (p: string): Buffer =>
          charset === 'utf16le'
            ? Buffer.from(p, 'utf16le')
            : charset === 'utf16be'
              ? Buffer.from(p, 'utf16le').swap16()
              : Buffer.from(p, 'utf8');
        for (const p of pieces) res.write(bytes(p));
        res.end();
      }
    });
  };
}

let world: EgressWorld;
let sbx: Sandbox;
let sentinel: string;

beforeAll(async () => {
  if (!canRunNamespaces) return;
  world = await startEgressWorld({
    secretEnv: { API_SRC: VALUE, BODY_SRC: BODY_VALUE, INSECURE_SRC: INSECURE_VALUE },
  });
  const leaf = world.servers.ca.leafFor(HOST);
  const tls = createHttpsServer({ key: leaf.key, cert: leaf.cert }, reflect(true));
  const plain = createHttpServer(reflect(false));
  for (const [s, port] of [
    [tls, TLS_PORT],
    [plain, PLAIN_PORT],
  ] as const) {
    await new Promise<void>((resolve, reject) => {
      s.once('error', reject);
      s.listen(port, SECRET_HOST.address, () => resolve());
    });
    servers.push(s);
  }
  sbx = await world.airlock.create({
    network: { allow: [HOST, `${HOST}:${TLS_PORT}`, `${HOST}:${PLAIN_PORT}`] },
    secrets: [
      { name: 'API_TOKEN', value: { fromEnv: 'API_SRC' }, hosts: [HOST] },
      { name: 'BODY_TOKEN', value: { fromEnv: 'BODY_SRC' }, hosts: [HOST], body: true },
    ],
  });
  sentinel = (await sbx.exec(['sh', '-c', 'printf %s "$API_TOKEN"'])).stdout;
});

afterAll(async () => {
  await sbx?.kill();
  for (const s of servers) {
    (s as unknown as { closeAllConnections?: () => void }).closeAllConnections?.();
    await new Promise((r) => s.close(r));
  }
  await world?.close();
});

interface Case {
  readonly src: 'auth' | 'token' | 'decoded';
  readonly enc: string;
  /** -H "Authorization: Bearer …" or curl -u user:… (curl builds Basic, Airlock re-encodes it). */
  readonly auth: 'bearer' | 'basic';
  readonly coding?: 'gzip' | 'deflate' | 'br';
  readonly charset?: 'utf16le' | 'utf16be';
  /** How curl reaches the host. */
  readonly path?: 'connect' | 'socks5' | 'transparent';
}

/** Run the cases in one exec; returns each case's curl output (status line, headers, body). */
async function runCases(cases: readonly Case[]): Promise<Map<string, { out: string; c: Case }>> {
  const run = randomBytes(3).toString('hex');
  const ids = cases.map((_, i) => `c${i}-${run}`);
  const script = cases
    .map((c, i) => {
      const q = new URLSearchParams({
        id: ids[i]!,
        src: c.src,
        enc: c.enc,
        ...(c.coding ? { coding: c.coding } : {}),
        ...(c.charset ? { charset: c.charset } : {}),
      });
      const url = `https://${HOST}:${TLS_PORT}/reflect?${q.toString().replace(/'/g, '%27')}`;
      const auth = c.auth === 'bearer' ? `-H "Authorization: Bearer $API_TOKEN"` : `-u "user:$API_TOKEN"`;
      const via =
        c.path === 'transparent' ? `--noproxy '*'` : c.path === 'socks5' ? `-x socks5h://127.0.0.1:3128` : '';
      return `printf '\\n=== %s\\n' '${ids[i]}'; curl -sS -m 20 -D - ${c.coding ? '--compressed' : ''} ${via} ${auth} '${url}'`;
    })
    .join('\n');
  const r = await sbx.exec(['sh', '-c', script], { maxOutputBytes: 64_000_000, timeoutMs: 300_000 });
  const parts = r.stdout.split(/\n=== (\S+)\n/);
  const out = new Map<string, { out: string; c: Case }>();
  for (let i = 1; i + 1 < parts.length; i += 2) {
    out.set(parts[i]!, { out: parts[i + 1]!, c: cases[ids.indexOf(parts[i]!)]! });
  }
  expect(out.size, r.stderr).toBe(cases.length);
  return out;
}

/** The sandbox read back no form of the real value, and a sentinel or marker for every reflected copy. */
function expectScrubbed(results: Map<string, { out: string; c: Case }>): void {
  const basicToken = Buffer.from(`user:${sentinel}`).toString('base64');
  for (const [id, { out, c }] of results) {
    const label = `${JSON.stringify(c)}`;
    const e = emitted.get(id);
    expect(e, `${label}: the reflector answered`).toBeDefined();
    expect(e!.carried, `${label}: the reflected item carried the real value`).toBe(true);
    // The last status line is the answer (a CONNECT's own 200 may come first).
    expect([...out.matchAll(/^HTTP\/1\.1 (\d{3})/gm)].pop()?.[1], `${label}: ${out.slice(0, 400)}`).toBe(
      '200',
    );
    expect(out, label).not.toContain(e!.text);
    // As UTF-16 (ASCII text: each character and a NUL, in either order).
    expect(out, label).not.toContain([...e!.text].map((ch) => `${ch}\0`).join(''));
    expect(out, label).not.toContain([...e!.text].map((ch) => `\0${ch}`).join(''));
    expect(out, label).not.toContain(VALUE);
    const replaced = out.split(/airlock_redacted_api_token|airlock_sentinel_api_token_/).length - 1;
    const ownToken = out.split(basicToken).length - 1;
    // One per body copy at least (the status line and headers add more).
    expect(replaced + ownToken, label).toBeGreaterThanOrEqual(e!.text.length + 1);
  }
}

const ALL = Object.keys(ENCODINGS);
const SOME = [
  'verbatim',
  'base64 offset 1',
  'hex upper',
  'JSON \\u every char',
  'percent every byte (lower)',
];

describe.skipIf(!canRunNamespaces)('credential reflection never reaches the sandbox', () => {
  it('the whole Authorization header Airlock sent (Bearer), in every encoding', async () => {
    expectScrubbed(await runCases(ALL.map((enc) => ({ src: 'auth', enc, auth: 'bearer' }))));
  });

  it('the base64 token of a Basic header that Airlock re-encoded, in every encoding', async () => {
    expectScrubbed(await runCases(ALL.map((enc) => ({ src: 'token', enc, auth: 'basic' }))));
  });

  it('the whole Basic header and its decoded credentials', async () => {
    expectScrubbed(
      await runCases([
        ...SOME.map((enc) => ({ src: 'auth' as const, enc, auth: 'basic' as const })),
        ...SOME.map((enc) => ({ src: 'decoded' as const, enc, auth: 'basic' as const })),
      ]),
    );
  });

  it('compressed bodies (gzip, deflate, br) are decoded and scrubbed; the request asked for identity', async () => {
    const cases: Case[] = (['gzip', 'deflate', 'br'] as const).flatMap((coding) =>
      ['verbatim', 'base64 offset 2', 'JSON.stringify'].map((enc) => ({
        src: 'auth' as const,
        enc,
        auth: 'bearer' as const,
        coding,
      })),
    );
    const results = await runCases(cases);
    expectScrubbed(results);
    for (const id of results.keys()) {
      const req = seen.find((s) => s.url.includes(`id=${encodeURIComponent(id)}`));
      expect(req?.headers['accept-encoding']).toBe('identity');
    }
    for (const { out } of results.values()) expect(out).not.toMatch(/^content-encoding:/im);
  });

  it('a body in UTF-16 (either byte order)', async () => {
    expectScrubbed(
      await runCases(
        (['utf16le', 'utf16be'] as const).flatMap((charset) =>
          ['verbatim', 'upper case'].map((enc) => ({
            src: 'auth' as const,
            enc,
            auth: 'bearer' as const,
            charset,
          })),
        ),
      ),
    );
  });

  it('the same through SOCKS5 and the transparent path', async () => {
    const cases: Case[] = (['socks5', 'transparent'] as const).flatMap((path) => [
      ...SOME.map((enc) => ({ src: 'auth' as const, enc, auth: 'bearer' as const, path })),
      { src: 'token' as const, enc: 'base64url offset 1', auth: 'basic' as const, path },
      { src: 'auth' as const, enc: 'verbatim', auth: 'bearer' as const, path, coding: 'gzip' as const },
    ]);
    expectScrubbed(await runCases(cases));
  });

  it('a request with a swapped credential asks for the whole, unencoded response (no Range, TE)', async () => {
    const id = `range-${randomBytes(3).toString('hex')}`;
    const url = `https://${HOST}:${TLS_PORT}/reflect?id=${id}&src=auth&enc=verbatim`;
    const r = await sbx.exec([
      'sh',
      '-c',
      `curl -sS -m 20 -r 0-40 -H 'TE: gzip' -H 'If-Range: "x"' -H 'Accept-Encoding: gzip, br' -H "Authorization: Bearer $API_TOKEN" '${url}'`,
    ]);
    expect(r.exitCode, r.stderr).toBe(0);
    const req = seen.find((x) => x.url.includes(id));
    expect(req?.headers.range).toBeUndefined();
    expect(req?.headers['if-range']).toBeUndefined();
    expect(req?.headers.te).toBeUndefined();
    expect(req?.headers['accept-encoding']).toBe('identity');
    expect(r.stdout).not.toContain(VALUE);
  });

  it('a body in a coding Airlock cannot decode is refused with the reason', async () => {
    const id = `unknown-${randomBytes(3).toString('hex')}`;
    const url = `https://${HOST}:${TLS_PORT}/reflect?id=${id}&src=auth&enc=base64+offset+0&coding=compress`;
    const r = await sbx.exec([
      'sh',
      '-c',
      `curl -sS -m 20 -D - -H "Authorization: Bearer $API_TOKEN" '${url}'`,
    ]);
    expect(emitted.get(id)?.carried).toBe(true);
    expect(r.stdout).toMatch(/^HTTP\/1\.1 502/m);
    expect(r.stdout).toContain('"compress"');
    expect(r.stdout).not.toContain(emitted.get(id)!.text);
    await until(() => sbx.egressEvents.some((e) => e.code === 'content_encoding'));
    const ev = sbx.egressEvents.find((e) => e.code === 'content_encoding');
    expect(ev).toMatchObject({ decision: 'deny', host: HOST, port: TLS_PORT });
    expect(ev?.reason).toContain('compress');
  });

  it('no egress event ever held the real value', () => {
    expect(JSON.stringify(sbx.egressEvents)).not.toContain(VALUE);
  });
});

// ---- cleartext ---------------------------------------------------------------------------------------

/** curl inside the sandbox; returns stdout (status line, headers, body) and stderr. */
async function curl(args: string): Promise<{ stdout: string; stderr: string }> {
  const r = await sbx.exec(['sh', '-c', `curl -sS -m 10 -D - ${args}`]);
  return { stdout: r.stdout, stderr: r.stderr };
}

/** Everything a request carried, as received (headers unescaped, unlike JSON.stringify). */
function carriedText(s: Seen): string {
  return [s.url, ...Object.entries(s.headers).map(([k, v]) => `${k}: ${String(v)}`), s.body].join('\n');
}

describe.skipIf(!canRunNamespaces)('secrets go only into TLS to their bound host', () => {
  const cases: Array<[string, string, EgressEvent['protocol']]> = [
    [
      'proxy, Bearer',
      `-H "Authorization: Bearer $API_TOKEN" http://${HOST}:${PLAIN_PORT}/clear-bearer`,
      'http',
    ],
    ['proxy, Basic', `-u "user:$API_TOKEN" http://${HOST}:${PLAIN_PORT}/clear-basic`, 'http'],
    ['proxy, X-Api-Key', `-H "X-Api-Key: $API_TOKEN" http://${HOST}:${PLAIN_PORT}/clear-apikey`, 'http'],
    [
      'transparent, Bearer',
      `--noproxy '*' -H "Authorization: Bearer $API_TOKEN" http://${HOST}:${PLAIN_PORT}/clear-transparent`,
      'transparent-http',
    ],
    [
      'transparent, Basic',
      `--noproxy '*' -u "user:$API_TOKEN" http://${HOST}:${PLAIN_PORT}/clear-transparent-basic`,
      'transparent-http',
    ],
    [
      'proxy, body secret in the body',
      `--data-binary "x=$BODY_TOKEN" http://${HOST}:${PLAIN_PORT}/clear-body`,
      'http',
    ],
  ];
  for (const [name, args, protocol] of cases) {
    it(`${name}: refused with the reason, in the response and the event`, async () => {
      const path = /\/(clear-[a-z-]+)/.exec(args)![1]!;
      const before = sbx.egressEvents.length;
      const r = await curl(args);
      expect(r.stdout).toMatch(/^HTTP\/1\.1 403/m);
      expect(r.stdout).toContain('only over TLS');
      expect(r.stdout).toContain('insecureHttp: true');
      expect(
        seen.some((s) => s.url.includes(path)),
        'the upstream never saw the request',
      ).toBe(false);
      await until(() => sbx.egressEvents.slice(before).some((e) => e.code === 'cleartext_secret'));
      const ev = sbx.egressEvents.slice(before).find((e) => e.code === 'cleartext_secret');
      expect(ev).toMatchObject({ decision: 'deny', protocol, host: HOST, port: PLAIN_PORT });
      expect(ev?.reason).toContain(path.includes('body') ? 'BODY_TOKEN' : 'API_TOKEN');
      expect(ev?.reason).toContain('insecureHttp');
    });
  }

  it('plain HTTP inside a CONNECT or SOCKS5 tunnel to the bound host never carries the value', async () => {
    await curl(
      `-p -x http://127.0.0.1:3128 -H "Authorization: Bearer $API_TOKEN" http://${HOST}:${PLAIN_PORT}/clear-tunnel`,
    );
    await curl(
      `-x socks5h://127.0.0.1:3128 -H "Authorization: Bearer $API_TOKEN" http://${HOST}:${PLAIN_PORT}/clear-socks`,
    );
    for (const path of ['/clear-tunnel', '/clear-socks']) {
      const got = seen.filter((s) => s.url === path);
      for (const s of got) expect(carriedText(s)).not.toContain(VALUE);
    }
  });

  it('the same request over TLS gets the real value (the secret is live)', async () => {
    const r = await curl(`-H "Authorization: Bearer $API_TOKEN" https://${HOST}:${TLS_PORT}/live?src=none`);
    expect(r.stdout, r.stderr).toMatch(/^HTTP\/1\.1 200/m);
    expect(seen.find((s) => s.url.startsWith('/live'))?.headers.authorization).toBe(`Bearer ${VALUE}`);
  });

  it('a secret with insecureHttp: true is swapped into plain HTTP, and its reflection still scrubbed', async () => {
    await world.withSandbox(
      {
        network: { allow: [HOST, `${HOST}:${PLAIN_PORT}`] },
        secrets: [
          { name: 'PLAIN_TOKEN', value: { fromEnv: 'INSECURE_SRC' }, hosts: [HOST], insecureHttp: true },
        ],
      },
      async (s) => {
        for (const [via, path] of [
          ['', '/opt-in-proxy'],
          [`--noproxy '*'`, '/opt-in-transparent'],
        ] as const) {
          const r = await s.exec([
            'sh',
            '-c',
            `curl -sS -m 10 -D - ${via} -H "Authorization: Bearer $PLAIN_TOKEN" 'http://${HOST}:${PLAIN_PORT}${path}?id=${path}&src=auth&enc=verbatim'`,
          ]);
          expect(r.stdout, r.stderr).toMatch(/^HTTP\/1\.1 200/m);
          const got = seen.find((x) => x.url.startsWith(path));
          expect(got?.secure).toBe(false);
          expect(got?.headers.authorization).toBe(`Bearer ${INSECURE_VALUE}`);
          expect(r.stdout).not.toContain(INSECURE_VALUE);
          expect(r.stdout).toContain('Bearer airlock_sentinel_plain_token_');
        }
      },
    );
  });

  it('no plain-HTTP request the upstream received carried a TLS-only value, in any form', () => {
    const plain = seen.filter((s) => !s.secure);
    expect(plain.length).toBeGreaterThan(0); // the opt-in requests at least
    for (const s of plain) {
      const text = carriedText(s);
      for (const v of [VALUE, BODY_VALUE]) {
        for (const enc of [
          'verbatim',
          'base64 offset 0',
          'base64 offset 1',
          'base64 offset 2',
          'hex lower',
        ]) {
          expect(text).not.toContain(ENCODINGS[enc]!(v).slice(4, -4));
        }
      }
    }
  });
});
