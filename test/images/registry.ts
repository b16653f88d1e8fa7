// A real registry for the image tests: Debian's docker-registry (Distribution v2) in a network
// namespace of its own (`unshare -n`: it can reach nothing, not even the host's loopback), serving on
// a unix socket in a temp dir. The test process reaches it through a byte relay on 127.0.0.1, so the
// image store's HTTP client talks real TCP to a loopback address, and nothing leaves this machine.
// Optional token auth (the distribution token spec): a token service on 127.0.0.1 in this process
// signs RS256 JWTs with a throw-away certificate the registry trusts.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createHash, createPrivateKey, createSign } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

export const REGISTRY_BIN = '/usr/bin/docker-registry';
export const canRunRegistry = process.getuid?.() === 0 && existsSync(REGISTRY_BIN);
/** Why a suite against the real registry is skipped when canRunRegistry is false. */
export const REGISTRY_SKIP_REASON = `needs root and Debian's docker-registry at ${REGISTRY_BIN} (run scripts/setup.sh)`;

export interface TestRegistry {
  /** `127.0.0.1:<port>`: the relay in front of the registry. */
  readonly host: string;
  /** The registry's storage root (tests tamper with blobs here). */
  readonly storage: string;
  readonly child: ChildProcess;
  close(): Promise<void>;
}

export interface TokenService {
  readonly realm: string;
  readonly certFile: string;
  readonly issued: number;
  close(): Promise<void>;
}

const listen = (s: Server | HttpServer): Promise<number> =>
  new Promise((res) => s.listen(0, '127.0.0.1', () => res((s.address() as { port: number }).port)));

/** Starts a registry on `storage` (a fresh temp dir unless given). */
export async function startRegistry(
  o: { storage?: string; token?: TokenService } = {},
): Promise<TestRegistry> {
  const dir = mkdtempSync(join(tmpdir(), 'airlock-registry-'));
  const storage = o.storage ?? join(dir, 'storage');
  const sock = join(dir, 'registry.sock');
  const auth = o.token
    ? `auth:\n  token:\n    realm: ${o.token.realm}\n    service: test-registry\n    issuer: test-issuer\n    rootcertbundle: ${o.token.certFile}\n`
    : '';
  writeFileSync(
    join(dir, 'config.yml'),
    `version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: ${storage}\n  delete:\n    enabled: true\nhttp:\n  net: unix\n  addr: ${sock}\n${auth}`,
  );
  const child = spawn('unshare', ['--net', '--', REGISTRY_BIN, 'serve', join(dir, 'config.yml')], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  for (let i = 0; !existsSync(sock); i++) {
    if (child.exitCode !== null || i > 200) {
      child.kill('SIGKILL');
      throw new Error(`docker-registry did not start: ${stderr}`);
    }
    await sleep(25);
  }
  const sockets = new Set<Socket>();
  const relay = createServer((c) => {
    const u = connect(sock);
    sockets.add(c).add(u);
    c.pipe(u).pipe(c);
    const end = (): void => {
      c.destroy();
      u.destroy();
      sockets.delete(c);
      sockets.delete(u);
    };
    c.on('error', end).on('close', end);
    u.on('error', end).on('close', end);
  });
  const port = await listen(relay);
  return {
    host: `127.0.0.1:${port}`,
    storage,
    child,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((r) => relay.close(r));
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        child.kill('SIGTERM');
        await exited;
      }
      // The dir holds only the config and the socket (a given storage lives elsewhere and stays).
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

const b64url = (b: Buffer | string): string => Buffer.from(b).toString('base64url');

/** A token service that grants pull to `user`:`password` (and push to anyone with them). */
export async function startTokenService(user: string, password: string): Promise<TokenService> {
  const dir = mkdtempSync(join(tmpdir(), 'airlock-token-'));
  const keyFile = join(dir, 'key.pem');
  const certFile = join(dir, 'cert.pem');
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-keyout',
      keyFile,
      '-out',
      certFile,
      '-days',
      '1',
      '-subj',
      '/CN=airlock-test-token',
    ],
    { stdio: 'ignore' },
  );
  const key = createPrivateKey(readFileSync(keyFile));
  const der = Buffer.from(readFileSync(certFile, 'utf8').replace(/-----[^-]+-----|\s/g, ''), 'base64');
  let issued = 0;
  const server = createHttpServer((req, res) => {
    const want = `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;
    if (req.headers.authorization !== want) {
      res.writeHead(401, { 'www-authenticate': 'Basic realm="token"' }).end();
      return;
    }
    const url = new URL(req.url ?? '/', 'http://x');
    const scope = url.searchParams.get('scope') ?? '';
    const [type, name, actions] = scope.split(':');
    const now = Math.floor(Date.now() / 1000);
    const header = { alg: 'RS256', typ: 'JWT', x5c: [der.toString('base64')] };
    const claims = {
      iss: 'test-issuer',
      sub: user,
      aud: url.searchParams.get('service'),
      exp: now + 300,
      nbf: now - 10,
      iat: now,
      jti: createHash('sha256').update(String(Math.random())).digest('hex'),
      access: type ? [{ type, name, actions: (actions ?? '').split(',') }] : [],
    };
    const input = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(claims))}`;
    const sig = createSign('RSA-SHA256').update(input).sign(key);
    issued++;
    res
      .writeHead(200, { 'content-type': 'application/json' })
      .end(JSON.stringify({ token: `${input}.${b64url(sig)}` }));
  });
  const port = await listen(server);
  return {
    realm: `http://127.0.0.1:${port}/token`,
    certFile,
    get issued() {
      return issued;
    },
    async close() {
      await new Promise((r) => server.close(r));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
