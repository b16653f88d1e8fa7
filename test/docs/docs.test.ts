// The docs test: every fenced code block of README.md and docs/**.md is executed or checked (see
// blocks.ts for how each kind is covered), the generated API reference is current, and the reference
// tables of the guides name every field of the schemas they document. Code runs against the source
// (`airlock-sandbox` is mapped to src/index.ts, `airlock` is a shim running bin/airlock.cjs) in scratch
// dirs, on the test state dir and uid range, and leaves no sandbox behind.
import { execFile } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse as parseYaml } from 'yaml';
import type { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  parseGatewayConfig,
  McpServerAirlockSchema,
  GatewayOptionsSchema,
  TenantSchema,
} from '../../src/mcp/config.js';
import { BudgetsSchema } from '../../src/mcp/budget.js';
import {
  ArgumentRuleSchema,
  PathRuleSchema,
  ScanPolicySchema,
  ToolRulesSchema,
} from '../../src/policy/mcp.js';
import { EgressPolicySchema, NetworkPolicySchema, SecretSpecSchema } from '../../src/policy/network.js';
import { parseTemplate, TemplateFileSchema, TemplateStepSchema } from '../../src/core/template.js';
import { ServerConfigSchema } from '../../src/server/front.js';
import { ClosureManifestSchema } from '../../src/images/closure-manifest.js';
import { canRunNamespaces, residue, SKIP_REASON, TEST_STATE_DIR, TEST_UID_RANGE } from '../helpers.js';
import { blockName, docFiles, extractBlocks, type Block } from './blocks.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = join(ROOT, 'node_modules', '.bin');
const DOCS = docFiles(ROOT);
const BLOCKS = DOCS.flatMap((d) => extractBlocks(ROOT, d));

/** Config blocks: `schema=NAME` → the parser the code itself uses for that file. */
const SCHEMAS: Record<string, (v: unknown) => unknown> = {
  gateway: (v) => parseGatewayConfig(v),
  'mcp-policy': (v) => McpServerAirlockSchema.parse(v),
  policy: (v) => EgressPolicySchema.parse(v),
  template: (v) => parseTemplate(v),
  server: (v) => ServerConfigSchema.parse(v),
  'closure-manifest': (v) => ClosureManifestSchema.parse(v),
};

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function run(
  cmd: string,
  args: string[],
  opts: { cwd: string; env?: NodeJS.ProcessEnv; timeoutMs?: number },
): Promise<Run> {
  return new Promise((resolve) => {
    execFile(
      cmd,
      args,
      {
        cwd: opts.cwd,
        env: opts.env ?? process.env,
        timeout: opts.timeoutMs ?? 240_000,
        maxBuffer: 16 << 20,
      },
      (err, stdout, stderr) => {
        const code = err ? (typeof err.code === 'number' ? err.code : null) : 0;
        resolve({ code, stdout, stderr: err && code === null ? `${stderr}\n${err.message}` : stderr });
      },
    );
  });
}

const shown = (r: Run): string => `exit ${r.code}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`;

// ---- scratch: the shim package, the `airlock` command, tsconfigs -----------------------------------

let scratch: string;
let env: NodeJS.ProcessEnv;
const scratchOf = new Map<string, string>();

function setUpScratch(): void {
  scratch = mkdtempSync(join(tmpdir(), 'airlock-docs-'));
  symlinkSync(join(ROOT, 'node_modules'), join(scratch, 'node_modules'));
  writeFileSync(join(scratch, 'package.json'), JSON.stringify({ type: 'module', private: true }));
  const index = join(ROOT, 'src', 'index.ts');
  // `airlock-sandbox` at run time: the real exports, with runtimes on the test's state dir and uids;
  // the runner closes every runtime a block made (a block that forgets is still cleaned up).
  writeFileSync(
    join(scratch, 'airlock-sandbox.ts'),
    `import * as real from ${JSON.stringify(index)};
export * from ${JSON.stringify(index)};
const made: real.Airlock[] = [];
export class Airlock extends real.Airlock {
  constructor(o: real.AirlockOptions = {}) {
    super({ stateDir: ${JSON.stringify(TEST_STATE_DIR)}, uidRange: ${JSON.stringify(TEST_UID_RANGE)}, ...o });
    made.push(this);
  }
}
let shared: Airlock | undefined;
export const Sandbox = {
  create: (spec?: real.SandboxSpecInput, o: { airlock?: real.Airlock } = {}) =>
    real.Sandbox.create(spec, { airlock: o.airlock ?? (shared ??= new Airlock()) }),
};
export async function closeAll(): Promise<void> {
  for (const a of made) await a.close().catch(() => {});
}
`,
  );
  writeFileSync(
    join(scratch, 'runner.ts'),
    `import { closeAll } from './airlock-sandbox.ts';
import { pathToFileURL } from 'node:url';
let failed = false;
try {
  await import(pathToFileURL(process.argv[2]!).href);
} catch (e) {
  failed = true;
  console.error(e);
} finally {
  await closeAll();
}
process.exit(failed ? 1 : 0);
`,
  );
  writeFileSync(
    join(scratch, 'tsconfig.run.json'),
    JSON.stringify({
      compilerOptions: {
        module: 'NodeNext',
        moduleResolution: 'NodeNext',
        target: 'ES2022',
        allowImportingTsExtensions: true,
        paths: {
          'airlock-sandbox': ['./airlock-sandbox.ts'],
          'airlock-sandbox/ai': [join(ROOT, 'src', 'adapters', 'ai.ts')],
        },
      },
    }),
  );
  const bin = join(scratch, 'bin');
  mkdirSync(bin);
  writeFileSync(
    join(bin, 'airlock'),
    `#!/bin/sh\nexec node ${JSON.stringify(join(ROOT, 'bin', 'airlock.cjs'))} "$@"\n`,
  );
  chmodSync(join(bin, 'airlock'), 0o755);
  env = {
    ...process.env,
    PATH: `${bin}:${process.env.PATH}`,
    AIRLOCK_STATE_DIR: TEST_STATE_DIR,
    AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
  };
}

/** Each doc runs in its own dir, holding its `file=` blocks. */
function docDir(doc: string): string {
  let dir = scratchOf.get(doc);
  if (dir) return dir;
  dir = join(scratch, 'docs', doc.replace(/[/.]/g, '_'));
  mkdirSync(dir, { recursive: true });
  for (const b of BLOCKS.filter((x) => x.doc === doc && x.meta.file))
    writeFileSync(join(dir, b.meta.file!), b.code);
  scratchOf.set(doc, dir);
  return dir;
}

let cliHelp = '';

// ---- checks per kind ------------------------------------------------------------------------------

const SUBCOMMAND = /(?:^|[\s;&|(`$])airlock\s+([a-z][a-z-]*)/g;

function checkSubcommands(b: Block): void {
  for (const m of b.code.matchAll(SUBCOMMAND)) {
    expect(cliHelp, `${blockName(b)} uses \`airlock ${m[1]}\``).toMatch(new RegExp(`^\\s+${m[1]}\\b`, 'm'));
  }
}

async function checkSyntax(b: Block): Promise<void> {
  const dir = docDir(b.doc);
  const file = join(dir, `block-${b.line}.sh`);
  writeFileSync(file, b.code);
  const r = await run('sh', ['-n', file], { cwd: dir });
  expect(r.code, `${blockName(b)} does not parse under /bin/sh:\n${shown(r)}`).toBe(0);
  checkSubcommands(b);
}

/** A block that would change the machine: parsed, and everything it names exists. */
async function checkInstall(b: Block): Promise<void> {
  await checkSyntax(b);
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
    name: string;
    version: string;
    scripts: Record<string, string>;
  };
  for (const m of b.code.matchAll(/npm run ([\w:-]+)/g)) {
    expect(Object.keys(pkg.scripts), `${blockName(b)}: npm run ${m[1]}`).toContain(m[1]);
  }
  for (const m of b.code.matchAll(/(?:^|\s)(scripts\/[\w./-]+)/g)) {
    const p = join(ROOT, m[1]!);
    expect(
      existsSync(p) && (statSync(p).mode & 0o111) !== 0,
      `${blockName(b)}: ${m[1]} is an executable file`,
    ).toBe(true);
  }
  for (const m of b.code.matchAll(/([\w@-]+)-(\d+\.\d+\.\d+[\w.-]*)\.tgz/g)) {
    expect(`${m[1]}-${m[2]}`, `${blockName(b)}: the tarball npm pack makes`).toBe(
      `${pkg.name}-${pkg.version}`,
    );
  }
  if (/npm (ci|install)\b/.test(b.code)) expect(existsSync(join(ROOT, 'package-lock.json'))).toBe(true);
}

async function runShell(b: Block): Promise<void> {
  checkSubcommands(b);
  const dir = docDir(b.doc);
  const file = join(dir, `block-${b.line}.sh`);
  writeFileSync(file, b.code);
  const r = await run('sh', ['-e', file], { cwd: dir, env });
  expect(r.code, `${blockName(b)} failed:\n${shown(r)}`).toBe(0);
}

async function runTs(b: Block): Promise<void> {
  const dir = docDir(b.doc);
  const file = join(dir, `block-${b.line}.${b.lang === 'js' ? 'mjs' : 'ts'}`);
  writeFileSync(file, b.code);
  const r = await run(
    join(BIN, 'tsx'),
    ['--tsconfig', join(scratch, 'tsconfig.run.json'), join(scratch, 'runner.ts'), file],
    {
      cwd: dir,
      env,
    },
  );
  expect(r.code, `${blockName(b)} failed:\n${shown(r)}`).toBe(0);
}

function checkConfig(b: Block): void {
  const schema = b.meta.schema;
  expect(
    schema,
    `${blockName(b)}: a config block names its schema (schema=${Object.keys(SCHEMAS).join('|')})`,
  ).toBeDefined();
  const parse = SCHEMAS[schema!];
  expect(parse, `${blockName(b)}: unknown schema=${schema}`).toBeDefined();
  const value: unknown = b.lang === 'json' ? JSON.parse(b.code) : parseYaml(b.code);
  expect(() => parse!(value), blockName(b)).not.toThrow();
}

/** All ts/js blocks in one tsc run, with `airlock-sandbox` mapped to the source's types. */
async function typecheckAll(blocks: readonly Block[]): Promise<Map<Block, string>> {
  const dir = join(scratch, 'typecheck');
  mkdirSync(dir);
  const files = blocks.map((b, i) => {
    const f = join(dir, `b${i}.ts`);
    writeFileSync(f, b.code.includes('import ') ? b.code : `export {};\n${b.code}`);
    return f;
  });
  writeFileSync(
    join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        target: 'ES2022',
        lib: ['ES2023'],
        module: 'NodeNext',
        moduleResolution: 'NodeNext',
        strict: true,
        noUncheckedIndexedAccess: true,
        skipLibCheck: true,
        noEmit: true,
        types: ['node'],
        typeRoots: [join(ROOT, 'node_modules', '@types')],
        paths: {
          'airlock-sandbox': [join(ROOT, 'src', 'index.ts')],
          'airlock-sandbox/ai': [join(ROOT, 'src', 'adapters', 'ai.ts')],
        },
      },
      files,
    }),
  );
  const r = await run(join(BIN, 'tsc'), ['-p', join(dir, 'tsconfig.json'), '--pretty', 'false'], {
    cwd: scratch,
    timeoutMs: 400_000, // the whole program; minutes when the host is busy
  });
  const errors = new Map<Block, string>();
  for (const line of r.stdout.split('\n')) {
    const m = /b(\d+)\.ts\((\d+),\d+\): (error .*)$/.exec(line);
    if (!m) continue;
    const b = blocks[Number(m[1])]!;
    errors.set(
      b,
      `${errors.get(b) ?? ''}line ${Number(m[2]) - (b.code.includes('import ') ? 0 : 1)}: ${m[3]}\n`,
    );
  }
  if (r.code !== 0 && errors.size === 0) throw new Error(`tsc failed:\n${shown(r)}`);
  return errors;
}

// ---- the tests ------------------------------------------------------------------------------------

const TS = BLOCKS.filter((b) => b.lang === 'ts' || b.lang === 'js');
let typeErrors: Promise<Map<Block, string>>;
let typedoc: Promise<Run>;
let apiOut: string;

beforeAll(async () => {
  setUpScratch();
  typeErrors = typecheckAll(TS);
  typeErrors.catch(() => {}); // awaited by its test
  apiOut = join(scratch, 'api');
  typedoc = run(join(BIN, 'typedoc'), ['--out', apiOut, '--logLevel', 'Error'], {
    cwd: ROOT,
    timeoutMs: 400_000,
  });
  const help = await run(join(scratch, 'bin', 'airlock'), ['--help'], { cwd: scratch, env });
  cliHelp = help.stdout;
  expect(cliHelp, shown(help)).toContain('Commands:');
}, 120_000);

afterAll(() => {
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

it('finds the docs and their blocks', () => {
  expect(DOCS).toEqual(
    expect.arrayContaining(['README.md', 'docs/getting-started.md', 'docs/guides/mcp.md']),
  );
  expect(BLOCKS.length).toBeGreaterThan(20);
});

it('every ts/js block typechecks against the public API', async () => {
  const errors = await typeErrors;
  expect([...errors].map(([b, e]) => `${blockName(b)}\n${e}`)).toEqual([]);
}, 420_000);

for (const doc of DOCS) {
  const blocks = BLOCKS.filter((b) => b.doc === doc);
  if (blocks.length === 0) continue;
  describe(doc, () => {
    for (const b of blocks) {
      const sandboxed = (b.lang === 'ts' || b.lang === 'js') && !b.flags.has('typecheck');
      const shell = b.lang === 'sh' && !b.flags.has('syntax') && !b.flags.has('install');
      const needsHost = sandboxed || shell;
      it.skipIf(needsHost && !canRunNamespaces)(
        `${blockName(b)}${needsHost && !canRunNamespaces ? ` [skipped: ${SKIP_REASON}]` : ''}`,
        async () => {
          if (b.lang === 'json' || b.lang === 'yaml') return checkConfig(b);
          if (b.lang === 'sh') {
            if (b.flags.has('install')) return checkInstall(b);
            if (b.flags.has('syntax')) return checkSyntax(b);
            return runShell(b);
          }
          if (b.flags.has('typecheck')) return; // covered by the typecheck test above
          return runTs(b);
        },
        300_000,
      );
    }
  });
}

it.skipIf(!canRunNamespaces)(
  `the blocks left no sandbox behind${canRunNamespaces ? '' : ` [skipped: ${SKIP_REASON}]`}`,
  async () => {
    expect(residue()).toEqual({ mounts: [], cgroups: [], sandboxDirs: [], leases: [], processes: [] });
  },
);

// ---- generated reference and schema coverage ------------------------------------------------------

it('docs/reference/api is what `npm run docs:api` generates from the current TSDoc', async () => {
  const out = apiOut;
  const r = await typedoc; // started in beforeAll, beside the blocks
  expect(r.code, shown(r)).toBe(0);
  const committed = join(ROOT, 'docs', 'reference', 'api');
  const list = (d: string): string[] =>
    readdirSync(d, { recursive: true, withFileTypes: true })
      .filter((e) => e.isFile())
      .map((e) => relative(d, join(e.parentPath, e.name)))
      .sort();
  expect(list(committed), 'run `npm run docs:api` and commit docs/reference/api').toEqual(list(out));
  for (const f of list(out)) {
    expect(readFileSync(join(committed, f), 'utf8'), `${f}: run \`npm run docs:api\``).toBe(
      readFileSync(join(out, f), 'utf8'),
    );
  }
}, 420_000);

/** The keys of a zod object schema (through refinements, defaults and transforms). */
function keysOf(schema: z.ZodType): string[] {
  let s: unknown = schema;
  for (let i = 0; i < 8; i++) {
    const o = s as { shape?: Record<string, unknown>; def?: { in?: unknown; innerType?: unknown } };
    if (o.shape) return Object.keys(o.shape);
    s = o.def?.in ?? o.def?.innerType;
  }
  throw new Error('not an object schema');
}

describe('the guides document every field of the schemas they are the reference for', () => {
  const cases: Array<[string, Record<string, z.ZodType>]> = [
    [
      'docs/guides/mcp.md',
      {
        McpServerAirlockSchema,
        GatewayOptionsSchema,
        TenantSchema,
        ToolRulesSchema,
        ArgumentRuleSchema,
        PathRuleSchema,
        BudgetsSchema,
        ScanPolicySchema,
      },
    ],
    ['docs/guides/egress.md', { NetworkPolicySchema, SecretSpecSchema }],
    ['docs/guides/templates.md', { TemplateFileSchema, TemplateStepSchema }],
  ];
  for (const [doc, schemas] of cases) {
    it(doc, () => {
      const text = readFileSync(join(ROOT, doc), 'utf8');
      const absent = Object.entries(schemas).flatMap(([name, s]) =>
        keysOf(s)
          // `k`, `parent.k`, `k[]` or `parent[].k`, e.g. `steps[].run`
          .filter((k) => !new RegExp(`\`(?:[\\w.\\[\\]]*\\.)?${k}(?:\\[\\])?\``).test(text))
          .map((k) => `${name}.${k}`),
      );
      expect(absent).toEqual([]);
    });
  }
});

// ---- links and the specification ------------------------------------------------------------------

/** Generated by another part of the build; linked before it lands (reconciled at merge). */
const PENDING_LINKS: Record<string, string> = {
  'docs/reference/cli.md': 'generated by `npm run docs:cli`',
};

it('every relative link of README, docs/ and SPECIFICATION.md points at a file that exists', () => {
  const broken: string[] = [];
  for (const doc of [...DOCS, 'SPECIFICATION.md']) {
    const text = readFileSync(join(ROOT, doc), 'utf8').replace(/```[\s\S]*?```/g, '');
    for (const m of text.matchAll(/\]\(([^)\s]+)\)/g)) {
      const target = m[1]!.split('#')[0]!;
      if (!target || /^[a-z]+:/.test(target)) continue;
      const path = relative(ROOT, join(ROOT, dirname(doc), target));
      if (!existsSync(join(ROOT, path)) && !(path in PENDING_LINKS)) broken.push(`${doc}: ${m[1]}`);
    }
  }
  expect(broken).toEqual([]);
});

it('SPECIFICATION.md: every target is numbered and names a bench or test file that exists', () => {
  const text = readFileSync(join(ROOT, 'SPECIFICATION.md'), 'utf8');
  const rows = text.split('\n').filter((l) => /^\|\s*[A-Z]\d+[a-z]?\s*\|/.test(l));
  expect(rows.length).toBeGreaterThan(30);
  const ids = rows.map((r) => r.split('|')[1]!.trim());
  expect(new Set(ids).size, 'target numbers are unique').toBe(ids.length);
  const problems = rows.flatMap((r) => {
    const files = [...r.matchAll(/`((?:test|bench)\/[\w./-]+\.ts)`/g)].map((m) => m[1]!);
    if (files.length === 0) return [`${r.split('|')[1]!.trim()} names no bench or test file`];
    return files
      .filter((f) => !existsSync(join(ROOT, f)))
      .map((f) => `${r.split('|')[1]!.trim()}: ${f} does not exist`);
  });
  expect(problems).toEqual([]);
});
