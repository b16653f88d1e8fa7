// SECURITY-CRITICAL: the bubblewrap command line that defines what a sandboxed process can see.
// Every namespace is new; nothing of the host is visible except read-only /usr (and its /bin, /lib*
// symlinks), a generated /etc, and the sandbox's own writable dirs. On an image root, not even /usr:
// "/" is the sandbox's overlay of the image (host/image-root.privileged.ts). bwrap runs as the sandbox's
// unprivileged host uid (never root), so the user namespace maps sandbox uid 1000 to that uid only.
import { existsSync } from 'node:fs';
import { SANDBOX_HOME, SANDBOX_HOSTNAME, SANDBOX_UID } from '../host/rootfs.js';
import { IMAGE_HELPER_PATH, type SandboxLayout } from '../host/layout.js';

/** The bwrap view of a sandbox is the host layout every tier shares (host/layout.ts). */
export type BwrapLayout = SandboxLayout;

/** File descriptors passed to bwrap through Node's stdio array (dash cannot redirect fds >= 10). */
export const FD = { args: 3, seccomp: 4, info: 5, block: 6 } as const;

const SYSTEM_RO = ['/usr'];
const USR_SYMLINKS: ReadonlyArray<[string, string]> = [
  ['usr/bin', '/bin'],
  ['usr/sbin', '/sbin'],
  ['usr/lib', '/lib'],
  ['usr/lib64', '/lib64'],
  ['usr/lib32', '/lib32'],
  ['usr/libx32', '/libx32'],
];

/**
 * Options passed on the --args fd (NUL-separated), so nothing in them, env values included, shows up
 * in the host's process list. Only the command itself stays on bwrap's argv.
 */
export function bwrapOptions(
  layout: BwrapLayout,
  cwd: string,
  env: Readonly<Record<string, string>>,
): string[] {
  const a: string[] = [
    '--unshare-user', // explicit: required by --disable-userns
    '--unshare-ipc',
    '--unshare-pid',
    '--unshare-uts',
    '--unshare-cgroup',
    // The network namespace is the sandbox's own (only `lo`), entered before bwrap starts and shared
    // by its execs; without one, bwrap makes a fresh, equally empty one for this exec.
    ...(layout.inSandboxNetns ? [] : ['--unshare-net']),
    '--disable-userns', // no nested user namespaces (also blocked by seccomp)
    '--die-with-parent', // if Airlock dies, the sandbox dies with it
    '--new-session', // setsid: no TIOCSTI into a controlling terminal
    '--uid',
    String(SANDBOX_UID),
    '--gid',
    String(SANDBOX_UID),
    '--hostname',
    SANDBOX_HOSTNAME,
    '--cap-drop',
    'ALL',
  ];
  const image = layout.imageRoot;
  if (image) {
    // An image root: the sandbox's own overlay (image layers + its upper dir on its disk) is "/",
    // with Airlock's generated /etc files and every mount point already in it (image-root.privileged.ts).
    a.push('--bind', image.dir, '/');
    a.push('--ro-bind', image.helper, IMAGE_HELPER_PATH);
  } else {
    for (const d of SYSTEM_RO) a.push('--ro-bind', d, d);
    for (const [target, link] of USR_SYMLINKS)
      if (existsSync(`/${target}`)) a.push('--symlink', target, link);
    a.push('--ro-bind', layout.etcDir, '/etc');
  }
  a.push('--proc', '/proc'); // procfs of the sandbox's own pid namespace
  // Minimal: null, zero, full, random, urandom, tty, pts, shm. Read-only: device nodes still open
  // for writing; no files can be created.
  if (layout.devDir) a.push('--dev-bind', layout.devDir, '/dev');
  else a.push('--dev', '/dev');
  a.push('--bind', layout.shmDir, '/dev/shm');
  if (layout.ptsDir) a.push('--dev-bind', layout.ptsDir, '/dev/pts');
  if (!layout.devDir) a.push('--remount-ro', '/dev');
  a.push('--bind', layout.tmpDir, '/tmp');
  if (!image) a.push('--dir', '/home');
  a.push('--bind', layout.homeDir, SANDBOX_HOME);
  a.push(layout.workspaceReadOnly ? '--ro-bind' : '--bind', layout.workspaceDir, '/workspace');
  // bwrap's root is an unbounded tmpfs: once every mount point exists, make it read-only so that
  // the only writable places are the ones on the sandbox's size-capped disk.
  for (const [host, inside] of layout.extraRoFiles ?? []) a.push('--ro-bind', host, inside);
  for (const [host, inside] of layout.roMounts ?? []) a.push('--ro-bind', host, inside);
  // An image root stays writable: it is the overlay on the sandbox's disk, not bwrap's tmpfs.
  if (!image) a.push('--remount-ro', '/');
  a.push('--chdir', cwd);
  a.push('--clearenv');
  for (const [k, v] of Object.entries(env)) a.push('--setenv', k, v);
  a.push(
    '--seccomp',
    String(FD.seccomp),
    '--json-status-fd',
    String(FD.info),
    '--block-fd',
    String(FD.block),
  );
  return a;
}
