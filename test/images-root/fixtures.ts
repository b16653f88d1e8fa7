// Image layers for the image-root tests, built at set-up from files already on this host (no network):
//   busybox   /bin/busybox (static) + applet symlinks, /etc/passwd with a named user (app, 1001)
//   mask      a whiteout (char 0/0) over /etc/motd, an opaque /opt/lower, escaping symlinks
//   python    python3.11 (python3.11-minimal + libpython3.11-minimal, `dpkg -L`) and the libraries
//             it loads (ldd), and a setuid-root copy of it
// and a small ImageResolver over them (the fake above the layer under test: the image store is
// another part's). Layers are root-owned dirs in overlayfs format, as the image store unpacks them.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  chmodSync,
  chownSync,
  copyFileSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import type { ImageConfig, ImageResolver, PullPolicy, ResolvedImage } from '../../src/core/image.js';
import { AirlockError } from '../../src/core/errors.js';
import { libc } from '../../src/core/libc.privileged.js';

export interface Fixtures {
  readonly root: string;
  readonly layers: { busybox: string; mask: string; python: string; hostile: string; symlinkCa: string };
  /** What the hostile layer's links point at on the host. */
  readonly hostDir: string;
  readonly resolver: ImageResolver & { calls: Array<{ ref: string; pull?: PullPolicy }> };
  /** sha256 over every entry of a layer dir (type, mode, owner, content, link target). */
  hash(dir: string): string;
}

const BASE_CONFIG: ImageConfig = { env: [], workingDir: '', user: '', entrypoint: [], cmd: [], labels: {} };

function put(path: string, content: string, mode = 0o644): void {
  mkdirSync(dirname(path), { recursive: true, mode: 0o755 });
  writeFileSync(path, content, { mode });
  chmodSync(path, mode);
}

function busyboxLayer(dir: string): void {
  mkdirSync(join(dir, 'bin'), { recursive: true, mode: 0o755 });
  copyFileSync('/bin/busybox', join(dir, 'bin/busybox'));
  chmodSync(join(dir, 'bin/busybox'), 0o755);
  const applets = execFileSync('/bin/busybox', ['--list'], { encoding: 'utf8' }).split('\n').filter(Boolean);
  for (const a of applets) if (a !== 'busybox') symlinkSync('busybox', join(dir, 'bin', a));
  put(join(dir, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\napp:x:1001:1001:app:/home/app:/bin/sh\n');
  put(join(dir, 'etc/group'), 'root:x:0:\napp:x:1001:\n');
  put(join(dir, 'etc/motd'), 'lower motd\n');
  put(join(dir, 'opt/lower/a'), 'a\n');
  put(join(dir, 'opt/lower/b'), 'b\n');
  put(join(dir, 'srv/data/owned-by-app'), 'app data\n');
  chownSync(join(dir, 'srv/data'), 1001, 1001);
  chownSync(join(dir, 'srv/data/owned-by-app'), 1001, 1001);
  put(join(dir, 'srv/data/owned-by-root'), 'root data\n');
}

function maskLayer(dir: string): void {
  mkdirSync(join(dir, 'etc'), { recursive: true, mode: 0o755 });
  execFileSync('mknod', [join(dir, 'etc/motd'), 'c', '0', '0']); // whiteout
  mkdirSync(join(dir, 'opt/lower'), { recursive: true, mode: 0o755 });
  const y = Buffer.from('y');
  if (libc().lsetxattr(Buffer.from(`${join(dir, 'opt/lower')}\0`), 'trusted.overlay.opaque', y, 1, 0) !== 0)
    throw new Error(`lsetxattr: errno ${libc().errno()}`);
  put(join(dir, 'opt/lower/c'), 'c\n');
  // Symlinks to host paths: they must resolve inside the sandbox's root.
  symlinkSync('/usr/bin/perl', join(dir, 'perl-link'));
  symlinkSync('/etc/shadow', join(dir, 'shadow-link'));
}

/** An image whose CA bundle is a symlink (as on Fedora-style images). */
function symlinkCaLayer(dir: string): void {
  mkdirSync(join(dir, 'etc/ssl/certs'), { recursive: true, mode: 0o755 });
  put(join(dir, 'etc/pki/bundle.crt'), '');
  symlinkSync('/etc/pki/bundle.crt', join(dir, 'etc/ssl/certs/ca-certificates.crt'));
}

/**
 * A hostile layer: mount points and /etc/passwd as symlinks to host paths. `hostDir` is a host dir
 * the sandbox must never reach; `hostPasswd` a host file naming a user "evil" with uid 0.
 */
function hostileLayer(dir: string, hostDir: string, hostPasswd: string): void {
  for (const m of ['tmp', 'workspace', 'proc']) symlinkSync(hostDir, join(dir, m));
  mkdirSync(join(dir, 'home'), { mode: 0o755 });
  symlinkSync(hostDir, join(dir, 'home/user'));
  mkdirSync(join(dir, 'etc'), { mode: 0o755 });
  symlinkSync(hostPasswd, join(dir, 'etc/passwd'));
}

function pythonLayer(dir: string): void {
  const files = execFileSync('dpkg', ['-L', 'python3.11-minimal', 'libpython3.11-minimal'], {
    encoding: 'utf8',
  })
    .split('\n')
    .filter((f) => f.startsWith('/usr/'));
  // The interpreter's libraries, and those of its TLS and hash modules (ssl works in the image).
  const dynload = '/usr/lib/python3.11/lib-dynload';
  const modules = readdirSync(dynload)
    .filter((n) => /^_(ssl|hashlib)\./.test(n))
    .map((n) => join(dynload, n));
  const libs = [
    ...new Set(
      execFileSync('ldd', ['/usr/bin/python3.11', ...modules], { encoding: 'utf8' })
        .split('\n')
        .map((l) => /(\/\S+)\s+\(/.exec(l)?.[1])
        .filter((l): l is string => l !== undefined),
    ),
  ];
  for (const f of [...files, ...libs]) {
    let st;
    try {
      st = lstatSync(f);
    } catch {
      continue;
    }
    const to = join(dir, f);
    if (st.isDirectory()) {
      mkdirSync(to, { recursive: true, mode: 0o755 });
      continue;
    }
    mkdirSync(dirname(to), { recursive: true, mode: 0o755 });
    // Package symlinks stay symlinks; a library is copied as the file it resolves to.
    if (st.isSymbolicLink() && !libs.includes(f)) symlinkSync(readlinkSync(f), to);
    else copyFileSync(f, to);
  }
  symlinkSync('python3.11', join(dir, 'usr/bin/python3'));
  mkdirSync(join(dir, 'opt/suid'), { recursive: true, mode: 0o755 });
  copyFileSync('/usr/bin/python3.11', join(dir, 'opt/suid/python3'));
  chmodSync(join(dir, 'opt/suid/python3'), 0o4755);
}

export function buildFixtures(root: string): Fixtures {
  rmSync(root, { recursive: true, force: true });
  mkdirSync(root, { recursive: true, mode: 0o755 });
  const layers = {
    busybox: join(root, 'busybox'),
    mask: join(root, 'mask'),
    python: join(root, 'python'),
    hostile: join(root, 'hostile'),
    symlinkCa: join(root, 'symlink-ca'),
  };
  for (const d of Object.values(layers)) mkdirSync(d, { mode: 0o755 });
  const hostDir = join(root, 'host-only');
  mkdirSync(hostDir, { mode: 0o777 });
  chmodSync(hostDir, 0o777);
  put(join(root, 'host-passwd'), 'evil:x:0:0::/:/bin/sh\n');
  busyboxLayer(layers.busybox);
  maskLayer(layers.mask);
  pythonLayer(layers.python);
  hostileLayer(layers.hostile, hostDir, join(root, 'host-passwd'));
  symlinkCaLayer(layers.symlinkCa);
  const images: Record<string, { layers: string[]; config: ImageConfig }> = {
    'example.com/test/busybox:1': {
      layers: [layers.busybox, layers.mask],
      config: {
        ...BASE_CONFIG,
        env: ['PATH=/bin:/usr/bin', 'IMAGE_VAR=from-image', 'OVERRIDDEN=image'],
        workingDir: '/srv/app',
        user: 'app',
        cmd: ['/bin/echo', 'hello from the image'],
      },
    },
    'example.com/test/python:3.11': {
      layers: [layers.busybox, layers.mask, layers.python],
      config: { ...BASE_CONFIG, env: ['PATH=/usr/bin:/bin'] },
    },
    'example.com/test/hostile:1': { layers: [layers.busybox, layers.hostile], config: BASE_CONFIG },
    'example.com/test/hostile-user:1': {
      layers: [layers.busybox, layers.hostile],
      config: { ...BASE_CONFIG, user: 'evil' },
    },
    'example.com/test/numeric-user:1': {
      layers: [layers.busybox],
      config: { ...BASE_CONFIG, user: '1001:1001' },
    },
    'example.com/test/unknown-user:1': {
      layers: [layers.busybox],
      config: { ...BASE_CONFIG, user: 'nobody-here' },
    },
    'example.com/test/python-symlink-ca:3.11': {
      layers: [layers.python, layers.symlinkCa],
      config: { ...BASE_CONFIG, env: ['PATH=/usr/bin'] },
    },
    // No shell, no coreutils: only python.
    'example.com/test/python-only:3.11': {
      layers: [layers.python],
      config: { ...BASE_CONFIG, env: ['PATH=/usr/bin'], entrypoint: ['python3', '-c'], cmd: ['print(6*7)'] },
    },
  };
  const calls: Array<{ ref: string; pull?: PullPolicy }> = [];
  const resolver = {
    calls,
    async resolve(ref: string, o: { pull?: PullPolicy } = {}): Promise<ResolvedImage> {
      calls.push({ ref, ...(o.pull ? { pull: o.pull } : {}) });
      const img = images[ref];
      if (!img)
        throw new AirlockError('INVALID_SPEC', `no image ${ref} in the test fixtures`, { field: 'image' });
      return {
        ref,
        digest: `sha256:${createHash('sha256').update(ref).digest('hex')}`,
        layers: img.layers,
        config: img.config,
      };
    },
  };
  return { root, layers, hostDir, resolver, hash: hashTree };
}

function hashTree(dir: string): string {
  const h = createHash('sha256');
  const walk = (rel: string): void => {
    const p = join(dir, rel);
    const st = lstatSync(p);
    h.update(`${rel}\0${st.mode}\0${st.uid}\0${st.gid}\0${st.size}\0${st.mtimeMs}\0`);
    if (st.isSymbolicLink()) h.update(readlinkSync(p));
    else if (st.isFile()) h.update(readFileSync(p));
    else if (st.isDirectory()) for (const n of readdirSync(p).sort()) walk(join(rel, n));
  };
  walk('.');
  return h.digest('hex');
}
