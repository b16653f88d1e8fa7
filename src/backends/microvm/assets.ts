// What a microVM boots, built once per content and cached (root-owned, world-readable: nothing in them
// is secret, and QEMU runs as the sandbox's uid): the guest agent (a static binary from guest/agent.c),
// the initramfs (the agent as /init plus the virtio/erofs/overlay modules of the guest kernel), and the
// read-only root filesystem (an erofs image of a list of layer dirs, bottom first). The guest kernel is
// Debian's linux-image-cloud-amd64, unpacked by scripts/setup.sh into <cacheDir>/kernel.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { AirlockError } from '../../core/errors.js';
import { SANDBOX_HOME, SANDBOX_UID } from '../host/rootfs.js';
import { newcArchive, type CpioEntry } from './cpio.js';

const run = promisify(execFile);

/** Where the assets live unless the backend is told otherwise (scripts/setup.sh puts the kernel here). */
export const DEFAULT_CACHE_DIR = '/var/cache/airlock/microvm';

/** The repo's guest/ dir (sources of the agent and the rootfs builder), from src/ or dist/. */
export const GUEST_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'guest');

/**
 * Kernel modules the guest needs before its root is mounted, in load order (dependencies first). The
 * Debian cloud kernel builds all of these as modules (checked in docs/microvm.md).
 */
const MODULES = [
  'drivers/virtio/virtio_ring.ko',
  'drivers/virtio/virtio.ko',
  'drivers/virtio/virtio_mmio.ko',
  'drivers/block/virtio_blk.ko',
  'drivers/char/virtio_console.ko',
  'lib/libcrc32c.ko',
  'fs/erofs/erofs.ko',
  'fs/overlayfs/overlay.ko',
] as const;

/** The guest's NIC driver, loaded (after MODULES) only in a guest that has a NIC (`airlock.ip`). */
const NET_MODULES = [
  'net/core/failover.ko',
  'drivers/net/net_failover.ko',
  'drivers/net/virtio_net.ko',
] as const;

/** Host packages (and their dependency closure) the package rootfs is made of. */
export const ROOTFS_PACKAGES = [
  'base-files',
  'coreutils',
  'dash',
  'bash',
  'python3-minimal',
  'findutils',
  'grep',
  'sed',
  'gzip',
  'tar',
  'procps',
  'mawk',
  'diffutils',
  'busybox-static',
] as const;

export interface Kernel {
  readonly vmlinuz: string;
  readonly version: string;
  readonly modulesDir: string;
}

/** The unpacked guest kernel under `<cacheDir>/kernel`, or undefined with what is missing. */
export function findKernel(cacheDir: string): Kernel | string {
  const boot = join(cacheDir, 'kernel', 'boot');
  const vmlinuz = existsSync(boot) ? readdirSync(boot).find((n) => n.startsWith('vmlinuz-')) : undefined;
  if (!vmlinuz) {
    return `no guest kernel in ${boot}: run scripts/setup.sh (it unpacks Debian's linux-image-cloud-amd64 there)`;
  }
  const version = vmlinuz.slice('vmlinuz-'.length);
  const modulesDir = join(cacheDir, 'kernel', 'lib', 'modules', version, 'kernel');
  const missing = [...MODULES, ...NET_MODULES].find((m) => !existsSync(join(modulesDir, m)));
  if (missing) return `the guest kernel ${version} has no module ${missing}`;
  return { vmlinuz: join(boot, vmlinuz), version, modulesDir };
}

function sha(...parts: Array<string | Buffer>): string {
  const h = createHash('sha256');
  for (const p of parts) h.update(p).update('\0');
  return h.digest('hex').slice(0, 20);
}

/** Builds happen once per content, even when creates race: one promise per output path. */
const building = new Map<string, Promise<string>>();

/** Make `out` with `build(tmp)` unless it exists; the result appears atomically (rename). */
function once(out: string, build: (tmp: string) => Promise<void>): Promise<string> {
  if (existsSync(out)) return Promise.resolve(out);
  let p = building.get(out);
  if (!p) {
    p = (async () => {
      mkdirSync(dirname(out), { recursive: true, mode: 0o755 });
      const tmp = `${out}.tmp-${process.pid}-${Date.now()}`;
      try {
        await build(tmp);
        renameSync(tmp, out);
      } finally {
        rmSync(tmp, { recursive: true, force: true });
        building.delete(out);
      }
      return out;
    })();
    building.set(out, p);
  }
  return p;
}

/** The agent's sources (guest/): every one is part of its cache key. */
const AGENT_SOURCES = ['agent.c', 'boot.c', 'guest.h', 'protocol.h'] as const;

/** The static guest agent, compiled from guest/agent.c (cached by source hash). */
export function ensureAgent(cacheDir: string): Promise<string> {
  const sources = AGENT_SOURCES.map((f) => readFileSync(join(GUEST_DIR, f)));
  const out = join(cacheDir, `agent-${sha(...AGENT_SOURCES, ...sources)}`);
  return once(out, async (tmp) => {
    try {
      const units = AGENT_SOURCES.filter((f) => f.endsWith('.c')).map((f) => join(GUEST_DIR, f));
      await run('gcc', ['-static', '-Os', '-Wall', '-o', tmp, ...units], {
        timeout: 120_000,
      });
    } catch (e) {
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        `building the microVM guest agent failed (needs gcc and libc6-dev): ${(e as { stderr?: string }).stderr ?? (e as Error).message}`,
      );
    }
    chmodSync(tmp, 0o755);
  });
}

/**
 * The VMM jail helper (guest/vmm-jail.c, a host program despite its folder: it is built the same
 * way as the agent): namespaces, pivot_root, the uid drop, then the seccomp filter it reads from fd 6,
 * then QEMU (qemu.privileged.ts startQemu).
 */
export function ensureVmmJail(cacheDir: string): Promise<string> {
  const src = join(GUEST_DIR, 'vmm-jail.c');
  const out = join(cacheDir, `vmm-jail-${sha('vmm-jail.c', readFileSync(src))}`);
  return once(out, async (tmp) => {
    try {
      await run('gcc', ['-static', '-Os', '-Wall', '-o', tmp, src], { timeout: 120_000 });
    } catch (e) {
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        `building the microVM's jail helper failed (needs gcc and libc6-dev): ${(e as { stderr?: string }).stderr ?? (e as Error).message}`,
      );
    }
    chmodSync(tmp, 0o755);
  });
}

/** The initramfs: the agent as /init, the modules it loads and their order (cached by content). */
export function ensureInitramfs(cacheDir: string, kernel: Kernel, agent: string): Promise<string> {
  const all = [...MODULES, ...NET_MODULES];
  const out = join(cacheDir, `initramfs-${sha(agent, kernel.version, all.join(','))}.cpio`);
  const list = (ms: readonly string[]): Buffer =>
    Buffer.from(ms.map((m) => `/m/${m.split('/').pop()}\n`).join(''));
  return once(out, async (tmp) => {
    const entries: CpioEntry[] = [
      ...['dev', 'proc', 'sys', 'lower', 'rw', 'newroot', 'm'].map((d) => ({ name: d, mode: 0o40755 })),
      { name: 'init', mode: 0o100755, data: readFileSync(agent) },
      { name: 'modules.order', mode: 0o100644, data: list(MODULES) },
      { name: 'modules.net', mode: 0o100644, data: list(NET_MODULES) },
      ...all.map((m) => ({
        name: `m/${m.split('/').pop()}`,
        mode: 0o100644,
        data: readFileSync(join(kernel.modulesDir, m)),
      })),
    ];
    writeFileSync(tmp, newcArchive(entries), { mode: 0o644 });
  });
}

/**
 * The host packages' files as a layer dir (cached by the builder script, the package list and the
 * host's package database, which changes whenever a package is installed or upgraded).
 */
export function ensurePackageLayer(cacheDir: string): Promise<string> {
  const script = join(GUEST_DIR, 'rootfs-packages.sh');
  const key = sha(readFileSync(script), ROOTFS_PACKAGES.join(' '), readFileSync('/var/lib/dpkg/status'));
  return once(join(cacheDir, `packages-${key}`), async (tmp) => {
    await run(script, ['build', tmp, ...ROOTFS_PACKAGES], { timeout: 600_000, maxBuffer: 1 << 20 });
  });
}

/** One layer of the guest's root: a dir tree shown at `at` (default: the root). */
export interface RootfsLayer {
  readonly dir: string;
  readonly at?: string;
}

/**
 * The read-only root: the layer dirs merged in order (a later layer's files replace an earlier one's),
 * the sandbox's own dirs added, as an erofs image. Keyed by the layer paths, which are content-named
 * (packages-<hash>, etc-<hash>, image layers by digest).
 */
export function ensureRootfs(cacheDir: string, layers: readonly RootfsLayer[]): Promise<string> {
  const out = join(cacheDir, `rootfs-${sha(...layers.map((l) => `${l.at ?? '/'}=${l.dir}`), 'v1')}.erofs`);
  return once(out, async (tmp) => {
    const tree = `${tmp}.d`;
    try {
      mkdirSync(tree, { mode: 0o755 });
      for (const l of layers) {
        const at = join(tree, l.at ?? '/');
        mkdirSync(at, { recursive: true, mode: 0o755 });
        await run('cp', ['-a', '--', `${l.dir}/.`, at], { timeout: 300_000 });
      }
      for (const [d, mode, uid] of [
        ['workspace', 0o755, SANDBOX_UID],
        ['home', 0o755, 0],
        [SANDBOX_HOME.slice(1), 0o755, SANDBOX_UID],
        ['root', 0o700, 0],
        ['tmp', 0o1777, 0],
        ['dev', 0o755, 0],
        ['proc', 0o555, 0],
        ['sys', 0o555, 0],
      ] as const) {
        mkdirSync(join(tree, d), { recursive: true });
        chmodSync(join(tree, d), mode);
        chownSync(join(tree, d), uid, uid);
      }
      await run('mkfs.erofs', [tmp, tree], { timeout: 300_000, maxBuffer: 64 << 20 });
      chmodSync(tmp, 0o644);
    } catch (e) {
      if (AirlockError.isInstance(e)) throw e;
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        `building the microVM root filesystem failed (needs erofs-utils): ${(e as { stderr?: string }).stderr ?? (e as Error).message}`,
      );
    } finally {
      rmSync(tree, { recursive: true, force: true });
    }
  });
}
