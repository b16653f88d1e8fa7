// Fixtures for the allowlist tests: a scratch dir a sandbox uid can traverse, overlayfs-format layer
// pieces (whiteouts, opaque dirs), synthetic ELF files for the loader-search cases (never executed,
// only read), a synthetic ld.so.cache, and a runner that starts a built root with bubblewrap as an
// unprivileged sandbox uid (setpriv drops to it BEFORE bwrap, so nothing in the root runs as root).
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, chmodSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { AirlockError } from '../../src/core/errors.js';
import { libc } from '../../src/core/libc.privileged.js';
import { TEST_STATE_DIR, TEST_UID_RANGE } from '../helpers.js';

/** A dir beside the test state dir (/var/tmp is 1777, so a sandbox uid can reach a 0755 dir in it). */
export const SCRATCH = `${TEST_STATE_DIR}-allowlist`;
/** The uid (and gid) the built roots run as: from this run's uid range, above the sandboxes' own. */
export const SANDBOX_UID = TEST_UID_RANGE.first + TEST_UID_RANGE.count - 7;

export function scratchDir(): string {
  mkdirSync(SCRATCH, { recursive: true, mode: 0o755 });
  chmodSync(SCRATCH, 0o755);
  const d = join(SCRATCH, randomBytes(6).toString('hex'));
  mkdirSync(d, { mode: 0o755 });
  return d;
}

/** Names in `dir` other than `keep`: leftovers of a failed build (its private .tmp- dir) show here. */
export function strays(dir: string, keep: readonly string[] = []): string[] {
  return readdirSync(dir).filter((n) => !keep.includes(n));
}

export function writeFile(root: string, path: string, content: string | Buffer, mode = 0o644): string {
  const at = join(root, path);
  mkdirSync(dirname(at), { recursive: true, mode: 0o755 });
  writeFileSync(at, content, { mode });
  chmodSync(at, mode);
  return at;
}

/** An overlayfs whiteout (char device 0/0) at `path` in a layer. */
export function whiteout(layer: string, path: string): void {
  const at = join(layer, path);
  mkdirSync(dirname(at), { recursive: true, mode: 0o755 });
  const rc = libc().mknod(Buffer.from(at + '\0'), 0o20000 | 0o644, 0);
  if (rc !== 0) throw new Error(`mknod ${at} failed (errno ${libc().errno()})`);
}

/** Marks a layer's dir opaque (trusted.overlay.opaque=y): every lower copy of it is hidden. */
export function opaque(layer: string, path: string): void {
  const at = join(layer, path);
  mkdirSync(at, { recursive: true, mode: 0o755 });
  const rc = libc().lsetxattr(Buffer.from(at + '\0'), 'trusted.overlay.opaque', Buffer.from('y'), 1, 0);
  if (rc !== 0) throw new Error(`lsetxattr ${at} failed (errno ${libc().errno()})`);
}

export interface RunResult {
  status: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs argv inside `root` as the ONLY filesystem (no host /usr): bwrap binds it read-only at /, with
 * its own /proc and /dev, every namespace unshared, as SANDBOX_UID (dropped to before bwrap starts).
 */
export function runInRoot(root: string, argv: readonly string[]): RunResult {
  const r = spawnSync(
    'setpriv',
    [
      `--reuid=${SANDBOX_UID}`,
      `--regid=${SANDBOX_UID}`,
      '--clear-groups',
      '--',
      'bwrap',
      '--ro-bind',
      root,
      '/',
      '--proc',
      '/proc',
      '--dev',
      '/dev',
      '--tmpfs',
      '/tmp',
      '--unshare-all',
      '--die-with-parent',
      '--clearenv',
      '--setenv',
      'PATH',
      '/usr/local/bin:/usr/bin:/bin',
      '--',
      ...argv,
    ],
    { encoding: 'utf8', timeout: 30_000 },
  );
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

export function cleanup(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}

// ---- synthetic ELF files ----------------------------------------------------------------------

export interface FakeElf {
  type?: 'exec' | 'dyn';
  interpreter?: string;
  needed?: string[];
  rpath?: string;
  runpath?: string;
  soname?: string;
  /** 32-bit class (an i386 object: the x86-64 loader skips it). */
  elf32?: boolean;
  machine?: number;
}

const VBASE = 0x400000;

/**
 * A minimal ELF64 x86-64 file: header, program headers (PT_LOAD over the whole file, PT_INTERP,
 * PT_DYNAMIC), the interpreter string, the dynamic section and its string table. Enough for a
 * loader-search planner; not runnable.
 */
export function fakeElf(o: FakeElf): Buffer {
  const strs: string[] = [''];
  const strOff = (s: string): number => {
    const at = Buffer.byteLength(strs.join('\0')) + 1;
    strs.push(s);
    return at;
  };
  const dyn: Array<[number, number]> = [];
  for (const n of o.needed ?? []) dyn.push([1, strOff(n)]);
  if (o.rpath !== undefined) dyn.push([15, strOff(o.rpath)]);
  if (o.runpath !== undefined) dyn.push([29, strOff(o.runpath)]);
  if (o.soname !== undefined) dyn.push([14, strOff(o.soname)]);
  const strtab = Buffer.from(strs.join('\0') + '\0');
  const phnum = o.interpreter === undefined ? 2 : 3;
  const interp = o.interpreter === undefined ? Buffer.alloc(0) : Buffer.from(o.interpreter + '\0');
  const phOff = 64;
  const interpOff = phOff + phnum * 56;
  const dynOff = (interpOff + interp.length + 7) & ~7;
  const dynLen = (dyn.length + 3) * 16; // + DT_STRTAB, DT_STRSZ, DT_NULL
  const strOffFile = dynOff + dynLen;
  const size = strOffFile + strtab.length;
  const b = Buffer.alloc(size);
  b.writeUInt32BE(0x7f454c46, 0);
  b[4] = o.elf32 ? 1 : 2;
  b[5] = 1;
  b[6] = 1;
  b.writeUInt16LE(o.type === 'exec' ? 2 : 3, 16);
  b.writeUInt16LE(o.machine ?? 62, 18);
  b.writeUInt32LE(1, 20);
  b.writeBigUInt64LE(BigInt(phOff), 32);
  b.writeUInt16LE(64, 52);
  b.writeUInt16LE(56, 54);
  b.writeUInt16LE(phnum, 56);
  const ph = (i: number, type: number, off: number, len: number): void => {
    const at = phOff + i * 56;
    b.writeUInt32LE(type, at);
    b.writeUInt32LE(4, at + 4);
    b.writeBigUInt64LE(BigInt(off), at + 8);
    b.writeBigUInt64LE(BigInt(VBASE + off), at + 16);
    b.writeBigUInt64LE(BigInt(VBASE + off), at + 24);
    b.writeBigUInt64LE(BigInt(len), at + 32);
    b.writeBigUInt64LE(BigInt(len), at + 40);
    b.writeBigUInt64LE(0x1000n, at + 48);
  };
  ph(0, 1, 0, size);
  ph(1, 2, dynOff, dynLen);
  if (o.interpreter !== undefined) {
    ph(2, 3, interpOff, interp.length);
    interp.copy(b, interpOff);
  }
  let d = dynOff;
  const put = (tag: number, val: number): void => {
    b.writeBigInt64LE(BigInt(tag), d);
    b.writeBigUInt64LE(BigInt(val), d + 8);
    d += 16;
  };
  for (const [t, v] of dyn) put(t, v);
  put(5, VBASE + strOffFile);
  put(10, strtab.length);
  put(0, 0);
  strtab.copy(b, strOffFile);
  return b;
}

/** A glibc-ld.so.cache1.1 file mapping each name to a path (x86-64 libc6 entries, no hwcap). */
export function fakeLdCache(entries: ReadonlyArray<[string, string]>): Buffer {
  const header = 48;
  const strsStart = header + entries.length * 24;
  const strs: Buffer[] = [];
  let off = strsStart;
  const at: Array<[number, number]> = [];
  for (const [k, v] of entries) {
    const kb = Buffer.from(k + '\0');
    const vb = Buffer.from(v + '\0');
    at.push([off, off + kb.length]);
    off += kb.length + vb.length;
    strs.push(kb, vb);
  }
  const b = Buffer.alloc(strsStart);
  b.write('glibc-ld.so.cache1.1', 0, 'latin1');
  b.writeUInt32LE(entries.length, 20);
  b.writeUInt32LE(off - strsStart, 24);
  b[28] = 2;
  entries.forEach((_, i) => {
    const e = header + i * 24;
    b.writeInt32LE(0x0303, e);
    b.writeUInt32LE(at[i]![0], e + 4);
    b.writeUInt32LE(at[i]![1], e + 8);
  });
  return Buffer.concat([b, ...strs]);
}

/** The AirlockError a promise rejects with; fails the test if it resolves or rejects with anything else. */
export async function failure(p: Promise<unknown>): Promise<AirlockError> {
  let result: unknown;
  try {
    result = await p;
  } catch (e) {
    if (AirlockError.isInstance(e)) return e;
    throw e;
  }
  throw new Error(`expected a typed failure, got ${JSON.stringify(result)?.slice(0, 200)}`);
}
