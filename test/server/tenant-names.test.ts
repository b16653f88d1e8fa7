// Tenant names are checked wherever they enter: `airlock keys create --tenant` (the real CLI), the
// server config file (`airlock serve --config`), and the store API itself. One rule (store.ts
// TENANT_NAME_RE, docs/server.md): 1-63 lowercase ASCII letters, digits, ".", "_", "-", starting with
// a letter or digit. The error is INVALID_ARGUMENT naming the field, and says what is allowed.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { ServerConfigSchema } from '../../src/server/front.js';
import { checkTenantName, Store } from '../../src/server/store.js';
import { runCli } from '../helpers.js';

const RULE = /1-63 lowercase ASCII letters, digits, "\.", "_" or "-", starting with a letter or digit/;

// Each is refused everywhere. (NUL cannot travel in argv: it is tried through the store and config.)
const BAD: Record<string, string> = {
  empty: '',
  slash: 'a/b',
  'dot-dot': '..',
  'leading dot': '.hidden',
  'leading dash': '-x',
  '64 chars': 'a'.repeat(64),
  '65 chars': 'a'.repeat(65),
  'upper case (a second "alice")': 'Alice',
  'Cyrillic а (a confusable of "alice")': '\u0430lice',
  'fullwidth letters': '\uff41lice',
  'zero-width space': 'ali\u200bce',
  space: 'al ice',
  colon: 'a:b',
  newline: 'a\nb',
};
const GOOD = ['alice', 'team-a', 'a', '0', 'a.b_c-d', 'a'.repeat(63)];

const dir = mkdtempSync(join(tmpdir(), 'airlock-tenants-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('tenant names', () => {
  it('the store refuses each bad name (keys, quotas, sandboxes, snapshots), with NUL, and accepts the good ones', () => {
    const s = new Store(join(dir, 'store.db'));
    try {
      for (const [what, name] of Object.entries({ ...BAD, NUL: 'a\0b', 'NUL alone': '\0' })) {
        for (const f of [
          () => s.createKey(name),
          () => s.setQuota(name, { maxSandboxes: 1 }),
          () => s.recordSnapshot('snap', name),
          () =>
            s.insertSandbox({
              id: 'sbx-x',
              tenant: name,
              state: 'running',
              backend: 'namespaces',
              template: null,
              createdAt: new Date().toISOString(),
              deadline: null,
              metadata: {},
              reason: null,
              bootId: 'b',
              memoryBytes: 1,
              cpus: 1,
            }),
        ]) {
          const e = (() => {
            try {
              f();
            } catch (err) {
              return err;
            }
            return undefined;
          })();
          expect(AirlockError.is(e, 'INVALID_ARGUMENT'), what).toBe(true);
          expect((e as AirlockError).field, what).toBe('tenant');
          expect((e as Error).message, what).toMatch(RULE);
        }
      }
      expect(s.listKeys()).toEqual([]); // nothing was written
      for (const name of GOOD) {
        expect(checkTenantName(name)).toBe(name);
        const { id } = s.createKey(name);
        expect(s.keyActive(id, name)).toBe(true);
      }
    } finally {
      s.close();
    }
  });

  it('`airlock keys create --tenant` refuses each bad name and stores no key', async () => {
    const stateDir = join(dir, 'cli');
    for (const [what, name] of Object.entries(BAD)) {
      const r = await runCli(['keys', 'create', '--tenant', name, '--state-dir', stateDir], {
        timeoutMs: 60_000,
      });
      expect(r.code, what).not.toBe(0);
      expect(r.stdout, what).toBe('');
      expect(r.stderr, what).toMatch(RULE);
    }
    const ok = await runCli(['keys', 'create', '--tenant', 'team-a', '--json', '--state-dir', stateDir], {
      timeoutMs: 60_000,
    });
    expect(ok.code, ok.stderr).toBe(0);
    const list = await runCli(['keys', 'list', '--json', '--state-dir', stateDir], { timeoutMs: 60_000 });
    expect((JSON.parse(list.stdout) as Array<{ tenant: string }>).map((k) => k.tenant)).toEqual(['team-a']);
  }, 300_000);

  it('the server config file refuses a bad tenant name under tenants:, naming it', async () => {
    for (const [what, name] of Object.entries({ ...BAD, NUL: 'a\0b' })) {
      const r = ServerConfigSchema.safeParse({ tenants: { [name]: { maxSandboxes: 1 }, ok: {} } });
      expect(r.success, what).toBe(false);
      expect(r.error!.issues[0]!.path, what).toEqual(['tenants', name]);
      expect(r.error!.issues[0]!.message, what).toMatch(RULE);
    }
    for (const name of GOOD)
      expect(ServerConfigSchema.safeParse({ tenants: { [name]: {} } }).success).toBe(true);
    // Through the real CLI: airlock serve stops at the config, before it starts anything.
    const cfg = join(dir, 'bad.json');
    writeFileSync(cfg, JSON.stringify({ tenants: { 'Team/A': { maxSandboxes: 1 } } }));
    const r = await runCli(
      ['serve', '--config', cfg, '--state-dir', join(dir, 'serve'), '--listen', '127.0.0.1:0'],
      {
        timeoutMs: 60_000,
      },
    );
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/tenants\.Team\/A/);
    expect(r.stderr).toMatch(RULE);
  }, 120_000);
});
