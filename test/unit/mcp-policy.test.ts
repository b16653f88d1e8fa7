// MCP tool-call policy: tool globs, deny-wins, quarantine, argument JSON Schemas, path fields (with
// normalisation of `..`, `//`, `./`, file:// URIs, percent-encoding, NUL, ~), config-time validation with
// field paths, reasons a model can act on, and the scan policy.
import { describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import {
  ScanPolicySchema,
  ToolRulesSchema,
  compileToolRules,
  decideCall,
  decideFinding,
  decideTool,
  resolveArgumentPath,
  type CallVerdict,
  type CompileToolRulesOptions,
  type ToolRulesInput,
} from '../../src/policy/mcp.js';

const PREFIX = 'blocked by Airlock MCP policy: ';

function rules(input: ToolRulesInput, opts: CompileToolRulesOptions = { server: 'fs' }) {
  return compileToolRules(ToolRulesSchema.parse(input), opts);
}

function denied(v: CallVerdict): { code: string; reason: string } {
  if (v.action !== 'deny') throw new Error(`expected deny, got ${JSON.stringify(v)}`);
  expect(v.reason.startsWith(PREFIX)).toBe(true);
  return v;
}

/** The first issue of a ToolRulesSchema parse, as dotted path + message. */
function issue(input: unknown): { path: string; message: string } {
  const r = ToolRulesSchema.safeParse(input);
  if (r.success) throw new Error(`expected a parse failure for ${JSON.stringify(input)}`);
  const i = r.error.issues[0]!;
  const nested = i.code === 'invalid_key' ? i.issues[0] : undefined;
  return { path: i.path.map(String).join('.'), message: nested?.message ?? i.message };
}

describe('tool names', () => {
  it('allows every tool when tools.allow is absent', () => {
    expect(decideCall(rules({}), 'anything', {})).toEqual({ action: 'allow' });
    expect(decideCall(compileToolRules(undefined), 'anything', undefined)).toEqual({ action: 'allow' });
  });

  it('matches allow globs exactly (case-sensitive), * crossing / and .', () => {
    const c = rules({ allow: ['read_*', 'list_directory', '{get,search}_files', 'admin/*'] });
    for (const t of ['read_file', 'read_multiple_files', 'list_directory', 'get_files', 'admin/x.y'])
      expect(decideCall(c, t, {}).action).toBe('allow');
    for (const t of ['write_file', 'READ_FILE', 'list_directory2', 'xread_file']) {
      const v = denied(decideCall(c, t, {}));
      expect(v.code).toBe('tool_not_allowed');
    }
  });

  it('writes a reason the model can act on', () => {
    const v = denied(decideCall(rules({ allow: ['read_*'] }), 'write_file', {}));
    expect(v.reason).toBe(
      `${PREFIX}tool "write_file" is not in tools.allow for server fs; ask the operator to allow it`,
    );
  });

  it('deny wins over allow, and ignores case', () => {
    const c = rules({ allow: ['*'], deny: ['delete_*', '*admin*'] });
    expect(decideCall(c, 'read_file', {}).action).toBe('allow');
    for (const t of ['delete_file', 'DELETE_FILE', 'Delete_File', 'x/admin/y', 'superADMIN']) {
      const v = denied(decideCall(c, t, {}));
      expect(v.code).toBe('tool_denied');
    }
    expect(denied(decideCall(c, 'delete_file', {})).reason).toContain('tools.deny entry "delete_*"');
  });

  it('an empty allow list allows nothing', () => {
    expect(denied(decideCall(rules({ allow: [] }), 'read_file', {})).code).toBe('tool_not_allowed');
  });

  it('refuses quarantined tools with the reason, after allow/deny', () => {
    const quarantined = new Map([['read_file', 'hidden-instruction (high) in its description']]);
    const c = rules({ deny: ['rm'] });
    const v = denied(decideCall(c, 'read_file', {}, { quarantined }));
    expect(v.code).toBe('quarantined');
    expect(v.reason).toContain('hidden-instruction (high)');
    expect(decideCall(c, 'list', {}, { quarantined }).action).toBe('allow');
    expect(denied(decideCall(c, 'rm', {}, { quarantined: new Map([['rm', 'x']]) })).code).toBe('tool_denied');
  });

  it('omits the server from reasons when it is not known', () => {
    const v = denied(decideCall(compileToolRules(ToolRulesSchema.parse({ allow: [] })), 'x', {}));
    expect(v.reason).toBe(`${PREFIX}tool "x" is not in tools.allow; ask the operator to allow it`);
  });
});

describe('decideTool (what tools/list may show)', () => {
  it('agrees with decideCall on the name rules, whatever the arguments', () => {
    const r = rules({ allow: ['read_*', 'list', 'Write'], deny: ['READ_SECRET*'] });
    for (const name of [
      'read_file',
      'read_secret_key',
      'Read_Secret',
      'list',
      'LIST',
      'write',
      'Write',
      'x',
    ]) {
      const byName = decideTool(r, name);
      const byCall = decideCall(r, name, {});
      expect(byName, name).toEqual(byCall);
    }
    expect(decideTool(r, 'read_file')).toEqual({ action: 'allow' });
    expect(denied(decideTool(r, 'read_secret_key')).code).toBe('tool_denied');
    expect(denied(decideTool(r, 'LIST')).code).toBe('tool_not_allowed'); // allow is exact
  });

  it('does not look at arguments or quarantine: a tool allowed by name is listable', () => {
    const r = rules({ arguments: { '*': { schema: { type: 'object', required: ['x'] } } } });
    expect(decideTool(r, 'anything')).toEqual({ action: 'allow' });
    expect(denied(decideCall(r, 'anything', {})).code).toBe('arguments_schema');
  });
});

describe('argument schemas', () => {
  const c = rules({
    arguments: {
      'write_*': {
        schema: {
          type: 'object',
          properties: { content: { type: 'string', maxLength: 10 } },
          required: ['content'],
        },
      },
    },
  });

  it('allows arguments that satisfy every matching schema', () => {
    expect(decideCall(c, 'write_file', { content: 'short' }).action).toBe('allow');
    expect(decideCall(c, 'read_file', { content: 'x'.repeat(100) }).action).toBe('allow');
  });

  it('denies arguments that break the schema, saying why', () => {
    const v = denied(decideCall(c, 'write_file', { content: 'x'.repeat(11) }));
    expect(v.code).toBe('arguments_schema');
    expect(v.reason).toContain('tools.arguments["write_*"].schema');
    expect(v.reason).toContain('arguments/content must NOT have more than 10 characters');
    expect(denied(decideCall(c, 'write_file', {})).code).toBe('arguments_schema');
    expect(denied(decideCall(c, 'write_file', undefined)).code).toBe('arguments_schema');
  });

  it('applies argument rules to the tool name whatever its case', () => {
    expect(denied(decideCall(c, 'WRITE_FILE', { content: 'x'.repeat(11) })).code).toBe('arguments_schema');
  });

  it('never coerces or fills in the arguments', () => {
    const args = { content: 5 };
    expect(denied(decideCall(c, 'write_file', args)).code).toBe('arguments_schema');
    expect(args).toEqual({ content: 5 });
  });

  it('refuses arguments that are not an object', () => {
    for (const args of [[], 'x', 5, null]) {
      const v = denied(decideCall(rules({}), 'read_file', args));
      expect(v.code).toBe('arguments_schema');
      expect(v.reason).toContain('must be a JSON object');
    }
  });

  it('accepts draft-07 schemas when they say so', () => {
    const d7 = rules({
      arguments: {
        q: {
          schema: { $schema: 'http://json-schema.org/draft-07/schema#', properties: { n: { maximum: 3 } } },
        },
      },
    });
    expect(decideCall(d7, 'q', { n: 3 }).action).toBe('allow');
    expect(denied(decideCall(d7, 'q', { n: 4 })).code).toBe('arguments_schema');
  });

  it('rejects schemas that cannot be enforced, naming the field', () => {
    expect(issue({ arguments: { w: { schema: { type: 'object', maxLenght: 3 } } } })).toEqual({
      path: 'arguments.w.schema',
      message: expect.stringContaining('unknown keyword: "maxLenght"'),
    });
    expect(issue({ arguments: { w: { schema: { type: 'nonsense' } } } }).path).toBe('arguments.w.schema');
    expect(issue({ arguments: { w: { schema: { format: 'uri' } } } }).message).toContain('use pattern');
    expect(issue({ arguments: { w: { schema: { $schema: 'https://example.com/s' } } } }).message).toContain(
      '$schema must be',
    );
    expect(issue({ arguments: { w: { schema: { $ref: 'https://example.com/x.json' } } } }).path).toBe(
      'arguments.w.schema',
    );
  });

  it('compileToolRules refuses hand-built rules that would not compile', () => {
    const bad = { deny: [], arguments: { w: { schema: { type: 'nope' } } } };
    expect(() => compileToolRules(bad)).toThrow(
      expect.objectContaining({ code: 'MCP_INVALID_CONFIG', field: 'tools.arguments.w.schema' }),
    );
    try {
      compileToolRules({ deny: ['!x'], arguments: {} });
      expect.unreachable();
    } catch (e) {
      expect(AirlockError.is(e, 'MCP_INVALID_CONFIG')).toBe(true);
    }
  });
});

describe('path fields', () => {
  const c = rules({
    arguments: {
      '*': {
        paths: {
          path: { allow: ['/data/**'], deny: ['**/.env', '/data/secret/**'] },
          'source.path': { allow: ['/data/**'] },
          'paths.*': { allow: ['/data/**'] },
          'edits.*.path': { allow: ['/data/**'] },
        },
      },
    },
  });
  const call = (args: unknown) => decideCall(c, 'read_file', args);

  it('allows paths under the allowed globs', () => {
    for (const path of ['/data', '/data/a.txt', '/data/x/y/z', '/data/.hidden', 'file:///data/a.txt'])
      expect(call({ path }).action).toBe('allow');
  });

  it('normalises .., //, ./ and trailing / before matching', () => {
    expect(call({ path: '/data/./a//b/' }).action).toBe('allow');
    expect(call({ path: '/data/x/../y' }).action).toBe('allow');
    const v = denied(call({ path: '/data/../etc/passwd' }));
    expect(v.code).toBe('path_not_allowed');
    expect(v.reason).toContain('"/data/../etc/passwd" (resolved to /etc/passwd)');
    expect(v.reason).toContain('allowed: /data/**');
    expect(denied(call({ path: '//etc//passwd' })).code).toBe('path_not_allowed');
    expect(denied(call({ path: '/data/../../../../etc' })).code).toBe('path_not_allowed');
    expect(denied(call({ path: '/database' })).code).toBe('path_not_allowed');
  });

  it('resolves relative paths against cwd (default /)', () => {
    expect(call({ path: 'data/a' }).action).toBe('allow');
    expect(denied(call({ path: 'etc/passwd' })).code).toBe('path_not_allowed');
    const inData = rules(
      { arguments: { '*': { paths: { path: { allow: ['/data/**'] } } } } },
      { cwd: '/data' },
    );
    expect(decideCall(inData, 't', { path: 'a/b' }).action).toBe('allow');
    expect(decideCall(inData, 't', { path: './a' }).action).toBe('allow');
    expect(denied(decideCall(inData, 't', { path: '../etc/passwd' })).code).toBe('path_not_allowed');
  });

  it('deny globs win, ignore case, and match dotfiles', () => {
    for (const path of [
      '/data/.env',
      '/data/a/b/.ENV',
      '/data/secret/k',
      '/data/SECRET/k',
      '/data/x/../secret/k',
    ]) {
      const v = denied(call({ path }));
      expect(v.code).toBe('path_not_allowed');
      expect(v.reason).toContain('matches deny entry');
    }
  });

  it('decodes file:// URIs and percent-escapes before checking', () => {
    expect(call({ path: 'file://localhost/data/a' }).action).toBe('allow');
    expect(call({ path: 'FILE:///data/a%20b' }).action).toBe('allow');
    expect(call({ path: 'file:/data/a' }).action).toBe('allow');
    expect(denied(call({ path: 'file:///etc/passwd' })).code).toBe('path_not_allowed');
    expect(denied(call({ path: 'file:///data/%2e%2e/etc/passwd' })).code).toBe('path_not_allowed');
    expect(denied(call({ path: 'file:///data/..%2Fetc/passwd' })).code).toBe('path_not_allowed');
    expect(denied(call({ path: 'file:///data/%2Eenv/../.env' })).code).toBe('path_not_allowed');
  });

  it('refuses values it cannot check safely', () => {
    const invalid = (args: unknown, fragment: string) => {
      const v = denied(call(args));
      expect(v.code).toBe('path_invalid');
      expect(v.reason).toContain(fragment);
    };
    invalid({ path: '/data/a\0/../../etc/passwd' }, 'NUL');
    invalid({ path: 'file:///data/a%00b' }, 'NUL');
    invalid({ path: 'file:///data/%252e%252e/etc' }, 'double encoding');
    invalid({ path: 'file:///data/%zz' }, 'malformed percent-escape');
    invalid({ path: 'file://evil.example/data/a' }, 'another host');
    invalid({ path: 'file:///data/a?x=1' }, 'query or fragment');
    invalid({ path: 'file:data/a' }, 'not an absolute file URI');
    invalid({ path: '~/.ssh/id_rsa' }, '~');
    invalid({ path: '/data\\..\\etc' }, 'backslash');
    invalid({ path: '' }, 'is empty');
    invalid({ path: 5 }, 'must be a path string (got number)');
    invalid({ path: null }, 'got null');
    invalid({ path: ['/data/a'] }, 'got array');
    invalid({ paths: '/data/a' }, 'paths must be an array (got string)');
    invalid({ paths: ['/data/a', 7] }, 'argument paths.1 of tool');
    invalid({ source: '/data/a' }, 'source must be an object (got string)');
  });

  it('checks nested fields and every array element', () => {
    expect(call({ source: { path: '/data/a' }, paths: ['/data/a', '/data/b'] }).action).toBe('allow');
    expect(call({ edits: [{ path: '/data/a' }, { path: '/data/b' }] }).action).toBe('allow');
    const v = denied(call({ edits: [{ path: '/data/a' }, { path: '/etc/shadow' }] }));
    expect(v.code).toBe('path_not_allowed');
    expect(v.reason).toContain('argument edits.1.path');
    expect(denied(call({ paths: ['/data/a', '/etc'] })).code).toBe('path_not_allowed');
    expect(denied(call({ source: { path: '/etc' } })).code).toBe('path_not_allowed');
  });

  it('a missing path field is fine; inherited properties are not read', () => {
    expect(call({}).action).toBe('allow');
    expect(call({ source: {} }).action).toBe('allow');
    expect(call({ other: '/etc/passwd' }).action).toBe('allow');
    expect(call(JSON.parse('{"__proto__": {"path": "/etc/passwd"}}')).action).toBe('allow');
  });

  it('applies only to the tools its glob matches', () => {
    const only = rules({ arguments: { read_file: { paths: { path: { allow: ['/data/**'] } } } } });
    expect(decideCall(only, 'write_file', { path: '/etc/passwd' }).action).toBe('allow');
    expect(denied(decideCall(only, 'read_file', { path: '/etc/passwd' })).code).toBe('path_not_allowed');
  });

  it('every matching argument rule applies', () => {
    const both = rules({
      arguments: {
        '*': { paths: { path: { allow: ['/data/**', '/tmp/**'] } } },
        'write_*': { paths: { path: { allow: ['/data/out/**'] } } },
      },
    });
    expect(decideCall(both, 'read_file', { path: '/tmp/x' }).action).toBe('allow');
    expect(decideCall(both, 'write_file', { path: '/data/out/x' }).action).toBe('allow');
    expect(denied(decideCall(both, 'write_file', { path: '/tmp/x' })).code).toBe('path_not_allowed');
  });
});

describe('resolveArgumentPath', () => {
  it('canonicalises', () => {
    expect(resolveArgumentPath('/a/./b/../c//d/')).toEqual({ path: '/a/c/d' });
    expect(resolveArgumentPath('/..')).toEqual({ path: '/' });
    expect(resolveArgumentPath('x', '/w')).toEqual({ path: '/w/x' });
    expect(resolveArgumentPath('file:///a%2Fb/%2e%2e/c')).toEqual({ path: '/a/c' });
  });
});

describe('ToolRulesSchema validation', () => {
  it('names the offending field', () => {
    expect(issue({ allow: ['!read'] })).toEqual({
      path: 'allow.0',
      message: expect.stringContaining('negated globs are not supported'),
    });
    expect(issue({ deny: [''] }).path).toBe('deny.0');
    expect(issue({ arguments: { '': {} } }).message).toContain('cannot be empty');
    expect(issue({ arguments: { w: { paths: { path: { allow: ['data/**'] } } } } })).toEqual({
      path: 'arguments.w.paths.path.allow.0',
      message: expect.stringContaining('absolute'),
    });
    expect(issue({ arguments: { w: { paths: { path: { allow: ['/data/../etc'] } } } } }).message).toContain(
      '..',
    );
    expect(issue({ arguments: { w: { paths: { path: { allow: ['/data/'] } } } } }).message).toContain(
      '/data/**',
    );
    expect(issue({ arguments: { w: { paths: { '*.path': { allow: ['/x'] } } } } }).message).toContain(
      'start with a field name',
    );
    expect(issue({ arguments: { w: { paths: { 'a.b*': { allow: ['/x'] } } } } }).message).toContain(
      '* stands alone',
    );
    expect(issue({ arguments: { w: { paths: { p: { deny: ['/x'] } } } } }).path).toBe(
      'arguments.w.paths.p.allow',
    );
    expect(issue({ alow: ['x'] }).message).toContain('alow');
  });
});

describe('scan policy', () => {
  it('quarantines at or above the threshold (default high)', () => {
    const p = ScanPolicySchema.parse({});
    expect(p).toEqual({ quarantine: 'high', warn: [] });
    expect(decideFinding(p, 'high')).toBe('quarantine');
    expect(decideFinding(p, 'medium')).toBe('warn');
    expect(decideFinding(p, 'low')).toBe('warn');
    const medium = ScanPolicySchema.parse({ quarantine: 'medium' });
    expect(decideFinding(medium, 'high')).toBe('quarantine');
    expect(decideFinding(medium, 'medium')).toBe('quarantine');
    expect(decideFinding(medium, 'low')).toBe('warn');
    expect(decideFinding(ScanPolicySchema.parse({ quarantine: 'low' }), 'low')).toBe('quarantine');
    expect(decideFinding(ScanPolicySchema.parse({ quarantine: 'none' }), 'high')).toBe('warn');
  });

  it('lets the operator demote named rules to warnings', () => {
    const p = ScanPolicySchema.parse({ warn: ['excessive-length'] });
    expect(decideFinding(p, 'high', 'excessive-length')).toBe('warn');
    expect(decideFinding(p, 'high', 'hidden-instruction')).toBe('quarantine');
    expect(ScanPolicySchema.safeParse({ warn: ['no-such-rule'] }).success).toBe(false);
    expect(ScanPolicySchema.safeParse({ quarantine: 'critical' }).success).toBe(false);
  });
});
