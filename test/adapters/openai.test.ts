// OpenAI function calling: the definitions are valid JSON Schema (ajv compiles each, and accepts and
// refuses what the zod schemas do), and a tool call makes a round trip through a real sandbox.
import { join } from 'node:path';
import Ajv2020 from 'ajv/dist/2020.js';
import { build } from 'esbuild';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Airlock, Sandbox } from '../../src/index.js';
import {
  ExecInputSchema,
  ReadFileInputSchema,
  WriteFileInputSchema,
  handleOpenAiToolCall,
  openAiTools,
} from '../../src/adapters/ai.js';
import { expectError } from '../contract/support.js';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, settledResidue, testAirlock } from '../helpers.js';

describe('airlock-sandbox/ai without the ai package', () => {
  it('loads nothing from `ai` at run time (types only)', async () => {
    const r = await build({
      entryPoints: [join(import.meta.dirname, '..', '..', 'src', 'adapters', 'ai.ts')],
      bundle: true,
      write: false,
      platform: 'node',
      format: 'esm',
      packages: 'external',
      metafile: true,
      logLevel: 'silent',
    });
    const external = Object.values(r.metafile.inputs).flatMap((i) =>
      i.imports.filter((x) => x.external).map((x) => x.path),
    );
    expect(external).toContain('zod'); // the check sees package imports
    expect(external.filter((x) => x === 'ai' || x.startsWith('ai/') || x.startsWith('@ai-sdk/'))).toEqual([]);
  });
});

describe('OpenAI tool definitions', () => {
  const tools = openAiTools();
  const ajv = new Ajv2020.default({ strict: true, strictRequired: false, allErrors: true });
  const byName = Object.fromEntries(tools.map((t) => [t.function.name, t.function]));

  it('names each tool once, in the shape Chat Completions takes', () => {
    expect(tools.map((t) => t.function.name)).toEqual([
      'bash',
      'runCode',
      'readFile',
      'writeFile',
      'listFiles',
    ]);
    for (const t of tools) {
      expect(t.type).toBe('function');
      expect(t.function.name).toMatch(/^[a-zA-Z0-9_-]{1,64}$/);
      expect(t.function.description.length).toBeGreaterThan(20);
      expect(t.function.parameters).toMatchObject({ type: 'object', additionalProperties: false });
      expect(t.function.parameters).not.toHaveProperty('$schema');
    }
    expect(openAiTools({ runCode: false }).map((t) => t.function.name)).not.toContain('runCode');
  });

  it('compiles under ajv and agrees with the zod schemas on good and bad input', () => {
    const cases: Array<
      [
        string,
        typeof ExecInputSchema | typeof ReadFileInputSchema | typeof WriteFileInputSchema,
        unknown[],
        unknown[],
      ]
    > = [
      [
        'bash',
        ExecInputSchema,
        [{ command: 'ls' }, { command: 'ls', cwd: '/tmp', timeoutMs: 1000 }],
        [{}, { command: '' }, { command: 'ls', extra: 1 }, { command: 'ls', timeoutMs: 0 }, { command: 7 }],
      ],
      [
        'readFile',
        ReadFileInputSchema,
        [{ path: 'a.txt' }, { path: '/x', startLine: 2, endLine: 3 }],
        [{ path: '' }, { path: 'a', startLine: 0 }, { path: 'a', startLine: 1.5 }],
      ],
      ['writeFile', WriteFileInputSchema, [{ path: 'a', content: '' }], [{ path: 'a' }, { content: 'x' }]],
    ];
    for (const [name, zod, good, bad] of cases) {
      const validate = ajv.compile(byName[name]!.parameters);
      for (const g of good) {
        expect(validate(g), `${name} ${JSON.stringify(g)}`).toBe(true);
        expect(zod.safeParse(g).success).toBe(true);
      }
      for (const b of bad) {
        expect(validate(b), `${name} ${JSON.stringify(b)}`).toBe(false);
        expect(zod.safeParse(b).success).toBe(false);
      }
    }
    for (const t of tools) expect(() => ajv.compile(t.function.parameters)).not.toThrow();
  });
});

describe.skipIf(!canRunNamespaces)(`OpenAI tool calls in a sandbox (${SKIP_REASON})`, () => {
  let airlock: Airlock;
  let sbx: Sandbox;
  beforeAll(async () => {
    airlock = testAirlock();
    sbx = await airlock.create({});
  });
  afterAll(async () => {
    await airlock?.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });

  const call = (name: string, args: unknown, id = 'call_1') => ({
    id,
    type: 'function' as const,
    function: { name, arguments: typeof args === 'string' ? args : JSON.stringify(args) },
  });

  it('runs a call and answers with a tool message the model can read', async () => {
    const w = await handleOpenAiToolCall(
      sbx,
      call('writeFile', { path: 'o.txt', content: 'x\ny' }, 'call_w'),
    );
    expect(w).toEqual({
      role: 'tool',
      tool_call_id: 'call_w',
      content: JSON.stringify({ path: '/workspace/o.txt', bytes: 3 }),
    });
    const r = await handleOpenAiToolCall(sbx, call('bash', { command: 'cat o.txt; echo err >&2; exit 5' }));
    expect(JSON.parse(r.content)).toEqual({ exitCode: 5, stdout: 'x\ny', stderr: 'err\n' });
    const l = await handleOpenAiToolCall(sbx, call('listFiles', {}));
    expect(JSON.parse(l.content)).toEqual({ entries: [{ name: 'o.txt', type: 'file', size: 3 }] });
    const missing = await handleOpenAiToolCall(sbx, call('readFile', { path: 'none' }));
    expect(JSON.parse(missing.content)).toMatchObject({ error: { code: 'FILE_NOT_FOUND' } });
    const cut = await handleOpenAiToolCall(
      sbx,
      call('bash', { command: 'head -c 50000 /dev/zero | tr "\\0" a' }),
      {
        maxOutputChars: 1000,
      },
    );
    const out = JSON.parse(cut.content) as { stdout: string };
    expect(out.stdout.length).toBeLessThanOrEqual(1000);
    expect(out.stdout).toContain('characters cut');
  });

  it('refuses unknown tools and arguments that are not JSON or do not fit, before anything runs', async () => {
    await expectError(handleOpenAiToolCall(sbx, call('rm_rf', {})), 'INVALID_ARGUMENT', 'function.name');
    await expectError(handleOpenAiToolCall(sbx, call('__proto__', {})), 'INVALID_ARGUMENT', 'function.name');
    await expectError(
      handleOpenAiToolCall(sbx, call('bash', '{"command": "touch /workspace/x"')),
      'INVALID_ARGUMENT',
      'function.arguments',
    );
    await expectError(
      handleOpenAiToolCall(sbx, call('bash', { command: 'touch /workspace/x', sudo: true })),
      'INVALID_ARGUMENT',
    );
    await expectError(
      handleOpenAiToolCall(sbx, call('bash', { cmd: 'touch /workspace/x' })),
      'INVALID_ARGUMENT',
      'command',
    );
    await expectError(
      handleOpenAiToolCall(sbx, call('runCode', { code: '1' }), { runCode: false }),
      'INVALID_ARGUMENT',
      'function.name',
    );
    expect(await sbx.files.exists('/workspace/x')).toBe(false);
  });
});
