// A small, strict reader of what the dynamic loader needs from an x86-64 ELF file: its program
// interpreter (PT_INTERP) and its dynamic section (DT_NEEDED, DT_RPATH, DT_RUNPATH, DT_SONAME,
// DT_FLAGS_1). Reads are bounded (no section is read whole beyond a cap) and every offset is checked
// against the file's size: a hostile file in an image yields EXECUTABLE_INVALID, never a huge read.
// Only ELF64 little-endian x86-64 is accepted, the one architecture Airlock runs.
import { closeSync, fstatSync, openSync, readSync, constants } from 'node:fs';
import { AirlockError } from '../core/errors.js';

const EM_X86_64 = 62;
const PT_LOAD = 1;
const PT_DYNAMIC = 2;
const PT_INTERP = 3;
const DT_NULL = 0n;
const DT_NEEDED = 1n;
const DT_STRTAB = 5n;
const DT_STRSZ = 10n;
const DT_SONAME = 14n;
const DT_RPATH = 15n;
const DT_RUNPATH = 29n;
const DT_FLAGS_1 = 0x6ffffffbn;
const DF_1_NODEFLIB = 0x800n;

/** Caps on what one file may make us read. Real binaries are far below each. */
const MAX_PHNUM = 1024;
const MAX_INTERP_BYTES = 4096;
const MAX_DYNAMIC_BYTES = 1 << 20;
const MAX_STRTAB_BYTES = 16 << 20;
const MAX_NEEDED = 4096;

/** What the loader reads from one ELF object. */
export interface ElfInfo {
  /** PT_INTERP (e.g. /lib64/ld-linux-x86-64.so.2), or undefined for a static binary or a library. */
  readonly interpreter: string | undefined;
  /** DT_NEEDED, in file order. */
  readonly needed: readonly string[];
  /** DT_RPATH entries (colon-split, unexpanded); ignored by the loader when DT_RUNPATH is present. */
  readonly rpath: readonly string[] | undefined;
  /** DT_RUNPATH entries (colon-split, unexpanded). */
  readonly runpath: readonly string[] | undefined;
  readonly soname: string | undefined;
  /** DF_1_NODEFLIB: the loader skips ld.so.cache and the default dirs for this object's needs. */
  readonly noDefaultLib: boolean;
}

/** The first bytes of a file: an ELF, a `#!` script, or something else. */
export type FileKind = 'elf' | 'script' | 'other';

export function sniffKind(head: Buffer): FileKind {
  if (head.length >= 4 && head.readUInt32BE(0) === 0x7f454c46) return 'elf';
  if (head.length >= 2 && head[0] === 0x23 && head[1] === 0x21) return 'script';
  return 'other';
}

function invalid(path: string, what: string): AirlockError {
  return new AirlockError('EXECUTABLE_INVALID', `${path}: ${what}`);
}

/** Reads [offset, offset+length) exactly, or throws (offsets are checked against the size first). */
class BoundedFile {
  constructor(
    private readonly fd: number,
    readonly size: number,
    private readonly label: string,
  ) {}

  read(offset: number, length: number, what: string): Buffer {
    if (!Number.isSafeInteger(offset) || offset < 0 || length < 0 || offset + length > this.size)
      throw invalid(this.label, `${what} lies outside the file (offset ${offset}, ${length} bytes)`);
    const buf = Buffer.alloc(length);
    let done = 0;
    while (done < length) {
      const n = readSync(this.fd, buf, done, length - done, offset + done);
      if (n === 0) throw invalid(this.label, `${what}: file shrank while being read`);
      done += n;
    }
    return buf;
  }
}

function num(v: bigint, label: string, what: string): number {
  if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw invalid(label, `${what} is out of range`);
  return Number(v);
}

/** A NUL-terminated string at `offset` inside `buf`. */
function cString(buf: Buffer, offset: number, label: string, what: string): string {
  if (offset >= buf.length) throw invalid(label, `${what} points past the string table`);
  const end = buf.indexOf(0, offset);
  if (end < 0) throw invalid(label, `${what} is not NUL-terminated`);
  return buf.toString('utf8', offset, end);
}

/** The first `n` bytes of a file (fewer if it is shorter); the file is opened without following a final link. */
export function readHead(hostPath: string, n: number, label = hostPath): Buffer {
  const fd = openNoFollow(hostPath, label);
  try {
    const buf = Buffer.alloc(n);
    const got = readSync(fd, buf, 0, n, 0);
    return buf.subarray(0, got);
  } finally {
    closeSync(fd);
  }
}

/** Opens a file of the source root for reading, never through a symlink (EXECUTABLE_INVALID if it cannot). */
function openNoFollow(hostPath: string, label: string): number {
  try {
    return openSync(hostPath, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (e) {
    throw new AirlockError('EXECUTABLE_INVALID', `${label}: cannot be read (${(e as Error).message})`, {
      cause: e,
    });
  }
}

/**
 * Parses the loader-relevant parts of an ELF file. `label` names the file in errors (its path inside
 * the source root, not the host path). Throws EXECUTABLE_INVALID for anything that is not a
 * well-formed ELF64 little-endian x86-64 executable or shared object.
 */
export function readElf(hostPath: string, label: string): ElfInfo {
  const fd = openNoFollow(hostPath, label);
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw invalid(label, 'not a regular file');
    return parse(new BoundedFile(fd, st.size, label), label);
  } finally {
    closeSync(fd);
  }
}

/** Whether a file is an ELF the x86-64 loader would accept (ld.so skips others while searching). */
export function isLoadableElf(hostPath: string): boolean {
  const h = readHead(hostPath, 20);
  return (
    h.length === 20 &&
    sniffKind(h) === 'elf' &&
    h[4] === 2 &&
    h[5] === 1 &&
    h.readUInt16LE(18) === EM_X86_64 &&
    (h.readUInt16LE(16) === 2 || h.readUInt16LE(16) === 3)
  );
}

interface Segment {
  type: number;
  offset: number;
  vaddr: number;
  filesz: number;
}

function parse(f: BoundedFile, label: string): ElfInfo {
  if (f.size < 64) throw invalid(label, 'not an ELF file (too short)');
  const eh = f.read(0, 64, 'ELF header');
  if (sniffKind(eh) !== 'elf') throw invalid(label, 'not an ELF file');
  if (eh[4] !== 2) throw invalid(label, 'not a 64-bit ELF (only x86-64 is supported)');
  if (eh[5] !== 1) throw invalid(label, 'not a little-endian ELF');
  if (eh[6] !== 1) throw invalid(label, `unknown ELF version ${eh[6]}`);
  const type = eh.readUInt16LE(16);
  if (type !== 2 && type !== 3)
    throw invalid(label, `ELF type ${type} is not an executable or shared object`);
  const machine = eh.readUInt16LE(18);
  if (machine !== EM_X86_64) throw invalid(label, `ELF machine ${machine} is not x86-64`);
  const phoff = num(eh.readBigUInt64LE(32), label, 'e_phoff');
  const phentsize = eh.readUInt16LE(54);
  const phnum = eh.readUInt16LE(56);
  if (phentsize !== 56) throw invalid(label, `program header size ${phentsize} (expected 56)`);
  if (phnum > MAX_PHNUM) throw invalid(label, `${phnum} program headers (at most ${MAX_PHNUM})`);
  const ph = f.read(phoff, phnum * 56, 'program headers');
  const segs: Segment[] = [];
  for (let i = 0; i < phnum; i++) {
    const o = i * 56;
    segs.push({
      type: ph.readUInt32LE(o),
      offset: num(ph.readBigUInt64LE(o + 8), label, 'p_offset'),
      vaddr: num(ph.readBigUInt64LE(o + 16), label, 'p_vaddr'),
      filesz: num(ph.readBigUInt64LE(o + 32), label, 'p_filesz'),
    });
  }

  let interpreter: string | undefined;
  const interps = segs.filter((s) => s.type === PT_INTERP);
  if (interps.length > 1) throw invalid(label, 'more than one PT_INTERP');
  if (interps[0]) {
    const s = interps[0];
    if (s.filesz === 0 || s.filesz > MAX_INTERP_BYTES) throw invalid(label, 'PT_INTERP has a bad size');
    const b = f.read(s.offset, s.filesz, 'PT_INTERP');
    interpreter = cString(b, 0, label, 'PT_INTERP');
    if (!interpreter.startsWith('/')) throw invalid(label, `interpreter ${interpreter} is not absolute`);
  }

  const dyns = segs.filter((s) => s.type === PT_DYNAMIC);
  if (dyns.length > 1) throw invalid(label, 'more than one PT_DYNAMIC');
  const empty = { interpreter, needed: [], rpath: undefined, runpath: undefined, soname: undefined };
  if (!dyns[0]) return { ...empty, noDefaultLib: false };
  const d = dyns[0];
  if (d.filesz > MAX_DYNAMIC_BYTES) throw invalid(label, 'PT_DYNAMIC is too large');
  const dyn = f.read(d.offset, d.filesz - (d.filesz % 16), 'PT_DYNAMIC');

  const neededOffs: number[] = [];
  let strtabAddr: number | undefined;
  let strsz: number | undefined;
  let sonameOff: number | undefined;
  let rpathOff: number | undefined;
  let runpathOff: number | undefined;
  let flags1 = 0n;
  for (let o = 0; o + 16 <= dyn.length; o += 16) {
    const tag = dyn.readBigInt64LE(o);
    const val = dyn.readBigUInt64LE(o + 8);
    if (tag === DT_NULL) break;
    if (tag === DT_NEEDED) {
      if (neededOffs.length >= MAX_NEEDED) throw invalid(label, 'too many DT_NEEDED entries');
      neededOffs.push(num(val, label, 'DT_NEEDED'));
    } else if (tag === DT_STRTAB) strtabAddr = num(val, label, 'DT_STRTAB');
    else if (tag === DT_STRSZ) strsz = num(val, label, 'DT_STRSZ');
    else if (tag === DT_SONAME) sonameOff = num(val, label, 'DT_SONAME');
    else if (tag === DT_RPATH) rpathOff = num(val, label, 'DT_RPATH');
    else if (tag === DT_RUNPATH) runpathOff = num(val, label, 'DT_RUNPATH');
    else if (tag === DT_FLAGS_1) flags1 = val;
  }
  const noDefaultLib = (flags1 & DF_1_NODEFLIB) !== 0n;
  const wantsStrings =
    neededOffs.length > 0 || sonameOff !== undefined || rpathOff !== undefined || runpathOff !== undefined;
  if (!wantsStrings) return { ...empty, noDefaultLib };
  if (strtabAddr === undefined || strsz === undefined)
    throw invalid(label, 'dynamic section has no string table');
  if (strsz > MAX_STRTAB_BYTES) throw invalid(label, 'dynamic string table is too large');
  // DT_STRTAB is a virtual address: map it to a file offset through the PT_LOAD segment holding it.
  const load = segs.find(
    (s) => s.type === PT_LOAD && s.vaddr <= strtabAddr && strtabAddr + strsz <= s.vaddr + s.filesz,
  );
  if (!load) throw invalid(label, 'dynamic string table is outside every loaded segment');
  const strtab = f.read(load.offset + (strtabAddr - load.vaddr), strsz, 'dynamic string table');
  const str = (off: number, what: string): string => cString(strtab, off, label, what);
  const list = (s: string): string[] => s.split(':').filter((x) => x !== '');
  return {
    interpreter,
    needed: neededOffs.map((o) => str(o, 'DT_NEEDED')),
    soname: sonameOff === undefined ? undefined : str(sonameOff, 'DT_SONAME'),
    rpath: rpathOff === undefined ? undefined : list(str(rpathOff, 'DT_RPATH')),
    runpath: runpathOff === undefined ? undefined : list(str(runpathOff, 'DT_RUNPATH')),
    noDefaultLib,
  };
}
