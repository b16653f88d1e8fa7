// What an executable allowlist root must hold: the listed programs, every symlink on the way to them,
// the closure the dynamic loader would load (PT_INTERP, DT_NEEDED resolved as glibc's ld.so does),
// the interpreters of scripts, and the data files of known runtimes. Pure planning over a SourceRoot:
// reads the source, writes nothing (closure-write.privileged.ts does that).
//
// Library search, per needing object, in ld.so's order (LD_LIBRARY_PATH is ignored: a sandbox's
// environment must not change what exists in its root):
//   1. DT_RPATH of the object and then of each object that loaded it, up to the executable — only
//      when the object has no DT_RUNPATH (and each RPATH only from objects without one);
//   2. DT_RUNPATH of the object;
//   3. /etc/ld.so.cache of the source root, then the default dirs — unless the object is DF_1_NODEFLIB.
// $ORIGIN is the executable's real dir, or the dir a library was found in; $LIB and $PLATFORM expand
// to this root's multiarch lib dir and x86_64. A candidate that is not an x86-64 ELF is skipped, as
// the loader does. A name already loaded (by name or DT_SONAME) in this program is not searched again.
import { posix } from 'node:path';
import { AirlockError } from '../core/errors.js';
import { isLoadableElf, readElf, readHead, sniffKind, type ElfInfo } from './elf.js';
import { parseLdCache } from './ldcache.js';
import { excludedName, runtimeDataFor, type RuntimeData } from './runtimes.js';
import { SourceRoot, type Resolved, type RootEntry } from './source-root.js';

/** The PATH searched inside the source root when the caller gives none (Debian's default for root). */
export const DEFAULT_SEARCH_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** The loader's default dirs after ld.so.cache (Debian multiarch first, then the RPM-style lib64). */
export const DEFAULT_LIB_DIRS = [
  '/lib/x86_64-linux-gnu',
  '/usr/lib/x86_64-linux-gnu',
  '/lib64',
  '/usr/lib64',
  '/lib',
  '/usr/lib',
];
/** Mount points every root gets (empty): the sandbox mounts /dev, /proc, /sys and a /tmp of its own. */
export const MOUNT_POINTS = ['/dev', '/proc', '/sys', '/tmp'];
/** As the kernel (binfmt_script): at most this many nested `#!` interpreters. */
const MAX_SCRIPT_DEPTH = 4;
/** The kernel reads at most this much of a `#!` line. */
const SHEBANG_BYTES = 256;

export type PlanType = 'file' | 'dir' | 'symlink';

export interface PlanItem {
  readonly type: PlanType;
  readonly src: RootEntry;
  /** Symlinks: the link text, kept as in the source. */
  readonly target?: string;
  readonly why: Set<string>;
}

/** A library an ELF inside a data tree needs that the source does not have (not fatal: see docs). */
export interface MissingLibrary {
  readonly library: string;
  readonly neededBy: string;
}

interface Obj {
  readonly path: string;
  readonly info: ElfInfo;
  /** $ORIGIN: the executable's real dir, or the dir a library was found in. */
  readonly origin: string;
  readonly loader: Obj | undefined;
}

export class ClosurePlanner {
  readonly items = new Map<string, PlanItem>();
  readonly missing: MissingLibrary[] = [];
  readonly runtimes = new Map<string, RuntimeData>();
  private readonly elfs = new Map<string, ElfInfo>();
  private readonly analyzed = new Set<string>();
  private cache: Map<string, string> | undefined;
  private libDir: string | undefined;

  constructor(
    readonly root: SourceRoot,
    readonly searchPath: string,
    private readonly checkpoint: () => void,
  ) {}

  // ---- recording --------------------------------------------------------------------------------

  private add(entry: RootEntry, type: PlanType, why: string, target?: string): void {
    const have = this.items.get(entry.path);
    if (have) {
      have.why.add(why);
      return;
    }
    this.items.set(entry.path, {
      type,
      src: entry,
      why: new Set([why]),
      ...(target === undefined ? {} : { target }),
    });
    this.addParents(entry.path);
  }

  private addParents(path: string): void {
    for (let p = posix.dirname(path); ; p = posix.dirname(p)) {
      if (this.items.has(p)) return;
      const e = p === '/' ? this.root.resolve('/')?.entry : this.root.entry(p);
      if (!e) throw new AirlockError('INTERNAL', `parent ${p} of a resolved path vanished`);
      this.items.set(p, { type: 'dir', src: e, why: new Set() });
      if (p === '/') return;
    }
  }

  /** Records a resolved path: each link on the way, then what it ends at (a file or a dir). */
  private addResolved(r: Resolved, why: string): void {
    for (const l of r.links) {
      const e = this.root.entry(l.path);
      if (e) this.add(e, 'symlink', `link on the way to ${r.entry.path}`, l.target);
    }
    this.add(r.entry, r.entry.stat.isDirectory() ? 'dir' : 'file', why);
  }

  /**
   * Empty dirs where a sandbox mounts its own filesystems (bwrap cannot create a mount point in a
   * read-only root). They take the mode and owner of the source's root dir; nothing from the source
   * is copied into them.
   */
  addMountPoints(): void {
    const top = this.root.resolve('/')!.entry;
    for (const p of MOUNT_POINTS) {
      const have = this.items.get(p);
      if (have) have.why.add('mount point');
      else this.items.set(p, { type: 'dir', src: { ...top, path: p }, why: new Set(['mount point']) });
    }
  }

  /**
   * Top-level links of a merged-/usr source (/bin -> usr/bin, /lib64 -> usr/lib64, …) whose target
   * dir is already in the root: a `#!/bin/sh`-style path written later inside the sandbox then finds
   * what the root holds. Links to dirs not in the root are not added.
   */
  addRootLinks(): void {
    for (const name of this.root.readdir('/')) {
      const e = this.root.entry(`/${name}`);
      if (!e || !e.stat.isSymbolicLink() || this.items.has(e.path)) continue;
      const t = this.root.resolve(e.path);
      if (t && t.entry.stat.isDirectory() && this.items.has(t.entry.path))
        this.add(e, 'symlink', 'top-level link', this.root.readlink(e));
    }
  }

  // ---- executables ------------------------------------------------------------------------------

  /** Finds a program: an absolute path as is, a bare name on the search PATH (regular, executable). */
  findExecutable(name: string): Resolved {
    if (name.includes('/')) {
      const r = name.startsWith('/') ? this.root.resolve(name) : undefined;
      if (r && r.entry.stat.isFile() && (r.entry.stat.mode & 0o111) === 0)
        throw new AirlockError(
          'EXECUTABLE_INVALID',
          `${name}: not executable (no x bit) in ${this.root.describe()}`,
        );
      if (r && r.entry.stat.isFile()) return r;
      throw new AirlockError('EXECUTABLE_NOT_FOUND', `${name}: no such file in ${this.root.describe()}`);
    }
    for (const dir of this.searchPath.split(':')) {
      if (!dir.startsWith('/')) continue; // an empty or relative PATH entry means the cwd: never here
      const r = this.root.resolve(`${dir}/${name}`);
      if (r && r.entry.stat.isFile() && (r.entry.stat.mode & 0o111) !== 0) return r;
    }
    throw new AirlockError(
      'EXECUTABLE_NOT_FOUND',
      `${name}: not found on PATH ${this.searchPath} in ${this.root.describe()} (list its absolute path, or check the name)`,
    );
  }

  /** Adds a listed program and everything it needs to run. */
  addExecutable(name: string): void {
    const r = this.findExecutable(name);
    this.addResolved(r, 'executable');
    this.analyze(r.entry, 0, true);
  }

  /** What a program needs: its ELF closure, or its `#!` interpreter's; then its runtime's data. */
  private analyze(entry: RootEntry, depth: number, strict: boolean): void {
    if (this.analyzed.has(entry.path)) return;
    this.analyzed.add(entry.path);
    this.checkpoint();
    const head = readHead(entry.hostPath, SHEBANG_BYTES, entry.path);
    const kind = sniffKind(head);
    if (kind === 'elf') this.elfClosure(entry, strict);
    else if (kind === 'script') this.script(entry, head, depth, strict);
    else
      throw new AirlockError(
        'EXECUTABLE_INVALID',
        `${entry.path}: not an ELF executable and not a #! script, so it cannot be executed`,
      );
    const data = runtimeDataFor(posix.basename(entry.path));
    if (data && !this.runtimes.has(data.runtime)) {
      this.runtimes.set(data.runtime, data);
      for (const p of data.paths) this.addTree(p, `data of ${data.runtime}`, data.exclude, false);
    }
  }

  private script(entry: RootEntry, head: Buffer, depth: number, strict: boolean): void {
    if (depth >= MAX_SCRIPT_DEPTH)
      throw new AirlockError(
        'EXECUTABLE_INVALID',
        `${entry.path}: more than ${MAX_SCRIPT_DEPTH} nested #! interpreters`,
      );
    const nl = head.indexOf(0x0a);
    const line = head
      .toString('utf8', 2, nl < 0 ? head.length : nl)
      .replace(/[ \t]+$/, '')
      .replace(/^[ \t]+/, '');
    // As binfmt_script: the interpreter is the first word; the rest is ONE argument.
    const cut = line.search(/[ \t]/);
    const interp = cut < 0 ? line : line.slice(0, cut);
    const arg = cut < 0 ? '' : line.slice(cut).trim();
    if (!interp.startsWith('/'))
      throw new AirlockError(
        'EXECUTABLE_INVALID',
        `${entry.path}: the #! interpreter "${interp}" is not an absolute path`,
      );
    const r = this.root.resolve(interp);
    if (!r || !r.entry.stat.isFile())
      throw new AirlockError(
        'EXECUTABLE_NOT_FOUND',
        `${interp}, the #! interpreter of ${entry.path}, is not in ${this.root.describe()}`,
      );
    this.addResolved(r, `interpreter of ${entry.path}`);
    this.analyze(r.entry, depth + 1, strict);
    if (posix.basename(interp) !== 'env' && posix.basename(r.entry.path) !== 'env') return;
    const command = envCommand(arg);
    if (command === undefined) return;
    const target = this.findExecutable(command);
    this.addResolved(target, `run by env for ${entry.path}`);
    this.analyze(target.entry, depth + 1, strict);
  }

  // ---- ELF closure ------------------------------------------------------------------------------

  private elf(entry: RootEntry): ElfInfo {
    let info = this.elfs.get(entry.path);
    if (!info) {
      info = readElf(entry.hostPath, entry.path);
      this.elfs.set(entry.path, info);
    }
    return info;
  }

  /** The program's interpreter and the libraries it loads, breadth first, as the loader loads them. */
  private elfClosure(entry: RootEntry, strict: boolean): void {
    const info = this.elf(entry);
    if (info.interpreter !== undefined) {
      const r = this.root.resolve(info.interpreter);
      if (!r || !r.entry.stat.isFile()) {
        if (!strict) return void this.missing.push({ library: info.interpreter, neededBy: entry.path });
        throw new AirlockError(
          'LIBRARY_NOT_FOUND',
          `${info.interpreter}, the program interpreter of ${entry.path}, is not in ${this.root.describe()}`,
        );
      }
      this.addResolved(r, `interpreter of ${entry.path}`);
      this.elf(r.entry); // the loader itself must be a valid ELF too
    }
    const main: Obj = { path: entry.path, info, origin: posix.dirname(entry.path), loader: undefined };
    const loaded = new Set<string>([entry.path]);
    const names = new Set<string>(info.soname ? [info.soname] : []);
    const queue: Obj[] = [main];
    for (let i = 0; i < queue.length; i++) {
      const obj = queue[i]!;
      for (const name of obj.info.needed) {
        if (names.has(name)) continue;
        this.checkpoint();
        const found = this.findLibrary(name, obj);
        if (!found) {
          if (!strict) {
            this.missing.push({ library: name, neededBy: obj.path });
            continue;
          }
          throw new AirlockError(
            'LIBRARY_NOT_FOUND',
            `${name}, needed by ${obj.path}${obj === main ? '' : ` (loaded for ${entry.path})`}, is not in ${this.root.describe()} ` +
              `(searched its RPATH/RUNPATH, /etc/ld.so.cache and ${DEFAULT_LIB_DIRS.join(', ')})`,
          );
        }
        names.add(name);
        this.addResolved(found.r, `needed by ${obj.path}`);
        const lib = found.r.entry;
        if (loaded.has(lib.path)) continue;
        loaded.add(lib.path);
        const libInfo = this.elf(lib);
        if (libInfo.soname) names.add(libInfo.soname);
        queue.push({ path: lib.path, info: libInfo, origin: posix.dirname(found.at), loader: obj });
      }
    }
  }

  private findLibrary(name: string, obj: Obj): { r: Resolved; at: string } | undefined {
    if (name.includes('/')) return name.startsWith('/') ? this.candidate(name) : undefined;
    const dirs: string[] = [];
    if (!obj.info.runpath)
      for (let o: Obj | undefined = obj; o; o = o.loader)
        if (!o.info.runpath && o.info.rpath) dirs.push(...this.expand(o.info.rpath, o));
    if (obj.info.runpath) dirs.push(...this.expand(obj.info.runpath, obj));
    for (const d of dirs) {
      const c = this.candidate(`${d}/${name}`);
      if (c) return c;
    }
    if (obj.info.noDefaultLib) return undefined;
    const cached = this.ldCache().get(name);
    if (cached) {
      const c = this.candidate(cached);
      if (c) return c;
    }
    for (const d of DEFAULT_LIB_DIRS) {
      const c = this.candidate(`${d}/${name}`);
      if (c) return c;
    }
    return undefined;
  }

  private candidate(path: string): { r: Resolved; at: string } | undefined {
    const r = this.root.resolve(path);
    if (!r || !r.entry.stat.isFile() || !isLoadableElf(r.entry.hostPath)) return undefined;
    return { r, at: posix.normalize(path) };
  }

  /** RPATH/RUNPATH entries with $ORIGIN, $LIB and $PLATFORM expanded; relative ones dropped (cwd-relative). */
  private expand(entries: readonly string[], obj: Obj): string[] {
    const lib = this.multiarchLib();
    return entries
      .map((e) =>
        e
          .replace(/\$(\{ORIGIN\}|ORIGIN)/g, obj.origin)
          .replace(/\$(\{LIB\}|LIB)/g, lib)
          .replace(/\$(\{PLATFORM\}|PLATFORM)/g, 'x86_64'),
      )
      .filter((e) => e.startsWith('/'));
  }

  private multiarchLib(): string {
    if (this.libDir === undefined) {
      const r = this.root.resolve('/lib/x86_64-linux-gnu');
      this.libDir = r && r.entry.stat.isDirectory() ? 'lib/x86_64-linux-gnu' : 'lib64';
    }
    return this.libDir;
  }

  private ldCache(): Map<string, string> {
    if (!this.cache) {
      const r = this.root.resolve('/etc/ld.so.cache');
      this.cache = new Map();
      if (r && r.entry.stat.isFile()) {
        const size = Math.min(r.entry.stat.size, 64 << 20);
        this.cache = parseLdCache(readHead(r.entry.hostPath, size, '/etc/ld.so.cache'));
      }
    }
    return this.cache;
  }

  // ---- data trees and extra paths ---------------------------------------------------------------

  /** Adds an extra path the caller listed: a file (with its closure when it is an ELF) or a whole dir. */
  addExtra(path: string): void {
    const r = path.startsWith('/') ? this.root.resolve(path) : undefined;
    if (!r)
      throw new AirlockError('FILE_NOT_FOUND', `extra path ${path} is not in ${this.root.describe()}`, {
        field: 'extraPaths',
      });
    if (r.entry.stat.isDirectory()) return this.addTree(path, 'extra path', [], false);
    this.addResolved(r, 'extra path');
    if (r.entry.stat.isFile() && sniffKind(readHead(r.entry.hostPath, 4, path)) === 'elf')
      this.elfClosure(r.entry, true);
  }

  /**
   * Adds a directory tree (absent: skipped). Links inside it are kept as links; a link to a file is
   * followed so its target is there too; a link to a dir outside the tree is kept but not followed.
   * Shared objects inside (*.so*) get their library closure, leniently: a library the source lacks is
   * recorded in `missing` (that module fails to import in the source root too) instead of failing.
   */
  addTree(path: string, why: string, exclude: readonly string[], strict: boolean): void {
    const r = this.root.resolve(path);
    if (!r || !r.entry.stat.isDirectory()) return;
    this.addResolved(r, why);
    const top = r.entry.path;
    const walk = (dir: string): void => {
      this.checkpoint();
      for (const name of this.root.readdir(dir)) {
        if (excludedName(name, exclude)) continue;
        const p = dir === '/' ? `/${name}` : `${dir}/${name}`;
        const e = this.root.entry(p);
        if (!e) continue;
        if (e.stat.isDirectory()) {
          this.add(e, 'dir', why);
          walk(p);
        } else if (e.stat.isFile()) {
          this.add(e, 'file', why);
          if (/\.so(\.|$)/.test(name) && sniffKind(readHead(e.hostPath, 4, p)) === 'elf')
            this.elfClosure(e, strict);
        } else if (e.stat.isSymbolicLink()) {
          this.add(e, 'symlink', why, this.root.readlink(e));
          // A link to a file: the file too. A link to a dir outside the tree is kept, not followed.
          const t = this.root.resolve(p);
          if (t && t.entry.stat.isFile()) this.addResolved(t, why);
        }
        // fifos, sockets and devices are never part of a closure
      }
    };
    walk(top);
  }
}

/**
 * The command `env` runs for a `#!/usr/bin/env ARG` line: options and NAME=value assignments are
 * skipped; `-S`/`--split-string` splits the rest into words (the common `env -S python3 -u`).
 */
export function envCommand(arg: string): string | undefined {
  const words = arg.split(/[ \t]+/).filter((w) => w !== '');
  for (let i = 0; i < words.length; i++) {
    const w = words[i]!;
    if (w === '-S' || w === '--split-string' || w === '-i' || w === '-' || w === '--ignore-environment')
      continue;
    if (w.startsWith('-S')) return words[i]!.slice(2) || undefined;
    if (w === '-u' || w === '--unset' || w === '-C' || w === '--chdir') {
      i++;
      continue;
    }
    if (w.startsWith('-')) continue;
    if (/^[A-Za-z_][A-Za-z0-9_]*=/.test(w)) continue;
    return w;
  }
  return undefined;
}
