// Egress on the microVM tier: the guest's one NIC is a tap in the sandbox's netns, whose only
// sockets are the egress gateway's (proxy and DNS at the tap's host address, transparent interception
// by a prerouting DNAT). The suite's core cases against test servers in this run's private network
// namespace: the allowed host through the proxy and transparently, the denied host and the metadata
// address refused before any socket opens, secrets swapped at egress and never in the guest.
// One VM serves every case (TCG boots are slow); each case uses its own paths so results stay apart.
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { setTimeout as sleep } from 'node:timers/promises';
import { AirlockError, type Sandbox } from '../../src/index.js';
import { canRunMicrovm, myQemus } from '../microvm/qemus.js';
import { startEgressWorld, type EgressWorld } from './harness.js';
import { ALLOWED, assertPrivateNetns, DENIED, SECRET_HOST } from './net.js';

assertPrivateNetns();

const REAL = 'real-secret-value-mvm-42';
let world: EgressWorld;
let sbx: Sandbox;

/**
 * An HTTP GET from the guest (python3-minimal has sockets but no http.client): through the proxy
 * that $http_proxy names, or `direct` (resolved by the guest's DNS, connected to port 80). Prints
 * the status line, then the body after a blank line, or the client's error.
 */
const get = (url: string, how: 'proxy' | 'direct', header = ''): string =>
  `python3 -c '
import os, socket, sys
url, how, header = sys.argv[1:4]
host, _, path = url.split("://", 1)[1].partition("/")
try:
    if how == "proxy":
        p = os.environ["http_proxy"].split("://", 1)[1].rstrip("/").rsplit(":", 1)
        s = socket.create_connection((p[0], int(p[1])), timeout=20); target = url
    else:
        s = socket.create_connection((host, 80), timeout=20); target = "/" + path
    s.sendall(("GET %s HTTP/1.1\\r\\nHost: %s\\r\\n%sConnection: close\\r\\n\\r\\n" % (target, host, header + "\\r\\n" if header else "")).encode())
    out = b""
    while True:
        b = s.recv(65536)
        if not b: break
        out += b
    head, _, body = out.decode(errors="replace").partition("\\r\\n\\r\\n")
    print(head.split("\\r\\n")[0]); print(); print(body)
except OSError as e:
    print("error", type(e).__name__, e)
' '${url}' ${how} "${header}"`;

describe.skipIf(!canRunMicrovm)(
  'egress on the microVM tier (needs root, qemu-system-x86 and the guest kernel in /var/cache/airlock/microvm: run scripts/setup.sh)',
  () => {
    beforeAll(async () => {
      world = await startEgressWorld({ secretEnv: { TEST_TOKEN: REAL } });
      sbx = await world.airlock.create({
        backend: 'microvm',
        network: { allow: [ALLOWED.name, SECRET_HOST.name] },
        secrets: [{ name: 'TEST_TOKEN', value: { fromEnv: 'TEST_TOKEN' }, hosts: [SECRET_HOST.name] }],
      });
    }, 600_000);

    afterAll(async () => {
      await sbx?.kill();
      await world?.close();
      expect(myQemus()).toEqual([]);
    }, 120_000);

    it('the guest has one NIC, routed to the gateway, and resolves through the gateway DNS', async () => {
      const r = await sbx.exec('ls /sys/class/net; cat /etc/resolv.conf; echo "$HTTP_PROXY"');
      expect(r.stdout).toMatch(/^eth0\nlo\nnameserver 10\.0\.2\.1\n/);
      expect(r.stdout).toContain('http://10.0.2.1:3128');
      // The tap lives in the sandbox's netns only (QEMU holds it as an fd), never in this one.
      expect(readFileSync('/proc/net/dev', 'utf8')).not.toMatch(/\bvm0:/);
      const dns = await sbx.exec(
        `busybox nslookup ${ALLOWED.name} 2>&1; busybox nslookup ${DENIED.name} 2>&1`,
      );
      expect(dns.stdout).toMatch(/Address: 198\.1[89]\./); // a synthetic address, never the real one
      expect(dns.stdout).not.toContain(ALLOWED.address);
      expect(dns.stdout).toMatch(/NXDOMAIN/);
    }, 120_000);

    it('the proxy allows the listed host and refuses another with a reason', async () => {
      const ok = await sbx.exec(get(`http://${ALLOWED.name}/mvm-hello`, 'proxy'));
      expect(ok.stdout, ok.stderr).toMatch(/^HTTP\/1\.1 200 /);
      expect(JSON.parse(ok.stdout.split('\n\n')[1]!)).toMatchObject({
        host: ALLOWED.name,
        url: '/mvm-hello',
      });
      const no = await sbx.exec(get(`http://${DENIED.name}/mvm-no`, 'proxy'));
      expect(no.stdout).toMatch(
        /^HTTP\/1\.1 403 [\s\S]*blocked by Airlock egress policy: host denied\.test is not in network\.allow/,
      );
      expect(world.dialer.dials).not.toContain(`${DENIED.address}:80`);
      expect(world.servers.seen.some((q) => q.url === '/mvm-no')).toBe(false);
    }, 120_000);

    it('transparent interception: a proxy-unaware client reaches the allowed host; a raw denied address does not', async () => {
      const ok = await sbx.exec(get(`http://${ALLOWED.name}/mvm-direct`, 'direct'));
      expect(ok.stdout, ok.stderr).toMatch(/^HTTP\/1\.1 200 /);
      expect(JSON.parse(ok.stdout.split('\n\n')[1]!)).toMatchObject({ url: '/mvm-direct' });
      const no = await sbx.exec(get(`http://${DENIED.address}/mvm-raw`, 'direct'));
      expect(no.stdout).not.toMatch(/^HTTP\/1\.1 200/);
      expect(world.dialer.dials).not.toContain(`${DENIED.address}:80`);
      expect(world.servers.seen.some((q) => q.url === '/mvm-raw')).toBe(false);
    }, 120_000);

    it('the metadata address is refused before a socket opens, through the proxy and transparently', async () => {
      const before = world.dialer.dials.length;
      const viaProxy = await sbx.exec(get('http://169.254.169.254/latest/meta-data/', 'proxy'));
      const direct = await sbx.exec(get('http://169.254.169.254/latest/meta-data/', 'direct'));
      expect(viaProxy.stdout).toMatch(/^HTTP\/1\.1 403 /);
      expect(direct.stdout).not.toMatch(/^HTTP\/1\.1 200/);
      expect(world.dialer.dials.slice(before).filter((d) => d.startsWith('169.254.'))).toEqual([]);
    }, 120_000);

    it('nothing else on the host side answers: not other ports of the gateway, not UDP elsewhere', async () => {
      const r = await sbx.exec(
        `python3 -c '
import socket
s = socket.socket(); s.settimeout(5)
try:
    s.connect(("10.0.2.1", 22)); print("tcp22 open")
except OSError as e:
    print("tcp22", type(e).__name__)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
u.sendto(b"x", ("${ALLOWED.address}", 53))
try:
    u.recvfrom(100); print("udp answered")
except OSError as e:
    print("udp", type(e).__name__)
'`,
      );
      expect(r.stdout).not.toMatch(/open|answered/);
      expect(r.stdout).toMatch(/tcp22 ConnectionRefusedError/);
    }, 120_000);

    it('the guest sees only a sentinel; the bound host gets the real value; another host gets nothing', async () => {
      const env = await sbx.exec('echo "$TEST_TOKEN"');
      expect(env.stdout).toMatch(/^airlock_sentinel_test_token_/);
      // Python's ssl trusts SSL_CERT_FILE: Airlock's CA, copied into the guest, root-owned.
      const r = await sbx.exec(
        `python3 -c '
import os, socket, ssl
ctx = ssl.create_default_context()
raw = socket.create_connection(("10.0.2.1", 3128), timeout=20)
raw.sendall(b"CONNECT ${SECRET_HOST.name}:443 HTTP/1.1\\r\\nHost: ${SECRET_HOST.name}:443\\r\\n\\r\\n")
head = b""
while b"\\r\\n\\r\\n" not in head: head += raw.recv(1)
s = ctx.wrap_socket(raw, server_hostname="${SECRET_HOST.name}")
s.sendall(("GET /mvm-api HTTP/1.1\\r\\nHost: ${SECRET_HOST.name}\\r\\nAuthorization: Bearer " + os.environ["TEST_TOKEN"] + "\\r\\nConnection: close\\r\\n\\r\\n").encode())
out = b""
while True:
    b = s.recv(65536)
    if not b: break
    out += b
print(out.decode(errors="replace"))
'; ls -l /etc/ssl/certs/ca-certificates.crt`,
      );
      expect(r.exitCode, r.stderr).toBe(0);
      expect(r.stdout).toMatch(/^-rw-r--r-- 1 root root /m);
      expect(world.servers.seen.findLast((q) => q.url === '/mvm-api')?.headers.authorization).toBe(
        `Bearer ${REAL}`,
      );
      expect(r.stdout).not.toContain(REAL);
      const leak = await sbx.exec(
        get(`http://${ALLOWED.name}/mvm-steal`, 'proxy', 'Authorization: Bearer $TEST_TOKEN'),
      );
      expect(leak.stdout).toMatch(/^HTTP\/1\.1 403 [\s\S]*may only be sent to its bound host/);
      expect(world.servers.seen.some((q) => q.url === '/mvm-steal')).toBe(false);
      // Nowhere in the guest: not in any process's environment, not in a file it can read. (The
      // pattern goes in reversed, so this very exec does not carry the value in.)
      const find = await sbx.exec(
        `python3 -c '
import glob, os, sys
pat = sys.argv[1][::-1].encode()
hits = []
for f in glob.glob("/proc/[0-9]*/environ"):
    try:
        if pat in open(f, "rb").read(): hits.append(f)
    except OSError: pass
for top in ["/etc", "/tmp", "/workspace", "/home", "/root"]:
    for d, _, names in os.walk(top):
        for n in names:
            try:
                if pat in open(os.path.join(d, n), "rb").read(): hits.append(os.path.join(d, n))
            except OSError: pass
print("hits", hits)
' '${[...REAL].reverse().join('')}'`,
      );
      expect(find.stdout).toBe('hits []\n');
    }, 180_000);

    it("connectPort reaches a server in the guest, and only the guest's own ports", async () => {
      // busybox httpd on 0.0.0.0:8080 in the guest; a bare listener on the guest's loopback only.
      await sbx.exec('mkdir -p /tmp/www && echo guest-page > /tmp/www/index.html');
      await sbx.exec('busybox httpd -f -p 8080 -h /tmp/www', { background: true, timeoutMs: 600_000 });
      await sbx.exec(
        `python3 -c 'import socket,time; s=socket.socket(); s.bind(("127.0.0.1",8081)); s.listen(); time.sleep(600)'`,
        { background: true, timeoutMs: 600_000 },
      );
      const fetchVia = async (port: number): Promise<string> => {
        const s = await sbx.connectPort(port);
        const chunks: Buffer[] = [];
        s.on('data', (c: Buffer) => chunks.push(c));
        const done = new Promise((r) => s.once('close', r));
        s.end('GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n');
        await done;
        return Buffer.concat(chunks).toString();
      };
      let page = '';
      for (let i = 0; i < 100 && !page.includes('guest-page'); i++) {
        page = await fetchVia(8080).catch(async (e: unknown) => {
          if (!AirlockError.is(e, 'PORT_UNREACHABLE')) throw e;
          await sleep(200); // the server is still starting
          return '';
        });
      }
      expect(page).toMatch(/^HTTP\/1\.[01] 200[\s\S]*guest-page/);
      // A port nothing listens on, and one bound to the guest's own loopback: refused, typed.
      for (const port of [8082, 8081]) {
        const e = await sbx.connectPort(port).catch((x: unknown) => x);
        expect(AirlockError.is(e, 'PORT_UNREACHABLE')).toBe(true);
      }
    }, 180_000);

    it('connectPort on a microVM without a NIC says how to get one', async () => {
      const bare = await world.airlock.create({ backend: 'microvm' });
      try {
        const e = await bare.connectPort(8080).catch((x: unknown) => x);
        expect(AirlockError.is(e, 'BACKEND_UNAVAILABLE')).toBe(true);
        expect((e as Error).message).toMatch(/network policy/);
      } finally {
        await bare.kill();
      }
    }, 600_000);
  },
);
