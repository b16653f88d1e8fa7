// SECURITY-RELEVANT: decides which host files an untrusted MCP server can read. Turns a server command
// as users paste it from Claude Desktop configs (`npx -y @scope/server /data`, `node build/index.js`,
// `tsx server.ts`, `python3 server.py`, `/path/to/executable`) into what to run INSIDE a sandbox that
// has no network and sees only /usr, plus the smallest set of host paths to bind read-only: an npm
// package's `node_modules` tree, a script's project dir, or a binary's dir. Nothing is downloaded: an
// npm package must already be installed locally, in npm's npx cache, or globally. Never mounted: `/`,
// kernel and host-config dirs, the user's home dir or anything containing it; /usr is visible already.
// Reads the file system (package.json, shebangs, realpaths) but starts nothing.
import {
  closeSync,
  existsSync,
  openSync,
  readFileSync,
  readSync,
  readdirSync,
  realpathSync,
  statSync,
} from 'node:fs';
import { isBuiltin } from 'node:module';
import { basename, dirname, isAbsolute, join, normalize, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { exports as resolveExports } from 'resolve.exports';
import semver from 'semver';
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import { forbiddenMountSourceReason, MountSchema } from '../core/spec.js';

/** Node.js inside the sandbox: the host's own, visible through read-only /usr. */
export const SANDBOX_NODE = '/usr/bin/node';
/** Host paths that would cover the sandbox layout (/tmp, /home, ...) are bound under here instead. */
export const RELOCATED_MOUNTS_ROOT = '/opt/airlock/mounts';

export type CommandSource = 'npx-local' | 'npx-cache' | 'npx-global' | 'script' | 'binary' | 'image';

export interface ResolvedCommand {
  /** What to run inside the sandbox, e.g. `['/usr/bin/node', '<package bin>', ...args]`. */
  argv: string[];
  /** Read-only binds: `hostPath` is a realpath; `path` equals it unless it had to be relocated. */
  mounts: Array<{ hostPath: string; path: string }>;
  source: CommandSource;
  /** The npm package run (npx-style commands only); `dir` is its real host path. */
  package?: { name: string; version: string; dir: string };
  /** Human readable, e.g. "npm package @scope/server@1.2.3 from ./node_modules". */
  description: string;
}

export interface ResolveCommandOptions {
  /** Directory the command was written for: relative paths and local node_modules resolve from here. */
  cwd: string;
  /** Host environment: HOME, PATH, npm_config_cache, npm_config_prefix. */
  env: Record<string, string | undefined>;
  /** Global npm roots (`<prefix>/lib/node_modules`); default from npm_config_prefix, node's prefix, /usr/local, /usr. */
  globalRoots?: string[];
}

const SUPPORTED =
  'Supported: `npx`, `npm exec`, `pnpm dlx` or `yarn dlx` with an npm package already installed (locally, in the npm cache or globally), `node <script>`, `tsx <script>`, `python3 <script>`, or the path of an executable script or binary.';

const UNSUPPORTED: Record<string, string> = {
  uvx: 'it downloads Python packages at start-up; install the server into a virtualenv made from /usr/bin/python3 and run `<venv>/bin/python -m <module>`',
  uv: 'it manages its own Python and downloads packages; run the server with /usr/bin/python3 or a virtualenv made from it',
  pipx: 'it downloads Python packages; run the server with /usr/bin/python3 or a virtualenv made from it',
  docker: 'containers are not run inside the sandbox',
  podman: 'containers are not run inside the sandbox',
  deno: 'Deno is not available inside the sandbox',
  bun: 'Bun is not available inside the sandbox',
  bunx: 'Bun is not available inside the sandbox',
  sh: 'a shell command line cannot be resolved to the files it needs; give the server command itself',
  bash: 'a shell command line cannot be resolved to the files it needs; give the server command itself',
  zsh: 'a shell command line cannot be resolved to the files it needs; give the server command itself',
  env: 'give the server command itself and set variables in the sandbox env',
  cmd: 'drop the Windows `cmd /c` wrapper and give the server command itself',
  powershell: 'drop the PowerShell wrapper and give the server command itself',
  pwsh: 'drop the PowerShell wrapper and give the server command itself',
};

/** Interpreters a `#!` line may name that the sandbox does not have (shell scripts do run). */
const NOT_IN_SANDBOX = new Set(['uvx', 'uv', 'pipx', 'docker', 'podman', 'deno', 'bun', 'bunx']);

/** A set from space-separated words (long option lists stay readable). */
const words = (...lines: string[]): ReadonlySet<string> => new Set(lines.join(' ').split(' '));

const bad = (message: string): AirlockError =>
  new AirlockError('INVALID_ARGUMENT', message, { field: 'command' });

const under = (p: string, root: string): boolean =>
  p === root || p.startsWith(root === '/' ? '/' : root + '/');

/** A host path to translate to its inside-the-sandbox path once the mounts are known. */
type Arg = string | { host: string; prefix?: string };

interface Plan {
  argv: Arg[];
  /** Real host paths (dirs or files) to bind; those under /usr and those inside another are dropped. */
  roots: string[];
  source: CommandSource;
  package?: { name: string; version: string; dir: string };
  description: string;
}

interface Ctx {
  cwd: string;
  env: Record<string, string | undefined>;
  home: string | undefined;
  globalRoots: string[];
}

/**
 * A server command for a sandbox on an image: run as given, with the image's programs (its PATH, its
 * launchers); nothing of the host is bound. What a launcher may download is up to the network policy.
 */
export function imageServerCommand(argv: readonly string[], image: string): ResolvedCommand {
  if (argv.length === 0 || argv[0]!.trim() === '')
    throw bad('no MCP server command given, e.g. `uvx some-server` (run with what the image holds)');
  return { argv: [...argv], mounts: [], source: 'image', description: `${argv[0]} in image ${image}` };
}

/**
 * Resolve a pasted MCP server command. Throws INVALID_ARGUMENT (field `command`) with what to change when
 * the command cannot run offline in the sandbox: an uninstalled package, an unsupported launcher, ...
 */
export function resolveServerCommand(argv: string[], opts: ResolveCommandOptions): ResolvedCommand {
  const [cmd, ...args] = argv;
  if (cmd === undefined || cmd.trim() === '') {
    throw bad('no MCP server command given, e.g. `npx -y @modelcontextprotocol/server-filesystem /data`');
  }
  const home = opts.env.HOME ? realOr(resolve(opts.env.HOME)) : undefined;
  const ctx: Ctx = {
    cwd: resolve(opts.cwd),
    env: opts.env,
    home: home === '/' ? undefined : home,
    globalRoots: opts.globalRoots ?? defaultGlobalRoots(opts.env),
  };
  return finalize(plan(cmd, args, ctx), ctx);
}

function plan(cmd: string, args: string[], ctx: Ctx): Plan {
  const name = basename(cmd).replace(/\.(cmd|exe|ps1)$/i, '');
  if (name === 'npx') return npxPlan(parseLauncher('npx', args, 'first-positional', NPX_VALUE_FLAGS), ctx);
  if (name === 'pnpx') return npxPlan(parseLauncher('pnpx', args, 'first-positional', DLX_VALUE_FLAGS), ctx);
  if (name === 'npm' || name === 'pnpm' || name === 'yarn') {
    const sub = args[0];
    if (name === 'npm' && (sub === 'exec' || sub === 'x')) {
      return npxPlan(parseLauncher(`npm ${sub}`, args.slice(1), 'until-dashdash', NPM_EXEC_VALUE_FLAGS), ctx);
    }
    if (name !== 'npm' && sub === 'dlx') {
      return npxPlan(parseLauncher(`${name} dlx`, args.slice(1), 'first-positional', DLX_VALUE_FLAGS), ctx);
    }
    const runner = name === 'npm' ? 'npm exec' : `${name} dlx`;
    throw bad(
      `\`${sub === undefined ? name : `${name} ${sub}`}\` is not supported by airlock mcp (package scripts run through a shell); use \`${runner} <package>\` or the server command itself, e.g. \`node build/index.js\`. ${SUPPORTED}`,
    );
  }
  if (name === 'node' || name === 'nodejs') return nodePlan(args, ctx);
  if (name === 'tsx') return tsxPlan(args, ctx, undefined);
  if (PYTHON_RE.test(name)) return pythonPlan(cmd, args, ctx);
  const why = UNSUPPORTED[name.toLowerCase()];
  if (why !== undefined) throw bad(`\`${name}\` is not supported by airlock mcp (${why}). ${SUPPORTED}`);
  if (cmd.includes('/')) return pathPlan(cmd, args, ctx);
  const found = whichOnPath(cmd, ctx);
  if (found === undefined) {
    throw bad(
      `command \`${cmd}\` was not found on PATH; give its absolute path or run it through node, tsx or python3. ${SUPPORTED}`,
    );
  }
  return pathPlan(found, args, ctx);
}

// ---------------------------------------------------------------------------------------------------
// Mounts: choose, refuse, relocate, translate.

/** Why `p` (a real host path) may never be bound into a sandbox, or undefined. */
function refusal(p: string, ctx: Ctx): string | undefined {
  const why = forbiddenMountSourceReason(p);
  if (why !== undefined) return why;
  if (ctx.home !== undefined && under(ctx.home, p)) return `${p} is or contains your home directory`;
  return undefined;
}

/**
 * The root to bind for a script or package file (real path): the outermost node_modules of a package
 * tree, else the nearest project dir (a package.json with a name or a node_modules beside it, or a
 * pyproject.toml), else the file's own dir, else the file alone. Never a refused path.
 */
function mountRootFor(file: string, kind: 'node' | 'python', ctx: Ctx): string {
  if (under(file, '/usr')) return file;
  const nm = kind === 'node' ? outerNodeModules(file) : undefined;
  if (nm !== undefined && refusal(nm, ctx) === undefined) return nm;
  const dir = dirname(file);
  for (let d = dir; ; d = dirname(d)) {
    if (isProjectRoot(d, kind)) {
      if (refusal(d, ctx) === undefined) return d;
      break;
    }
    if (d === '/') break;
  }
  if (refusal(dir, ctx) === undefined) return dir;
  const why = refusal(file, ctx);
  if (why !== undefined) throw bad(`cannot mount ${file} into the sandbox: ${why}`);
  return file;
}

function isProjectRoot(d: string, kind: 'node' | 'python'): boolean {
  if (kind === 'python') return existsSync(join(d, 'pyproject.toml'));
  // A bare {"type":"module"} marker (as builds emit into dist/esm) is not a project root.
  const pj = readPackageJson(join(d, 'package.json'));
  return pj !== undefined && (pj.name !== undefined || isDir(join(d, 'node_modules')));
}

/** The outermost node_modules of the nested chain (`a/node_modules/b/node_modules`, .pnpm) holding `p`. */
function outerNodeModules(p: string): string | undefined {
  const segs = p.split('/');
  let j = segs.lastIndexOf('node_modules');
  if (j <= 0) return undefined;
  for (;;) {
    const up1 = segs[j - 1] ?? '';
    const up2 = segs[j - 2] ?? '';
    if (j >= 2 && segs[j - 2] === 'node_modules' && !up1.startsWith('.') && !up1.startsWith('@')) j -= 2;
    else if (j >= 3 && segs[j - 3] === 'node_modules' && (up2.startsWith('@') || up2 === '.pnpm')) j -= 3;
    else break;
  }
  return segs.slice(0, j + 1).join('/');
}

function finalize(p: Plan, ctx: Ctx): ResolvedCommand {
  const roots = [...new Set(p.roots)].filter((r) => !under(r, '/usr'));
  for (const r of roots) {
    const why = refusal(r, ctx);
    if (why !== undefined) throw bad(`cannot mount ${r} into the sandbox: ${why}`);
  }
  const kept = roots.filter((r) => !roots.some((o) => o !== r && under(r, o)));
  const mounts = kept.map((hostPath, i) => {
    const same =
      !under(hostPath, RELOCATED_MOUNTS_ROOT) && MountSchema.safeParse({ hostPath, path: hostPath }).success;
    return { hostPath, path: same ? hostPath : `${RELOCATED_MOUNTS_ROOT}/${i}${hostPath}` };
  });
  const inside = (host: string): string => {
    if (under(host, '/usr')) return host;
    const m = mounts.find((x) => under(host, x.hostPath));
    if (m === undefined) throw new AirlockError('INTERNAL', `no mount covers ${host}`);
    return m.path + host.slice(m.hostPath.length);
  };
  const argv = p.argv.map((a) => (typeof a === 'string' ? a : (a.prefix ?? '') + inside(a.host)));
  if (argv[0] === SANDBOX_NODE && !existsSync(SANDBOX_NODE)) {
    throw bad(
      `Node.js is not installed at ${SANDBOX_NODE}; the sandbox sees only /usr, so install node there`,
    );
  }
  return {
    argv,
    mounts,
    source: p.source,
    ...(p.package === undefined ? {} : { package: p.package }),
    description: p.description,
  };
}

// ---------------------------------------------------------------------------------------------------
// npx-style launchers.

const NPX_VALUE_FLAGS = words(
  '-p --package --cache --registry --userconfig --prefix -w --workspace --loglevel --node-options',
);
const NPM_EXEC_VALUE_FLAGS = new Set([...NPX_VALUE_FLAGS].filter((f) => f !== '-p'));
const DLX_VALUE_FLAGS = new Set(['-p', '--package', '--allow-build', '--registry', '--cache-dir']);
const SHELL_FLAGS = new Set(['-c', '--call', '--shell-mode']);

interface Launch {
  launcher: string;
  packages: string[];
  command: string;
  args: string[];
  cacheDir: string | undefined;
}

/**
 * npx, pnpm/yarn dlx: launcher options end at the first positional (the package), the rest is the
 * command's. npm exec: npm options may appear anywhere before `--`; positionals and everything after
 * `--` form the command.
 */
function parseLauncher(
  launcher: string,
  args: string[],
  style: 'first-positional' | 'until-dashdash',
  valueFlags: ReadonlySet<string>,
): Launch {
  const packages: string[] = [];
  const positional: string[] = [];
  let after: string[] = [];
  let cacheDir: string | undefined;
  for (let i = 0; i < args.length; i++) {
    const a = args[i] as string;
    if (a === '--') {
      after = args.slice(i + 1);
      break;
    }
    if (!a.startsWith('-') || a === '-') {
      if (style === 'first-positional') {
        after = args.slice(i);
        break;
      }
      positional.push(a);
      continue;
    }
    const eq = a.indexOf('=');
    const flag = a.startsWith('--') && eq > 0 ? a.slice(0, eq) : a;
    if (SHELL_FLAGS.has(flag)) {
      throw bad(
        `\`${launcher} ${flag}\` runs a shell command line, which cannot be resolved to the files it needs; give the package and its arguments directly, e.g. \`npx -y <package> <args>\``,
      );
    }
    if (!valueFlags.has(flag)) continue; // a boolean such as -y/--yes/--quiet: irrelevant offline
    const value = flag === a ? args[++i] : a.slice(eq + 1);
    if (value === undefined) throw bad(`\`${launcher} ${flag}\` needs a value`);
    if (flag === '-p' || flag === '--package') packages.push(value);
    if (flag === '--cache') cacheDir = value;
  }
  const [command, ...rest] = [...positional, ...after];
  if (command === undefined) {
    throw bad(
      `\`${launcher}\` needs a package to run, e.g. \`${launcher} @modelcontextprotocol/server-memory\``,
    );
  }
  return { launcher, packages, command, args: rest, cacheDir };
}

function npxPlan(l: Launch, ctx: Ctx): Plan {
  const cacheDir = l.cacheDir === undefined ? undefined : resolve(ctx.cwd, l.cacheDir);
  if (l.packages.length === 0) {
    const { name, range } = parsePackageSpec(l.command);
    const found = findPackage(name, range, ctx, { cacheDir, display: l.command, binFallback: true });
    if (name === 'tsx' && found.binFile === undefined) return tsxPlan(l.args, ctx, found);
    return packagePlan(found, found.binName ?? pickBin(found, undefined), l.args, ctx);
  }
  const founds = l.packages.map((spec) => {
    const { name, range } = parsePackageSpec(spec);
    return findPackage(name, range, ctx, { cacheDir, display: spec, binFallback: false });
  });
  const hit = founds.find((f) => binsOf(f)[l.command] !== undefined);
  if (hit === undefined) {
    const have = founds.map((f) => `${f.name}: ${Object.keys(binsOf(f)).join(', ') || 'none'}`).join('; ');
    throw bad(
      `\`${l.launcher} --package\` runs a bin of the given packages, and none is named \`${l.command}\` (bins: ${have})`,
    );
  }
  return packagePlan(hit, l.command, l.args, ctx);
}

const NAME_RE = /^(?:@[a-z0-9~-][a-z0-9._~-]*\/)?[a-z0-9~-][a-z0-9._~-]*$/i;

function parsePackageSpec(spec: string): { name: string; range: string } {
  const at = spec.indexOf('@', 1);
  const name = at === -1 ? spec : spec.slice(0, at);
  const range = at === -1 ? '' : spec.slice(at + 1);
  if (
    /^(?:\.{0,2}\/|~)/.test(spec) ||
    /^[a-z+]+:/i.test(spec) ||
    (name.includes('/') && !name.startsWith('@'))
  ) {
    throw bad(
      `\`${spec}\` is not an npm registry package (local paths, git repositories, URLs and aliases are not supported); for a server on disk run its script, e.g. \`node <path/to/index.js>\``,
    );
  }
  if (!NAME_RE.test(name) || name.length > 214) throw bad(`\`${name}\` is not a valid npm package name`);
  return { name, range };
}

/** The fields used here; a malformed field reads as absent rather than hiding the whole package. */
const PackageJsonSchema = z.object({
  name: z.string().optional().catch(undefined),
  version: z.string().optional().catch(undefined),
  bin: z
    .union([z.string(), z.record(z.string(), z.string())])
    .optional()
    .catch(undefined),
  main: z.string().optional().catch(undefined),
  exports: z.unknown().optional(),
});
type PackageJson = z.output<typeof PackageJsonSchema>;

/** A package.json, or undefined when missing or malformed (an installed package's file is untrusted). */
function readPackageJson(file: string): PackageJson | undefined {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    return undefined;
  }
  try {
    const r = PackageJsonSchema.safeParse(JSON.parse(text));
    return r.success ? r.data : undefined;
  } catch {
    return undefined;
  }
}

interface FoundPackage {
  name: string;
  version: string;
  /** The package dir as found (may be a symlink). */
  dir: string;
  pj: PackageJson;
  /** The node_modules dir it was found in (as found). */
  nodeModules: string;
  source: 'npx-local' | 'npx-cache' | 'npx-global';
  /** Set when found through `node_modules/.bin/<name>` rather than by package name. */
  binFile?: string;
  binName?: string;
}

/** Local (cwd and its ancestors), then npm's npx cache (highest match), then the global roots. */
function findPackage(
  name: string,
  range: string,
  ctx: Ctx,
  o: { cacheDir?: string | undefined; display: string; binFallback: boolean; extraStarts?: string[] },
): FoundPackage {
  const req = parseVersionReq(range, o.display);
  const mismatched: string[] = [];
  const at = (nm: string, source: FoundPackage['source']): FoundPackage | undefined => {
    const dir = join(nm, name);
    const pj = readPackageJson(join(dir, 'package.json'));
    if (pj === undefined) return undefined;
    const version = pj.version ?? 'unknown';
    if (satisfies(version, req)) return { name, version, dir, pj, nodeModules: nm, source };
    mismatched.push(`${name}@${version} in ${nm}`);
    return undefined;
  };
  const seen = new Set<string>();
  for (const start of [ctx.cwd, ...(o.extraStarts ?? [])]) {
    for (const d of ancestors(start)) {
      const nm = join(d, 'node_modules');
      if (seen.has(nm)) continue;
      seen.add(nm);
      const hit = at(nm, 'npx-local') ?? (o.binFallback && range === '' ? viaDotBin(nm, name) : undefined);
      if (hit !== undefined) return hit;
    }
  }
  const cache =
    o.cacheDir ??
    ctx.env.npm_config_cache ??
    ctx.env.NPM_CONFIG_CACHE ??
    (ctx.env.HOME ? join(ctx.env.HOME, '.npm') : undefined);
  if (cache !== undefined) {
    const npx = join(cache, '_npx');
    const hashes = isDir(npx) ? readdirSync(npx).sort() : [];
    const hits = hashes.flatMap((h) => at(join(npx, h, 'node_modules'), 'npx-cache') ?? []);
    const best = highest(hits, req);
    if (best !== undefined) return best;
  }
  for (const g of ctx.globalRoots) {
    const hit = at(g, 'npx-global');
    if (hit !== undefined) return hit;
  }
  const found =
    mismatched.length === 0 ? '' : ` (found ${mismatched.join(', ')}, which does not match ${range})`;
  throw bad(
    `npm package ${o.display} is not installed locally or in the npm cache${found}; the sandbox has no network to download it. Install it first: \`npm install ${o.display}\` (or run \`npx -y ${o.display} --help\` once outside Airlock)`,
  );
}

/** `npx <bin>` where only `node_modules/.bin/<bin>` matches (the bin is named unlike its package). */
function viaDotBin(nm: string, bin: string): FoundPackage | undefined {
  if (bin.includes('/')) return undefined;
  const link = join(nm, '.bin', bin);
  if (!isFile(link)) return undefined;
  const file = realpathSync(link);
  const tree = treeOf(nm);
  for (let d = dirname(file); under(d, tree) && d !== tree; d = dirname(d)) {
    const pj = readPackageJson(join(d, 'package.json'));
    if (pj?.name === undefined) continue;
    const version = pj.version ?? 'unknown';
    return {
      name: pj.name,
      version,
      dir: d,
      pj,
      nodeModules: nm,
      source: 'npx-local',
      binFile: file,
      binName: bin,
    };
  }
  return undefined;
}

function binsOf(f: FoundPackage): Record<string, string> {
  const bin = f.pj.bin;
  if (bin === undefined) return {};
  return typeof bin === 'string' ? { [f.name.slice(f.name.lastIndexOf('/') + 1)]: bin } : bin;
}

/** The bin to run: the only one, or the one named like the package (without its scope). */
function pickBin(f: FoundPackage, wanted: string | undefined): string {
  const bins = binsOf(f);
  const names = Object.keys(bins);
  if (wanted !== undefined && bins[wanted] !== undefined) return wanted;
  if (names.length === 0) {
    throw bad(
      `npm package ${f.name}@${f.version} has no bin, so there is nothing to run; check the package name in the server command`,
    );
  }
  const unscoped = f.name.slice(f.name.lastIndexOf('/') + 1);
  if (bins[unscoped] !== undefined) return unscoped;
  if (names.length === 1) return names[0] as string;
  throw bad(
    `npm package ${f.name}@${f.version} has several bins (${names.join(', ')}) and none is named ${unscoped}; pick one: \`npx --package=${f.name} <bin> ...\``,
  );
}

function packagePlan(f: FoundPackage, binName: string, args: string[], ctx: Ctx): Plan {
  const treeRoot = treeOf(f.nodeModules);
  const pkgReal = realpathSync(f.dir);
  let binReal = f.binFile;
  if (binReal === undefined) {
    const rel = binsOf(f)[binName] as string;
    const binPath = join(f.dir, rel);
    if (!under(binPath, f.dir))
      throw bad(`the bin ${binName} of npm package ${f.name} points outside the package`);
    if (!isFile(binPath)) {
      throw bad(
        `npm package ${f.name}@${f.version} in ${f.dir} declares bin ${binName} -> ${rel}, but that file is missing; reinstall the package`,
      );
    }
    binReal = realpathSync(binPath);
  }
  if (!under(binReal, treeRoot) && !under(binReal, pkgReal)) {
    throw bad(`the bin ${binName} of npm package ${f.name} resolves outside its node_modules (${binReal})`);
  }
  const sb = parseShebang(readHead(binReal));
  if (sb !== undefined && !NODE_RE.test(sb.interp)) {
    throw bad(
      `the bin ${binName} of npm package ${f.name} is a ${sb.interp} script; airlock mcp runs npm packages with Node.js only`,
    );
  }
  const p = nodePlan([...(sb?.args ?? []), binReal, ...args], ctx);
  const where =
    f.source === 'npx-cache'
      ? `the npx cache (${f.nodeModules})`
      : f.source === 'npx-global'
        ? `the global npm root ${f.nodeModules}`
        : displayPath(f.nodeModules, ctx);
  return {
    ...p,
    roots: [treeRoot, ...p.roots],
    source: f.source,
    package: { name: f.name, version: f.version, dir: pkgReal },
    description: `npm package ${f.name}@${f.version} from ${where}`,
  };
}

// ---------------------------------------------------------------------------------------------------
// Versions (the `semver` package): enough to choose among installed copies.

/** Any version (no range, `*`, or a dist-tag such as `latest`: the highest installed), or a semver range. */
type VersionReq = { kind: 'any' } | { kind: 'range'; range: string };

function parseVersionReq(range: string, display: string): VersionReq {
  const s = range.trim();
  if (s === '' || s === '*' || s === 'x' || s === 'X') return { kind: 'any' };
  if (/^[A-Za-z][\w.-]*$/.test(s) && !/^v\d/i.test(s)) return { kind: 'any' }; // a dist-tag: the highest
  const valid = semver.validRange(s);
  if (valid === null) {
    throw bad(
      `version range "${s}" in ${display} is not a valid semver range; use an exact version (1.2.3), a range (^1.2.3, ~1.2.3, 1.x, >=1.2 <2) or a dist-tag such as latest`,
    );
  }
  return { kind: 'range', range: valid };
}

/** Prereleases match only a range that names a prerelease of the same version (npm's rule). */
function satisfies(version: string, req: VersionReq): boolean {
  if (req.kind === 'any') return true;
  return semver.valid(version) !== null && semver.satisfies(version, req.range);
}

/** The highest version; for "any", a release beats every prerelease. */
function highest(found: FoundPackage[], req: VersionReq): FoundPackage | undefined {
  const ranked = found
    .map((f) => ({ f, v: semver.valid(f.version) }))
    .sort((a, b) => (a.v && b.v ? semver.rcompare(a.v, b.v) : a.v ? -1 : b.v ? 1 : 0));
  const release = ranked.find((r) => r.v !== null && semver.prerelease(r.v) === null);
  return (req.kind === 'any' && release !== undefined ? release : ranked[0])?.f;
}

// ---------------------------------------------------------------------------------------------------
// node, tsx.

const NODE_RE = /^(node|nodejs)$/;
const NODE_VALUE_FLAGS = words(
  '--input-type -C --conditions --inspect-port --debug-port --title --stack-size',
  '--stack-trace-limit --max-old-space-size --max-semi-space-size --max-http-header-size',
  '--unhandled-rejections --dns-result-order --disable-warning --experimental-default-type',
  '--heapsnapshot-signal --heapsnapshot-near-heap-limit --diagnostic-dir --report-dir',
  '--report-directory --report-filename --report-signal --redirect-warnings --tls-cipher-list',
  '--tls-keylog --secure-heap --secure-heap-min --trace-event-categories',
  '--trace-event-file-pattern --cpu-prof-dir --cpu-prof-name --cpu-prof-interval --heap-prof-dir',
  '--heap-prof-name --heap-prof-interval --use-largepages --watch-path --localstorage-file',
);
/** Options whose value is code to load: resolved on the host and mounted. */
const NODE_MODULE_FLAGS = new Set(['-r', '--require', '--import', '--loader', '--experimental-loader']);
/** Options that read other host files: refused rather than silently broken. */
const NODE_HOST_FILE_FLAGS = words(
  '--env-file --env-file-if-exists --experimental-policy --openssl-config --icu-data-dir',
  '--snapshot-blob --experimental-config-file',
);
const NODE_EVAL_FLAGS = new Set(['-e', '--eval', '-p', '--print', '-pe', '-ep']);
const TSX_VALUE_FLAGS = new Set(['--tsconfig', '--include', '--exclude', '--ignore']);

interface NodeArgs {
  flags: Arg[];
  roots: string[];
  evalMode: boolean;
  /** From the script (or, in eval mode, the code's arguments) on. */
  rest: string[];
}

function parseNodeFlags(args: string[], ctx: Ctx, runner: string, extra: ReadonlySet<string>): NodeArgs {
  const flags: Arg[] = [];
  const roots: string[] = [];
  let evalMode = false;
  let i = 0;
  for (; i < args.length; i++) {
    const a = args[i] as string;
    if (a === '--') {
      i++;
      break;
    }
    if (a === '-') {
      throw bad(
        `\`${runner} -\` reads the program from stdin, which carries the MCP protocol; give a script file`,
      );
    }
    if (!a.startsWith('-')) break;
    const eq = a.indexOf('=');
    const flag = a.startsWith('--') && eq > 0 ? a.slice(0, eq) : a;
    if (NODE_HOST_FILE_FLAGS.has(flag)) {
      throw bad(
        `\`${runner} ${flag}\` reads a host file the sandbox cannot see; ${flag.startsWith('--env-file') ? 'set the variables in the sandbox env instead' : 'drop the option'}`,
      );
    }
    const evalFlag = NODE_EVAL_FLAGS.has(flag);
    if (!evalFlag && !NODE_MODULE_FLAGS.has(flag) && !NODE_VALUE_FLAGS.has(flag) && !extra.has(flag)) {
      flags.push(a);
      continue;
    }
    const inline = flag === a ? undefined : a.slice(eq + 1);
    const value = inline ?? args[++i];
    if (value === undefined) throw bad(`\`${runner} ${flag}\` needs a value`);
    let out: Arg = value;
    if (evalFlag) evalMode = true;
    else if (NODE_MODULE_FLAGS.has(flag)) {
      const file = resolveModuleSpecifier(value, flag, ctx, runner);
      if (file !== undefined) {
        roots.push(mountRootFor(file, 'node', ctx));
        out = { host: file };
      }
    } else if (flag === '--tsconfig') {
      const file = resolve(ctx.cwd, value);
      if (!isFile(file)) throw bad(`tsconfig ${value} not found (relative paths resolve against ${ctx.cwd})`);
      const real = realpathSync(file);
      roots.push(mountRootFor(real, 'node', ctx));
      out = { host: real };
    }
    if (inline === undefined) flags.push(flag, out);
    else flags.push(typeof out === 'string' ? a : { ...out, prefix: `${flag}=` });
  }
  return { flags, roots, evalMode, rest: args.slice(i) };
}

/** A `-r`/`--import`/`--loader` value as a real host file, or undefined for builtins. */
function resolveModuleSpecifier(spec: string, flag: string, ctx: Ctx, runner: string): string | undefined {
  if (spec.startsWith('node:') || isBuiltin(spec)) return undefined;
  const missing = (): AirlockError =>
    bad(
      `cannot find \`${spec}\` for \`${runner} ${flag}\` from ${ctx.cwd}; install the package locally or give a path to the file`,
    );
  let file: string | undefined;
  if (spec.startsWith('file:')) file = withExtensions(fileURLToPath(spec), JS_EXTENSIONS);
  else if (isAbsolute(spec) || /^\.{1,2}(\/|$)/.test(spec))
    file = withExtensions(resolve(ctx.cwd, spec), JS_EXTENSIONS);
  else {
    const m = /^((?:@[^/]+\/)?[^/]+)(\/.*)?$/.exec(spec);
    if (m === null || !NAME_RE.test(m[1] as string)) throw missing();
    const name = m[1] as string;
    const subpath = m[2] === undefined ? '.' : `.${m[2]}`;
    const conditions =
      flag === '-r' || flag === '--require' ? ['node', 'require', 'default'] : ['node', 'import', 'default'];
    for (const d of ancestors(ctx.cwd)) {
      const dir = join(d, 'node_modules', name);
      const pj = readPackageJson(join(dir, 'package.json'));
      if (pj === undefined) continue;
      const target = packageEntry(pj, subpath, conditions);
      const entry = target === undefined ? undefined : join(dir, target);
      file = entry === undefined ? undefined : withExtensions(entry, JS_EXTENSIONS);
      if (file === undefined) throw missing();
      // An installed package is untrusted: its entry may not lead the mount outside its own tree.
      const real = realpathSync(file);
      if (
        !under(entry as string, dir) ||
        !(under(real, treeOf(join(d, 'node_modules'))) || under(real, realpathSync(dir)))
      ) {
        throw bad(`\`${spec}\` for \`${runner} ${flag}\` resolves outside its package (${real})`);
      }
      return real;
    }
  }
  if (file === undefined) throw missing();
  return realpathSync(file);
}

/** The real outermost node_modules dir of the tree `nm` belongs to. */
function treeOf(nm: string): string {
  const real = realpathSync(nm);
  return outerNodeModules(real) ?? real;
}

/**
 * A package's entry for `subpath` under `exports` (the `resolve.exports` package: subpaths, patterns,
 * conditions, fallback arrays) or, without `exports`, `main`. Only `./`-relative targets are taken.
 */
function packageEntry(pj: PackageJson, subpath: string, conditions: string[]): string | undefined {
  if (pj.exports === undefined || pj.exports === null) {
    return subpath === '.' ? (pj.main ?? 'index.js') : subpath;
  }
  let targets: string[] | void;
  try {
    // unsafe: exactly these conditions (plus "default"), not the library's guess from `require`.
    targets = resolveExports(pj, subpath, {
      conditions: conditions.filter((c) => c !== 'default'),
      unsafe: true,
    });
  } catch {
    return undefined; // not exported (or an invalid target): the caller says the module is missing
  }
  return (targets ?? []).find((t) => t.startsWith('./'));
}

const JS_EXTENSIONS = ['', '.js', '.mjs', '.cjs', '/index.js'];
const TS_EXTENSIONS = ['', '.ts', '.mts', '.cts', '.js', '.mjs', '.cjs', '/index.ts', '/index.js'];

function withExtensions(p: string, exts: readonly string[]): string | undefined {
  return exts.map((e) => p + e).find(isFile);
}

function resolveScript(script: string, ctx: Ctx, runner: string, exts: readonly string[]): string {
  const abs = resolve(ctx.cwd, script);
  const file = withExtensions(abs, exts);
  if (file === undefined) {
    throw bad(`${runner} script ${script} not found at ${abs} (relative paths resolve against ${ctx.cwd})`);
  }
  return realpathSync(file);
}

function nodePlan(args: string[], ctx: Ctx): Plan {
  const p = parseNodeFlags(args, ctx, 'node', new Set());
  if (p.evalMode) {
    return {
      argv: [SANDBOX_NODE, ...p.flags, ...p.rest],
      roots: p.roots,
      source: 'binary',
      description: 'node with inline code (no script file)',
    };
  }
  const [script, ...rest] = p.rest;
  if (script === undefined) {
    throw bad('`node` needs a script file to run, e.g. `node build/index.js` (a REPL cannot serve MCP)');
  }
  const file = resolveScript(script, ctx, 'node', JS_EXTENSIONS);
  return {
    argv: [SANDBOX_NODE, ...p.flags, { host: file }, ...rest],
    roots: [...p.roots, mountRootFor(file, 'node', ctx)],
    source: 'script',
    description: `Node.js script ${file}`,
  };
}

/** tsx's CLI run by /usr/bin/node; tsx comes from the cwd's or the script's node_modules, the cache, or global. */
function tsxPlan(args: string[], ctx: Ctx, tsx: FoundPackage | undefined): Plan {
  const watch = args[0] === 'watch' ? ['watch'] : [];
  const p = parseNodeFlags(args.slice(watch.length), ctx, 'tsx', TSX_VALUE_FLAGS);
  const [script, ...rest] = p.rest;
  if (!p.evalMode && script === undefined)
    throw bad('`tsx` needs a script file to run, e.g. `tsx src/index.ts`');
  const file =
    p.evalMode || script === undefined ? undefined : resolveScript(script, ctx, 'tsx', TS_EXTENSIONS);
  const found =
    tsx ??
    findPackage('tsx', '', ctx, {
      display: 'tsx',
      binFallback: false,
      ...(file === undefined ? {} : { extraStarts: [dirname(file)] }),
    });
  const cli = packagePlan(found, pickBin(found, 'tsx'), [], ctx);
  const tail: Arg[] = file === undefined ? p.rest : [{ host: file }, ...rest];
  return {
    argv: [...cli.argv, ...watch, ...p.flags, ...tail],
    roots: [...cli.roots, ...p.roots, ...(file === undefined ? [] : [mountRootFor(file, 'node', ctx)])],
    source: file === undefined ? 'binary' : 'script',
    description: `${file === undefined ? 'inline code' : `TypeScript script ${file}`} run with tsx@${found.version}`,
  };
}

// ---------------------------------------------------------------------------------------------------
// Python.

const PYTHON_RE = /^python(\d+(\.\d+)?)?$/;

function pythonPlan(cmd: string, args: string[], ctx: Ctx): Plan {
  const py = pythonInterpreter(cmd, ctx);
  const flags: string[] = [];
  let mode: 'script' | 'eval' | 'module' = 'script';
  let i = 0;
  for (; i < args.length && mode === 'script'; i++) {
    const a = args[i] as string;
    if (a === '--') {
      i++;
      break;
    }
    if (a === '-')
      throw bad(
        '`python -` reads the program from stdin, which carries the MCP protocol; give a script file',
      );
    if (!a.startsWith('-')) break;
    flags.push(a);
    if (a.startsWith('--')) {
      if (a !== '--check-hash-based-pycs') continue;
      const v = args[++i];
      if (v === undefined) throw bad(`\`python ${a}\` needs a value`);
      flags.push(v);
      continue;
    }
    for (let j = 1; j < a.length; j++) {
      const c = a[j] as string;
      if (!'cmWX'.includes(c)) continue;
      if (c === 'c') mode = 'eval';
      if (c === 'm') mode = 'module';
      if (j === a.length - 1) {
        const v = args[++i];
        if (v === undefined) throw bad(`\`python ${a}\` needs a value`);
        flags.push(v);
      }
      break;
    }
  }
  const rest = args.slice(i);
  if (mode === 'module' && py.venv === undefined) {
    throw bad(
      "`python -m` is not supported with the system Python: the module would come from the host's site-packages; run the script file (`python3 /path/to/server.py`) or a virtualenv's python (`<venv>/bin/python -m <module>`)",
    );
  }
  if (mode !== 'script') {
    const what =
      mode === 'eval'
        ? 'Python with inline code (no script file)'
        : `Python module from the virtualenv ${py.venv}`;
    return { argv: [py.argv0, ...flags, ...rest], roots: py.roots, source: 'script', description: what };
  }
  const [script, ...scriptArgs] = rest;
  if (script === undefined) throw bad('`python3` needs a script file to run, e.g. `python3 server.py`');
  const file = resolveScript(script, ctx, 'python', ['']);
  return {
    argv: [py.argv0, ...flags, { host: file }, ...scriptArgs],
    roots: [...py.roots, mountRootFor(file, 'python', ctx)],
    source: 'script',
    description: `Python script ${file}`,
  };
}

/** The system Python under /usr, or a virtualenv made from it (mounted whole). */
function pythonInterpreter(cmd: string, ctx: Ctx): { argv0: Arg; roots: string[]; venv?: string } {
  const name = basename(cmd);
  if (!cmd.includes('/')) {
    const p = `/usr/bin/${name === 'python' ? 'python3' : name}`;
    if (!existsSync(p)) {
      throw bad(
        `${name} is not installed at ${p}; the sandbox sees only /usr, so install the system Python (e.g. python3)`,
      );
    }
    return { argv0: p, roots: [] };
  }
  const abs = resolve(ctx.cwd, cmd);
  if (!existsSync(abs)) throw bad(`${cmd} not found at ${abs} (relative paths resolve against ${ctx.cwd})`);
  const venvDir = dirname(dirname(abs));
  const cfg = join(venvDir, 'pyvenv.cfg');
  if (isFile(cfg)) {
    const home = /^\s*home\s*=\s*(.+?)\s*$/m.exec(readFileSync(cfg, 'utf8'))?.[1];
    if (home === undefined || !under(realOr(home), '/usr')) {
      throw bad(
        `the virtualenv ${venvDir} is based on ${home ?? 'an unknown Python'}, which the sandbox cannot see (only /usr); recreate it with \`/usr/bin/python3 -m venv\``,
      );
    }
    const real = realpathSync(venvDir);
    return { argv0: { host: join(real, 'bin', basename(abs)) }, roots: [real], venv: real };
  }
  const real = realpathSync(abs);
  if (under(real, '/usr')) return { argv0: under(abs, '/usr') ? normalize(abs) : real, roots: [] };
  throw bad(
    `${cmd} is outside /usr; the sandbox can run only the system Python (/usr/bin/python3) or a virtualenv made from it`,
  );
}

// ---------------------------------------------------------------------------------------------------
// Paths: executable scripts and binaries.

function pathPlan(cmd: string, args: string[], ctx: Ctx): Plan {
  const abs = resolve(ctx.cwd, cmd);
  if (!isFile(abs)) throw bad(`${cmd} not found at ${abs} (relative paths resolve against ${ctx.cwd})`);
  const real = realpathSync(abs);
  const head = readHead(real);
  const sb = parseShebang(head);
  if (sb !== undefined) {
    if (NODE_RE.test(sb.interp)) return nodePlan([...sb.args, real, ...args], ctx);
    if (PYTHON_RE.test(sb.interp)) {
      return pythonPlan(sb.path.includes('/') ? sb.path : sb.interp, [...sb.args, real, ...args], ctx);
    }
    const why = NOT_IN_SANDBOX.has(sb.interp) ? UNSUPPORTED[sb.interp] : undefined;
    if (why !== undefined)
      throw bad(`${cmd} is a ${sb.interp} script, which is not supported (${why}). ${SUPPORTED}`);
  } else if (!head.startsWith('\x7fELF')) {
    throw bad(
      `${cmd} is neither a binary nor a script with a #! line; run it with its interpreter, e.g. \`node ${cmd}\``,
    );
  }
  if ((statSync(real).mode & 0o111) === 0) {
    throw bad(`${cmd} is not executable; \`chmod +x\` it or run it with its interpreter`);
  }
  const what = sb === undefined ? 'binary' : `${sb.interp} script`;
  if (under(real, '/usr')) {
    const argv0 = under(abs, '/usr') ? abs : real;
    return { argv: [argv0, ...args], roots: [], source: 'binary', description: `${what} ${argv0}` };
  }
  return {
    argv: [{ host: real }, ...args],
    roots: [dirOrFile(real, ctx)],
    source: 'binary',
    description: `${what} ${real}`,
  };
}

/** A binary's own dir, or the file alone when the dir may not be mounted (e.g. it is $HOME). */
function dirOrFile(file: string, ctx: Ctx): string {
  if (refusal(dirname(file), ctx) === undefined) return dirname(file);
  const why = refusal(file, ctx);
  if (why !== undefined) throw bad(`cannot mount ${file} into the sandbox: ${why}`);
  return file;
}

function parseShebang(head: string): { interp: string; path: string; args: string[] } | undefined {
  if (!head.startsWith('#!')) return undefined;
  const tokens = (head.slice(2).split('\n')[0] ?? '').trim().split(/\s+/).filter(Boolean);
  let path = tokens.shift();
  if (path === undefined) return undefined;
  if (basename(path) === 'env') {
    while (tokens[0] !== undefined && (tokens[0].startsWith('-') || tokens[0].includes('='))) tokens.shift();
    path = tokens.shift() ?? '';
  }
  return { interp: basename(path), path, args: tokens };
}

function whichOnPath(cmd: string, ctx: Ctx): string | undefined {
  const dirs = (ctx.env.PATH ?? '/usr/local/bin:/usr/bin:/bin').split(':').filter((d) => isAbsolute(d));
  return dirs.map((d) => join(d, cmd)).find((p) => isFile(p) && (statSync(p).mode & 0o111) !== 0);
}

// ---------------------------------------------------------------------------------------------------
// Small file-system helpers.

function defaultGlobalRoots(env: Record<string, string | undefined>): string[] {
  const prefixes = [
    env.npm_config_prefix,
    env.NPM_CONFIG_PREFIX,
    dirname(dirname(process.execPath)), // npm's default global prefix is node's own
    '/usr/local',
    '/usr',
  ].filter((p): p is string => p !== undefined && p !== '');
  return [...new Set(prefixes.map((p) => join(p, 'lib', 'node_modules')))];
}

function ancestors(dir: string): string[] {
  const out = [dir];
  for (let d = dir; d !== dirname(d); d = dirname(d)) out.push(dirname(d));
  return out;
}

function displayPath(p: string, ctx: Ctx): string {
  const rel = relative(ctx.cwd, p);
  return rel === '' ? '.' : rel.startsWith('..') || isAbsolute(rel) ? p : `./${rel}`;
}

function isFile(p: string): boolean {
  return statSync(p, { throwIfNoEntry: false })?.isFile() ?? false;
}

function isDir(p: string): boolean {
  return statSync(p, { throwIfNoEntry: false })?.isDirectory() ?? false;
}

function realOr(p: string): string {
  try {
    return realpathSync(p);
  } catch {
    return p;
  }
}

function readHead(file: string): string {
  const fd = openSync(file, 'r');
  try {
    const buf = Buffer.alloc(256);
    const n = readSync(fd, buf, 0, buf.length, 0);
    return buf.subarray(0, n).toString('latin1');
  } finally {
    closeSync(fd);
  }
}
