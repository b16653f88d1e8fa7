// captureLayer on host trees (no sandbox): the digest is a function of content only, the layer is in
// overlayfs format with ownership relative to the sandbox, and nothing in the source is followed.
// Needs root (chown, mknod, trusted.* xattrs, a tmpfs mount); skipped otherwise.
import {
  chmodSync,
  chownSync,
  lchownSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/index.js';
import {
  captureLayer,
  OPAQUE_XATTR,
  type CaptureSource,
} from '../../src/backends/host/layer-capture.privileged.js';
import { libc } from '../../src/core/libc.privileged.js';
import { mountTmpfs, unmount } from '../../src/backends/host/mount.privileged.js';

const SELF = 3_999_001;
const isRoot = process.getuid?.() === 0;
const dirs: string[] = [];

afterEach(() => {
  for (const d of dirs.splice(0)) {
    unmount(join(d, 'src', 'mnt'));
    rmSync(d, { recursive: true, force: true });
  }
});

/** A fresh source tree (owned by SELF) and an empty destination. */
function fixture(build: (src: string) => void): { src: string; dest: string } {
  const root = mkdtempSync(join(tmpdir(), 'airlock-capture-'));
  dirs.push(root);
  const src = join(root, 'src');
  mkdirSync(src);
  build(src);
  const own = (p: string): void => {
    const st = lstatSync(p);
    if (st.uid === 0) lchownSync(p, SELF, SELF);
    if (st.isDirectory()) for (const n of readdirSync(p)) own(join(p, n));
  };
  own(src);
  const dest = join(root, 'dest');
  mkdirSync(dest);
  return { src, dest };
}

async function capture(
  src: string,
  dest: string,
  kind: CaptureSource['kind'] = 'full',
  header = 'h',
): Promise<Awaited<ReturnType<typeof captureLayer>>> {
  return captureLayer({
    sources: [{ area: 'workspace', kind, dir: src }],
    dest,
    selfUid: SELF,
    header,
    checkpoint: () => {},
    maxContentBytes: 64 * 1024 * 1024,
  });
}

const project = (src: string): void => {
  mkdirSync(join(src, 'd'));
  writeFileSync(join(src, 'd', 'f'), 'content');
  writeFileSync(join(src, 'x'), 'xx');
  symlinkSync('d/f', join(src, 'l'));
};

describe.skipIf(!isRoot)('captureLayer', () => {
  it('the digest depends on content, not on timestamps or where it was made', async () => {
    const a = fixture(project);
    const b = fixture(project);
    utimesSync(join(b.src, 'x'), new Date('2001-01-01'), new Date('2001-01-01'));
    const ra = await capture(a.src, a.dest);
    const rb = await capture(b.src, b.dest);
    expect(ra.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(rb.digest).toBe(ra.digest);
    expect(ra).toMatchObject({ sizeBytes: 9, entries: 5 });
    // mtimes are copied all the same
    expect(lstatSync(join(b.dest, 'workspace', 'x')).mtime.getFullYear()).toBe(2001);
  });

  it('any change of path, type, mode, owner, target, bytes or header changes the digest', async () => {
    const base = (await capture(...(Object.values(fixture(project)) as [string, string]))).digest;
    const variants: Array<[string, (src: string) => void, string?]> = [
      ['bytes', (s) => writeFileSync(join(s, 'x'), 'xy')],
      ['mode', (s) => chmodSync(join(s, 'x'), 0o600)],
      ['owner', (s) => chownSync(join(s, 'x'), SELF + 1, SELF)],
      ['group', (s) => chownSync(join(s, 'x'), SELF, SELF + 1)],
      ['target', (s) => (rmSync(join(s, 'l')), symlinkSync('d/g', join(s, 'l')))],
      ['name', (s) => (writeFileSync(join(s, 'y'), 'xx'), rmSync(join(s, 'x')))],
      ['boundary', (s) => (writeFileSync(join(s, 'x'), 'x'), writeFileSync(join(s, 'd', 'f'), 'xcontent'))],
      ['type', (s) => (rmSync(join(s, 'x')), mkdirSync(join(s, 'x')))],
      ['header', () => {}, 'other'],
    ];
    const seen = new Set([base]);
    for (const [what, change, header] of variants) {
      const f = fixture((s) => {
        project(s);
        change(s);
      });
      const d = (await capture(f.src, f.dest, 'full', header ?? 'h')).digest;
      expect({ what, fresh: !seen.has(d) }).toEqual({ what, fresh: true });
      seen.add(d);
    }
  });

  it('writes overlayfs format: whiteouts, opaque dirs, ids relative to the sandbox, no setuid', async () => {
    const c = libc();
    const f = fixture((s) => {
      project(s);
      mkdirSync(join(s, 'opaque'));
      writeFileSync(join(s, 'suid'), '#!/bin/sh\n');
      chmodSync(join(s, 'suid'), 0o4755);
      writeFileSync(join(s, 'foreign'), 'f');
      expect(c.mknod(Buffer.from(`${join(s, 'deleted')}\0`), 0o020000, 0)).toBe(0);
      const y = Buffer.from('y');
      expect(c.lsetxattr(Buffer.from(`${join(s, 'opaque')}\0`), OPAQUE_XATTR, y, 1, 0)).toBe(0);
    });
    chownSync(join(f.src, 'foreign'), 1234, 1234);
    const r = await capture(f.src, f.dest, 'diff');
    const ws = join(f.dest, 'workspace');
    const wh = lstatSync(join(ws, 'deleted'));
    expect(wh.isCharacterDevice() && wh.rdev === 0).toBe(true);
    const buf = Buffer.alloc(4);
    expect(c.lgetxattr(Buffer.from(`${join(ws, 'opaque')}\0`), OPAQUE_XATTR, buf, 4)).toBe(1);
    expect(buf.subarray(0, 1).toString()).toBe('y');
    expect(lstatSync(join(ws, 'suid')).mode & 0o7777).toBe(0o755);
    const ids = (p: string): [number, number] => [lstatSync(join(ws, p)).uid, lstatSync(join(ws, p)).gid];
    expect(ids('x')).toEqual([0, 0]);
    expect(ids('l')).toEqual([0, 0]);
    expect(ids('foreign')).toEqual([65534, 65534]);
    expect(readFileSync(join(ws, 'd', 'f'), 'utf8')).toBe('content');
    // In a plain (full) tree the same 0/0 node is not a deletion: it is left out, and so is the
    // opaque marker (a plain tree has no lower layers to hide).
    const g = fixture((s) => {
      expect(c.mknod(Buffer.from(`${join(s, 'node')}\0`), 0o020000, 0)).toBe(0);
    });
    const rg = await capture(g.src, g.dest, 'full');
    expect(readdirSync(join(g.dest, 'workspace'))).toEqual([]);
    expect(rg.entries).toBe(1);
    expect(r.entries).toBe(9);
  });

  it('never follows a symlink and never crosses into another filesystem', async () => {
    const f = fixture((s) => {
      symlinkSync('/etc/passwd', join(s, 'passwd'));
      symlinkSync('/', join(s, 'root'));
    });
    const r = await capture(f.src, f.dest);
    expect(r.sizeBytes).toBe(0);
    expect(lstatSync(join(f.dest, 'workspace', 'passwd')).isSymbolicLink()).toBe(true);
    const m = fixture((s) => mkdirSync(join(s, 'mnt')));
    mountTmpfs(join(m.src, 'mnt'), 1024 * 1024, 0);
    writeFileSync(join(m.src, 'mnt', 'host-file'), 'not the sandbox disk');
    const e = await capture(m.src, m.dest).catch((x: unknown) => x);
    expect(AirlockError.isInstance(e) && e.message).toMatch(/another filesystem/);
  });

  it('keeps sparse files sparse and stops at the content cap with DISK_FULL', async () => {
    const f = fixture((s) => {
      writeFileSync(join(s, 'sparse'), '');
      writeFileSync(join(s, 'sparse'), 'end', { flag: 'r+' });
    });
    const big = join(f.src, 'sparse');
    // 32 MiB apparent, a few bytes of data at the end
    const fd = (await import('node:fs')).openSync(big, 'r+');
    (await import('node:fs')).writeSync(fd, 'end', 32 * 1024 * 1024);
    (await import('node:fs')).closeSync(fd);
    const r = await capture(f.src, f.dest);
    expect(r.sizeBytes).toBe(32 * 1024 * 1024 + 3);
    expect(lstatSync(join(f.dest, 'workspace', 'sparse')).blocks * 512).toBeLessThan(1024 * 1024);
    const g = fixture((s) => writeFileSync(join(s, 'f'), Buffer.alloc(2048)));
    const e = await captureLayer({
      sources: [{ area: 'workspace', kind: 'full', dir: g.src }],
      dest: g.dest,
      selfUid: SELF,
      header: 'h',
      checkpoint: () => {},
      maxContentBytes: 1024,
    }).catch((x: unknown) => x);
    expect(AirlockError.is(e, 'DISK_FULL')).toBe(true);
  });
});
