// SECURITY-CRITICAL: the OCI bundle that defines what a gVisor-sandboxed process can see. It mirrors
// the bubblewrap command line of the namespaces tier (src/backends/namespaces/bwrap.ts): a read-only
// root that holds only mount points, read-only /usr and the generated /etc (on an image root: the
// sandbox's writable overlay of the image instead, host/image-root.privileged.ts), the sandbox's own
// writable dirs on its size-capped disk, no capabilities, no_new_privs, and the same syscall deny
// list (enforced by the sentry: runsc --oci-seccomp). Every namespace is new; the user namespace maps
// sandbox uid 1000 to the sandbox's leased host uid (files it creates on the host belong to that uid)
// and root to nobody.
import { chmodSync, existsSync, mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { IMAGE_HELPER_PATH, type SandboxLayout } from '../host/layout.js';
import { SANDBOX_HOME, SANDBOX_HOSTNAME, SANDBOX_UID } from '../host/rootfs.js';
import { DENIED_SYSCALLS } from '../host/seccomp.privileged.js';

const NOBODY = 65534;
/** RLIMIT_NOFILE inside the sandbox, as on the namespaces tier. */
const NOFILE = 4096;

const USR_SYMLINKS: ReadonlyArray<[string, string]> = [
  ['usr/bin', 'bin'],
  ['usr/sbin', 'sbin'],
  ['usr/lib', 'lib'],
  ['usr/lib64', 'lib64'],
  ['usr/lib32', 'lib32'],
  ['usr/libx32', 'libx32'],
];

/**
 * The sandbox's root filesystem: empty mount points and the /usr symlinks, root-owned, never written
 * by the sandbox (the bundle marks it read-only). runsc's gofer runs as the sandbox's "nobody" and
 * cannot create mount points itself, so every mount target exists here first. One per sandbox (its
 * read-only mounts have their own targets); `dir` is inside the sandbox's host dir.
 */
export function makeRootfs(dir: string, mounts: ReadonlyArray<{ path: string; file: boolean }>): string {
  mkdirSync(dir, { mode: 0o755 });
  for (const d of ['usr', 'etc', 'proc', 'dev', 'dev/shm', 'sys', 'tmp', 'home', 'home/user', 'workspace']) {
    mkdirSync(join(dir, d), { recursive: true, mode: 0o755 });
  }
  for (const [target, link] of USR_SYMLINKS)
    if (existsSync(`/${target}`)) symlinkSync(target, join(dir, link));
  for (const m of mounts) {
    const p = join(dir, m.path);
    if (!p.startsWith(dir + '/') || existsSync(p)) continue;
    mkdirSync(m.file ? dirname(p) : p, { recursive: true, mode: 0o755 });
    if (m.file) writeFileSync(p, '', { mode: 0o444 });
  }
  chmodSync(dir, 0o755);
  return dir;
}

export interface OciProcess {
  readonly argv: readonly string[];
  readonly env: Readonly<Record<string, string>>;
  readonly cwd: string;
}

export interface OciOptions {
  readonly rootfs: string;
  readonly layout: SandboxLayout;
  readonly hostUid: number;
  readonly process: OciProcess;
  /** Own network namespace (runsc --network=none); false when the sentry uses the sandbox's netns. */
  readonly ownNetns: boolean;
  /** limits.pids: processes (threads) the exec may have. */
  readonly pids: number;
}

interface Mount {
  destination: string;
  type: string;
  source: string;
  options?: string[];
}

const bind = (source: string, destination: string, ro: boolean): Mount => ({
  destination,
  type: 'bind',
  source,
  options: ['rbind', ro ? 'ro' : 'rw', 'nosuid', 'nodev'],
});

const CLONE_NEWUSER = 0x10000000;
const CLONE_NEWCGROUP = 0x02000000;
const EPERM = 1;
/** Address families a sandbox may open (as on the namespaces tier): AF_UNIX 1, AF_INET 2, AF_INET6 10. */
const DENIED_FAMILIES = [0, 3, 4, 5, 6, 7, 8, 9];

/**
 * The namespaces tier's seccomp policy (seccomp.privileged.ts) in OCI form, enforced by the sentry:
 * the deny list; no new user (or cgroup) namespaces through clone/unshare; sockets of
 * AF_UNIX/INET/INET6 only. gVisor has no x32 syscalls at all, and personality() changes nothing it
 * emulates. Not clone3: this runsc ignores errnoRet (every denial is EPERM), and glibc falls back
 * from clone3 to clone only on ENOSYS, so denying clone3 breaks every thread. clone3 can therefore
 * still make a user namespace — one of the sentry's own emulated kernel, not of the host's.
 * UNAVAILABLE_SYSCALLS and numbers above HIGHEST_REVIEWED_SYSCALL are not listed: the sentry does not
 * implement them and answers ENOSYS itself (test/escape/syscalls.test.ts), where a listing here
 * would turn that into EPERM.
 */
function seccompProfile(): Record<string, unknown> {
  const deny = (names: string[], args?: object[]): object => ({
    names,
    action: 'SCMP_ACT_ERRNO',
    errnoRet: EPERM,
    ...(args ? { args } : {}),
  });
  const flag = (v: number): object => ({ index: 0, value: v, valueTwo: v, op: 'SCMP_CMP_MASKED_EQ' });
  return {
    defaultAction: 'SCMP_ACT_ALLOW',
    architectures: ['SCMP_ARCH_X86_64'],
    syscalls: [
      deny([...DENIED_SYSCALLS]),
      deny(['clone', 'unshare'], [flag(CLONE_NEWUSER)]),
      deny(['clone', 'unshare'], [flag(CLONE_NEWCGROUP)]),
      ...DENIED_FAMILIES.map((f) =>
        deny(['socket', 'socketpair'], [{ index: 0, value: f, op: 'SCMP_CMP_EQ' }]),
      ),
      deny(['socket', 'socketpair'], [{ index: 0, value: 10, op: 'SCMP_CMP_GT' }]),
    ],
  };
}

/** config.json of one container (one exec). */
export function ociConfig(o: OciOptions): Record<string, unknown> {
  const l = o.layout;
  const image = l.imageRoot;
  const mounts: Mount[] = [
    { destination: '/proc', type: 'proc', source: 'proc' },
    // On an image root, "/" is the sandbox's overlay of the image with Airlock's /etc files in it.
    ...(image
      ? [bind(image.helper, IMAGE_HELPER_PATH, true)]
      : [bind('/usr', '/usr', true), bind(l.etcDir, '/etc', true)]),
    bind(l.shmDir, '/dev/shm', false),
    bind(l.tmpDir, '/tmp', false),
    bind(l.homeDir, SANDBOX_HOME, false),
    bind(l.workspaceDir, '/workspace', l.workspaceReadOnly),
    ...(l.extraRoFiles ?? []).map(([h, s]) => bind(h, s, true)),
    ...(l.roMounts ?? []).map(([h, s]) => bind(h, s, true)),
  ];
  const none: string[] = [];
  return {
    ociVersion: '1.0.2',
    process: {
      terminal: false,
      user: { uid: SANDBOX_UID, gid: SANDBOX_UID, additionalGids: [] },
      args: [...o.process.argv],
      env: Object.entries(o.process.env).map(([k, v]) => `${k}=${v}`),
      cwd: o.process.cwd,
      capabilities: { bounding: none, effective: none, inheritable: none, permitted: none, ambient: none },
      noNewPrivileges: true,
      rlimits: [
        { type: 'RLIMIT_NOFILE', hard: NOFILE, soft: NOFILE },
        // Enforced by the sentry: a fork past the limit fails with EAGAIN inside the exec, as on the
        // namespaces tier (the sandbox's cgroup stays the host-side bound over all its execs).
        { type: 'RLIMIT_NPROC', hard: o.pids, soft: o.pids },
      ],
    },
    // An image root is writable: the overlay's upper dir is on the sandbox's size-capped disk.
    root: { path: image ? image.dir : o.rootfs, readonly: !image },
    hostname: SANDBOX_HOSTNAME,
    mounts,
    linux: {
      namespaces: [
        { type: 'pid' },
        { type: 'ipc' },
        { type: 'uts' },
        { type: 'mount' },
        { type: 'user' },
        ...(o.ownNetns ? [{ type: 'network' }] : []),
      ],
      uidMappings: [
        { containerID: 0, hostID: NOBODY, size: 1 },
        { containerID: SANDBOX_UID, hostID: o.hostUid, size: 1 },
      ],
      gidMappings: [
        { containerID: 0, hostID: NOBODY, size: 1 },
        { containerID: SANDBOX_UID, hostID: o.hostUid, size: 1 },
      ],
      seccomp: seccompProfile(),
    },
  };
}
