// The user namespaces behind idmapped mounts (idmap.privileged.ts): made by the Perl helper's forked
// children (userns.privileged.ts) or, where it cannot run, by an exec'd unshare. Either way the
// namespace maps exactly one uid and one gid, and no process is left holding it.
import {
  chownSync,
  closeSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { mappingUserns, mountIdmappedAll, unshareUserns } from '../../src/backends/host/idmap.privileged.js';
import { unmount } from '../../src/backends/host/mount.privileged.js';
import { usernsHelper, usernsHelperPid } from '../../src/backends/host/userns.privileged.js';
import { canRunNamespaces, SKIP_REASON } from '../helpers.js';

const OWNER = 4321;
const OTHER = 4322;
const HOST_UID = 3_990_123;
const OVERFLOW = Number(readFileSync('/proc/sys/kernel/overflowuid', 'utf8'));

const root = mkdtempSync(join('/var/tmp', 'airlock-userns-'));
const src = join(root, 'src');
mkdirSync(src);
for (const [name, uid] of [
  ['owned', OWNER],
  ['other', OTHER],
] as const) {
  writeFileSync(join(src, name), name);
  chownSync(join(src, name), uid, uid);
}
const targets: string[] = [];
afterAll(() => {
  for (const t of targets) unmount(t);
  rmSync(root, { recursive: true, force: true });
});

/** Owners of src's files seen through an idmapped mount made with `fd` (closed). */
async function seenThrough(fd: number): Promise<Record<string, [number, number]>> {
  const target = join(root, `view-${targets.length}`);
  mkdirSync(target);
  targets.push(target);
  expect(
    await mountIdmappedAll([{ source: src, target }], { uid: OWNER, gid: OWNER }, HOST_UID, true, fd),
  ).toBe(undefined);
  const out: Record<string, [number, number]> = {};
  for (const name of ['owned', 'other']) {
    const st = statSync(join(target, name));
    out[name] = [st.uid, st.gid];
  }
  return out;
}

/** The pids of the helper's children (none once every namespace has been handed over). */
function helperChildren(): string[] {
  const pid = usernsHelperPid();
  if (pid === undefined) return [];
  return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean);
}

async function settledChildren(): Promise<string[]> {
  for (let i = 0; i < 100 && helperChildren().length; i++) await new Promise((r) => setTimeout(r, 20));
  return helperChildren();
}

const EXPECTED = { owned: [HOST_UID, HOST_UID], other: [OVERFLOW, OVERFLOW] };

describe.skipIf(!canRunNamespaces)(`user namespaces for idmapped mounts (${SKIP_REASON})`, () => {
  it('the helper runs here, and its namespace maps the owner to the sandbox uid and nobody else', async () => {
    expect(usernsHelper()).toBeDefined();
    const fd = await mappingUserns(OWNER, OWNER, HOST_UID);
    expect(usernsHelperPid()).toBeGreaterThan(0);
    expect(await seenThrough(fd)).toEqual(EXPECTED);
    expect(await settledChildren()).toEqual([]);
  });

  it('the exec-unshare fallback makes the same mapping', async () => {
    expect(await seenThrough(await unshareUserns(OWNER, OWNER, HOST_UID))).toEqual(EXPECTED);
  });

  it('makes many at once, each answered in order, and leaves no child behind', async () => {
    const fds = await Promise.all(Array.from({ length: 16 }, () => mappingUserns(OWNER, OWNER, HOST_UID)));
    expect(new Set(fds).size).toBe(16);
    expect(await seenThrough(fds.pop()!)).toEqual(EXPECTED);
    for (const fd of fds) closeSync(fd);
    expect(await settledChildren()).toEqual([]);
  });

  it('runs as our child with no environment; its children die with it (PR_SET_PDEATHSIG)', async () => {
    const helper = usernsHelper()!;
    const pid = usernsHelperPid()!;
    expect(readFileSync(`/proc/${pid}/environ`, 'utf8')).toBe('');
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    expect(Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])).toBe(process.pid);
    const child = await helper.fork(); // not released: only the helper's death ends it
    expect(readlinkSync(`/proc/${child}/ns/user`)).not.toBe(readlinkSync('/proc/self/ns/user'));
    process.kill(pid, 'SIGKILL');
    const gone = (): boolean => {
      try {
        return /^\S+ \(.*\) [ZX]/.test(readFileSync(`/proc/${child}/stat`, 'utf8'));
      } catch {
        return true;
      }
    };
    for (let i = 0; i < 100 && !gone(); i++) await new Promise((r) => setTimeout(r, 20));
    expect(gone()).toBe(true);
  });

  it('is restarted after it dies, and a namespace asked for meanwhile still comes', async () => {
    usernsHelper(); // the last test killed it
    const before = usernsHelperPid()!;
    const pending = mappingUserns(OWNER, OWNER, HOST_UID);
    process.kill(before, 'SIGKILL');
    expect(await seenThrough(await pending)).toEqual(EXPECTED);
    const fd = await mappingUserns(OWNER, OWNER, HOST_UID);
    const after = usernsHelperPid();
    expect(after).toBeGreaterThan(0);
    expect(after).not.toBe(before);
    expect(await seenThrough(fd)).toEqual(EXPECTED);
    expect(await settledChildren()).toEqual([]);
  });
});
