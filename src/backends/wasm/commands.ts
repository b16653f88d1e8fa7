// What an exec on the WASM tier runs, from its argv (pure; tested in test/wasm/commands.test.ts).
// There is no shell and there are no programs: python-like argv runs in Pyodide, node-like argv in
// QuickJS, a handful of builtins (echo, true, false, sleep, cat, pwd, and what sbx.files sends) run
// in the worker, anything else exits 127 with one line. The sandbox facade wraps commands for the
// shell-based tiers; those wrappings are undone here:
// - an argv array arrives as `/bin/sh -c <check> airlock-exec ARGV…` (src/sandbox/exec-check.ts):
//   the check is what this file does itself, so ARGV is taken as is;
// - a string command arrives as `/bin/sh -c STRING`: it is split into words like a shell would
//   (quotes and backslashes), and anything that needs a real shell (`;`, `|`, `$`, redirections,
//   globs, …) is refused with one line, never half-interpreted.

export type Command =
  | { readonly kind: 'python'; readonly code?: string; readonly path?: string; readonly argv: string[] }
  | { readonly kind: 'javascript'; readonly code?: string; readonly path?: string; readonly argv: string[] }
  | { readonly kind: 'builtin'; readonly argv: string[] }
  | { readonly kind: 'refuse'; readonly exitCode: number; readonly message: string };

/** The line every command the tier cannot run gets (with the command's name before it). */
export const NOT_RUNNABLE = 'wasm tier runs only python and node-like commands';

/** src/sandbox/files.ts's write command (kept byte-equal; test/wasm/files.test.ts catches a drift). */
export const FILES_WRITE_SCRIPT = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"';

export const BUILTINS = new Set(['echo', 'true', 'false', 'sleep', 'cat', 'pwd', 'test', 'rm', 'find']);
const PYTHON = /^python(3(\.\d+)?)?$/;
const NODE = new Set(['node', 'nodejs', 'js', 'qjs']);
/** Interpreter flags that change nothing here (buffering, isolation: the sandbox is isolated anyway). */
const PY_NOOP_FLAGS = new Set(['-u', '-B', '-I', '-E', '-s', '-S', '-q']);

const SHELL = new Set(['/bin/sh', 'sh', '/bin/bash', 'bash', '/usr/bin/sh', '/usr/bin/bash']);

export function commandOf(argv: readonly string[]): Command {
  const inner = unwrap(argv);
  if ('kind' in inner) return inner;
  const [cmd, ...rest] = inner.argv;
  const name = cmd!.slice(cmd!.lastIndexOf('/') + 1);
  if (PYTHON.test(name)) return python(rest);
  if (NODE.has(name)) return javascript(rest);
  if (BUILTINS.has(name)) return { kind: 'builtin', argv: [name, ...rest] };
  return refuse(name);
}

function refuse(name: string, why = ''): Command {
  return { kind: 'refuse', exitCode: 127, message: `airlock: ${name}: ${why}${NOT_RUNNABLE}` };
}

function unwrap(argv: readonly string[]): { argv: string[] } | Command {
  if (argv.length === 0) return refuse('(empty)');
  if (SHELL.has(argv[0]!) && argv[1] === '-c' && argv[2] !== undefined) {
    const script = argv[2];
    if (argv[3] === 'airlock-exec' && script.endsWith('exec "$@"') && argv.length > 4) {
      return { argv: argv.slice(4) };
    }
    if (script === FILES_WRITE_SCRIPT && argv.length === 5)
      return { kind: 'builtin', argv: ['airlock-write', argv[4]!] };
    if (argv.length === 3) {
      const words = shellWords(script);
      if (typeof words === 'string') return refuse('sh', `no shell (${words}): `);
      if (words.length === 0) return { kind: 'builtin', argv: ['true'] };
      return { argv: words };
    }
    return refuse('sh', 'no shell: ');
  }
  return { argv: [...argv] };
}

function python(args: string[]): Command {
  let i = 0;
  while (i < args.length && PY_NOOP_FLAGS.has(args[i]!)) i++;
  const a = args.slice(i);
  if (a[0] === '-c') {
    if (a[1] === undefined)
      return { kind: 'refuse', exitCode: 2, message: 'python: argument expected for the -c option' };
    return { kind: 'python', code: a[1], argv: ['-c', ...a.slice(2)] };
  }
  if (a[0] === undefined || a[0] === '-')
    return { kind: 'python', path: '/dev/stdin', argv: ['-', ...a.slice(1)] };
  if (a[0].startsWith('-'))
    return {
      kind: 'refuse',
      exitCode: 2,
      message: `python: option ${a[0]} is not supported on the wasm tier`,
    };
  return { kind: 'python', path: a[0], argv: a };
}

function javascript(args: string[]): Command {
  const a = args;
  if (a[0] === '-e' || a[0] === '--eval') {
    if (a[1] === undefined)
      return { kind: 'refuse', exitCode: 9, message: `node: ${a[0]} requires an argument` };
    return { kind: 'javascript', code: a[1], argv: a.slice(2) };
  }
  if (a[0] === undefined || a[0] === '-') return { kind: 'javascript', path: '/dev/stdin', argv: a.slice(1) };
  if (a[0].startsWith('-'))
    return { kind: 'refuse', exitCode: 9, message: `node: option ${a[0]} is not supported on the wasm tier` };
  return { kind: 'javascript', path: a[0], argv: a.slice(1) };
}

/**
 * A shell string → its words (quotes and backslashes as sh reads them), or, when it needs a real
 * shell, a short description of the first thing that does.
 */
export function shellWords(s: string): string[] | string {
  const words: string[] = [];
  let cur = '';
  let inWord = false;
  for (let i = 0; i < s.length; i++) {
    const c = s[i]!;
    if (c === ' ' || c === '\t') {
      if (inWord) words.push(cur);
      cur = '';
      inWord = false;
      continue;
    }
    if (c === "'") {
      const end = s.indexOf("'", i + 1);
      if (end < 0) return 'an unterminated quote';
      cur += s.slice(i + 1, end);
      i = end;
      inWord = true;
      continue;
    }
    if (c === '"') {
      let j = i + 1;
      for (; j < s.length && s[j] !== '"'; j++) {
        const d = s[j]!;
        if (d === '$' || d === '`') return `\`${d}\` expansion`;
        if (d === '\\' && '"\\$`\n'.includes(s[j + 1] ?? '')) {
          cur += s[++j];
          continue;
        }
        cur += d;
      }
      if (j >= s.length) return 'an unterminated quote';
      i = j;
      inWord = true;
      continue;
    }
    if (c === '\\') {
      if (i + 1 >= s.length) return 'a trailing backslash';
      cur += s[++i];
      inWord = true;
      continue;
    }
    if (c === '\n') return 'a second line';
    if (';&|<>()$`*?[]{}~'.includes(c) || (c === '#' && !inWord)) {
      return `\`${c}\``;
    }
    cur += c;
    inWord = true;
  }
  if (inWord) words.push(cur);
  // `NAME=value cmd` is a shell assignment.
  if (words.length && /^[A-Za-z_][A-Za-z0-9_]*=/.test(words[0]!)) return 'a variable assignment';
  return words;
}
