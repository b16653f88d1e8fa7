// The light data flow the language analysers share: what an expression is known to be (its text
// where it folds to a constant, with unknown parts marked), where its data came from (taints), and
// what module or function it names (aliases). Scopes are ignored: one cell is one scope, variables
// keep the last value assigned in source order, which over-approximates taint within the cell.
import type { Node } from 'web-tree-sitter';
import type { CodeSeverity } from '../../core/code.js';
import type { CodeRuleId } from './rules.js';

/** Stands for a part of a string that is not known statically. */
export const UNKNOWN = '\u0000';

/** Where a value's data came from. */
export type Taint =
  | 'network' // a response body, a socket read
  | 'file' // a file read, stdin
  | 'env' // an environment variable
  | 'input' // input(), argv, a request parameter
  | 'decoded' // base64/hex/zlib/rot13/marshal/URI decoding
  | 'charcode' // built from chr()/String.fromCharCode
  | 'envdump' // the whole environment (os.environ, process.env)
  | 'libc'; // a handle on libc (ctypes.CDLL, cffi dlopen)

/** What the analysis knows about one expression. */
export interface Val {
  /** Folded text, with UNKNOWN where a part is not constant. */
  readonly text: string;
  /** True when the whole value is a constant (a literal or literals joined). */
  readonly literal: boolean;
  readonly taint: ReadonlySet<Taint>;
  /** The qualified name this value refers to: `os`, `subprocess.run`, `child_process.exec`. */
  readonly ref?: string;
  /** True when `ref` was reached through a computed name (getattr, globals()[...], obj['ev'+'al']). */
  readonly hidden?: boolean;
  /** Elements of a list/array literal (for argv lists). */
  readonly items?: readonly Val[];
  /** For an object/dict literal: its properties by folded key. */
  readonly props?: ReadonlyMap<string, Val>;
}

const NONE: ReadonlySet<Taint> = new Set();

/** An unknown value with no taint. */
export const UNKNOWN_VAL: Val = { text: UNKNOWN, literal: false, taint: NONE };

/** A constant string. */
export function lit(text: string): Val {
  return { text, literal: true, taint: NONE };
}

/** Union of taints (the result shares no set with its inputs). */
export function taints(...vals: readonly (Val | undefined)[]): Set<Taint> {
  const out = new Set<Taint>();
  for (const v of vals) for (const t of v?.taint ?? NONE) out.add(t);
  return out;
}

/** Several values joined into one string (concatenation, f-string, template, path join). */
export function join(parts: readonly Val[], sep = ''): Val {
  return {
    text: parts.map((p) => p.text).join(sep),
    literal: parts.every((p) => p.literal),
    taint: taints(...parts),
  };
}

/** An unknown value carrying the taint of `from` (the result of a call on tainted data). */
export function carry(...from: readonly (Val | undefined)[]): Val {
  return { text: UNKNOWN, literal: false, taint: taints(...from) };
}

/** `v` with extra taints. */
export function withTaint(v: Val, ...add: Taint[]): Val {
  const t = taints(v);
  for (const a of add) t.add(a);
  return { ...v, taint: t };
}

/** True when `v` carries any of `ts`. */
export function has(v: Val | undefined, ...ts: Taint[]): boolean {
  return v !== undefined && ts.some((t) => v.taint.has(t));
}

/** What one finding of a language analyser says (index.ts turns it into a CodeFinding). */
export interface Hit {
  readonly rule: CodeRuleId;
  readonly node: Node;
  /** Overrides the rule's default severity. */
  readonly severity?: CodeSeverity;
}

/** What the analysers report to, and the shell analysis they hand literal command strings to. */
export interface Sink {
  report(rule: CodeRuleId, node: Node, severity?: CodeSeverity): void;
  /** Analyse a literal shell command string found at `node` (reported at `node`). */
  shell(command: string, node: Node): void;
  /** Analyse a literal string of code in the host's own language (exec("…"), eval('…')) found at `node`. */
  code(source: string, node: Node): void;
  /** Analyse an argv (null for a non-literal element) found at `node` as one command. */
  argv(argv: readonly (string | null)[], node: Node): void;
}

/** A variable environment: the last value assigned to each name. */
export class Env {
  private readonly vars = new Map<string, Val>();
  get(name: string): Val | undefined {
    return this.vars.get(name);
  }
  set(name: string, v: Val): void {
    this.vars.set(name, v);
  }
}

/** The named children of `node` (never null entries). */
export function kids(node: Node): Node[] {
  return node.namedChildren.filter((c): c is Node => c !== null);
}
