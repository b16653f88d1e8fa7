// Egress and secrets on an image root, on every tier: the sandbox's python (from the image: no curl,
// no host /usr) reaches an allowed host through the egress proxy over TLS, verifying against the
// trust bundle Airlock binds at /etc/ssl/certs/ca-certificates.crt (the image's own has no Airlock
// CA), and the server receives the real secret where the sandbox only ever had its sentinel.
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Airlock } from '../../src/index.js';
import { canRunGvisor, canRunNamespaces, TEST_UID_RANGE } from '../helpers.js';
import { buildFixtures, type Fixtures } from '../images-root/fixtures.js';
import { EGRESS_STATE_DIR } from './harness.js';
import {
  assertPrivateNetns,
  DENIED,
  guardedDialer,
  SECRET_HOST,
  startTestServers,
  testResolver,
  type TestServers,
} from './net.js';

assertPrivateNetns();

const TOKEN = 'image-root-secret-value';
/** GET https://HOST/PATH through HTTPS_PROXY with a default (verifying) TLS context; prints status and body. */
const FETCH = String.raw`
import os, socket, ssl, sys
host, path = sys.argv[1], sys.argv[2]
proxy = os.environ['HTTPS_PROXY'].split('//', 1)[1].rstrip('/')
ph, pp = proxy.rsplit(':', 1)
s = socket.create_connection((ph, int(pp)), timeout=10)
s.sendall(('CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n' % (host, host)).encode())
head = b''
while b'\r\n\r\n' not in head:
    chunk = s.recv(1)
    if not chunk:
        break
    head += chunk
status = head.split(b' ', 2)[1].decode() if head else 'none'
if status != '200':
    print('CONNECT', status)
    sys.exit(3)
ctx = ssl.create_default_context()
t = ctx.wrap_socket(s, server_hostname=host)
t.sendall(('GET /%s HTTP/1.0\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n' % (path, host, os.environ['TOKEN'])).encode())
out = b''
while True:
    chunk = t.recv(65536)
    if not chunk:
        break
    out += chunk
print(out.split(b'\r\n\r\n', 1)[1].decode())
`;

const tiers = [
  ...(canRunNamespaces ? (['namespaces'] as const) : []),
  ...(canRunGvisor ? (['gvisor'] as const) : []),
];

describe.skipIf(!tiers.length)('egress and secrets on an image root', () => {
  let fx: Fixtures;
  let servers: TestServers;
  let airlock: Airlock;
  beforeAll(async () => {
    fx = buildFixtures(mkdtempSync(join(`${EGRESS_STATE_DIR}-image-fixtures-`)));
    servers = await startTestServers();
    airlock = new Airlock({
      stateDir: EGRESS_STATE_DIR,
      uidRange: TEST_UID_RANGE,
      egress: { resolver: testResolver(), dialer: guardedDialer(), upstreamCa: [servers.ca.certPem] },
      secretEnv: { TOKEN_SRC: TOKEN },
      images: fx.resolver,
    });
  }, 120_000);
  afterAll(async () => {
    await airlock?.close();
    await servers?.close();
    if (fx) rmSync(fx.root, { recursive: true, force: true });
  });

  for (const backend of tiers) {
    it(`${backend}: an image whose CA bundle is a symlink gets a real one (the egress CA bind lands on it)`, async () => {
      const sbx = await airlock.create({
        backend,
        image: 'example.com/test/python-symlink-ca:3.11',
        network: { allow: [SECRET_HOST.name] },
        secrets: [{ name: 'TOKEN', value: { fromEnv: 'TOKEN_SRC' }, hosts: [SECRET_HOST.name] }],
      });
      try {
        const r = await sbx.exec(['python3', '-c', FETCH, SECRET_HOST.name, `symlink-ca-${backend}`], {
          timeoutMs: 30_000,
        });
        expect(r.stderr).toBe('');
        expect(servers.seen.find((s) => s.url === `/symlink-ca-${backend}`)?.headers.authorization).toBe(
          `Bearer ${TOKEN}`,
        );
      } finally {
        await sbx.kill();
      }
    });

    it(`${backend}: TLS through the proxy verifies against Airlock's CA; the secret is swapped in`, async () => {
      const sbx = await airlock.create({
        backend,
        image: 'example.com/test/python-only:3.11',
        network: { allow: [SECRET_HOST.name] },
        secrets: [{ name: 'TOKEN', value: { fromEnv: 'TOKEN_SRC' }, hosts: [SECRET_HOST.name] }],
      });
      try {
        const env = await sbx.exec(['python3', '-c', 'import os; print(os.environ["TOKEN"])']);
        expect(env.stdout.trim()).not.toBe(TOKEN);
        const path = `img-${backend}`;
        const r = await sbx.exec(['python3', '-c', FETCH, SECRET_HOST.name, path], { timeoutMs: 30_000 });
        expect(r.stderr).toBe('');
        // The server got the real value; its echo comes back scrubbed to the sentinel.
        const seen = servers.seen.find((s) => s.url === `/${path}`);
        expect(seen?.headers.authorization).toBe(`Bearer ${TOKEN}`);
        const body = JSON.parse(r.stdout) as { host: string; authorization: string };
        expect(body).toMatchObject({ host: SECRET_HOST.name, authorization: `Bearer ${env.stdout.trim()}` });
        // A host outside the policy stays unreachable.
        const d = await sbx.exec(['python3', '-c', FETCH, DENIED.name, 'x'], { timeoutMs: 30_000 });
        expect(d.stdout).toMatch(/^CONNECT 403/);
      } finally {
        await sbx.kill();
      }
    });
  }
});
