// Credential shapes for the output guard: every pattern finds a realistic fake token (built at run time
// from fragments, so this file holds nothing a secret scanner would flag), look-alikes that are not
// credentials stay untouched, matches are sorted and non-overlapping, and hostile 1 MiB inputs finish.
import { describe, expect, it } from 'vitest';
import { CREDENTIAL_PATTERNS, findCredentials } from '../../src/guard/credentials.js';
import { fakeToken } from '../../src/secrets/sentinels.js';

/** Deterministic filler: `n` characters of `alphabet`, different for each seed. */
function body(
  n: number,
  seed = 1,
  alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789',
): string {
  let x = seed * 2654435761;
  let out = '';
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) % 2147483648;
    out += alphabet[x % alphabet.length];
  }
  return out;
}
const join = (...parts: string[]): string => parts.join('');
const b64url = (s: string): string => Buffer.from(s).toString('base64url');

const PEM_LABEL = join('PRIV', 'ATE KEY');
const pemBody = Array.from({ length: 6 }, (_, i) =>
  body(64, i + 10, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'),
).join('\n');
const pem = (kind: string, text = pemBody, eol = '\n') =>
  join(
    '-----BEGIN ',
    kind,
    PEM_LABEL,
    '-----',
    eol,
    text.replace(/\n/g, eol),
    eol,
    '-----END ',
    kind,
    PEM_LABEL,
    '-----',
  );
const jwt = join(
  b64url('{"alg":"HS256","typ":"JWT"}'),
  '.',
  b64url('{"sub":"1234567890","name":"Jane","iat":1516239022}'),
  '.',
  body(43, 3, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'),
);

/** [pattern id, text around the token, the token (the part that must be matched)]. */
const POSITIVES: Array<[string, string, string]> = [
  ['private-key', 'key:\n%s\ntrailing', pem('RSA ')],
  ['private-key', 'openssh %s', pem('OPENSSH ')],
  ['private-key', '{"key": "%s"}', pem('', pemBody, '\\n')],
  ['private-key', 'cut short:\n%s', join('-----BEGIN EC ', PEM_LABEL, '-----\n', pemBody)],
  ['jwt', 'Authorization cookie=%s; path=/', jwt],
  ['jwt', 'unsigned %s', join(b64url('{"alg":"none"}'), '.', b64url('{"sub":"x"}'), '.')],
  ['aws-access-key-id', 'id=%s', fakeToken('aws-access-key')],
  ['aws-access-key-id', 'temporary %s,', join('AS', 'IA', body(16, 4, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567'))],
  ['aws-secret-access-key', 'aws_secret_access_key = %s\n', fakeToken('aws-secret-key')],
  ['aws-secret-access-key', '"SecretAccessKey": "%s"', fakeToken('aws-secret-key')],
  ['github-token', 'GITHUB_TOKEN=%s', fakeToken('github')],
  ['github-token', 'oauth %s.', join('gh', 'o_', body(36, 5))],
  ['github-token', 'user-to-server %s', join('gh', 'u_', body(36, 6))],
  ['github-token', 'server-to-server %s', join('gh', 's_', body(36, 7))],
  ['github-token', 'refresh %s', join('gh', 'r_', body(36, 8))],
  ['github-token', 'fine-grained %s', join('github', '_pat_', body(22, 9), '_', body(59, 10))],
  ['slack-token', 'bot %s', join('xo', 'xb-', '123456789012-1234567890123-', body(24, 11))],
  [
    'slack-token',
    'user %s',
    join('xo', 'xp-', '1234567890-1234567890-1234567890-', body(32, 12, '0123456789abcdef')),
  ],
  [
    'slack-webhook',
    'post to %s now',
    join('https://hooks.', 'slack.com/services/T0', body(8, 13), '/B0', body(8, 14), '/', body(24, 15)),
  ],
  [
    'google-api-key',
    'maps key %s',
    join('AI', 'za', body(35, 16, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_')),
  ],
  ['openai-key', 'OPENAI_API_KEY=%s', fakeToken('openai')],
  ['openai-key', 'project %s', join('sk', '-proj-', body(74, 17), '-', body(80, 18))],
  ['anthropic-key', 'ANTHROPIC_API_KEY=%s', fakeToken('anthropic')],
  ['stripe-key', 'stripe %s', join('sk', '_live_', body(24, 19))],
  ['stripe-key', 'restricted %s', join('rk', '_live_', body(24, 20))],
  ['npm-token', '//registry.npm.example.com/:_authToken=%s', join('np', 'm_', body(36, 21))],
  [
    'url-password',
    'DATABASE_URL=postgres://app:%s@db.internal:5432/app',
    join('Tr0ub4', 'dor-', body(8, 22)),
  ],
  ['authorization-header', 'Authorization: Bearer %s', join('ya29', '.', body(40, 23))],
  ['secret-assignment', 'password = "%s"', join('hunter', '2-', body(6, 24))],
  ['secret-assignment', '{"client_secret": "%s"}', body(32, 25)],
  ['secret-assignment', 'GET /cb?code=1&token=%s&state=2', body(20, 26)],
];

describe('CREDENTIAL_PATTERNS', () => {
  it('have unique ids, descriptions and no g flag', () => {
    const ids = CREDENTIAL_PATTERNS.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    for (const p of CREDENTIAL_PATTERNS) {
      expect(p.description).not.toBe('');
      expect(p.regex.flags).not.toContain('g');
    }
    expect(Object.isFrozen(CREDENTIAL_PATTERNS)).toBe(true);
  });

  it('every pattern has a positive case below', () => {
    const covered = new Set(POSITIVES.map(([id]) => id));
    expect(CREDENTIAL_PATTERNS.map((p) => p.id).filter((id) => !covered.has(id))).toEqual([]);
  });
});

describe('findCredentials', () => {
  it.each(POSITIVES.map(([id, around, token], i) => [`${id} #${i}`, id, around, token] as const))(
    'finds %s',
    (_, id, around, token) => {
      const text = around.replace('%s', token);
      const start = text.indexOf(token);
      expect(findCredentials(text)).toEqual([{ patternId: id, start, end: start + token.length }]);
    },
  );

  it.each([
    ['a UUID', 'request 3f2b8c1e-9d4a-4e6f-8b2a-1c3d5e7f9a0b done'],
    ['a git SHA', 'commit 9fceb02d0ae598e95dc970b74767f19372d61af8 (HEAD)'],
    ['a sha256 digest', `sha256:${'a3f5'.repeat(16)}`],
    [
      'a base64 blob',
      Buffer.from('The quick brown fox jumps over the lazy dog. '.repeat(4)).toString('base64'),
    ],
    ['a random base64 blob', Buffer.from(body(300, 30)).toString('base64')],
    ['a 40-char base64 string without an AWS name', `value=${body(40, 31)}`],
    ['a TypeScript type', 'interface Login { password: string; token?: string }'],
    ['a placeholder', 'password=${DB_PASSWORD} token=<your-token> secret: "changeme"'],
    ['pagination tokens', '{"next_token": "c2FtcGxlMTIzNDU2Nzg5", "page_token": "abc123def456ghi"}'],
    ['a limit', 'max_tokens: 4096, tokens=128000'],
    [
      'prose',
      'Use Bearer authentication with a token; the AKIA prefix marks AWS keys; sk-learn is a library.',
    ],
    ['a URL with a port', 'https://example.com:8443/path/to@thing'],
    ['a dotted host that starts like a JWT', 'ewwwwwwwwww.example.com.au'],
    ['JWT-shaped non-JSON', `${b64url('not json at all')}.${b64url('x')}.sig`],
    ['a JWT header without alg', `${b64url('{"typ":"JWT"}')}.${b64url('{"sub":"x"}')}.${body(20, 32)}`],
    ['a certificate', join('-----BEGIN CERTIFICATE-----\n', pemBody, '\n-----END CERTIFICATE-----')],
    ['a public key', join('-----BEGIN PUBLIC KEY-----\n', pemBody, '\n-----END PUBLIC KEY-----')],
    ['a short Slack-like id', 'xoxb-1-2'],
    ['a test Stripe key', join('sk', '_test_', body(24, 33))],
    ['an ssh URL', 'git clone ssh://git@github.com/org/repo.git'],
  ])('leaves %s alone', (_, text) => {
    expect(findCredentials(text)).toEqual([]);
  });

  it('returns sorted, non-overlapping matches (the earlier, longer one wins)', () => {
    const gh = fakeToken('github');
    const text = `token=${jwt}\naws_secret_access_key=${fakeToken('aws-secret-key')} ${gh} ${pem('')}`;
    const found = findCredentials(text);
    expect(found.map((m) => m.patternId)).toEqual([
      'jwt',
      'aws-secret-access-key',
      'github-token',
      'private-key',
    ]);
    for (let i = 1; i < found.length; i++) expect(found[i]!.start).toBeGreaterThanOrEqual(found[i - 1]!.end);
    expect(text.slice(found[0]!.start, found[0]!.end)).toBe(jwt);
  });

  it('matches the whole PEM block, armour lines included', () => {
    const key = pem(
      'ENCRYPTED ',
      `Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,${body(32, 40, '0123456789ABCDEF')}\n\n${pemBody}`,
    );
    const [m] = findCredentials(`x ${key} y`);
    expect(m).toEqual({ patternId: 'private-key', start: 2, end: 2 + key.length });
  });

  it('finishes on hostile 1 MiB inputs', () => {
    const MiB = 1 << 20;
    const fill = (s: string) => s.repeat(Math.ceil(MiB / s.length)).slice(0, MiB);
    const inputs = [
      fill('a'),
      fill(`-----BEGIN ${PEM_LABEL}-----`),
      `-----BEGIN ${PEM_LABEL}-----${fill('\nAAAA')}`,
      `-----BEGIN ${PEM_LABEL}-----${fill('-')}`,
      fill(`-----BEGIN ${PEM_LABEL}---------a`),
      fill('eyJ'),
      `eyJ${fill('A.')}`,
      fill('xoxb-1-'),
      fill('password='),
      `password=${fill('a1')}`,
      fill('https://a:'),
      `https://user:${fill('p')}`,
      fill('Bearer '),
      fill('ghp_'),
      fill('aws_secret_access_key='),
      fill('sk-proj-'),
      Buffer.alloc((MiB / 4) * 3, 0xab).toString('base64'),
      fill(`${jwt} `),
    ];
    for (const text of inputs) expect(Array.isArray(findCredentials(text))).toBe(true);
  });
});
