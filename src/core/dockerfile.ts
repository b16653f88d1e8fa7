// The Dockerfile subset a template can be built from (`airlock template build -f Dockerfile`):
// FROM (one stage), RUN, COPY and ADD of local files, ENV, WORKDIR, USER, ARG, LABEL, CMD, ENTRYPOINT.
// Pure: text in, a validated build plan out; nothing here reads files or runs anything. Everything
// outside the subset is refused with INVALID_SPEC naming the line and what to write instead, so a
// Dockerfile never builds into something other than what it says.
//
// Semantics follow Docker's reference: line continuations with the escape character (`\`, or the one
// an `# escape=` directive names), comment lines removed inside continuations, exec form when the
// arguments are a JSON array of strings and shell form otherwise, `$VAR`/`${VAR}`/`${VAR:-w}`/
// `${VAR:+w}` substituted (from ARG and ENV) in FROM, COPY, ADD, ENV, WORKDIR, USER, LABEL and ARG,
// never in RUN, CMD or ENTRYPOINT (the shell sees them in its environment instead).
import { posix } from 'node:path';
import { AirlockError } from './errors.js';
import type { ImageConfig } from './image.js';

/** One build step, in file order. `env` is the ARG and ENV values in force for it. */
export type DockerStep =
  | {
      kind: 'run';
      line: number;
      command: string | string[];
      env: Record<string, string>;
      workdir: string;
      user: string;
    }
  | {
      kind: 'copy';
      line: number;
      /** ADD (local files only) rather than COPY. */
      add: boolean;
      /** Paths relative to the build context, as written (the builder resolves and confines them). */
      sources: string[];
      /** Absolute path inside the image (relative ones are resolved against WORKDIR). */
      dest: string;
      /** True when dest ends in "/" or there are several sources: copy into the directory. */
      intoDir: boolean;
      chown?: string;
      chmod?: string;
      user: string;
    };

/**
 * A parsed Dockerfile: the base, the steps, and the config the result runs with (the base image's
 * config carried through, then changed by the file's ENV, WORKDIR, USER, LABEL, CMD, ENTRYPOINT).
 */
export interface DockerfilePlan {
  /** The FROM reference after ARG substitution (`scratch` is refused: a template needs a base). */
  base: string;
  steps: DockerStep[];
  /** ENV as `KEY=value`: the base's, then the file's (a redefinition moves to the end). */
  env: string[];
  workingDir: string;
  user: string;
  labels: Record<string, string>;
  entrypoint: string[];
  cmd: string[];
}

const SUPPORTED = new Set([
  'FROM',
  'RUN',
  'COPY',
  'ADD',
  'ENV',
  'WORKDIR',
  'USER',
  'ARG',
  'LABEL',
  'CMD',
  'ENTRYPOINT',
]);
const ADVICE: Record<string, string> = {
  EXPOSE: 'remove it: a sandbox port is reached with getHost(port), no declaration needed',
  VOLUME: "remove it: /workspace is the sandbox's writable directory",
  HEALTHCHECK: 'remove it',
  ONBUILD: 'remove it',
  SHELL: 'remove it and call the shell explicitly in RUN (exec form)',
  STOPSIGNAL: 'remove it',
  MAINTAINER: 'use LABEL maintainer=…',
};
const NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
/** Docker's predefined proxy build args are not defined here: egress is the sandbox's network policy. */
const MAX_LINES = 10_000;

const fail = (line: number, message: string): never => {
  throw new AirlockError('INVALID_SPEC', `Dockerfile line ${line}: ${message}`, {
    field: `Dockerfile:${line}`,
  });
};

interface Logical {
  line: number;
  keyword: string;
  args: string;
}

/** Split into logical instructions: directives read, comments dropped, continuations joined. */
function logicalLines(text: string): { escape: string; lines: Logical[] } {
  const raw = text.replace(/\r\n?/g, '\n').split('\n');
  if (raw.length > MAX_LINES) fail(MAX_LINES, `a Dockerfile is at most ${MAX_LINES} lines`);
  let escape = '\\';
  let i = 0;
  // Parser directives: `# key=value` lines at the very top, before any comment, blank line or instruction.
  for (; i < raw.length; i++) {
    const m = /^#\s*([a-zA-Z]+)\s*=\s*(\S+)\s*$/.exec(raw[i]!);
    if (!m) break;
    const key = m[1]!.toLowerCase();
    if (key === 'escape') {
      if (m[2] !== '\\' && m[2] !== '`') fail(i + 1, 'the escape directive takes "\\" or "`"');
      escape = m[2]!;
    } else if (key !== 'syntax' && key !== 'check') break; // an ordinary comment
  }
  const out: Logical[] = [];
  let buf = '';
  let start = 0;
  for (; i < raw.length; i++) {
    const text = raw[i]!;
    const trimmed = text.trim();
    if (!buf && (trimmed === '' || trimmed.startsWith('#'))) continue;
    if (buf && trimmed.startsWith('#')) continue; // comment lines inside a continuation are removed
    if (!buf) start = i + 1;
    const cont = text.replace(/\s+$/, '');
    if (cont.endsWith(escape) && !cont.endsWith(escape + escape)) {
      buf += cont.slice(0, -1);
      continue;
    }
    buf += text;
    out.push(split(buf, start));
    buf = '';
  }
  if (buf.trim()) out.push(split(buf, start));
  return { escape, lines: out };
}

function split(text: string, line: number): Logical {
  const m = /^\s*(\S+)\s*([\s\S]*)$/.exec(text);
  if (!m) return fail(line, 'an empty instruction');
  return { line, keyword: m[1]!.toUpperCase(), args: m[2]!.trim() };
}

/** `["a","b"]` → argv; undefined for shell form (Docker treats invalid JSON as shell form too). */
function execForm(args: string): string[] | undefined {
  if (!args.startsWith('[')) return undefined;
  try {
    const v: unknown = JSON.parse(args);
    if (Array.isArray(v) && v.every((x) => typeof x === 'string')) return v as string[];
  } catch {
    /* shell form */
  }
  return undefined;
}

type Vars = Record<string, string>;

/**
 * Expand the `$…` at `s[i]`: `$X`, `${X}`, `${X:-word}`, `${X:+word}` (word expanded in turn).
 * Returns the text and the index of the last character consumed.
 */
function expand(
  s: string,
  i: number,
  vars: Vars,
  escape: string,
  line: number,
): { text: string; end: number } {
  if (s[i + 1] === '{') {
    const end = s.indexOf('}', i + 2);
    if (end < 0) fail(line, 'an unterminated ${…}');
    const body = s.slice(i + 2, end);
    const m = /^([A-Za-z_][A-Za-z0-9_]*)(?:(:[-+])([\s\S]*))?$/.exec(body);
    if (!m) {
      fail(
        line,
        `unsupported substitution \${${body}}: use $NAME, \${NAME}, \${NAME:-default} or \${NAME:+alt}`,
      );
    }
    const [, name, op, word = ''] = m!;
    const v = vars[name!];
    const w = (): string => lex(word, vars, escape, line, false).join('');
    const text = op === ':-' ? (v ? v : w()) : op === ':+' ? (v ? w() : '') : (v ?? '');
    return { text, end };
  }
  const m = /^[A-Za-z_][A-Za-z0-9_]*/.exec(s.slice(i + 1));
  if (!m) return { text: '$', end: i };
  return { text: vars[m[0]] ?? '', end: i + m[0].length };
}

/** Substitution only (exec-form arguments): the escape character makes `$` literal. */
function substitute(s: string, vars: Vars, escape: string, line: number): string {
  let out = '';
  for (let i = 0; i < s.length; i++) {
    const c = s[i]!;
    if (c === escape && s[i + 1] === '$') {
      out += '$';
      i++;
    } else if (c === '$') {
      const r = expand(s, i, vars, escape, line);
      out += r.text;
      i = r.end;
    } else out += c;
  }
  return out;
}

/**
 * Docker's word processing in one pass: quotes group and are removed, single quotes stop
 * substitution, the escape character escapes (inside double quotes only before `"`, `$` or itself),
 * `$…` is expanded when `vars` is given (an expanded value is never split again). `split`: whitespace
 * outside quotes separates words.
 */
function lex(s: string, vars: Vars | undefined, escape: string, line: number, split = true): string[] {
  const out: string[] = [];
  let cur = '';
  let has = false;
  let quote = '';
  for (let i = 0; i < s.length; i++) {
    const c = s[i]!;
    if (quote === "'") {
      if (c === "'") quote = '';
      else cur += c;
    } else if (c === escape && i + 1 < s.length) {
      const n = s[i + 1]!;
      if (quote === '"' && n !== '"' && n !== '$' && n !== escape) cur += c;
      else {
        cur += n;
        i++;
      }
      has = true;
    } else if (c === '$' && vars) {
      const r = expand(s, i, vars, escape, line);
      cur += r.text;
      i = r.end;
      has = true;
    } else if (quote === '"') {
      if (c === '"') quote = '';
      else cur += c;
    } else if (c === '"' || c === "'") {
      quote = c;
      has = true;
    } else if (split && /\s/.test(c)) {
      if (has) out.push(cur);
      cur = '';
      has = false;
    } else {
      cur += c;
      has = true;
    }
  }
  if (quote) fail(line, `an unterminated ${quote} quote`);
  if (has) out.push(split ? cur : cur.trim());
  return out;
}

/** `k=v k2="v 2"` (or the legacy `ENV k value…` form) → pairs. */
function pairs(kw: string, args: string, vars: Vars, escape: string, line: number): [string, string][] {
  const raw = lex(args, undefined, escape, line);
  if (!raw.length) fail(line, `${kw} needs at least one name=value`);
  if (!raw[0]!.includes('=')) {
    if (kw !== 'ENV' || raw.length < 2) fail(line, `${kw} takes name=value pairs`);
    // Legacy form: everything after the name is the value.
    const rest = args.replace(/^\S+\s+/, '');
    return [[checkName(raw[0]!, kw, line), lex(rest, vars, escape, line, false).join('')]];
  }
  return lex(args, vars, escape, line).map((p) => {
    const eq = p.indexOf('=');
    if (eq <= 0) fail(line, `${kw} takes name=value pairs, got "${p}"`);
    const name = kw === 'LABEL' ? p.slice(0, eq) : checkName(p.slice(0, eq), kw, line);
    return [name, p.slice(eq + 1)] as [string, string];
  });
}

function checkName(name: string, kw: string, line: number): string {
  if (!NAME_RE.test(name))
    fail(line, `${kw} name "${name}" must be letters, digits and _, not starting with a digit`);
  return name;
}

const abs = (p: string, workdir: string): string =>
  posix.normalize(p.startsWith('/') ? p : posix.join(workdir, p)).replace(/(.)\/+$/, '$1');

export interface DockerfileOptions {
  /** ARG values (an ARG not declared in the file is refused: a typo should not pass silently). */
  buildArgs?: Record<string, string>;
  /** The base image's config (from `dockerfileBase` → the image store); absent for "host". */
  baseConfig?: ImageConfig;
}

/** The FROM reference alone (ARGs before FROM applied): what to resolve before parsing fully. */
export function dockerfileBase(text: string, buildArgs: Record<string, string> = {}): string {
  return parse(text, { buildArgs }, true).base;
}

/** Parse a Dockerfile of the supported subset into a build plan. */
export function parseDockerfile(text: string, options: DockerfileOptions = {}): DockerfilePlan {
  return parse(text, options, false);
}

function parse(text: string, options: DockerfileOptions, baseOnly: boolean): DockerfilePlan {
  const buildArgs = options.buildArgs ?? {};
  const bc = options.baseConfig;
  const { escape, lines } = logicalLines(text);
  const declared = new Set<string>();
  const args: Record<string, string> = {}; // ARG values in scope
  const envMap = new Map<string, string>();
  for (const e of bc?.env ?? []) {
    const eq = e.indexOf('=');
    if (eq > 0) envMap.set(e.slice(0, eq), e.slice(eq + 1));
  }
  // ENV wins over ARG of the same name (Docker's rule).
  const vars = (): Record<string, string> => ({ ...args, ...Object.fromEntries(envMap) });
  let base: string | undefined;
  let workdir = bc?.workingDir || '/';
  let user = bc?.user ?? '';
  const labels: Record<string, string> = { ...bc?.labels };
  let entrypoint = [...(bc?.entrypoint ?? [])];
  let cmd = [...(bc?.cmd ?? [])];
  let cmdSet = false;
  const steps: DockerStep[] = [];

  for (const { line, keyword, args: a } of lines) {
    if (!SUPPORTED.has(keyword)) {
      fail(
        line,
        ADVICE[keyword]
          ? `${keyword} is not supported: ${ADVICE[keyword]}`
          : `unknown instruction ${keyword}`,
      );
    }
    if (base === undefined && keyword !== 'ARG' && keyword !== 'FROM')
      fail(line, `${keyword} before FROM: the first instruction is FROM (ARG may precede it)`);
    // BuildKit reads `<<EOF` in RUN/COPY/ADD as a heredoc spanning the next lines, a classic builder
    // passes it to the shell: ambiguous, so refused.
    if (/^(RUN|COPY|ADD)$/.test(keyword) && /<<-?\s*["']?[A-Za-z_]/.test(a))
      fail(line, 'heredocs are not supported: put the text in a file and COPY it');
    switch (keyword) {
      case 'ARG': {
        const w = lex(a, undefined, escape, line);
        if (w.length !== 1) fail(line, 'ARG declares one name, optionally with =default');
        const eq = w[0]!.indexOf('=');
        const name = checkName(eq < 0 ? w[0]! : w[0]!.slice(0, eq), 'ARG', line);
        declared.add(name);
        const dflt = eq < 0 ? undefined : lex(w[0]!.slice(eq + 1), vars(), escape, line, false).join('');
        const v = buildArgs[name] ?? dflt;
        if (v !== undefined) args[name] = v;
        break;
      }
      case 'FROM': {
        if (base !== undefined) fail(line, 'only one FROM: multi-stage builds are not supported');
        const w = lex(a, args, escape, line);
        if (w.some((x) => x.startsWith('--')))
          fail(line, 'FROM flags (--platform) are not supported: images are linux/amd64');
        if (w.length !== 1) fail(line, 'FROM takes one image reference (no "AS name": one stage only)');
        if (w[0] === 'scratch') fail(line, 'FROM scratch is not supported: start from an image or "host"');
        base = w[0]!;
        if (baseOnly)
          return { base, steps: [], env: [], workingDir: '/', user: '', labels: {}, entrypoint: [], cmd: [] };
        // ARGs declared before FROM are visible only to FROM (Docker's scoping).
        for (const k of Object.keys(args)) delete args[k];
        break;
      }
      case 'RUN': {
        if (/^--/.test(a))
          fail(
            line,
            "RUN flags (--mount, --network) are not supported: a step's network comes from the template policy",
          );
        if (!a) fail(line, 'RUN needs a command');
        steps.push({ kind: 'run', line, command: execForm(a) ?? a, env: vars(), workdir, user });
        break;
      }
      case 'COPY':
      case 'ADD': {
        let rest = a;
        const flags: Record<string, string> = {};
        for (let m; (m = /^--([a-z-]+)(?:=(\S*))?\s+/.exec(rest)); rest = rest.slice(m[0].length))
          flags[m[1]!] = m[2] ?? '';
        for (const f of Object.keys(flags)) {
          if (f === 'from') fail(line, `${keyword} --from needs multi-stage builds, which are not supported`);
          if (f !== 'chown' && f !== 'chmod')
            fail(line, `${keyword} --${f} is not supported (only --chown and --chmod)`);
        }
        const sub = (s: string): string => substitute(s, vars(), escape, line);
        const json = execForm(rest);
        const list = json ? json.map(sub) : lex(rest, vars(), escape, line);
        if (list.length < 2) fail(line, `${keyword} takes at least one source and a destination`);
        const sources = list.slice(0, -1);
        for (const s of sources) {
          if (keyword === 'ADD' && /^[a-z][a-z0-9+.-]*:\/\//i.test(s)) {
            fail(
              line,
              `ADD of a URL is not supported (${s}): download it in a RUN step whose network policy allows that host`,
            );
          }
          if (s.startsWith('/') || s.split('/').includes('..'))
            fail(line, `${keyword} source "${s}" must stay inside the build context (relative, no "..")`);
        }
        const rawDest = list[list.length - 1]!;
        const intoDir = rawDest.endsWith('/') || sources.length > 1;
        const step: DockerStep = {
          kind: 'copy',
          line,
          add: keyword === 'ADD',
          sources,
          dest: abs(rawDest, workdir),
          intoDir,
          user,
        };
        if (flags.chown !== undefined) step.chown = sub(flags.chown);
        if (flags.chmod !== undefined) {
          if (!/^[0-7]{3,4}$/.test(flags.chmod)) fail(line, '--chmod takes an octal mode such as 755');
          step.chmod = flags.chmod;
        }
        steps.push(step);
        break;
      }
      case 'ENV':
        for (const [k, v] of pairs('ENV', a, vars(), escape, line)) {
          envMap.delete(k); // a redefinition moves to the end, like a shell's export order
          envMap.set(k, v);
        }
        break;
      case 'LABEL':
        for (const [k, v] of pairs('LABEL', a, vars(), escape, line)) labels[k] = v;
        break;
      case 'WORKDIR': {
        const w = lex(a, vars(), escape, line, false).join('');
        if (!w) fail(line, 'WORKDIR needs a path');
        workdir = abs(w, workdir);
        break;
      }
      case 'USER': {
        const u = lex(a, vars(), escape, line, false).join('');
        if (!/^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$/.test(u))
          fail(line, 'USER takes name, uid, name:group or uid:gid');
        user = u;
        break;
      }
      case 'CMD':
      case 'ENTRYPOINT': {
        if (!a) fail(line, `${keyword} needs a command`);
        const argv = execForm(a) ?? ['/bin/sh', '-c', a];
        if (keyword === 'CMD') {
          cmd = argv;
          cmdSet = true;
        } else {
          entrypoint = argv;
          if (!cmdSet) cmd = []; // Docker: ENTRYPOINT resets a CMD inherited from the base, not one set here
        }
        break;
      }
    }
  }
  if (base === undefined) return fail(1, 'no FROM: a Dockerfile starts from an image or "host"');
  for (const k of Object.keys(buildArgs)) {
    if (!declared.has(k)) fail(1, `build arg "${k}" is not declared by any ARG in the Dockerfile`);
  }
  return {
    base,
    steps,
    env: [...envMap].map(([k, v]) => `${k}=${v}`),
    workingDir: workdir,
    user,
    labels,
    entrypoint,
    cmd,
  };
}
