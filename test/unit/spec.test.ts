// The sandbox spec and exec options at the trust boundary: defaults, security refinements, and
// INVALID_SPEC errors that name the offending field by its dotted path.
import { describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import {
  BACKEND_NAMES,
  ExecOptionsSchema,
  parseCommand,
  parseOrThrow,
  parseSandboxSpec,
  SandboxSpecSchema,
} from '../../src/core/spec.js';

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;
const DAY_MS = 24 * 3_600_000;

function specError(input: unknown): AirlockError {
  try {
    parseSandboxSpec(input);
  } catch (e) {
    if (AirlockError.isInstance(e)) return e;
    throw e;
  }
  return expect.fail(`expected INVALID_SPEC for ${JSON.stringify(input)}`);
}

function expectInvalid(input: unknown, field: string): AirlockError {
  const e = specError(input);
  expect({ code: e.code, field: e.field }).toEqual({ code: 'INVALID_SPEC', field });
  return e;
}

describe('parseSandboxSpec defaults', () => {
  const defaults = {
    backend: 'namespaces',
    ttlMs: 600_000,
    limits: { memoryBytes: 512 * MiB, cpus: 1, pids: 256, diskBytes: 512 * MiB },
    workspace: { mode: 'empty' },
    mounts: [],
    env: {},
    metadata: {},
    secrets: [],
    canaries: [],
  };

  it('fills every default from an empty spec', () => {
    expect(parseSandboxSpec({})).toEqual(defaults);
  });

  it('treats undefined and null as an empty spec', () => {
    expect(parseSandboxSpec(undefined)).toEqual(defaults);
    expect(parseSandboxSpec(null)).toEqual(defaults);
  });

  it('fills the limits a partial spec leaves out', () => {
    expect(parseSandboxSpec({ limits: { pids: 64 } }).limits).toEqual({ ...defaults.limits, pids: 64 });
    expect(parseSandboxSpec({ limits: {} }).limits).toEqual(defaults.limits);
  });

  it('keeps what was given', () => {
    const spec = {
      backend: 'namespaces',
      ttlMs: 5_000,
      limits: { memoryBytes: 64 * MiB, cpus: 0.5, pids: 8, diskBytes: MiB },
      workspace: { mode: 'ro', hostDir: '/home/me/project' },
      mounts: [{ hostPath: '/opt/srv', path: '/opt/srv' }],
      env: { A: '1', _B: '', c9: 'x=y' },
      metadata: { owner: 'me' },
      secrets: [],
      canaries: [],
    };
    expect(parseSandboxSpec(spec)).toEqual(spec);
  });

  it('does not share default objects between specs', () => {
    const a = parseSandboxSpec({});
    const b = parseSandboxSpec({});
    expect(a.limits).not.toBe(b.limits);
    a.env.X = 'mutated';
    expect(parseSandboxSpec({}).env).toEqual({});
  });

  it('accepts every backend name', () => {
    for (const backend of BACKEND_NAMES) expect(parseSandboxSpec({ backend }).backend).toBe(backend);
    expect([...BACKEND_NAMES]).toEqual(['namespaces', 'gvisor', 'microvm', 'wasm']);
  });

  it('is exported as a zod schema', () => {
    expect(SandboxSpecSchema.safeParse({}).success).toBe(true);
    expect(SandboxSpecSchema.safeParse({ nope: 1 }).success).toBe(false);
  });
});

describe('parseSandboxSpec limits', () => {
  it.each([
    ['memoryBytes', -1],
    ['memoryBytes', 16 * MiB - 1],
    ['memoryBytes', 64 * GiB + 1],
    ['memoryBytes', 16 * MiB + 0.5],
    ['memoryBytes', '512m'],
    ['cpus', 0],
    ['cpus', -1],
    ['cpus', 257],
    ['pids', 7],
    ['pids', 65_537],
    ['pids', 10.5],
    ['diskBytes', MiB - 1],
    ['diskBytes', 256 * GiB + 1],
  ])('rejects %s = %s', (key, value) => {
    expectInvalid({ limits: { [key]: value } }, `limits.${key}`);
  });

  it.each([
    ['memoryBytes', 16 * MiB],
    ['memoryBytes', 64 * GiB],
    ['cpus', 0.01],
    ['cpus', 256],
    ['pids', 8],
    ['pids', 65_536],
    ['diskBytes', MiB],
    ['diskBytes', 256 * GiB],
  ])('accepts %s = %s (bounds are inclusive)', (key, value) => {
    expect(parseSandboxSpec({ limits: { [key]: value } }).limits[key as 'pids']).toBe(value);
  });

  it('says what the minimum is', () => {
    expect(specError({ limits: { memoryBytes: -1 } }).message).toMatch(/16 MiB/);
    expect(specError({ limits: { pids: 1 } }).message).toMatch(/at least 8/);
  });

  it('rejects unknown limit keys by their path', () => {
    const e = expectInvalid({ limits: { memory: 1 } }, 'limits.memory');
    expect(e.message).toContain('"memory"');
  });
});

describe('parseSandboxSpec ttlMs', () => {
  it.each([999, DAY_MS + 1, 1500.5, -1, '10s'])('rejects %s', (ttlMs) => {
    expectInvalid({ ttlMs }, 'ttlMs');
  });
  it.each([1000, DAY_MS])('accepts %s', (ttlMs) => {
    expect(parseSandboxSpec({ ttlMs }).ttlMs).toBe(ttlMs);
  });
});

describe('parseSandboxSpec workspace', () => {
  it('normalises hostDir', () => {
    const hostDir = (h: string): string | undefined =>
      parseSandboxSpec({ workspace: { mode: 'cow', hostDir: h } }).workspace.hostDir;
    expect(hostDir('/home/me/project/')).toBe('/home/me/project');
    expect(hostDir('/home//me/./x/../project')).toBe('/home/me/project');
  });

  it.each([
    ['cow without hostDir', { mode: 'cow' }, 'workspace.hostDir'],
    ['ro without hostDir', { mode: 'ro' }, 'workspace.hostDir'],
    ['relative hostDir', { mode: 'cow', hostDir: 'project' }, 'workspace.hostDir'],
    ['dot-relative hostDir', { mode: 'cow', hostDir: './project' }, 'workspace.hostDir'],
    ['empty hostDir', { mode: 'cow', hostDir: '' }, 'workspace.hostDir'],
    ['hostDir "/"', { mode: 'ro', hostDir: '/' }, 'workspace.hostDir'],
    ['hostDir "//"', { mode: 'ro', hostDir: '//' }, 'workspace.hostDir'],
    ['hostDir normalising to "/"', { mode: 'ro', hostDir: '/home/..' }, 'workspace.hostDir'],
    ['hostDir /proc', { mode: 'ro', hostDir: '/proc' }, 'workspace.hostDir'],
    ['hostDir under /proc', { mode: 'ro', hostDir: '/proc/1/root' }, 'workspace.hostDir'],
    ['hostDir /sys/', { mode: 'cow', hostDir: '/sys/' }, 'workspace.hostDir'],
    ['hostDir under /dev', { mode: 'cow', hostDir: '/dev/shm' }, 'workspace.hostDir'],
    ['hostDir under /run', { mode: 'cow', hostDir: '/run/user/0' }, 'workspace.hostDir'],
    ['hostDir dodging into /proc', { mode: 'ro', hostDir: '/tmp/../proc' }, 'workspace.hostDir'],
    ['hostDir with mode empty', { hostDir: '/home/me' }, 'workspace.mode'],
    ['unknown mode', { mode: 'rw', hostDir: '/home/me' }, 'workspace.mode'],
    ['unknown key', { mode: 'empty', path: '/x' }, 'workspace.path'],
  ])('rejects %s', (_what, workspace, field) => {
    expectInvalid({ workspace }, field);
  });

  it('allows paths that merely start like a forbidden root', () => {
    for (const hostDir of ['/runner/work', '/procedures', '/devel', '/system']) {
      expect(parseSandboxSpec({ workspace: { mode: 'ro', hostDir } }).workspace.hostDir).toBe(hostDir);
    }
  });
});

describe('parseSandboxSpec env and metadata', () => {
  it.each(['1BAD', 'A-B', 'A B', '', 'É', 'A=B'])('rejects env name %j', (name) => {
    expectInvalid({ env: { [name]: 'x' } }, `env.${name}`);
  });

  it('explains the env name rule', () => {
    expect(specError({ env: { '1BAD': 'x' } }).message).toMatch(/letters, digits and _/);
  });

  it('rejects NUL bytes in env values', () => {
    const e = expectInvalid({ env: { OK: 'a\0b' } }, 'env.OK');
    expect(e.message).toMatch(/NUL/);
  });

  it('rejects non-string env values and metadata', () => {
    expectInvalid({ env: { N: 1 } }, 'env.N');
    expectInvalid({ metadata: { n: 1 } }, 'metadata.n');
    expectInvalid({ env: ['A=1'] }, 'env');
  });
});

describe('parseSandboxSpec persistent and layers', () => {
  const d = (c: string): string => `sha256:${c.repeat(64)}`;

  it('leaves both out unless given', () => {
    const spec = parseSandboxSpec({});
    expect('persistent' in spec).toBe(false);
    expect('layers' in spec).toBe(false);
    expect(parseSandboxSpec({ persistent: true, layers: [d('a'), d('b')] })).toMatchObject({
      persistent: true,
      layers: [d('a'), d('b')],
    });
  });

  it('rejects what is not a snapshot chain', () => {
    expect(expectInvalid({ persistent: 'yes' }, 'persistent').code).toBe('INVALID_SPEC');
    expect(expectInvalid({ layers: ['latest'] }, 'layers.0').message).toMatch(/sha256:.*64 lowercase hex/);
    expectInvalid({ layers: [d('A')] }, 'layers.0');
    expectInvalid({ layers: [`sha512:${'a'.repeat(64)}`] }, 'layers.0');
    expectInvalid({ layers: [d('a'), d('b'), d('a')] }, 'layers');
    expectInvalid({ layers: [] }, 'layers');
    const deep = Array.from({ length: 33 }, (_, i) => `sha256:${i.toString(16).padStart(64, '0')}`);
    expect(expectInvalid({ layers: deep }, 'layers').message).toMatch(/32/);
  });
});

describe('parseSandboxSpec errors', () => {
  it('names an unknown top-level key', () => {
    const e = expectInvalid({ memoryBytes: 1 }, 'memoryBytes');
    expect(e.message).toContain('"memoryBytes"');
  });

  it('names an unknown backend', () => {
    const e = expectInvalid({ backend: 'nope' }, 'backend');
    expect(e.message).toContain('namespaces');
  });

  it('reports a non-object spec without a field', () => {
    for (const input of [5, 'spec', [], true]) {
      const e = specError(input);
      expect(e.code).toBe('INVALID_SPEC');
      expect(e.field).toBe('');
    }
  });

  it('puts the field in the message', () => {
    expect(specError({ limits: { memoryBytes: -1 } }).message).toContain('limits.memoryBytes');
    expect(specError({ workspace: { mode: 'cow' } }).message).toContain('workspace.hostDir');
  });
});

describe('exec options', () => {
  const parse = (o: unknown) => parseOrThrow(ExecOptionsSchema, o, 'exec options');

  it('has defaults', () => {
    expect(parse({})).toEqual({
      timeoutMs: 60_000,
      maxOutputBytes: 64_000,
      cwd: '/workspace',
      env: {},
      background: false,
    });
  });

  it('keeps the options it does not validate (stdin, signal, callbacks)', () => {
    const signal = new AbortController().signal;
    const onStdout = (): void => {};
    const onStderr = (): void => {};
    expect(parse({ signal, onStdout, onStderr, stdin: 'x' })).toMatchObject({
      signal,
      onStdout,
      onStderr,
      stdin: 'x',
    });
  });

  it.each([
    [{ timeoutMs: 0 }, 'timeoutMs'],
    [{ timeoutMs: 1.5 }, 'timeoutMs'],
    [{ timeoutMs: DAY_MS + 1 }, 'timeoutMs'],
    [{ maxOutputBytes: 63 }, 'maxOutputBytes'],
    [{ maxOutputBytes: 256 * MiB + 1 }, 'maxOutputBytes'],
    [{ cwd: 'tmp' }, 'cwd'],
    [{ cwd: '/tmp\0' }, 'cwd'],
    [{ env: { '1X': 'y' } }, 'env.1X'],
    [{ background: 'yes' }, 'background'],
    [{ timeout: 5 }, 'timeout'],
    [{ onstdout: () => {} }, 'onstdout'],
  ])('rejects %j naming %s', (o, field) => {
    let err: unknown;
    try {
      parse(o);
    } catch (e) {
      err = e;
    }
    expect(AirlockError.isInstance(err)).toBe(true);
    expect((err as AirlockError).field).toBe(field);
    expect((err as AirlockError).message).toContain('exec options');
  });
});

describe('parseCommand', () => {
  it('runs a shell string with /bin/sh -c', () => {
    expect(parseCommand('echo hi | wc -c')).toEqual(['/bin/sh', '-c', 'echo hi | wc -c']);
  });

  it('copies an argv array verbatim', () => {
    const argv = ['printf', '%s|', 'a b', "c'd", ''];
    const out = parseCommand(argv);
    expect(out).toEqual(argv);
    expect(out).not.toBe(argv);
  });

  it.each([[''], ['   '], ['\n\t'], [[]], [['a\0b']], ['echo \0'], [[1]], [null], [undefined], [{}]])(
    'rejects %j with INVALID_ARGUMENT',
    (cmd) => {
      let err: unknown;
      try {
        parseCommand(cmd);
      } catch (e) {
        err = e;
      }
      expect(AirlockError.is(err, 'INVALID_ARGUMENT')).toBe(true);
      expect((err as AirlockError).field).toBe('command');
    },
  );
});

describe('egress in the sandbox spec', () => {
  it('has no network unless one is given', () => {
    expect(parseSandboxSpec({}).network).toBeUndefined();
  });

  it('accepts a network policy and secrets bound to allowed hosts', () => {
    const spec = parseSandboxSpec({
      network: { allow: ['api.github.com'] },
      secrets: [{ name: 'GITHUB_TOKEN', value: { fromEnv: 'GITHUB_TOKEN' }, hosts: ['api.github.com'] }],
    });
    expect(spec.network?.allow).toEqual(['api.github.com']);
    expect(spec.secrets[0]?.name).toBe('GITHUB_TOKEN');
  });

  it('takes a literal value, alone and non-empty', () => {
    const network = { allow: ['api.example.com'] };
    const spec = parseSandboxSpec({
      network,
      secrets: [{ name: 'T', value: { literal: 'v' }, hosts: ['api.example.com'] }],
    });
    expect(spec.secrets[0]?.value).toEqual({ literal: 'v' });
    expectInvalid(
      { network, secrets: [{ name: 'T', value: { literal: '' }, hosts: ['api.example.com'] }] },
      'secrets.0.value.literal',
    );
    expectInvalid(
      {
        network,
        secrets: [{ name: 'T', value: { literal: 'v', fromEnv: 'T' }, hosts: ['api.example.com'] }],
      },
      'secrets.0.value',
    );
  });

  it('refuses secrets without a network policy, and secrets for hosts the policy does not allow', () => {
    expectInvalid(
      { secrets: [{ name: 'T', value: { fromEnv: 'T' }, hosts: ['api.github.com'] }] },
      'secrets',
    );
    expectInvalid(
      {
        network: { allow: ['example.com'] },
        secrets: [{ name: 'T', value: { fromEnv: 'T' }, hosts: ['api.github.com'] }],
      },
      'secrets.0.hosts.0',
    );
  });
});
