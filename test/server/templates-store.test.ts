// The store's templates table (migration 2): each tenant's template names, kept apart per tenant,
// replaced on a rebuild, surviving a reopen; and a database of schema 1 (before templates) migrates
// with its data. A real database file.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { Store, type TemplateRow } from '../../src/server/store.js';
import { internalTemplateName } from '../../src/server/templates.js';

let dir: string;
let path: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'airlock-tpl-store-'));
  path = join(dir, 'server.db');
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const D1 = `sha256:${'1'.repeat(64)}`;
const D2 = `sha256:${'2'.repeat(64)}`;
const row = (tenant: string, name: string, digest = D1): TemplateRow => ({
  tenant,
  name,
  internal: internalTemplateName(tenant, name),
  digest,
  createdAt: new Date().toISOString(),
  sizeBytes: 10,
});

describe('Store: templates', () => {
  it('keeps names per tenant; a rebuild replaces; forget removes only that tenant’s; reopening keeps them', () => {
    const s = new Store(path);
    s.putTemplate(row('a', 'py'));
    s.putTemplate(row('b', 'py', D2));
    expect(s.getTemplate('a', 'py')?.digest).toBe(D1);
    expect(s.getTemplate('b', 'py')?.digest).toBe(D2);
    expect(s.getTemplate('c', 'py')).toBeUndefined();
    expect(s.ownsTemplateDigest('a', D1)).toBe(true);
    expect(s.ownsTemplateDigest('a', D2)).toBe(false); // b's layer is not a's
    expect(s.isTenantTemplate(internalTemplateName('b', 'py'))).toBe(true);
    expect(s.isTenantTemplate('py')).toBe(false);
    s.putTemplate(row('a', 'py', D2)); // rebuilt
    expect(s.templates('a').map((t) => [t.name, t.digest])).toEqual([['py', D2]]);
    s.forgetTemplate('a', 'py');
    expect(s.templates('a')).toEqual([]);
    expect(s.templates('b')).toHaveLength(1);
    s.close();
    const again = new Store(path);
    expect(again.getTemplate('b', 'py')?.digest).toBe(D2);
    expect(again.events().map((e) => e.type)).toEqual([
      'template.built',
      'template.built',
      'template.built',
      'template.removed',
    ]);
    again.close();
  });

  it('internal names differ per tenant, fit the library’s 63 characters, and never equal a plain name', () => {
    const n = internalTemplateName('tenant-a', 'x'.repeat(40));
    expect(n.length).toBeLessThanOrEqual(63);
    expect(internalTemplateName('tenant-a', 'py')).not.toBe(internalTemplateName('tenant-b', 'py'));
    expect(internalTemplateName('tenant-a', 'py')).toMatch(/^tn-[0-9a-f]{16}-py$/);
  });

  it('a schema-1 database (before templates) migrates and keeps its keys', () => {
    const s = new Store(path);
    const { key } = s.createKey('team');
    s.close();
    const raw = new Database(path);
    raw.exec('DROP TABLE templates; UPDATE schema_version SET version = 1');
    raw.close();
    const again = new Store(path);
    expect(again.schemaVersion()).toBe(2);
    expect(again.verifyKey(key)?.tenant).toBe('team');
    again.putTemplate(row('team', 'py'));
    expect(again.templates('team')).toHaveLength(1);
    again.close();
  });
});
