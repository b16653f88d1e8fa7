// The front server's SQLite store: migrations, hashed API keys, tenants, sandboxes and the lost
// marking of a dead supervisor's sandboxes, and the append-only event log. A real database file.
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { Store, type SandboxRow } from '../../src/server/store.js';

let dir: string;
let path: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'airlock-store-'));
  path = join(dir, 'sub', 'server.db');
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const row = (id: string, over: Partial<SandboxRow> = {}): SandboxRow => ({
  id,
  tenant: 'a',
  state: 'running',
  backend: 'namespaces',
  template: null,
  createdAt: new Date().toISOString(),
  deadline: Date.now() + 60_000,
  metadata: { k: 'v' },
  reason: null,
  bootId: 'boot-1',
  memoryBytes: 1024,
  cpus: 0.5,
  ...over,
});

describe('Store', () => {
  it('creates the file 0600 in WAL mode at the latest schema, and reopening keeps the data', () => {
    const s = new Store(path);
    expect(statSync(path).mode & 0o777).toBe(0o600);
    expect(s.schemaVersion()).toBe(2);
    s.insertSandbox(row('sb1'));
    s.close();
    const raw = new Database(path, { readonly: true });
    expect(raw.pragma('journal_mode', { simple: true })).toBe('wal');
    raw.close();
    const again = new Store(path);
    expect(again.getSandbox('sb1')).toMatchObject({
      id: 'sb1',
      tenant: 'a',
      metadata: { k: 'v' },
      cpus: 0.5,
    });
    again.close();
  });

  it('refuses a database whose schema is newer than this code', () => {
    new Store(path).close();
    const raw = new Database(path);
    raw.prepare('UPDATE schema_version SET version = 99').run();
    raw.close();
    expect(() => new Store(path)).toThrow(/schema version 99, newer than this airlock/);
  });

  it('stores only the sha256 of a key; verify accepts it until revoked, and nothing else', () => {
    const s = new Store(path);
    const { id, key } = s.createKey('team-a');
    expect(key).toMatch(/^alk_[0-9a-f]{16}_/);
    expect(s.verifyKey(key)).toEqual({ id, tenant: 'team-a' });
    // The key text appears nowhere in the database file (WAL included).
    s.close();
    const bytes = Buffer.concat(
      ['', '-wal'].flatMap((x) => {
        try {
          return [readFileSync(path + x)];
        } catch {
          return [];
        }
      }),
    );
    expect(bytes.includes(Buffer.from(key))).toBe(false);
    expect(bytes.includes(Buffer.from(key.slice(22)))).toBe(false); // its secret part either
    const s2 = new Store(path);
    // Near misses: one character changed, wrong prefix, another key's id with this secret, empty.
    const flipped = key.slice(0, -1) + (key.endsWith('A') ? 'B' : 'A');
    for (const bad of [flipped, key.replace('alk_', 'alx_'), '', 'Bearer ' + key, key + ' '])
      expect(s2.verifyKey(bad)).toBeUndefined();
    const other = s2.createKey('team-b');
    expect(s2.verifyKey(`alk_${other.id}_${key.split('_')[2]}`)).toBeUndefined();
    expect(s2.revokeKey(id).revoked).not.toBeNull();
    expect(s2.verifyKey(key)).toBeUndefined();
    expect(s2.verifyKey(other.key)).toEqual({ id: other.id, tenant: 'team-b' });
    // team-a's key is revoked, team-b's is not.
    expect(s2.listKeys().map((k) => [k.tenant, k.revoked !== null])).toEqual(
      expect.arrayContaining([
        ['team-a', true],
        ['team-b', false],
      ]),
    );
    s2.close();
  });

  it('revoking an unknown key id is INVALID_ARGUMENT naming the id; a bad tenant name is refused', () => {
    const s = new Store(path);
    try {
      s.revokeKey('0123456789abcdef');
      expect.unreachable();
    } catch (e) {
      expect(AirlockError.is(e, 'INVALID_ARGUMENT') && e.message).toMatch(
        /no API key with id "0123456789abcdef"/,
      );
    }
    for (const bad of ['', '../x', 'a b', '-lead', 'x'.repeat(65), 'ü'])
      expect(() => s.createKey(bad)).toThrow(/tenant/);
    s.close();
  });

  it('marks every live sandbox of another boot lost, with the reason, and only those', () => {
    const s = new Store(path);
    s.insertSandbox(row('old-running'));
    s.insertSandbox(row('old-paused', { state: 'paused' }));
    s.insertSandbox(row('old-killed'));
    s.endSandbox('old-killed', 'killed', 'by client');
    s.insertSandbox(row('new', { bootId: 'boot-2' }));
    expect(s.markLostExcept('boot-2', 'supervisor died').sort()).toEqual(['old-paused', 'old-running']);
    expect(s.getSandbox('old-running')).toMatchObject({ state: 'lost', reason: 'supervisor died' });
    expect(s.getSandbox('old-killed')).toMatchObject({ state: 'killed', reason: 'by client' });
    expect(s.getSandbox('new')!.state).toBe('running');
    expect(s.markLostExcept('boot-2', 'again')).toEqual([]);
    // An ended sandbox does not end twice.
    expect(s.endSandbox('old-running', 'killed', null)).toBe(false);
    s.close();
  });

  it('quota overrides per tenant; sandboxes listed per tenant and state', () => {
    const s = new Store(path);
    s.setQuota('a', { maxSandboxes: 2 });
    expect(s.quotaOverrides('a')).toEqual({ maxSandboxes: 2 });
    expect(s.quotaOverrides('nobody')).toEqual({});
    s.insertSandbox(row('x'));
    s.insertSandbox(row('y', { tenant: 'b' }));
    expect(s.sandboxes({ tenant: 'a', states: ['running'] }).map((r) => r.id)).toEqual(['x']);
    s.close();
  });

  it("liveUsage sums a tenant's running and paused sandboxes only, as the listed rows do", () => {
    const s = new Store(path);
    expect(s.liveUsage('a')).toEqual({ sandboxes: 0, memoryBytes: 0, cpus: 0 });
    s.insertSandbox(row('r1', { memoryBytes: 1000, cpus: 0.5 }));
    s.insertSandbox(row('p1', { state: 'paused', memoryBytes: 2000, cpus: 1.25 }));
    s.insertSandbox(row('k1', { memoryBytes: 4000, cpus: 2 }));
    s.endSandbox('k1', 'killed', null);
    s.insertSandbox(row('l1', { memoryBytes: 8000, cpus: 4 }));
    s.endSandbox('l1', 'lost', 'supervisor died');
    s.insertSandbox(row('other', { tenant: 'b', memoryBytes: 16_000, cpus: 8 }));
    expect(s.liveUsage('a')).toEqual({ sandboxes: 2, memoryBytes: 3000, cpus: 1.75 });
    const live = s.sandboxes({ tenant: 'a', states: ['running', 'paused'] });
    expect(live.reduce((n, r) => n + r.memoryBytes, 0)).toBe(3000);
    expect(s.liveUsage('b')).toEqual({ sandboxes: 1, memoryBytes: 16_000, cpus: 8 });
    s.close();
  });

  it("a sandbox's record and its event commit together: when the event cannot be written, neither is", () => {
    const s = new Store(path);
    // Another connection (as `airlock keys` is) makes the event insert fail for one event type.
    const raw = new Database(path);
    const failOn = (type: string): void => {
      raw.exec(
        `CREATE TRIGGER fail_event BEFORE INSERT ON events WHEN NEW.type = '${type}'
         BEGIN SELECT RAISE(ABORT, 'injected failure'); END`,
      );
    };
    failOn('sandbox.created');
    expect(() => s.insertSandbox(row('t1'))).toThrow(/injected failure/);
    expect(s.getSandbox('t1')).toBeUndefined();
    raw.exec('DROP TRIGGER fail_event');
    s.insertSandbox(row('t1'));
    failOn('sandbox.killed');
    expect(() => s.endSandbox('t1', 'killed', 'by client')).toThrow(/injected failure/);
    expect(s.getSandbox('t1')).toMatchObject({ state: 'running', reason: null });
    raw.exec('DROP TRIGGER fail_event');
    expect(s.endSandbox('t1', 'killed', 'by client')).toBe(true);
    expect(s.endSandbox('t1', 'killed', 'again')).toBe(false); // ended once: no second event
    const events = raw
      .prepare("SELECT type, tenant FROM events WHERE sandbox_id = 't1' ORDER BY seq")
      .all() as Array<{ type: string; tenant: string }>;
    expect(events).toEqual([
      { type: 'sandbox.created', tenant: 'a' },
      { type: 'sandbox.killed', tenant: 'a' },
    ]);
    raw.close();
    s.close();
  });

  it('the event log is append-only: updates and deletes are refused by the database', () => {
    const s = new Store(path);
    s.insertSandbox(row('e1'));
    s.endSandbox('e1', 'killed', 'test');
    expect(s.events({ sandboxId: 'e1' }).map((e) => e.type)).toEqual(['sandbox.created', 'sandbox.killed']);
    s.close();
    const raw = new Database(path);
    expect(() => raw.prepare("UPDATE events SET type = 'x'").run()).toThrow(/append-only/);
    expect(() => raw.prepare('DELETE FROM events').run()).toThrow(/append-only/);
    raw.close();
  });
});
