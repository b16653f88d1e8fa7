// Template files at the trust boundary: defaults, path rules, canonical hashing, and the sandbox
// spec's `template` field. Pure: no sandbox is built here (see test/contract/template.test.ts).
import { describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { parseSandboxSpec } from '../../src/core/spec.js';
import {
  DEFAULT_STEP_TIMEOUT_MS,
  canonicalJson,
  parseTemplate,
  parseTemplateYaml,
  templateSourceDigest,
} from '../../src/core/template.js';

const invalid = (f: () => unknown): AirlockError => {
  try {
    f();
  } catch (e) {
    if (AirlockError.isInstance(e)) return e;
    throw e;
  }
  throw new Error('expected an AirlockError');
};

describe('template files', () => {
  it('fills defaults and resolves file paths under /workspace', () => {
    const t = parseTemplate({ name: 'x', files: [{ path: 'a/./b', content: '' }], steps: [{ run: 'ls' }] });
    expect(t.base).toBe('host');
    expect(t.files[0]!.path).toBe('/workspace/a/b');
    expect(t.steps[0]!.timeoutMs).toBe(DEFAULT_STEP_TIMEOUT_MS);
    expect(t.limits.memoryBytes).toBe(512 * 1024 * 1024);
  });

  it('rejects what would escape the captured dirs or is ambiguous', () => {
    for (const [input, field] of [
      [{ name: 'x', files: [{ path: '/workspace', content: '' }] }, 'files.0.path'],
      [{ name: 'x', files: [{ path: '/tmp/x', content: '' }] }, 'files.0.path'],
      [{ name: 'x', files: [{ path: 'a/../../etc/x', content: '' }] }, 'files.0.path'],
      [
        {
          name: 'x',
          files: [
            { path: 'a', content: '' },
            { path: '/workspace/a', content: '' },
          ],
        },
        'files',
      ],
      [{ name: 'x', steps: [{ run: [] }] }, 'steps.0.run'],
      [{ name: 'x', steps: [{ run: 'ls', workdir: 'rel' }] }, 'steps.0.workdir'],
      [{ name: 'x', steps: [{ run: 'ls', timeoutMs: 10 }] }, 'steps.0.timeoutMs'],
      [{ name: 'x', base: 'Not A Name' }, 'base'],
      [{ name: 'UPPER' }, 'name'],
      [{ name: 'x', extra: 1 }, 'extra'],
    ] as const) {
      const e = invalid(() => parseTemplate(input));
      expect({ code: e.code, field: e.field }, JSON.stringify(input)).toEqual({
        code: 'INVALID_SPEC',
        field,
      });
    }
    expect(invalid(() => parseTemplateYaml('name: [unclosed')).code).toBe('INVALID_SPEC');
  });

  it('hashes the validated template canonically: key order and spelled-out defaults do not matter', () => {
    const a = parseTemplateYaml('name: x\nsteps:\n  - run: ls\n    env: { B: "2", A: "1" }\n');
    const b = parseTemplateYaml(
      `steps:\n  - env: { A: "1", B: "2" }\n    timeoutMs: ${DEFAULT_STEP_TIMEOUT_MS}\n    run: ls\nbase: host\nname: x\n`,
    );
    expect(templateSourceDigest(a)).toBe(templateSourceDigest(b));
    expect(templateSourceDigest(parseTemplate({ name: 'x', steps: [{ run: 'ls -l' }] }))).not.toBe(
      templateSourceDigest(a),
    );
    expect(canonicalJson({ b: [1, { d: 1, c: undefined }], a: 'x' })).toBe('{"a":"x","b":[1,{"d":1}]}');
  });
});

describe('spec.template', () => {
  const digest = `sha256:${'a'.repeat(64)}`;
  it('takes a name, a digest, or { name?, digest }', () => {
    expect(parseSandboxSpec({ template: 'node-tools' }).template).toBe('node-tools');
    expect(parseSandboxSpec({ template: digest }).template).toBe(digest);
    expect(parseSandboxSpec({ template: { name: 'n', digest } }).template).toEqual({ name: 'n', digest });
  });
  it('rejects anything else, and template together with layers', () => {
    for (const template of ['host', 'sha256:abc', 'Has Space', '', { name: 'n' }]) {
      expect(invalid(() => parseSandboxSpec({ template })).field, JSON.stringify(template)).toMatch(
        /^template/,
      );
    }
    expect(invalid(() => parseSandboxSpec({ template: digest, layers: [digest] })).field).toBe('template');
  });
});
