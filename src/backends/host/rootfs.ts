// The sandbox's /etc: generated, minimal, identical for every sandbox, never a view of the host's.
// It holds no shadow, no ssh keys, no host users; only what programs need to start (users, hosts,
// resolver config, the dynamic linker cache, CA certificates, Debian's alternatives symlinks).
import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SANDBOX_HOME } from '../../core/env.js';

export const SANDBOX_UID = 1000;
export const SANDBOX_USER = 'user';
export { SANDBOX_HOME };
export const SANDBOX_HOSTNAME = 'airlock';

/** Host /etc entries copied verbatim: public data only (checked: no secrets in any of these). */
const COPIED_FROM_HOST = [
  'ld.so.cache',
  'ld.so.conf',
  'ld.so.conf.d',
  'alternatives',
  'ssl/certs',
  'ssl/openssl.cnf',
  'ca-certificates.conf',
  'localtime',
  'timezone',
  'os-release',
  'debian_version',
  'protocols',
  'services',
  'mime.types',
  'host.conf',
  'gai.conf',
];

function generated(): Record<string, string> {
  return {
    passwd: [
      'root:x:0:0:root:/root:/usr/sbin/nologin',
      `${SANDBOX_USER}:x:${SANDBOX_UID}:${SANDBOX_UID}:sandbox user:${SANDBOX_HOME}:/bin/sh`,
      'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin',
      '',
    ].join('\n'),
    group: ['root:x:0:', `${SANDBOX_USER}:x:${SANDBOX_UID}:`, 'nogroup:x:65534:', ''].join('\n'),
    hosts: `127.0.0.1\tlocalhost ${SANDBOX_HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n`,
    hostname: `${SANDBOX_HOSTNAME}\n`,
    // No network yet: the sandbox's netns has only lo. Egress arrives through Airlock's proxy.
    'resolv.conf': 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n',
    // Mount point for Airlock's egress CA (bound over it for sandboxes whose secrets need TLS interception).
    'ssl/certs/airlock-egress-ca.pem': '',
    'nsswitch.conf':
      'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n',
  };
}

/**
 * Build (once per content) the shared /etc under `stateRoot/etc-<hash>` and return its path.
 * Readable by every sandbox uid, writable by none (it is bind-mounted read-only too).
 */
export function ensureEtc(stateRoot: string, hostEtc = '/etc'): string {
  const files = generated();
  const h = createHash('sha256');
  for (const [k, v] of Object.entries(files)) h.update(`${k}\0${v}\0`);
  for (const rel of COPIED_FROM_HOST) {
    const p = join(hostEtc, rel);
    h.update(`${rel}\0${existsSync(p) ? 'y' : 'n'}\0`);
  }
  const ldCache = join(hostEtc, 'ld.so.cache');
  if (existsSync(ldCache)) h.update(readFileSync(ldCache));
  const dir = join(stateRoot, `etc-${h.digest('hex').slice(0, 16)}`);
  if (existsSync(dir)) return dir;

  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true, mode: 0o755 });
  for (const rel of COPIED_FROM_HOST) {
    const src = join(hostEtc, rel);
    if (!existsSync(src)) continue;
    mkdirSync(join(tmp, rel, '..'), { recursive: true, mode: 0o755 });
    cpSync(src, join(tmp, rel), { recursive: true, verbatimSymlinks: true, dereference: false });
  }
  for (const [name, content] of Object.entries(files)) {
    mkdirSync(join(tmp, name, '..'), { recursive: true, mode: 0o755 });
    writeFileSync(join(tmp, name), content, { mode: 0o644 });
  }
  try {
    renameSync(tmp, dir);
  } catch (e) {
    // Another process won the race and built the same content: use theirs.
    rmSync(tmp, { recursive: true, force: true });
    if (!existsSync(dir)) throw e;
  }
  return dir;
}
