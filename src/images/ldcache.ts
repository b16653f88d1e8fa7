// /etc/ld.so.cache, as glibc's loader reads it: the "glibc-ld.so.cache1.1" format (glibc 2.32+
// writes only this; older ones prefix it with the "ld.so-1.7.0" format, which is skipped here).
//
//   header (48 bytes): magic "glibc-ld.so.cache" + version "1.1", u32 nlibs, u32 len_strings,
//                      u8 flags, 3 pad, u32 extension_offset, 3 × u32 unused
//   nlibs entries (24 bytes): i32 flags, u32 key, u32 value, u32 osversion, u64 hwcap
//   key/value: offsets of NUL-terminated strings (soname, path), from the start of the header
//
// Only entries for x86-64 libc6 libraries (flags 0x0303) with no hwcap subdirectory are used, so the
// result does not depend on the CPU the build runs on (glibc-hwcaps variants are an optimisation; the
// baseline library is always present beside them). The first entry for a name wins, as in the loader.
import { AirlockError } from '../core/errors.js';

const NEW_MAGIC = 'glibc-ld.so.cache1.1';
const OLD_MAGIC = 'ld.so-1.7.0';
const FLAG_X8664_LIBC6 = 0x0303;
const HEADER_BYTES = 48;
const ENTRY_BYTES = 24;
/** A real cache holds a few thousand entries; more is a corrupt or hostile file. */
const MAX_ENTRIES = 1 << 20;

function bad(what: string): AirlockError {
  return new AirlockError('EXECUTABLE_INVALID', `/etc/ld.so.cache: ${what}`);
}

/** Maps a library's name (DT_NEEDED, e.g. libc.so.6) to its path in the root, per the cache. */
export function parseLdCache(buf: Buffer): Map<string, string> {
  let base = 0;
  if (buf.toString('latin1', 0, OLD_MAGIC.length) === OLD_MAGIC) {
    // Old format first: u32 nlibs at 12, then 12-byte entries; the new header follows, 8-aligned.
    if (buf.length < 16) throw bad('truncated old-format header');
    const n = buf.readUInt32LE(12);
    if (n > MAX_ENTRIES) throw bad('too many old-format entries');
    base = 16 + n * 12;
    base = (base + 7) & ~7;
  }
  if (buf.length < base + HEADER_BYTES || buf.toString('latin1', base, base + NEW_MAGIC.length) !== NEW_MAGIC)
    throw bad(`not in the ${NEW_MAGIC} format`);
  const nlibs = buf.readUInt32LE(base + 20);
  if (nlibs > MAX_ENTRIES) throw bad('too many entries');
  const entriesEnd = base + HEADER_BYTES + nlibs * ENTRY_BYTES;
  if (entriesEnd > buf.length) throw bad('entries run past the end of the file');
  const str = (off: number): string => {
    const at = base + off;
    if (off < HEADER_BYTES || at >= buf.length) throw bad('a string offset points outside the file');
    const end = buf.indexOf(0, at);
    if (end < 0) throw bad('an unterminated string');
    return buf.toString('utf8', at, end);
  };
  const out = new Map<string, string>();
  for (let i = 0; i < nlibs; i++) {
    const o = base + HEADER_BYTES + i * ENTRY_BYTES;
    const flags = buf.readInt32LE(o);
    const hwcap = buf.readBigUInt64LE(o + 16);
    if (flags !== FLAG_X8664_LIBC6 || hwcap !== 0n) continue;
    const key = str(buf.readUInt32LE(o + 4));
    const value = str(buf.readUInt32LE(o + 8));
    if (!value.startsWith('/')) continue;
    if (!out.has(key)) out.set(key, value);
  }
  return out;
}
