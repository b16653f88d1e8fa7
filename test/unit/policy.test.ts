// Egress policy: pattern validation (with field paths), wildcard and port semantics, deny-wins, the SSRF
// guard inside the decision, operator exceptions, reasons a model can act on, and YAML files.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import {
  NetworkPolicySchema,
  decideAddress,
  decideHost,
  loadPolicyFile,
  parseEgressPolicy,
  type EgressPolicyInput,
  type NetworkPolicy,
  type NetworkPolicyInput,
} from '../../src/policy/index.js';
import { secretHostReachable } from '../../src/core/network-spec.js';

const PREFIX = 'blocked by Airlock egress policy: ';

function network(input: NetworkPolicyInput): NetworkPolicy {
  return parseEgressPolicy({ network: input }).network;
}

/** The INVALID_SPEC error a policy input produces. */
function specError(input: EgressPolicyInput): AirlockError {
  try {
    parseEgressPolicy(input);
  } catch (e) {
    if (AirlockError.is(e, 'INVALID_SPEC')) return e;
    throw e;
  }
  throw new Error(`expected INVALID_SPEC for ${JSON.stringify(input)}`);
}

describe('NetworkPolicySchema', () => {
  it('defaults to deny-all, transparent interception on, no exceptions', () => {
    expect(parseEgressPolicy(undefined)).toEqual({
      network: { allow: [], deny: [], transparent: true, allowPrivate: [] },
      secrets: [],
    });
    expect(NetworkPolicySchema.parse({})).toEqual({
      allow: [],
      deny: [],
      transparent: true,
      allowPrivate: [],
    });
  });

  it('canonicalises entries', () => {
    const n = network({
      allow: [
        'API.GitHub.com.',
        '*.NPM.Example.com',
        'example.com:8443',
        'bücher.de',
        '*.foo.github.io',
        '1.1.1.1',
        '16843009:443',
        '[2606:4700:0:0::1111]:443',
      ],
      deny: ['Gist.GitHub.com', '10.0.0.1', '[::1]'],
      allowPrivate: ['10.0.0.5:5432', '[FD00:0::1]:443'],
    });
    expect(n.allow).toEqual([
      'api.github.com',
      '*.npm.example.com',
      'example.com:8443',
      'xn--bcher-kva.de',
      '*.foo.github.io',
      '1.1.1.1',
      '1.1.1.1:443',
      '[2606:4700::1111]:443',
    ]);
    expect(n.deny).toEqual(['gist.github.com', '10.0.0.1', '[::1]']);
    expect(n.allowPrivate).toEqual(['10.0.0.5:5432', '[fd00::1]:443']);
  });

  it.each<[string, RegExp]>([
    ['*', /bare "\*" would allow every host/],
    ['*:443', /bare "\*"/],
    ['*.com', /"\*\.com": too broad: "com" is a public suffix/],
    ['*.co.uk', /"\*\.co\.uk": too broad: "co\.uk" is a public suffix/],
    ['*.github.io', /"\*\.github\.io": too broad: "github\.io" is a public suffix/],
    ['*.test', /too broad/],
    ['api.*.com', /only allowed as a whole leading label/],
    ['*foo.com', /only allowed as a whole leading label/],
    ['**.example.com', /only allowed as a whole leading label/],
    ['*.*.example.com', /only allowed as a whole leading label/],
    ['example.*', /only allowed as a whole leading label/],
    ['*.127.0.0.1', /wildcards match names, not addresses/],
    ['127.0.0.1', /127\.0\.0\.1 is in a blocked range \(loopback 127\.0\.0\.0\/8\).*network\.allowPrivate/],
    ['0x7f.1:8080', /127\.0\.0\.1 is in a blocked range.*allowPrivate: \["127\.0\.0\.1:8080"\]/],
    ['169.254.169.254', /link-local 169\.254\.0\.0\/16/],
    ['[::1]:443', /::1 is in a blocked range.*\["\[::1\]:443"\]/],
    ['[::ffff:10.0.0.1]', /IPv4-mapped/],
    ['2606:4700::1111', /IPv6 addresses must be in brackets/],
    ['https://api.github.com', /not a URL/],
    ['api.github.com/repos', /not a URL/],
    ['example.com:0', /"0" is not a TCP port/],
    ['example.com:65536', /"65536" is not a TCP port/],
    ['example.com:https', /"https" is not a TCP port/],
    ['example.com:', /"" is not a TCP port/],
    ['exa mple.com', /not a valid host name/],
    ['foo.123', /not a valid host name/],
    ['1.2.3.256', /not a valid host name/],
    ['', /empty entry/],
  ])('allow %j is rejected: %s', (entry, message) => {
    const e = specError({ network: { allow: ['api.github.com', entry] } });
    expect(e.field).toBe('network.allow.1');
    expect(e.message).toMatch(/^invalid egress policy at network\.allow\.1: /);
    expect(e.message).toMatch(message);
  });

  it('deny uses the same syntax; private addresses are fine there, bare "*" is pointless', () => {
    expect(network({ deny: ['127.0.0.1', '*.evil.example.com:22'] }).deny).toEqual([
      '127.0.0.1',
      '*.evil.example.com:22',
    ]);
    const e = specError({ network: { deny: ['*'] } });
    expect(e.field).toBe('network.deny.0');
    expect(e.message).toMatch(/already denied/);
    expect(specError({ network: { deny: ['*.com'] } }).field).toBe('network.deny.0');
  });

  it.each<[string, RegExp]>([
    ['10.0.0.5', /must be ADDRESS:PORT/],
    ['db.internal:5432', /is a name; exceptions take an exact IP address/],
    ['10.0.0.0/8:5432', /is not an IP address/],
    ['fd00::1:443', /must be ADDRESS:PORT/],
    ['10.0.0.5:99999', /not a TCP port/],
    ['1.1.1.1:443', /public address.*network\.allow/],
    ['0.0.0.0:80', /not a single host/],
    ['224.0.0.1:5353', /not a single host/],
    ['[::ffff:10.0.0.5]:5432', /write the IPv4 address/],
  ])('allowPrivate %j is rejected: %s', (entry, message) => {
    const e = specError({ network: { allowPrivate: [entry] } });
    expect(e.field).toBe('network.allowPrivate.0');
    expect(e.message).toMatch(message);
  });

  it('rejects unknown fields', () => {
    expect(specError({ network: { allwo: ['x.com'] } } as never).field).toBe('network.allwo');
    expect(specError({ netwrok: {} } as never).field).toBe('netwrok');
  });
});

describe('SecretsSchema', () => {
  const gh = { name: 'GITHUB_TOKEN', value: { fromEnv: 'GITHUB_TOKEN' }, hosts: ['api.github.com'] };

  it('accepts the three value sources and canonicalises hosts', () => {
    const p = parseEgressPolicy({
      secrets: [
        { ...gh, hosts: ['API.GitHub.com.', 'uploads.github.com'] },
        { name: 'NPM_TOKEN', value: { fromFile: '/run/secrets/npm' }, hosts: ['registry.npm.example.com'] },
        {
          name: 'VAULT_X',
          value: { command: ['vault', 'kv', 'get', '-field=x', 'secret/x'] },
          hosts: ['x.example'],
        },
      ],
    });
    expect(p.secrets).toEqual([
      {
        name: 'GITHUB_TOKEN',
        value: { fromEnv: 'GITHUB_TOKEN' },
        hosts: ['api.github.com', 'uploads.github.com'],
        body: false,
        insecureHttp: false,
      },
      {
        name: 'NPM_TOKEN',
        value: { fromFile: '/run/secrets/npm' },
        hosts: ['registry.npm.example.com'],
        body: false,
        insecureHttp: false,
      },
      {
        name: 'VAULT_X',
        value: { command: ['vault', 'kv', 'get', '-field=x', 'secret/x'] },
        hosts: ['x.example'],
        body: false,
        insecureHttp: false,
      },
    ]);
  });

  it.each<[string, unknown, string, RegExp]>([
    ['bad name', { ...gh, name: '1TOKEN' }, 'secrets.0.name', /environment variable name/],
    ['two sources', { ...gh, value: { fromEnv: 'A', fromFile: '/a' } }, 'secrets.0.value', /exactly one of/],
    ['no source', { ...gh, value: {} }, 'secrets.0.value', /exactly one of/],
    [
      'relative file',
      { ...gh, value: { fromFile: 'token.txt' } },
      'secrets.0.value.fromFile',
      /absolute path/,
    ],
    ['empty command', { ...gh, value: { command: [] } }, 'secrets.0.value.command', /non-empty array/],
    ['empty program', { ...gh, value: { command: [''] } }, 'secrets.0.value.command', /must not be empty/],
    ['unknown source', { ...gh, value: { fromVault: 'x' } }, 'secrets.0.value.fromVault', /unknown field/],
    ['no hosts', { ...gh, hosts: [] }, 'secrets.0.hosts', /at least one host/],
    ['wildcard host', { ...gh, hosts: ['*.github.com'] }, 'secrets.0.hosts.0', /not wildcards/],
    ['address host', { ...gh, hosts: ['140.82.112.5'] }, 'secrets.0.hosts.0', /not IP addresses/],
    ['host with port', { ...gh, hosts: ['api.github.com:443'] }, 'secrets.0.hosts.0', /without a port/],
    ['invalid host', { ...gh, hosts: ['api github com'] }, 'secrets.0.hosts.0', /not a valid host name/],
  ])('%s → %s', (_what, secret, field, message) => {
    const e = specError({ secrets: [secret] } as EgressPolicyInput);
    expect(e.field).toBe(field);
    expect(e.message).toMatch(message);
  });

  it('rejects duplicate names at the duplicate', () => {
    const e = specError({ secrets: [gh, { ...gh, hosts: ['github.com'] }] });
    expect(e.field).toBe('secrets.1.name');
    expect(e.message).toMatch(/duplicate secret name "GITHUB_TOKEN" \(already used by secrets\.0\)/);
  });
});

describe('decideHost', () => {
  const policy = network({
    allow: [
      'api.github.com',
      '*.github.com',
      '*.npm.example.com',
      'example.com:8443',
      'ssh.example.com:22',
      '1.1.1.1',
    ],
    deny: ['gist.github.com', 'api.github.com:8080', '*.evil.npm.example.com'],
  });

  it.each<[string, number, string]>([
    ['api.github.com', 443, 'api.github.com'],
    ['api.github.com', 80, 'api.github.com'],
    ['API.GITHUB.COM.', 443, 'api.github.com'],
    ['raw.github.com', 443, '*.github.com'],
    ['registry.npm.example.com', 443, '*.npm.example.com'],
    ['a.b.registry.npm.example.com', 443, '*.npm.example.com'],
    ['example.com', 8443, 'example.com:8443'],
    ['ssh.example.com', 22, 'ssh.example.com:22'],
    ['1.1.1.1', 443, '1.1.1.1'],
    ['16843009', 443, '1.1.1.1'],
  ])('allows %s:%i by %s', (host, port, rule) => {
    const v = decideHost(policy, host, port);
    expect(v).toEqual({ action: 'allow', rule, reason: expect.stringContaining(`"${rule}"`) });
  });

  it('"*.suffix" matches subdomains only, never the suffix itself or a look-alike', () => {
    for (const host of ['npm.example.com', 'evilnpm.example.com', 'npm.example.com.evil.com', 'github.com']) {
      expect(decideHost(policy, host, 443)).toMatchObject({ action: 'deny', code: 'not_allowed' });
    }
  });

  it('deny wins over allow', () => {
    expect(decideHost(policy, 'gist.github.com', 443)).toEqual({
      action: 'deny',
      code: 'denied',
      reason: `${PREFIX}host gist.github.com is denied by network.deny entry "gist.github.com"; it cannot be reached`,
    });
    expect(decideHost(policy, 'x.evil.npm.example.com', 443)).toMatchObject({ code: 'denied' });
    // A deny entry with a port denies only that port.
    expect(decideHost(policy, 'api.github.com', 8080)).toMatchObject({ code: 'denied' });
    expect(decideHost(policy, 'api.github.com', 443)).toMatchObject({ action: 'allow' });
  });

  it('allows only the listed ports: 80 and 443 without a port, exactly the port with one', () => {
    expect(decideHost(policy, 'api.github.com', 22)).toEqual({
      action: 'deny',
      code: 'port_not_allowed',
      reason: `${PREFIX}port 22 is not allowed for api.github.com (allowed: 80, 443); ask the operator to allow api.github.com:22 if it is needed`,
    });
    expect(decideHost(policy, 'example.com', 443)).toMatchObject({
      code: 'port_not_allowed',
      reason: expect.stringContaining('(allowed: 8443)'),
    });
    const only443 = network({ allow: ['api.github.com:443'] });
    expect(decideHost(only443, 'api.github.com', 22).reason).toBe(
      `${PREFIX}port 22 is not allowed for api.github.com (allowed: 443); ask the operator to allow api.github.com:22 if it is needed`,
    );
    expect(decideHost(only443, 'api.github.com', 80)).toMatchObject({ code: 'port_not_allowed' });
    for (const port of [0, -1, 65_536, 1.5, Number.NaN]) {
      expect(decideHost(policy, 'api.github.com', port)).toMatchObject({
        code: 'port_not_allowed',
        reason: expect.stringContaining('not a valid TCP port'),
      });
    }
  });

  it('denies hosts that are not listed, saying which host and what to do', () => {
    expect(decideHost(policy, 'evil.com', 443)).toEqual({
      action: 'deny',
      code: 'not_allowed',
      reason: `${PREFIX}host evil.com is not in network.allow; ask the operator to allow it`,
    });
    expect(decideHost(network({}), 'api.github.com', 443)).toMatchObject({ code: 'not_allowed' });
    expect(decideHost(policy, '8.8.8.8', 53)).toMatchObject({
      code: 'not_allowed',
      reason: expect.stringContaining('host 8.8.8.8 is not in network.allow'),
    });
  });

  it('blocks private, loopback and metadata addresses in every spelling, before the lists', () => {
    expect(decideHost(policy, '169.254.169.254', 80)).toEqual({
      action: 'deny',
      code: 'blocked_address',
      reason: `${PREFIX}169.254.169.254 is in a blocked range (link-local 169.254.0.0/16); private, loopback and metadata addresses are never reachable`,
    });
    for (const host of [
      '0xa9fea9fe',
      '2852039166',
      '127.1',
      '0x7f.1',
      '[::1]',
      '::ffff:127.0.0.1',
      '[64:ff9b::a9fe:a9fe]',
    ]) {
      expect(decideHost(policy, host, 80), host).toMatchObject({ action: 'deny', code: 'blocked_address' });
    }
  });

  it('denies invalid hosts, including numeric look-alikes that are not addresses', () => {
    for (const host of [
      '1.2.3.256',
      '0x100000000',
      'exa mple.com',
      'fe80::1%eth0',
      '',
      'api.github.com:443',
    ]) {
      const v = decideHost(policy, host, 443);
      expect(v, host).toMatchObject({ action: 'deny', code: 'invalid_host' });
      expect(v.reason).toMatch(
        /^blocked by Airlock egress policy: ".*" is not a valid host name or IP address \(/,
      );
    }
  });

  it('opens exactly the allowPrivate address and port, and deny still wins', () => {
    const p = network({ allowPrivate: ['10.0.0.5:5432', '[fd00::1]:443'] });
    expect(decideHost(p, '10.0.0.5', 5432)).toEqual({
      action: 'allow',
      rule: 'network.allowPrivate "10.0.0.5:5432"',
      reason: '10.0.0.5 port 5432 is an operator exception (network.allowPrivate "10.0.0.5:5432")',
    });
    expect(decideHost(p, '[fd00:0::1]', 443)).toMatchObject({ action: 'allow' });
    expect(decideHost(p, '10.0.0.5', 22)).toMatchObject({ code: 'blocked_address' });
    expect(decideHost(p, '10.0.0.6', 5432)).toMatchObject({ code: 'blocked_address' });
    const denied = network({ allowPrivate: ['10.0.0.5:5432'], deny: ['10.0.0.5'] });
    expect(decideHost(denied, '10.0.0.5', 5432)).toMatchObject({ code: 'denied' });
  });

  it('refuses a hand-built policy that the schema would reject, instead of guessing', () => {
    const bad: NetworkPolicy = { allow: ['*'], deny: [], transparent: true, allowPrivate: [] };
    expect(() => decideHost(bad, 'evil.com', 443)).toThrow(
      expect.objectContaining({ code: 'INVALID_SPEC', field: 'network.allow.0' }),
    );
  });
});

describe('decideAddress', () => {
  const policy = network({
    allow: ['allowed.test'],
    deny: ['203.0.113.66'],
    allowPrivate: ['10.0.0.5:5432'],
  });

  it('allows public addresses (TEST-NET-3 included)', () => {
    expect(decideAddress(policy, '203.0.113.10', 443)).toEqual({
      action: 'allow',
      rule: 'public address',
      reason: '203.0.113.10 is a public address',
    });
    expect(decideAddress(policy, '2606:4700::1111', 443)).toMatchObject({ action: 'allow' });
  });

  it('blocks a name that resolved to a blocked address (DNS rebinding), naming both', () => {
    expect(decideAddress(policy, '127.0.0.1', 443, 'allowed.test')).toEqual({
      action: 'deny',
      code: 'blocked_address',
      reason: `${PREFIX}host allowed.test resolved to 127.0.0.1, which is in a blocked range (loopback 127.0.0.0/8); private, loopback and metadata addresses are never reachable`,
    });
    for (const a of [
      '::ffff:169.254.169.254',
      '::1',
      'fd12::1',
      '100.64.0.1',
      '2002:a9fe:a9fe::',
      '0.0.0.0',
    ]) {
      expect(decideAddress(policy, a, 443), a).toMatchObject({ code: 'blocked_address' });
    }
  });

  it('honours the exact operator exception only', () => {
    expect(decideAddress(policy, '10.0.0.5', 5432)).toMatchObject({
      action: 'allow',
      rule: 'network.allowPrivate "10.0.0.5:5432"',
    });
    expect(decideAddress(policy, '10.0.0.5', 5433)).toMatchObject({ code: 'blocked_address' });
    expect(decideAddress(policy, '::ffff:10.0.0.5', 5432)).toMatchObject({ code: 'blocked_address' });
  });

  it('keeps an address in network.deny denied whatever name led to it', () => {
    expect(decideAddress(policy, '203.0.113.66', 443, 'allowed.test')).toMatchObject({
      code: 'denied',
      reason: expect.stringContaining('203.0.113.66 is denied by network.deny entry "203.0.113.66"'),
    });
  });

  it('rejects names and invalid input: the proxy must pass the address it will dial', () => {
    expect(decideAddress(policy, 'allowed.test', 443)).toMatchObject({ code: 'invalid_host' });
    expect(decideAddress(policy, '1.2.3.256', 443)).toMatchObject({ code: 'invalid_host' });
    expect(decideAddress(policy, '203.0.113.10', 0)).toMatchObject({ code: 'port_not_allowed' });
  });
});

describe('loadPolicyFile', () => {
  const dir = mkdtempSync(join(tmpdir(), 'airlock-policy-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const file = (name: string, text: string): string => {
    const path = join(dir, name);
    writeFileSync(path, text);
    return path;
  };

  it('loads the example from the issue', () => {
    const path = file(
      'policy.yaml',
      [
        'network:',
        '  allow: [ "api.github.com", "*.npm.example.com", "example.com:8443" ]   # host[:port]',
        '  deny:  [ "gist.github.com" ]',
        'secrets:',
        '  - name: GITHUB_TOKEN',
        '    value: { fromEnv: GITHUB_TOKEN }',
        '    hosts: [ "api.github.com" ]',
        '',
      ].join('\n'),
    );
    expect(loadPolicyFile(path)).toEqual({
      network: {
        allow: ['api.github.com', '*.npm.example.com', 'example.com:8443'],
        deny: ['gist.github.com'],
        transparent: true,
        allowPrivate: [],
      },
      secrets: [
        {
          name: 'GITHUB_TOKEN',
          value: { fromEnv: 'GITHUB_TOKEN' },
          hosts: ['api.github.com'],
          body: false,
          insecureHttp: false,
        },
      ],
    });
  });

  it('treats an empty file as the default (deny all)', () => {
    expect(loadPolicyFile(file('empty.yaml', ''))).toEqual(parseEgressPolicy({}));
  });

  it('names the file and the field of an invalid entry', () => {
    const path = file('broad.yaml', 'network:\n  allow:\n    - api.github.com\n    - "*.com"\n');
    expect(() => loadPolicyFile(path)).toThrow(
      expect.objectContaining({
        code: 'INVALID_SPEC',
        field: 'network.allow.1',
        message: expect.stringMatching(
          /^invalid policy file .*broad\.yaml at network\.allow\.1: "\*\.com": too broad/,
        ),
      }),
    );
  });

  it('rejects YAML syntax errors, duplicate keys and a missing file with typed errors', () => {
    expect(() => loadPolicyFile(file('syntax.yaml', 'network: [allow\n'))).toThrow(
      expect.objectContaining({ code: 'INVALID_SPEC' }),
    );
    expect(() => loadPolicyFile(file('dup.yaml', 'network: {}\nnetwork: {}\n'))).toThrow(
      expect.objectContaining({ code: 'INVALID_SPEC', message: expect.stringContaining('dup.yaml') }),
    );
    expect(() => loadPolicyFile(file('list.yaml', '- a\n- b\n'))).toThrow(
      expect.objectContaining({ code: 'INVALID_SPEC' }),
    );
    expect(() => loadPolicyFile(join(dir, 'missing.yaml'))).toThrow(
      expect.objectContaining({ code: 'FILE_NOT_FOUND' }),
    );
  });
});

describe('secretHostReachable (core, data only) agrees with decideHost on ports 443/80', () => {
  // core/spec.ts refuses a secret bound to a host the network policy never lets through; it checks
  // the policy's data itself (core cannot import policy), so it must give decideHost's answer.
  const policies: NetworkPolicyInput[] = [
    { allow: ['api.example.com'] },
    { allow: ['api.example.com:8443'] },
    { allow: ['api.example.com:80'] },
    { allow: ['*.example.com'] },
    { allow: ['*.example.com'], deny: ['api.example.com'] },
    { allow: ['*.example.com'], deny: ['api.example.com:443'] },
    { allow: ['api.example.com'], deny: ['api.example.com:443', 'api.example.com:80'] },
    { allow: ['*.example.com'], deny: ['*.api.example.com'] },
    { allow: ['203.0.113.10', 'other.example.org'] },
    { allow: [] },
  ];
  const hosts = [
    'api.example.com',
    'x.api.example.com',
    'example.com',
    'other.example.org',
    'API.Example.COM.',
  ];
  for (const input of policies) {
    it(JSON.stringify(input), () => {
      const policy = NetworkPolicySchema.parse(input);
      for (const host of hosts) {
        const byPolicy = [443, 80].some((port) => decideHost(policy, host, port).action === 'allow');
        expect(secretHostReachable(policy, host), host).toBe(byPolicy);
      }
    });
  }
  it('gives both answers over the whole set (the cases above are not all one way)', () => {
    const answers = new Set(
      policies.flatMap((input) => hosts.map((h) => secretHostReachable(NetworkPolicySchema.parse(input), h))),
    );
    expect([...answers].sort()).toEqual([false, true]);
  });
});
