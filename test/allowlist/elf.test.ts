// The ELF reader and the library search against independent oracles on this host's real binaries:
// binutils' readelf for the dynamic section, and the real dynamic loader (ldd) for the closure.
// Then hostile files: every malformed header is a typed EXECUTABLE_INVALID, never a crash or a huge read.
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, realpathSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { ClosurePlanner } from '../../src/images/closure-plan.js';
import { readElf } from '../../src/images/elf.js';
import { parseLdCache } from '../../src/images/ldcache.js';
import { SourceRoot } from '../../src/images/source-root.js';
import { cleanup, fakeElf, fakeLdCache, scratchDir, writeFile } from './fixtures.js';

const HOST_PROGRAMS = [
  '/usr/bin/python3.11',
  '/usr/bin/git',
  '/usr/bin/bash',
  '/usr/bin/curl',
  '/usr/bin/busybox',
].filter((p) => existsSync(p));
const hasBinutils = existsSync('/usr/bin/readelf');

function readelfNeeded(path: string): { needed: string[]; interp: string | undefined } {
  const d = execFileSync('readelf', ['-dlW', path], { encoding: 'utf8' });
  const needed = [...d.matchAll(/\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g)].map((m) => m[1]!);
  const interp = /Requesting program interpreter: ([^\]]+)\]/.exec(d)?.[1];
  return { needed, interp };
}

/** The real paths of what the real loader maps for a program (ldd runs ld.so in trace mode). */
function lddClosure(path: string): string[] {
  let out: string;
  try {
    out = execFileSync('ldd', [path], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  } catch {
    return []; // a static binary: "not a dynamic executable"
  }
  const paths = [...out.matchAll(/(?:=> )?(\/\S+) \(0x/g)].map((m) => realpathSync(m[1]!));
  return [...new Set(paths)].sort();
}

describe('ELF reader on this host', () => {
  it.skipIf(!hasBinutils).each(HOST_PROGRAMS)(
    '%s: DT_NEEDED and PT_INTERP match readelf (skipped without /usr/bin/readelf: binutils)',
    (p) => {
      const mine = readElf(p, p);
      const theirs = readelfNeeded(p);
      expect(mine.needed).toEqual(theirs.needed);
      expect(mine.interpreter).toBe(theirs.interp);
    },
  );

  it.each(HOST_PROGRAMS)('%s: the planned closure is exactly what the real loader maps (ldd)', (p) => {
    const planner = new ClosurePlanner(new SourceRoot(['/']), '/usr/bin', () => {});
    planner.addExecutable(p);
    // the program's own ELF closure: files that are the program, its interpreter or needed by something
    const elfFiles = [...planner.items.values()]
      .filter((i) => i.type === 'file')
      .filter((i) => [...i.why].some((w) => w === 'executable' || /^(needed by|interpreter of) /.test(w)))
      .map((i) => realpathSync(i.src.path))
      .filter((f) => f !== realpathSync(p))
      .sort();
    const loaded = lddClosure(p).filter((f) => f !== realpathSync(p));
    if (p.endsWith('python3.11')) {
      // python's lib-dynload modules bring more (needed by them, not by /usr/bin/python3.11)
      expect(elfFiles).toEqual(expect.arrayContaining(loaded));
    } else {
      expect(elfFiles).toEqual(loaded);
    }
  });

  it('parses the host ld.so.cache like the loader: libc.so.6 is where ldd finds it', () => {
    const cache = parseLdCache(readFileSync('/etc/ld.so.cache'));
    const libc = lddClosure('/usr/bin/bash').find((f) => /\/libc\.so\.6$/.test(f) || /libc-/.test(f));
    expect(realpathSync(cache.get('libc.so.6')!)).toBe(libc);
  });
});

describe('hostile and foreign files', () => {
  let dir: string;
  beforeAll(() => {
    dir = scratchDir();
  });
  afterAll(() => cleanup(dir));

  const parse = (name: string, bytes: Buffer): AirlockError | undefined => {
    const at = writeFile(dir, name, bytes, 0o755);
    try {
      readElf(at, name);
      return undefined;
    } catch (e) {
      if (!AirlockError.isInstance(e)) throw e;
      return e;
    }
  };

  it('a well-formed synthetic ELF parses: needed, RPATH, RUNPATH, SONAME', () => {
    const at = writeFile(
      dir,
      'ok.so',
      fakeElf({
        needed: ['liba.so.1', 'libb.so.2'],
        rpath: '/r1:/r2',
        runpath: '$ORIGIN/../lib',
        soname: 'libok.so.1',
      }),
    );
    expect(readElf(at, 'ok.so')).toEqual({
      interpreter: undefined,
      needed: ['liba.so.1', 'libb.so.2'],
      rpath: ['/r1', '/r2'],
      runpath: ['$ORIGIN/../lib'],
      soname: 'libok.so.1',
      noDefaultLib: false,
    });
  });

  it('truncated, foreign, oversized and out-of-range headers are EXECUTABLE_INVALID', () => {
    const good = fakeElf({ needed: ['libc.so.6'], interpreter: '/lib64/ld-linux-x86-64.so.2', type: 'exec' });
    const cases: Array<[string, Buffer, RegExp]> = [
      ['short', good.subarray(0, 40), /too short/],
      ['elf32', fakeElf({ elf32: true }), /64-bit/],
      ['arm64', fakeElf({ machine: 183 }), /not x86-64/],
      [
        'text',
        Buffer.from('hello world, this is not an ELF file at all.....................................'),
        /not an ELF/,
      ],
    ];
    const phnum = Buffer.from(good);
    phnum.writeUInt16LE(0xffff, 56);
    cases.push(['phnum', phnum, /program headers/]);
    const phoff = Buffer.from(good);
    phoff.writeBigUInt64LE(0xffffffffffn, 32);
    cases.push(['phoff', phoff, /outside the file/]);
    const strsz = Buffer.from(good);
    // DT_STRSZ is the second-last dynamic entry before DT_NULL: make it run past the file
    const dynEnd = strsz.indexOf(Buffer.from('libc.so.6')) - 1; // the string table starts right after
    strsz.writeBigUInt64LE(1n << 40n, dynEnd - 32 + 8);
    cases.push(['strsz', strsz, /too large|outside/]);
    const needed = Buffer.from(good);
    // the first DT_NEEDED's offset points far past the string table
    const dynStart = needed.indexOf(Buffer.from([1, 0, 0, 0, 0, 0, 0, 0]), 64 + 3 * 56);
    needed.writeBigUInt64LE(100000n, dynStart + 8);
    cases.push(['needed', needed, /past the string table/]);
    const interp = Buffer.from(good);
    const i = interp.indexOf(Buffer.from('/lib64/ld-linux-x86-64.so.2\0'));
    interp[i + 27] = 0x41; // no NUL any more
    cases.push(['interp', interp, /NUL|string table|interpreter/]);
    for (const [name, bytes, msg] of cases) {
      const e = parse(name, bytes);
      expect(e?.code, name).toBe('EXECUTABLE_INVALID');
      expect(e?.message, name).toMatch(msg);
    }
  });

  it('a corrupt ld.so.cache is a typed error, not a crash', () => {
    const good = fakeLdCache([['libx.so.1', '/opt/libx.so.1']]);
    expect(parseLdCache(good).get('libx.so.1')).toBe('/opt/libx.so.1');
    const many = Buffer.from(good);
    many.writeUInt32LE(0xffffffff, 20);
    const off = Buffer.from(good);
    off.writeUInt32LE(0xfffffff, 48 + 8);
    for (const b of [good.subarray(0, 30), many, off, Buffer.from('garbage')])
      expect(() => parseLdCache(b)).toThrow(AirlockError);
  });
});
