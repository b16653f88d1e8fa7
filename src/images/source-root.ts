// The root filesystem an allowlist is built from, seen the way a sandbox on it would see it, without
// mounting anything: either the host root (`['/']`) or a stack of unpacked layers in overlayfs format
// (bottom first). A path is looked up in the merged view (the top layer wins; a whiteout, char device
// 0/0, deletes the name; an opaque directory, xattr trusted.overlay.opaque=y, hides every lower copy),
// and symlinks are followed INSIDE the root: an absolute target starts again at the root, never at the
// host's /, and a target that climbs above the root with `..` is refused, as is a loop.
import { lstatSync, readdirSync, readlinkSync, type Stats } from 'node:fs';
import { AirlockError } from '../core/errors.js';
import { isOpaqueDir } from './opaque.privileged.js';

/** As the kernel's MAXSYMLINKS: more links than this while resolving one path is a loop. */
export const MAX_LINKS = 40;

/** One visible entry of the merged view. */
export interface RootEntry {
  /** Absolute path inside the root, with no symlink in its parents (canonical). */
  readonly path: string;
  /** Where the entry's bytes are on the host (in its topmost layer). */
  readonly hostPath: string;
  readonly stat: Stats;
}

/** A symlink met while resolving a path: `path` is canonical, `target` is the link's text. */
export interface RootLink {
  readonly path: string;
  readonly target: string;
}

export interface Resolved {
  readonly entry: RootEntry;
  /** Every link followed on the way, in order (the result must hold the same names). */
  readonly links: readonly RootLink[];
}

const isWhiteout = (st: Stats): boolean => st.isCharacterDevice() && st.rdev === 0;

export function splitPath(p: string): string[] {
  return p.split('/').filter((c) => c !== '' && c !== '.');
}

export class SourceRoot {
  private readonly layers: readonly string[];
  /** Layers (indexes, top first) in which a canonical directory takes part in the merge. */
  private readonly stacks = new Map<string, number[]>();
  private readonly entries = new Map<string, RootEntry | null>();

  /** `layers`: absolute host dirs, bottom first (the ImageResolver's order); `['/']` is the host root. */
  constructor(layers: readonly string[]) {
    this.layers = layers.map((l) => (l === '/' ? '' : l.replace(/\/+$/, '')));
    this.stacks.set('/', this.layers.map((_, i) => i).reverse());
  }

  /** A human name for the source, for error messages. */
  describe(): string {
    return this.layers.length === 1 && this.layers[0] === ''
      ? 'the host root'
      : `the layers ${this.layers.join(', ')}`;
  }

  private host(layer: number, path: string): string {
    return (this.layers[layer] ?? '') + path;
  }

  /** The merged entry at a canonical path (no symlinks among its parents), or undefined if absent. */
  entry(path: string): RootEntry | undefined {
    if (path === '/') return this.rootEntry();
    const cached = this.entries.get(path);
    if (cached !== undefined) return cached ?? undefined;
    const cut = path.lastIndexOf('/');
    const parent = cut === 0 ? '/' : path.slice(0, cut);
    const stack = this.stackOf(parent);
    let found: RootEntry | undefined;
    for (const li of stack ?? []) {
      const hp = this.host(li, path);
      const st = lstatSync(hp, { throwIfNoEntry: false });
      if (!st) continue;
      if (!isWhiteout(st)) found = { path, hostPath: hp, stat: st };
      break;
    }
    this.entries.set(path, found ?? null);
    return found;
  }

  private rootEntry(): RootEntry {
    const top = this.layers.length - 1;
    const hp = this.host(top, '/');
    return { path: '/', hostPath: hp, stat: lstatSync(hp) };
  }

  /** The layers in which the directory `dir` (canonical) is merged, top first; undefined if not a dir. */
  private stackOf(dir: string): number[] | undefined {
    const known = this.stacks.get(dir);
    if (known) return known;
    const e = this.entry(dir);
    if (!e || !e.stat.isDirectory()) return undefined;
    const cut = dir.lastIndexOf('/');
    const parentStack = this.stackOf(cut === 0 ? '/' : dir.slice(0, cut)) ?? [];
    const stack: number[] = [];
    let started = false;
    for (const li of parentStack) {
      const hp = this.host(li, dir);
      if (!started) {
        if (hp !== e.hostPath) continue; // above the layer the entry came from: it had no such name
        started = true;
        stack.push(li);
      } else {
        const st = lstatSync(hp, { throwIfNoEntry: false });
        if (!st) continue; // this layer has no such dir: lower ones still merge
        if (!st.isDirectory()) break; // a whiteout or a non-dir ends the merge
        stack.push(li);
      }
      if (this.layers.length > 1 && isOpaqueDir(hp)) break;
    }
    this.stacks.set(dir, stack);
    return stack;
  }

  /** The text of a symlink entry. */
  readlink(entry: RootEntry): string {
    return readlinkSync(entry.hostPath);
  }

  /** The merged listing of a canonical directory, sorted (whiteouts and hidden names removed). */
  readdir(dir: string): string[] {
    const stack = this.stackOf(dir);
    if (!stack) throw new AirlockError('INVALID_ARGUMENT', `${dir} is not a directory in ${this.describe()}`);
    const names = new Set<string>();
    for (const li of stack) for (const n of readdirSync(this.host(li, dir))) names.add(n);
    const base = dir === '/' ? '' : dir;
    return [...names].filter((n) => this.entry(`${base}/${n}`) !== undefined).sort();
  }

  /**
   * Resolves an absolute path inside the root, following symlinks there (the final one too unless
   * `followFinal` is false). Returns undefined when a component does not exist or is not a directory;
   * throws ROOT_LINK_UNSAFE for a link that climbs out of the root or a loop.
   */
  resolve(path: string, followFinal = true): Resolved | undefined {
    if (!path.startsWith('/')) throw new AirlockError('INVALID_ARGUMENT', `${path} is not an absolute path`);
    const todo = splitPath(path);
    const cur: string[] = [];
    const links: RootLink[] = [];
    let via: RootLink | undefined;
    for (;;) {
      const c = todo.shift();
      if (c === undefined) break;
      if (c === '..') {
        if (cur.length === 0) {
          throw new AirlockError(
            'ROOT_LINK_UNSAFE',
            via
              ? `the symlink ${via.path} -> ${via.target} in ${this.describe()} escapes the root`
              : `${path} climbs above the root`,
          );
        }
        cur.pop();
        continue;
      }
      const p = '/' + [...cur, c].join('/');
      const e = this.entry(p);
      if (!e) return undefined;
      if (e.stat.isSymbolicLink() && (todo.length > 0 || followFinal)) {
        const target = readlinkSync(e.hostPath);
        via = { path: p, target };
        links.push(via);
        if (links.length > MAX_LINKS)
          throw new AirlockError(
            'ROOT_LINK_UNSAFE',
            `resolving ${path} in ${this.describe()} followed more than ${MAX_LINKS} symlinks (a loop at ${p} -> ${target}?)`,
          );
        if (target === '') return undefined;
        if (target.startsWith('/')) cur.length = 0; // absolute: start again at the root of the source
        todo.unshift(...target.split('/').filter((x) => x !== '' && x !== '.'));
        continue;
      }
      if (todo.length > 0 && !e.stat.isDirectory()) return undefined;
      cur.push(c);
    }
    const entry = cur.length === 0 ? this.rootEntry() : this.entry('/' + cur.join('/'));
    if (!entry) return undefined;
    return { entry, links };
  }
}
