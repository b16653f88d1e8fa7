// The launch namespace bwrap starts in (launcher.privileged.ts): it holds the base (root tmpfs, /usr,
// /dev/null, /proc), the shared dirs, and one sandbox's own tree; nothing of the host's other mounts
// or of any other sandbox. The main thread's own mount namespace never changes.
import { execFileSync } from 'node:child_process';
import {
  closeSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { closeLaunchNamespace, Launcher } from '../../src/backends/host/launcher.privileged.js';
import { mountTmpfs, unmount } from '../../src/backends/host/mount.privileged.js';
import { reaped, spawnDirect } from '../../src/backends/host/spawn.privileged.js';
import { Airlock } from '../../src/index.js';
import { launcherPaysOff } from '../../src/cli/lifecycle.js';
import { canRunNamespaces, residue, SKIP_REASON, TEST_STATE_DIR, TEST_UID_RANGE } from '../helpers.js';

const root = mkdtempSync(join('/var/tmp', 'airlock-launcher-'));
afterAll(() => {
  for (const m of ['sandboxes/sbx-a/disk', 'sandboxes/sbx-b/disk']) unmount(join(root, m));
  rmSync(root, { recursive: true, force: true });
});

/** Run `argv` (as root, no netns) in launch namespace `ns`; its stdout. */
async function runIn(l: Launcher, ns: number, argv: string[]): Promise<string> {
  const child = spawnDirect(argv[0]!, argv, [], ['null', 'write', 'null'], undefined, (call) =>
    l.spawn(call, ns, undefined),
  );
  let out = '';
  child.pipes[1]!.on('data', (d: Buffer) => (out += d.toString()));
  const exit = await reaped(child);
  await new Promise<void>((r) => (child.pipes[1]!.readableEnded ? r() : child.pipes[1]!.once('end', r)));
  expect(exit).toEqual({ exitCode: 0, signal: null });
  return out;
}

describe.skipIf(!canRunNamespaces)(`launch namespaces (${SKIP_REASON})`, () => {
  it('hold the base, the shared dirs and one sandbox tree, nothing else', async () => {
    const l = Launcher.get();
    if (!(l instanceof Launcher)) throw new Error(l.failed);
    const mainNs = readlinkSync('/proc/thread-self/ns/mnt');
    const shared = join(root, 'etc-x');
    mkdirSync(shared, { recursive: true });
    writeFileSync(join(shared, 'passwd'), 'x\n');
    const dirs = ['sbx-a', 'sbx-b'].map((id) => join(root, 'sandboxes', id));
    for (const d of dirs) {
      mkdirSync(join(d, 'disk'), { recursive: true });
      mountTmpfs(join(d, 'disk'), 1 << 20, 0);
      writeFileSync(join(d, 'disk', 'mine'), d);
    }
    l.share(shared);
    const ns = l.sandboxNamespace(dirs[0]!);
    try {
      const mounts = (await runIn(l, ns, ['/bin/cat', '/proc/self/mountinfo']))
        .trim()
        .split('\n')
        .map((line) => line.split(' ')[4])
        .sort();
      expect(mounts).toEqual(
        [
          '/',
          '/dev/null',
          '/proc',
          '/usr',
          shared,
          join(root, 'sandboxes'),
          dirs[0],
          join(dirs[0]!, 'disk'),
        ].sort(),
      );
      // The sandbox's own files and the shared dir are there; the other sandbox is not.
      const seen = await runIn(l, ns, [
        '/bin/sh',
        '-c',
        `cat ${dirs[0]}/disk/mine ${shared}/passwd; ls ${root}/sandboxes`,
      ]);
      expect(seen).toBe(`${dirs[0]}x\nsbx-a\n`);
    } finally {
      await closeLaunchNamespace(ns);
    }
    // Nothing changed for this thread, or on the host.
    expect(readlinkSync('/proc/thread-self/ns/mnt')).toBe(mainNs);
    expect(readdirSync(join(root, 'sandboxes')).sort()).toEqual(['sbx-a', 'sbx-b']);
    expect(
      readFileSync('/proc/self/mountinfo', 'utf8')
        .split('\n')
        .filter((m) => m.includes(' - tmpfs airlock-launch ')),
    ).toEqual([]);
  });

  it('makes network namespaces off the main thread: only lo, up; every thread stays in the host netns', async () => {
    const l = Launcher.get();
    if (!(l instanceof Launcher)) throw new Error(l.failed);
    const host = readlinkSync('/proc/self/ns/net');
    const fd = await l.netns();
    try {
      const ns = readlinkSync(`/proc/self/fd/${fd}`);
      expect(ns).toMatch(/^net:\[\d+\]$/);
      expect(ns).not.toBe(host);
      const links = execFileSync('nsenter', [`--net=/proc/${process.pid}/fd/${fd}`, 'ip', '-o', 'link'], {
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'pipe'],
      })
        .trim()
        .split('\n');
      expect(links).toHaveLength(1);
      expect(links[0]).toMatch(/^1: lo: <LOOPBACK,UP,LOWER_UP>/);
    } finally {
      closeSync(fd);
    }
    for (const t of readdirSync('/proc/self/task'))
      expect(readlinkSync(`/proc/self/task/${t}/ns/net`)).toBe(host);
  });

  it('answers calls made without waiting and calls that wait, each with its own reply', async () => {
    const l = Launcher.get();
    if (!(l instanceof Launcher)) throw new Error(l.failed);
    const dir = join(root, 'sandboxes', 'sbx-c');
    mkdirSync(dir, { recursive: true });
    const early = [l.netns(), l.netns(), l.sandboxNamespaceAsync(dir), l.netns()];
    const waited = l.sandboxNamespace(dir); // blocks; settles the replies to the others it meets
    const late = l.netns();
    const fds = [...(await Promise.all(early)), waited, await late];
    try {
      const kinds = fds.map((fd) => readlinkSync(`/proc/self/fd/${fd}`).replace(/:.*/, ''));
      expect(kinds).toEqual(['net', 'net', 'mnt', 'net', 'mnt', 'net']);
      expect(new Set(fds.map((fd) => readlinkSync(`/proc/self/fd/${fd}`))).size).toBe(fds.length);
    } finally {
      for (const fd of fds) closeSync(fd);
    }
    // A failing call rejects only itself.
    await expect(l.sandboxNamespaceAsync(join(root, 'no-such-dir', 'x'))).rejects.toThrow(
      /launcher|open_tree/,
    );
    closeSync(await l.netns());
  });

  it('a sandbox runs the same with bwrap started from the host namespace (launchNamespaces: false)', async () => {
    const airlock = new Airlock({
      stateDir: TEST_STATE_DIR,
      uidRange: TEST_UID_RANGE,
      launchNamespaces: false,
    });
    try {
      const sbx = await airlock.create({});
      const r = await sbx.exec('echo hi > /workspace/f && cat /workspace/f && ls -A /dev | wc -l');
      expect(r.stdout).toBe('hi\n13\n');
      await sbx.kill();
    } finally {
      await airlock.close();
    }
    expect(residue().mounts).toEqual([]);
  });
});

describe('the CLI uses the launcher for its one sandbox only when the host has many mounts (cli/lifecycle.ts)', () => {
  const lines = (n: number): string => '36 25 0:32 / /x rw - tmpfs tmpfs rw\n'.repeat(n);
  it('a small mount table: no launcher; a large one or an unreadable one: the launcher', () => {
    expect(launcherPaysOff(() => lines(85))).toBe(false);
    expect(launcherPaysOff(() => lines(500))).toBe(false);
    expect(launcherPaysOff(() => lines(501))).toBe(true);
    expect(
      launcherPaysOff(() => {
        throw new Error('EACCES');
      }),
    ).toBe(true);
    // This host's own table is read without error (the default reader).
    expect(typeof launcherPaysOff()).toBe('boolean');
  });
});
