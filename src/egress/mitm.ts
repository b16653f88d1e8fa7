// SECURITY-CRITICAL: the per-installation CA that lets the egress proxy terminate TLS for hosts bound to
// a secret, so it can swap sentinels for real values. Whoever holds ca.key can impersonate any host to
// every sandbox that trusts ca.crt: the key lives outside every sandbox, mode 0600, owned by us, and we
// refuse to load it otherwise. The CA may sign only end-entity certificates (pathLenConstraint 0).
//
// node-forge builds the certificates; key generation and signatures use Node's native crypto, so the
// event loop is blocked for one RSA key generation per CA instance (the leaf key, see below) and one
// native signature (~1 ms) per new host.
import {
  createPrivateKey,
  createPublicKey,
  generateKeyPair,
  generateKeyPairSync,
  randomBytes,
  sign,
  X509Certificate,
  type KeyObject,
} from 'node:crypto';
import {
  closeSync,
  constants as fsConstants,
  fchmodSync,
  fstatSync,
  fsyncSync,
  linkSync,
  lstatSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { createSecureContext, type SecureContext } from 'node:tls';
import { inspect } from 'node:util';
import type Forge from 'node-forge';
import { lazyRequire } from '../core/lazy.js';
import { AirlockError } from '../core/errors.js';
import { canonicalHost } from '../core/address.js';

const forge = lazyRequire<typeof Forge>('node-forge');

const KEY_FILE = 'ca.key';
const CERT_FILE = 'ca.crt';
const RSA_BITS = 2048;
const DAY_MS = 24 * 60 * 60 * 1000;
const LEAF_BACKDATE_MS = DAY_MS;
const LEAF_LIFETIME_MS = 30 * DAY_MS;
/** A cached leaf this close to expiry is re-issued. */
const LEAF_RENEW_BEFORE_MS = DAY_MS;
const MAX_CACHED_LEAVES = 1024;
/** How long a loser of the creation race waits for the winner's ca.crt. */
const CERT_WAIT_MS = 2000;

export interface LeafCert {
  /** PEM private key (PKCS#8). */
  key: string;
  /** PEM certificate for exactly one host name, issued by the CA. */
  cert: string;
}

interface CachedLeaf extends LeafCert {
  notAfterMs: number;
  context?: SecureContext;
}

interface LeafKey {
  pem: string;
  publicKey: Forge.pki.PublicKey;
}

const internal = (message: string, cause?: unknown): AirlockError =>
  new AirlockError('INTERNAL', message, cause === undefined ? {} : { cause });

function randomSerial(): string {
  const b = randomBytes(16);
  b[0] = (b[0]! & 0x7f) | 0x40; // positive, and no leading zero byte (minimal DER INTEGER)
  return b.toString('hex');
}

/** Sign a forge certificate with a native key (sha256WithRSAEncryption) and return its PEM. */
function signToPem(cert: Forge.pki.Certificate, key: KeyObject): string {
  cert.md = forge().md.sha256.create();
  cert.signatureOid = cert.siginfo.algorithmOid = forge().pki.oids.sha256WithRSAEncryption!;
  const pki = forge().pki as unknown as { getTBSCertificate(c: Forge.pki.Certificate): Forge.asn1.Asn1 };
  cert.tbsCertificate = pki.getTBSCertificate(cert);
  const tbs = Buffer.from(forge().asn1.toDer(cert.tbsCertificate).getBytes(), 'binary');
  cert.signature = sign('sha256', tbs, key).toString('binary');
  return forge().pki.certificateToPem(cert);
}

function forgePublicKey(key: KeyObject): Forge.pki.PublicKey {
  const spki = createPublicKey(key).export({ type: 'spki', format: 'pem' }) as string;
  return forge().pki.publicKeyFromPem(spki);
}

function newRsaKeySync(): KeyObject {
  return generateKeyPairSync('rsa', { modulusLength: RSA_BITS }).privateKey;
}

function caSubject(): Forge.pki.CertificateField[] {
  return [
    { name: 'commonName', value: `Airlock egress CA ${hostname()}`.slice(0, 64) },
    { name: 'organizationName', value: 'Airlock' },
  ];
}

function buildCaCert(key: KeyObject): string {
  const cert = forge().pki.createCertificate();
  cert.publicKey = forgePublicKey(key);
  cert.serialNumber = randomSerial();
  const now = Date.now();
  cert.validity.notBefore = new Date(now - 60 * 60 * 1000); // an hour of clock skew
  const notAfter = new Date(now);
  notAfter.setUTCFullYear(notAfter.getUTCFullYear() + 10);
  cert.validity.notAfter = notAfter;
  const subject = caSubject();
  cert.setSubject(subject);
  cert.setIssuer(subject);
  cert.setExtensions([
    { name: 'basicConstraints', cA: true, pathLenConstraint: 0, critical: true },
    { name: 'keyUsage', keyCertSign: true, cRLSign: true, critical: true },
    { name: 'subjectKeyIdentifier' },
  ]);
  return signToPem(cert, key);
}

const modeText = (mode: number): string => `0${(mode & 0o777).toString(8)}`;

/** Open without following symlinks and check the owner; return the contents. */
function readOwnedFile(path: string, what: string, checkMode: (mode: number) => string | undefined): string {
  let fd: number;
  try {
    fd = openSync(path, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ELOOP')
      throw internal(`refusing to use the egress CA ${what} ${path}: it is a symbolic link`, e);
    throw internal(`cannot read the egress CA ${what} ${path} (${code ?? 'error'})`, e);
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw internal(`refusing to use the egress CA ${what} ${path}: not a regular file`);
    const uid = process.getuid?.();
    if (uid !== undefined && st.uid !== uid) {
      throw internal(
        `refusing to use the egress CA ${what} ${path}: it is owned by uid ${st.uid}, not by this process ` +
          `(uid ${uid}); whoever owns it can impersonate every intercepted host. Remove ${path} to create a new CA`,
      );
    }
    const problem = checkMode(st.mode);
    if (problem !== undefined) throw internal(`refusing to use the egress CA ${what} ${path}: ${problem}`);
    return readFileSync(fd, 'utf8');
  } finally {
    closeSync(fd);
  }
}

function writeNewFile(path: string, data: string, mode: number): void {
  const fd = openSync(path, 'wx', mode);
  try {
    fchmodSync(fd, mode); // whatever the umask
    writeFileSync(fd, data);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

const tmpName = (dir: string, file: string): string =>
  join(dir, `.${file}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`);

function unlinkQuietly(path: string): void {
  try {
    unlinkSync(path);
  } catch {
    // already gone
  }
}

function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/**
 * The egress CA of one installation: `dir/ca.key` (0600) and `dir/ca.crt` (0644), created on first use
 * and reloaded afterwards. `dir` must be outside every sandbox. ca.crt is what sandboxes trust.
 */
export class MitmCa {
  readonly dir: string;
  /** The CA certificate (PEM), for the sandbox trust store, SSL_CERT_FILE, NODE_EXTRA_CA_CERTS… */
  readonly certPem: string;
  readonly #key: KeyObject;
  readonly #issuer: Forge.pki.CertificateField[];
  readonly #keyIdentifier: string;
  readonly #notAfterMs: number;
  readonly #fingerprint256: string;
  /**
   * ONE leaf key pair for every host, generated once per CA instance: RSA key generation is the costly
   * step, so per-host cost is a single signature. Sharing it gives nothing away: it lives only in this
   * process's memory, next to the CA key that could sign any certificate anyway.
   */
  #leafKey: LeafKey | undefined;
  #leafKeyPending: Promise<void> | undefined;
  readonly #leaves = new Map<string, CachedLeaf>();

  private constructor(dir: string, key: KeyObject, certPem: string) {
    const x509 = new X509Certificate(certPem);
    if (!x509.ca) throw internal(`the egress CA certificate ${join(dir, CERT_FILE)} is not a CA certificate`);
    if (!x509.checkPrivateKey(key)) {
      throw internal(
        `the egress CA certificate ${join(dir, CERT_FILE)} does not match ${join(dir, KEY_FILE)}; ` +
          'remove both files to create a new CA (and re-inject its certificate)',
      );
    }
    if (Date.parse(x509.validTo) - Date.now() < LEAF_RENEW_BEFORE_MS) {
      throw internal(
        `the egress CA certificate ${join(dir, CERT_FILE)} expires ${x509.validTo}; ` +
          'remove ca.key and ca.crt to create a new CA (and re-inject its certificate)',
      );
    }
    const cert = forge().pki.certificateFromPem(certPem);
    const ski = cert.getExtension('subjectKeyIdentifier') as { subjectKeyIdentifier?: string } | undefined;
    this.dir = dir;
    this.certPem = certPem;
    this.#key = key;
    this.#issuer = cert.subject.attributes;
    this.#keyIdentifier =
      ski?.subjectKeyIdentifier !== undefined
        ? forge().util.hexToBytes(ski.subjectKeyIdentifier)
        : cert.generateSubjectKeyIdentifier().getBytes();
    this.#notAfterMs = cert.validity.notAfter.getTime();
    this.#fingerprint256 = x509.fingerprint256;
  }

  /** Load the CA in `dir`, creating it (and `dir`, mode 0700) on first use. */
  static loadOrCreate(dir: string): MitmCa {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const keyPath = join(dir, KEY_FILE);
    const certPath = join(dir, CERT_FILE);
    if (!exists(keyPath)) MitmCa.#create(dir);

    const keyPem = readOwnedFile(keyPath, 'key', (mode) =>
      (mode & 0o777) === 0o600
        ? undefined
        : `its mode is ${modeText(mode)}, it must be 0600 (readable by its owner only); ` +
          `check who could have read it, then run: chmod 600 ${keyPath}`,
    );
    let key: KeyObject;
    try {
      key = createPrivateKey(keyPem);
    } catch (e) {
      throw internal(
        `the egress CA key ${keyPath} is not a valid private key; remove it to create a new CA`,
        e,
      );
    }
    if (key.asymmetricKeyType !== 'rsa') {
      throw internal(`the egress CA key ${keyPath} is not an RSA key; remove it to create a new CA`);
    }

    // The creator links ca.key, then at once renames ca.crt into place. A cert missing next to a key
    // written moments ago is on its way: wait briefly. Otherwise (a creator crashed in between, or the
    // cert was deleted) issue it again from the key, without waiting.
    const deadline = lstatSync(keyPath).mtimeMs + CERT_WAIT_MS;
    while (!exists(certPath) && Date.now() < deadline) sleepSync(25);
    if (!exists(certPath)) {
      const tmp = tmpName(dir, CERT_FILE);
      writeNewFile(tmp, buildCaCert(key), 0o644);
      renameSync(tmp, certPath);
    }
    const certPem = readOwnedFile(certPath, 'certificate', (mode) =>
      mode & 0o022 ? `its mode is ${modeText(mode)}; it must not be writable by group or others` : undefined,
    );
    return new MitmCa(dir, key, certPem);
  }

  static #create(dir: string): void {
    const key = newRsaKeySync();
    const keyTmp = tmpName(dir, KEY_FILE);
    const certTmp = tmpName(dir, CERT_FILE);
    try {
      writeNewFile(keyTmp, key.export({ type: 'pkcs8', format: 'pem' }) as string, 0o600);
      writeNewFile(certTmp, buildCaCert(key), 0o644);
      try {
        linkSync(keyTmp, join(dir, KEY_FILE)); // no-clobber: exactly one concurrent creator wins
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === 'EEXIST') return; // another process created it
        throw e;
      }
      renameSync(certTmp, join(dir, CERT_FILE));
    } catch (e) {
      throw internal(`cannot create the egress CA in ${dir}: ${(e as Error).message}`, e);
    } finally {
      unlinkQuietly(keyTmp);
      unlinkQuietly(certTmp);
    }
  }

  /**
   * Generate the shared leaf key off the event loop (libuv thread pool). Optional: without it, the first
   * leafFor() generates the key synchronously.
   */
  prepare(): Promise<void> {
    if (this.#leafKey !== undefined) return Promise.resolve();
    this.#leafKeyPending ??= new Promise<void>((resolve, reject) => {
      generateKeyPair('rsa', { modulusLength: RSA_BITS }, (err, _pub, priv) => {
        if (err) {
          this.#leafKeyPending = undefined;
          reject(internal(`cannot generate the egress leaf key: ${err.message}`, err));
          return;
        }
        this.#leafKey ??= toLeafKey(priv);
        resolve();
      });
    });
    return this.#leafKeyPending;
  }

  /** A certificate for exactly `host` (SAN dNSName), cached per host. */
  leafFor(host: string): LeafCert {
    const leaf = this.#leaf(host);
    return { key: leaf.key, cert: leaf.cert };
  }

  /** A TLS context presenting leafFor(host), cached per host, for the proxy's TLS server side. */
  secureContextFor(host: string): SecureContext {
    const leaf = this.#leaf(host);
    leaf.context ??= createSecureContext({ key: leaf.key, cert: leaf.cert, minVersion: 'TLSv1.2' });
    return leaf.context;
  }

  #leaf(host: string): CachedLeaf {
    const c = canonicalHost(host);
    if (c.kind !== 'name') {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        c.kind === 'ip'
          ? `egress CA: ${c.address} is an IP address; certificates are issued for host names only`
          : `egress CA: ${JSON.stringify(host.slice(0, 100))} is not a valid host name (${c.reason})`,
      );
    }
    const name = c.name;
    const now = Date.now();
    const cached = this.#leaves.get(name);
    if (cached !== undefined && cached.notAfterMs - now > LEAF_RENEW_BEFORE_MS) {
      this.#leaves.delete(name); // most recently used goes last
      this.#leaves.set(name, cached);
      return cached;
    }
    const leaf = this.#issue(name, now);
    this.#leaves.delete(name);
    this.#leaves.set(name, leaf);
    if (this.#leaves.size > MAX_CACHED_LEAVES) {
      const oldest = this.#leaves.keys().next().value;
      if (oldest !== undefined) this.#leaves.delete(oldest);
    }
    return leaf;
  }

  #issue(name: string, now: number): CachedLeaf {
    this.#leafKey ??= toLeafKey(newRsaKeySync());
    const cert = forge().pki.createCertificate();
    cert.publicKey = this.#leafKey.publicKey;
    cert.serialNumber = randomSerial();
    cert.validity.notBefore = new Date(now - LEAF_BACKDATE_MS);
    cert.validity.notAfter = new Date(Math.min(now + LEAF_LIFETIME_MS, this.#notAfterMs));
    // A CN is at most 64 characters; longer names rely on the (then critical) SAN alone.
    cert.setSubject(name.length <= 64 ? [{ name: 'commonName', value: name }] : []);
    cert.setIssuer(this.#issuer);
    cert.setExtensions([
      { name: 'basicConstraints', cA: false, critical: true },
      { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
      { name: 'extKeyUsage', serverAuth: true },
      { name: 'subjectAltName', altNames: [{ type: 2, value: name }], critical: name.length > 64 },
      { name: 'subjectKeyIdentifier' },
      { name: 'authorityKeyIdentifier', keyIdentifier: this.#keyIdentifier },
    ]);
    const pem = signToPem(cert, this.#key);
    return { key: this.#leafKey.pem, cert: pem, notAfterMs: cert.validity.notAfter.getTime() };
  }

  toJSON(): { dir: string; fingerprint256: string } {
    return { dir: this.dir, fingerprint256: this.#fingerprint256 };
  }

  [inspect.custom](): string {
    return `MitmCa ${inspect(this.toJSON())}`;
  }
}

function toLeafKey(key: KeyObject): LeafKey {
  return { pem: key.export({ type: 'pkcs8', format: 'pem' }) as string, publicKey: forgePublicKey(key) };
}

/** lstat semantics: a dangling symlink "exists" (and is then refused by readOwnedFile). */
function exists(path: string): boolean {
  try {
    lstatSync(path);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code !== 'ENOENT';
  }
}
