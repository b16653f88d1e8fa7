// The egress CA: created once with a 0600 key, reloaded as-is, refused when its key file is unsafe, and
// issuing leaf certificates that Node's own TLS client accepts for exactly the host they name.
import { X509Certificate } from 'node:crypto';
import {
  chmodSync,
  chownSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  renameSync,
  utimesSync,
} from 'node:fs';
import { once } from 'node:events';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import type { AddressInfo } from 'node:net';
import forge from 'node-forge';
import { afterAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { MitmCa } from '../../src/egress/mitm.js';

const dirs: string[] = [];
function tempDir(): string {
  const d = mkdtempSync(join(tmpdir(), 'airlock-mitm-'));
  dirs.push(d);
  return d;
}
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const isRoot = process.getuid?.() === 0;
const SERVER_AUTH = '1.3.6.1.5.5.7.3.1';

function refusal(fn: () => unknown): AirlockError {
  try {
    fn();
  } catch (e) {
    expect(AirlockError.isInstance(e)).toBe(true);
    return e as AirlockError;
  }
  throw new Error('expected an error');
}

/** Connect to a TLS server on 127.0.0.1 and report how the client judged the certificate. */
async function handshake(
  ca: MitmCa,
  serverFor: (servername: string) => tls.SecureContext,
  servername: string,
  trust: string | undefined = ca.certPem,
): Promise<{ authorized: boolean; error: string | undefined; subject: string | undefined }> {
  const server = tls.createServer({ SNICallback: (name, cb) => cb(null, serverFor(name)) }, (s) =>
    s.end('ok'),
  );
  server.on('tlsClientError', () => {});
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as AddressInfo;
  try {
    const socket = tls.connect({
      host: '127.0.0.1',
      port,
      servername,
      ca: trust === undefined ? undefined : [trust],
      rejectUnauthorized: false, // judged below, from authorized / authorizationError
    });
    await once(socket, 'secureConnect');
    const cn = socket.getPeerCertificate().subject?.CN;
    const result = {
      authorized: socket.authorized,
      error: socket.authorizationError ? String(socket.authorizationError) : undefined,
      subject: typeof cn === 'string' ? cn : undefined,
    };
    socket.destroy();
    return result;
  } finally {
    server.close();
  }
}

describe('MitmCa: files', () => {
  it('creates a 0600 key and a 0644 CA certificate on first use', () => {
    const dir = join(tempDir(), 'state', 'egress-ca');
    const ca = MitmCa.loadOrCreate(dir);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(statSync(join(dir, 'ca.key')).mode & 0o777).toBe(0o600);
    expect(statSync(join(dir, 'ca.crt')).mode & 0o777).toBe(0o644);
    expect(readFileSync(join(dir, 'ca.crt'), 'utf8')).toBe(ca.certPem);

    const x = new X509Certificate(ca.certPem);
    expect(x.ca).toBe(true);
    expect(x.subject).toMatch(/CN=Airlock egress CA /);
    expect(x.issuer).toBe(x.subject);
    expect(x.verify(x.publicKey)).toBe(true);
    const years = (Date.parse(x.validTo) - Date.parse(x.validFrom)) / (365.25 * 86_400_000);
    expect(years).toBeGreaterThan(9.9);
    expect(years).toBeLessThan(10.1);
    const f = forge.pki.certificateFromPem(ca.certPem);
    expect(f.getExtension('basicConstraints')).toMatchObject({ cA: true, critical: true });
    expect(f.getExtension('keyUsage')).toMatchObject({
      keyCertSign: true,
      cRLSign: true,
      digitalSignature: false,
    });
    expect(JSON.stringify(ca)).not.toContain('PRIVATE KEY');
  });

  it('reloads the same CA afterwards', () => {
    const dir = tempDir();
    const first = MitmCa.loadOrCreate(dir);
    const key = readFileSync(join(dir, 'ca.key'), 'utf8');
    const second = MitmCa.loadOrCreate(dir);
    expect(second.certPem).toBe(first.certPem);
    expect(readFileSync(join(dir, 'ca.key'), 'utf8')).toBe(key);
    // A leaf from the reloaded CA still chains to the first one's certificate.
    const leaf = new X509Certificate(second.leafFor('example.test').cert);
    expect(leaf.verify(new X509Certificate(first.certPem).publicKey)).toBe(true);
  });

  it('refuses a key file readable by others', () => {
    const dir = tempDir();
    MitmCa.loadOrCreate(dir);
    chmodSync(join(dir, 'ca.key'), 0o644);
    const e = refusal(() => MitmCa.loadOrCreate(dir));
    expect(e.code).toBe('INTERNAL');
    expect(e.message).toMatch(/ca\.key: its mode is 0644, it must be 0600/);
    expect(e.message).toContain('chmod 600');
    chmodSync(join(dir, 'ca.key'), 0o640);
    expect(refusal(() => MitmCa.loadOrCreate(dir)).message).toContain('0640');
  });

  it.skipIf(!isRoot)('refuses a key file owned by another user (needs root to chown)', () => {
    const dir = tempDir();
    MitmCa.loadOrCreate(dir);
    chownSync(join(dir, 'ca.key'), 4_242_424, 4_242_424);
    const e = refusal(() => MitmCa.loadOrCreate(dir));
    expect(e.code).toBe('INTERNAL');
    expect(e.message).toMatch(/owned by uid 4242424, not by this process/);
  });

  it('refuses a symlinked key and a certificate that does not match the key', () => {
    const dir = tempDir();
    MitmCa.loadOrCreate(dir);
    const other = tempDir();
    MitmCa.loadOrCreate(other);

    renameSync(join(dir, 'ca.key'), join(dir, 'real.key'));
    symlinkSync(join(dir, 'real.key'), join(dir, 'ca.key'));
    expect(refusal(() => MitmCa.loadOrCreate(dir)).message).toContain('symbolic link');

    rmSync(join(dir, 'ca.key'));
    renameSync(join(dir, 'real.key'), join(dir, 'ca.key'));
    renameSync(join(other, 'ca.crt'), join(dir, 'ca.crt'));
    expect(refusal(() => MitmCa.loadOrCreate(dir)).message).toContain('does not match');
  });

  it('re-issues a missing certificate from the existing key', () => {
    const dir = tempDir();
    const first = MitmCa.loadOrCreate(dir);
    rmSync(join(dir, 'ca.crt'));
    // A key written moments ago means a concurrent creator is about to rename ca.crt in: it waits for
    // that. An older key without a certificate gets a new certificate at once.
    const old = new Date(Date.now() - 60_000);
    utimesSync(join(dir, 'ca.key'), old, old);
    const second = MitmCa.loadOrCreate(dir);
    expect(second.certPem).not.toBe(first.certPem);
    expect(
      new X509Certificate(second.certPem).publicKey.equals(new X509Certificate(first.certPem).publicKey),
    ).toBe(true);
  });
});

describe('MitmCa: leaf certificates', () => {
  const ca = MitmCa.loadOrCreate(tempDir());

  it('issues a serverAuth leaf for exactly one host, valid 1 day back and 30 days forward', () => {
    const { key, cert } = ca.leafFor('Example.TEST');
    expect(key).toContain('PRIVATE KEY');
    const leaf = new X509Certificate(cert);
    const root = new X509Certificate(ca.certPem);
    expect(leaf.verify(root.publicKey)).toBe(true);
    expect(leaf.checkIssued(root)).toBe(true);
    expect(leaf.ca).toBe(false);
    expect(leaf.subjectAltName).toBe('DNS:example.test');
    expect(leaf.checkHost('example.test')).toBe('example.test');
    expect(leaf.checkHost('other.test')).toBeUndefined();
    expect(leaf.keyUsage).toEqual([SERVER_AUTH]);
    const day = 86_400_000;
    expect(Math.abs(Date.now() - day - Date.parse(leaf.validFrom))).toBeLessThan(60_000);
    expect(Math.abs(Date.now() + 30 * day - Date.parse(leaf.validTo))).toBeLessThan(60_000);
  });

  it('caches per host, shares one leaf key, and uses random serials', () => {
    const a = ca.leafFor('a.example.test');
    expect(ca.leafFor('A.example.test.')).toEqual(a);
    const b = ca.leafFor('b.example.test');
    expect(b.key).toBe(a.key);
    expect(b.cert).not.toBe(a.cert);
    expect(new X509Certificate(a.cert).serialNumber).not.toBe(new X509Certificate(b.cert).serialNumber);
    expect(ca.secureContextFor('a.example.test')).toBe(ca.secureContextFor('a.example.test'));
  });

  it('refuses addresses and invalid names', () => {
    expect(refusal(() => ca.leafFor('127.0.0.1')).code).toBe('INVALID_ARGUMENT');
    expect(refusal(() => ca.leafFor('bad host')).code).toBe('INVALID_ARGUMENT');
  });

  it('prepares the leaf key off the event loop', async () => {
    const fresh = MitmCa.loadOrCreate(tempDir());
    await fresh.prepare();
    await fresh.prepare();
    expect(new X509Certificate(fresh.leafFor('x.test').cert).checkHost('x.test')).toBe('x.test');
  });
});

describe('MitmCa: TLS handshake with Node', () => {
  const ca = MitmCa.loadOrCreate(tempDir());
  const fixed = (): tls.SecureContext => ca.secureContextFor('example.test');

  it('is authorized for the host the leaf names', async () => {
    const r = await handshake(ca, fixed, 'example.test');
    expect(r).toEqual({ authorized: true, error: undefined, subject: 'example.test' });
  });

  it('is not authorized for another server name', async () => {
    const r = await handshake(ca, fixed, 'other.test');
    expect(r.authorized).toBe(false);
    expect(r.error).toBe('ERR_TLS_CERT_ALTNAME_INVALID');
  });

  it('is not authorized by a client that does not trust the CA', async () => {
    const stranger = MitmCa.loadOrCreate(tempDir());
    const r = await handshake(ca, fixed, 'example.test', stranger.certPem);
    expect(r.authorized).toBe(false);
    expect(r.error).toMatch(/UNABLE_TO_VERIFY_LEAF_SIGNATURE|UNABLE_TO_GET_ISSUER_CERT/);
  });

  it('serves a certificate per SNI name', async () => {
    const r = await handshake(ca, (name) => ca.secureContextFor(name), 'api.github.test');
    expect(r).toEqual({ authorized: true, error: undefined, subject: 'api.github.test' });
  });
});
