// The few commands the WASM tier runs without an interpreter, on the sandbox's in-memory filesystem
// (Pyodide's MEMFS, through Emscripten's FS API): echo, true, false, sleep, cat, pwd, and what
// sbx.files sends (cat, test -e/-d/-f, rm -rf, find … -printf, and the write command, here
// `airlock-write`). Messages and exit codes are coreutils' so that the facade reads them as it does
// on every tier (src/sandbox/files.ts maps "No such file or directory" to FILE_NOT_FOUND, …).
import { posix } from 'node:path';

/** The part of Emscripten's FS API the builtins use. */
export interface MemFs {
  readFile(path: string): Uint8Array;
  writeFile(path: string, data: Uint8Array): void;
  mkdirTree(path: string): void;
  readdir(path: string): string[];
  lstat(path: string): { mode: number; size: number; mtime: Date | number };
  stat(path: string): { mode: number; size: number; mtime: Date | number };
  unlink(path: string): void;
  rmdir(path: string): void;
  isDir(mode: number): boolean;
  isFile(mode: number): boolean;
  isLink(mode: number): boolean;
}

export interface Io {
  readonly fs: MemFs;
  readonly emit: (fd: 1 | 2, data: Uint8Array) => void;
  readonly stdin: Uint8Array;
  readonly cwd: string;
  /** Block up to ms, or until the job is told to stop (then true). */
  readonly sleep: (ms: number) => boolean;
}

/** Emscripten's errno numbers (WASI's) → the text coreutils print. */
const ERRNO_TEXT: Record<number, string> = {
  2: 'Permission denied',
  20: 'File exists',
  31: 'Is a directory',
  44: 'No such file or directory',
  51: 'No space left on device',
  54: 'Not a directory',
  55: 'Directory not empty',
  63: 'Operation not permitted',
  69: 'Read-only file system',
};

const enc = new TextEncoder();

function errText(e: unknown): string {
  const errno = (e as { errno?: number }).errno;
  return (errno !== undefined && ERRNO_TEXT[errno]) || (e as Error).message || 'unknown error';
}

export function runBuiltin(argv: readonly string[], io: Io): number {
  const [name, ...args] = argv;
  const out = (s: string): void => io.emit(1, enc.encode(s));
  const err = (s: string): void => io.emit(2, enc.encode(`${name}: ${s}\n`));
  const abs = (p: string): string => posix.resolve(io.cwd, p);
  switch (name) {
    case 'true':
      return 0;
    case 'false':
      return 1;
    case 'pwd':
      out(`${io.cwd}\n`);
      return 0;
    case 'echo': {
      const noNewline = args[0] === '-n';
      out(`${(noNewline ? args.slice(1) : args).join(' ')}${noNewline ? '' : '\n'}`);
      return 0;
    }
    case 'sleep': {
      const s = Number(args[0]);
      if (args.length !== 1 || !Number.isFinite(s) || s < 0) {
        err('usage: sleep SECONDS');
        return 1;
      }
      return io.sleep(s * 1000) ? 137 : 0;
    }
    case 'cat': {
      const files = args.filter((a) => a !== '--');
      let status = 0;
      for (const f of files.length ? files : ['-']) {
        if (f === '-') io.emit(1, io.stdin);
        else
          try {
            io.emit(1, io.fs.readFile(abs(f)));
          } catch (e) {
            err(`${f}: ${errText(e)}`);
            status = 1;
          }
      }
      return status;
    }
    case 'test': {
      const [op, p] = args;
      if (args.length !== 2 || !['-e', '-d', '-f'].includes(op!)) {
        err('only test -e, -d or -f PATH is supported on the wasm tier');
        return 2;
      }
      try {
        const st = io.fs.stat(abs(p!));
        return op === '-e' || (op === '-d' ? io.fs.isDir(st.mode) : io.fs.isFile(st.mode)) ? 0 : 1;
      } catch {
        return 1;
      }
    }
    case 'rm': {
      const flags = args.filter((a) => a.startsWith('-') && a !== '--').join('');
      const paths = args.filter((a) => !a.startsWith('-'));
      let status = 0;
      for (const p of paths) {
        try {
          remove(io.fs, abs(p), flags.includes('r'));
        } catch (e) {
          if (flags.includes('f') && (e as { errno?: number }).errno === 44) continue;
          err(`cannot remove '${p}': ${errText(e)}`);
          status = 1;
        }
      }
      return status;
    }
    case 'find':
      return find(args, io, err);
    case 'airlock-write': {
      const p = abs(args[0]!);
      try {
        io.fs.mkdirTree(posix.dirname(p));
        io.fs.writeFile(p, io.stdin);
        return 0;
      } catch (e) {
        io.emit(2, enc.encode(`write: ${p}: ${errText(e)}\n`));
        return 1;
      }
    }
    default:
      err('not a builtin');
      return 127;
  }
}

function remove(fs: MemFs, p: string, recursive: boolean): void {
  const st = fs.lstat(p);
  if (!fs.isDir(st.mode)) return fs.unlink(p);
  if (!recursive) throw Object.assign(new Error('Is a directory'), { errno: 31 });
  for (const n of fs.readdir(p)) if (n !== '.' && n !== '..') remove(fs, posix.join(p, n), true);
  fs.rmdir(p);
}

/** Only the listing sbx.files.list() asks for: `find DIR -mindepth 1 -maxdepth 1 -printf …`. */
function find(args: readonly string[], io: Io, err: (s: string) => void): number {
  const [dir, ...rest] = args;
  const form = ['-mindepth', '1', '-maxdepth', '1', '-printf', '%y\\0%s\\0%m\\0%T@\\0%f\\0'];
  if (dir === undefined || rest.join('\n') !== form.join('\n')) {
    err('only the listing form of sbx.files.list() is supported on the wasm tier');
    return 1;
  }
  const p = posix.resolve(io.cwd, dir);
  let names: string[];
  try {
    if (!io.fs.isDir(io.fs.stat(p).mode)) throw Object.assign(new Error('Not a directory'), { errno: 54 });
    names = io.fs.readdir(p).filter((n) => n !== '.' && n !== '..');
  } catch (e) {
    err(`'${dir}': ${errText(e)}`);
    return 1;
  }
  let listing = '';
  for (const n of names) {
    const st = io.fs.lstat(posix.join(p, n));
    const type = io.fs.isLink(st.mode) ? 'l' : io.fs.isDir(st.mode) ? 'd' : io.fs.isFile(st.mode) ? 'f' : 'o';
    const mtimeMs = st.mtime instanceof Date ? st.mtime.getTime() : Number(st.mtime);
    listing += `${type}\0${st.size}\0${(st.mode & 0o7777).toString(8)}\0${mtimeMs / 1000}\0${n}\0`;
  }
  io.emit(1, enc.encode(listing));
  return 0;
}
