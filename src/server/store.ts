// The front server's state (issue 36): one SQLite file (better-sqlite3 12, WAL) holding tenants and
// their quotas, API keys (sha256 hashes only: a key is shown once, at creation, and never stored),
// the sandboxes each tenant owns with their deadlines and the supervisor boot they live in, the
// snapshots each tenant took, and an append-only event log. Schema changes are numbered migrations
// recorded in a version table; a database newer than this code is refused, not guessed at.
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import Database from 'better-sqlite3';
import { AirlockError } from '../core/errors.js';

/** Per-tenant limits; undefined fields take the server's defaults (ServerConfig.defaultQuota). */
export interface Quota {
  /** Live (running or paused) sandboxes at once. */
  readonly maxSandboxes: number;
  /** Sum of the live sandboxes' memory limits. */
  readonly maxMemoryBytes: number;
  /** Sum of the live sandboxes' CPU limits. */
  readonly maxCpus: number;
  /** Creates accepted in any 60 s window. */
  readonly createsPerMinute: number;
}

export type StoredState = 'running' | 'paused' | 'killed' | 'expired' | 'lost';
export const LIVE_STATES: readonly StoredState[] = ['running', 'paused'];

export interface SandboxRow {
  readonly id: string;
  readonly tenant: string;
  readonly state: StoredState;
  readonly backend: string;
  readonly template: string | null;
  readonly createdAt: string;
  /** Epoch ms, or null for no TTL. */
  readonly deadline: number | null;
  readonly metadata: Record<string, string>;
  readonly reason: string | null;
  readonly bootId: string;
  readonly memoryBytes: number;
  readonly cpus: number;
}

export interface ApiKeyRow {
  readonly id: string;
  readonly tenant: string;
  readonly created: string;
  readonly revoked: string | null;
}

const MIGRATIONS: readonly string[] = [
  // 1: the first schema.
  `CREATE TABLE tenants (
     name TEXT PRIMARY KEY,
     created TEXT NOT NULL,
     max_sandboxes INTEGER, max_memory_bytes INTEGER, max_cpus REAL, creates_per_minute INTEGER
   );
   CREATE TABLE api_keys (
     id TEXT PRIMARY KEY,
     tenant TEXT NOT NULL REFERENCES tenants(name),
     hash TEXT NOT NULL UNIQUE,
     created TEXT NOT NULL,
     revoked TEXT
   );
   CREATE TABLE sandboxes (
     id TEXT PRIMARY KEY,
     tenant TEXT NOT NULL,
     state TEXT NOT NULL,
     backend TEXT NOT NULL,
     template TEXT,
     created_at TEXT NOT NULL,
     deadline INTEGER,
     metadata TEXT NOT NULL,
     reason TEXT,
     boot_id TEXT NOT NULL,
     memory_bytes INTEGER NOT NULL,
     cpus REAL NOT NULL
   );
   CREATE INDEX sandboxes_tenant ON sandboxes(tenant, state);
   CREATE TABLE snapshots (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created TEXT NOT NULL);
   CREATE TABLE events (
     seq INTEGER PRIMARY KEY AUTOINCREMENT,
     at TEXT NOT NULL,
     type TEXT NOT NULL,
     tenant TEXT,
     sandbox_id TEXT,
     data TEXT NOT NULL
   );
   CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
     BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
   CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
     BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;`,
  // 2: templates each tenant built (server/templates.ts): its name → the library's (internal) name.
  `CREATE TABLE templates (
     tenant TEXT NOT NULL,
     name TEXT NOT NULL,
     internal TEXT NOT NULL UNIQUE,
     digest TEXT NOT NULL,
     created_at TEXT NOT NULL,
     size_bytes INTEGER NOT NULL,
     PRIMARY KEY (tenant, name)
   );
   CREATE INDEX templates_digest ON templates(digest);`,
];

/** A template a tenant built: `name` is the tenant's, `internal` the library's (server/templates.ts). */
export interface TemplateRow {
  readonly tenant: string;
  readonly name: string;
  readonly internal: string;
  readonly digest: string;
  readonly createdAt: string;
  readonly sizeBytes: number;
}

interface RawTemplate {
  tenant: string;
  name: string;
  internal: string;
  digest: string;
  created_at: string;
  size_bytes: number;
}

const templateRowOf = (r: RawTemplate): TemplateRow => ({
  tenant: r.tenant,
  name: r.name,
  internal: r.internal,
  digest: r.digest,
  createdAt: r.created_at,
  sizeBytes: r.size_bytes,
});

/** Key format: `alk_<key id>_<secret>`; only sha256(whole key) is stored. */
const KEY_RE = /^alk_([0-9a-f]{16})_[A-Za-z0-9_-]{43}$/;
const sha256 = (s: string): string => createHash('sha256').update(s).digest('hex');

/**
 * Tenant names: 1-63 characters, lowercase ASCII letters, digits, ".", "_" and "-", starting with a
 * letter or digit. Lowercase only, so no two tenants differ by case alone (and no unicode
 * confusables: "аlice" with a Cyrillic а is refused, not a second tenant). docs/server.md.
 */
export const TENANT_NAME_RE = /^[a-z0-9][a-z0-9._-]{0,62}$/;

/** INVALID_ARGUMENT (field "tenant") unless `name` is a valid tenant name; the message says what is. */
export function checkTenantName(name: string, field = 'tenant'): string {
  if (typeof name === 'string' && TENANT_NAME_RE.test(name)) return name;
  const shown = JSON.stringify(String(name).slice(0, 80));
  throw new AirlockError(
    'INVALID_ARGUMENT',
    `tenant name ${shown} is not allowed: use 1-63 lowercase ASCII letters, digits, ".", "_" or "-", starting with a letter or digit (e.g. "team-a")`,
    { field },
  );
}

interface RawSandbox {
  id: string;
  tenant: string;
  state: StoredState;
  backend: string;
  template: string | null;
  created_at: string;
  deadline: number | null;
  metadata: string;
  reason: string | null;
  boot_id: string;
  memory_bytes: number;
  cpus: number;
}

const rowOf = (r: RawSandbox): SandboxRow => ({
  id: r.id,
  tenant: r.tenant,
  state: r.state,
  backend: r.backend,
  template: r.template,
  createdAt: r.created_at,
  deadline: r.deadline,
  metadata: JSON.parse(r.metadata) as Record<string, string>,
  reason: r.reason,
  bootId: r.boot_id,
  memoryBytes: r.memory_bytes,
  cpus: r.cpus,
});

export class Store {
  private readonly db: Database.Database;
  /** Prepared once per SQL text (a prepare costs more than most of these queries). */
  private readonly stmts = new Map<string, Database.Statement>();
  /**
   * One transaction function, made once, that runs the function it is given: db.transaction() builds
   * its wrappers on every call (~25 µs each here, two per create → kill through the API).
   */
  private readonly inTransaction: (f: () => unknown) => unknown;

  /** Opens (creating 0600 if needed) and migrates the database at `path`. */
  constructor(readonly path: string) {
    mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
    this.db = new Database(path);
    chmodSync(path, 0o600); // API key hashes and tenant data: the server's eyes only
    this.db.pragma('journal_mode = WAL');
    // NORMAL, not FULL: in WAL mode a commit is then written to the WAL but not fsynced, so it
    // survives any crash of this process (SIGTERM, kill -9: the restart guarantee) and is lost only
    // if the host itself goes down, which ends the sandboxes it records too. FULL fsynced every
    // write (~1 ms each here, several per create → exec → kill).
    this.db.pragma('synchronous = NORMAL');
    this.db.pragma('busy_timeout = 5000'); // `airlock keys` writes while the server runs
    this.db.pragma('foreign_keys = ON');
    this.inTransaction = this.db.transaction((f: () => unknown) => f());
    this.migrate();
  }

  /** Run `f` in one transaction (a savepoint when already inside one): one commit for all it writes. */
  private atomically<T>(f: () => T): T {
    return this.inTransaction(f) as T;
  }

  private stmt(sql: string): Database.Statement {
    let st = this.stmts.get(sql);
    if (!st) {
      st = this.db.prepare(sql);
      this.stmts.set(sql, st);
    }
    return st;
  }

  private migrate(): void {
    this.db.exec('CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)');
    const row = this.stmt('SELECT version FROM schema_version').get() as { version: number } | undefined;
    const current = row?.version ?? 0;
    if (current > MIGRATIONS.length) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `${this.path} has schema version ${current}, newer than this airlock (${MIGRATIONS.length}): upgrade airlock`,
      );
    }
    this.db
      .transaction(() => {
        for (let v = current; v < MIGRATIONS.length; v++) this.db.exec(MIGRATIONS[v]!);
        if (row) this.stmt('UPDATE schema_version SET version = ?').run(MIGRATIONS.length);
        else this.stmt('INSERT INTO schema_version VALUES (?)').run(MIGRATIONS.length);
      })
      .immediate();
  }

  schemaVersion(): number {
    return (this.stmt('SELECT version FROM schema_version').get() as { version: number }).version;
  }

  close(): void {
    this.db.close();
  }

  // ---- tenants and quotas -------------------------------------------------------------------------

  ensureTenant(name: string): void {
    checkTenantName(name);
    this.stmt('INSERT OR IGNORE INTO tenants (name, created) VALUES (?, ?)').run(
      name,
      new Date().toISOString(),
    );
  }

  /** The tenant's own quota overrides (fields it does not set are absent). */
  quotaOverrides(tenant: string): Partial<Quota> {
    const r = this.stmt(
      'SELECT max_sandboxes, max_memory_bytes, max_cpus, creates_per_minute FROM tenants WHERE name = ?',
    ).get(tenant) as
      | {
          max_sandboxes: number | null;
          max_memory_bytes: number | null;
          max_cpus: number | null;
          creates_per_minute: number | null;
        }
      | undefined;
    if (!r) return {};
    return {
      ...(r.max_sandboxes !== null ? { maxSandboxes: r.max_sandboxes } : {}),
      ...(r.max_memory_bytes !== null ? { maxMemoryBytes: r.max_memory_bytes } : {}),
      ...(r.max_cpus !== null ? { maxCpus: r.max_cpus } : {}),
      ...(r.creates_per_minute !== null ? { createsPerMinute: r.creates_per_minute } : {}),
    };
  }

  setQuota(tenant: string, q: Partial<Quota>): void {
    this.ensureTenant(tenant);
    this.stmt(
      `UPDATE tenants SET max_sandboxes = ?, max_memory_bytes = ?, max_cpus = ?, creates_per_minute = ?
         WHERE name = ?`,
    ).run(
      q.maxSandboxes ?? null,
      q.maxMemoryBytes ?? null,
      q.maxCpus ?? null,
      q.createsPerMinute ?? null,
      tenant,
    );
  }

  // ---- API keys -----------------------------------------------------------------------------------

  /** A new key for `tenant` (created if new). The key itself is returned once and never stored. */
  createKey(tenant: string): { id: string; key: string } {
    this.ensureTenant(tenant);
    const id = randomBytes(8).toString('hex');
    const key = `alk_${id}_${randomBytes(32).toString('base64url')}`;
    this.stmt('INSERT INTO api_keys (id, tenant, hash, created) VALUES (?, ?, ?, ?)').run(
      id,
      tenant,
      sha256(key),
      new Date().toISOString(),
    );
    this.event('key.created', tenant, null, { id });
    return { id, key };
  }

  /** The tenant of a valid, unrevoked key; undefined for anything else (no reason: no oracle). */
  verifyKey(key: string): { id: string; tenant: string } | undefined {
    const m = KEY_RE.exec(key);
    if (!m) return undefined;
    // Looked up by the hash of the whole key: a lookup by hash reveals nothing about the stored keys.
    const r = this.stmt('SELECT id, tenant FROM api_keys WHERE hash = ? AND revoked IS NULL').get(
      sha256(key),
    ) as { id: string; tenant: string } | undefined;
    return r && r.id === m[1] ? r : undefined;
  }

  /** Whether key `id` exists, belongs to `tenant` and is not revoked (one indexed lookup, no cache). */
  keyActive(id: string, tenant: string): boolean {
    return (
      this.stmt('SELECT 1 FROM api_keys WHERE id = ? AND tenant = ? AND revoked IS NULL').get(id, tenant) !==
      undefined
    );
  }

  listKeys(): ApiKeyRow[] {
    return this.stmt(
      'SELECT id, tenant, created, revoked FROM api_keys ORDER BY created, id',
    ).all() as ApiKeyRow[];
  }

  /** Revoke a key by id; KEY not found → INVALID_ARGUMENT naming the id. Idempotent for a revoked key. */
  revokeKey(id: string): ApiKeyRow {
    const r = this.stmt('SELECT id, tenant, created, revoked FROM api_keys WHERE id = ?').get(id) as
      ApiKeyRow | undefined;
    if (!r)
      throw new AirlockError('INVALID_ARGUMENT', `no API key with id "${id}" (see airlock keys list)`, {
        field: 'id',
      });
    if (r.revoked) return r;
    const revoked = new Date().toISOString();
    this.stmt('UPDATE api_keys SET revoked = ? WHERE id = ?').run(revoked, id);
    this.event('key.revoked', r.tenant, null, { id });
    return { ...r, revoked };
  }

  // ---- sandboxes ----------------------------------------------------------------------------------

  /**
   * Record a new sandbox and its `sandbox.created` event in ONE transaction (one commit: the record
   * and its event are in the WAL together, or neither is).
   */
  insertSandbox(r: SandboxRow): void {
    checkTenantName(r.tenant);
    this.atomically(() => this.insertSandboxRow(r));
  }

  private insertSandboxRow(r: SandboxRow): void {
    this.stmt(
      `INSERT INTO sandboxes (id, tenant, state, backend, template, created_at, deadline, metadata, reason,
           boot_id, memory_bytes, cpus) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    ).run(
      r.id,
      r.tenant,
      r.state,
      r.backend,
      r.template,
      r.createdAt,
      r.deadline,
      JSON.stringify(r.metadata),
      r.reason,
      r.bootId,
      r.memoryBytes,
      r.cpus,
    );
    this.event('sandbox.created', r.tenant, r.id, { bootId: r.bootId, deadline: r.deadline });
  }

  getSandbox(id: string): SandboxRow | undefined {
    const r = this.stmt('SELECT * FROM sandboxes WHERE id = ?').get(id) as RawSandbox | undefined;
    return r && rowOf(r);
  }

  /** Sandboxes in the given states (all tenants when tenant is undefined). */
  sandboxes(o: { tenant?: string; states?: readonly StoredState[] } = {}): SandboxRow[] {
    const states = o.states ?? ['running', 'paused', 'killed', 'expired', 'lost'];
    const marks = states.map(() => '?').join(',');
    const rows =
      o.tenant === undefined
        ? this.stmt(`SELECT * FROM sandboxes WHERE state IN (${marks}) ORDER BY created_at, id`).all(
            ...states,
          )
        : this.stmt(
            `SELECT * FROM sandboxes WHERE tenant = ? AND state IN (${marks}) ORDER BY created_at, id`,
          ).all(o.tenant, ...states);
    return (rows as RawSandbox[]).map(rowOf);
  }

  /**
   * What `tenant`'s live (running or paused) sandboxes take, summed by SQLite: the quota check of
   * every create, which must not load and parse every live row (metadata JSON included) to count them.
   */
  liveUsage(tenant: string): { sandboxes: number; memoryBytes: number; cpus: number } {
    const r = this.stmt(
      `SELECT count(*) AS n, total(memory_bytes) AS mem, total(cpus) AS cpus FROM sandboxes
         WHERE tenant = ? AND state IN ('running', 'paused')`,
    ).get(tenant) as { n: number; mem: number; cpus: number };
    return { sandboxes: r.n, memoryBytes: r.mem, cpus: r.cpus };
  }

  /** Move a live sandbox to `state`; false if it was not live (already ended). */
  /** The state change and its event in one transaction (one commit); RETURNING gives the tenant. */
  endSandbox(id: string, state: 'killed' | 'expired' | 'lost', reason: string | null): boolean {
    return this.atomically(() => {
      const r = this.stmt(
        `UPDATE sandboxes SET state = ?, reason = ? WHERE id = ? AND state IN ('running', 'paused')
         RETURNING tenant`,
      ).get(state, reason, id) as { tenant: string } | undefined;
      if (r) this.event(`sandbox.${state}`, r.tenant, id, { reason });
      return r !== undefined;
    });
  }

  setSandboxState(id: string, state: 'running' | 'paused'): void {
    this.stmt(`UPDATE sandboxes SET state = ? WHERE id = ? AND state IN ('running', 'paused')`).run(
      state,
      id,
    );
  }

  setDeadline(id: string, deadline: number | null): void {
    this.stmt('UPDATE sandboxes SET deadline = ? WHERE id = ?').run(deadline, id);
    this.event('sandbox.timeout', this.getSandbox(id)?.tenant ?? null, id, { deadline });
  }

  /**
   * Every live sandbox of a supervisor boot other than `bootId` is `lost`: that supervisor died, and
   * its sandboxes with it (fail closed). Returns the ids marked.
   */
  markLostExcept(bootId: string, reason: string): string[] {
    return this.db.transaction(() => {
      const ids = (
        this.stmt(`SELECT id FROM sandboxes WHERE state IN ('running', 'paused') AND boot_id != ?`).all(
          bootId,
        ) as Array<{ id: string }>
      ).map((r) => r.id);
      for (const id of ids) this.endSandbox(id, 'lost', reason);
      return ids;
    })();
  }

  // ---- snapshots ----------------------------------------------------------------------------------

  recordSnapshot(id: string, tenant: string): void {
    checkTenantName(tenant);
    this.stmt('INSERT OR IGNORE INTO snapshots (id, tenant, created) VALUES (?, ?, ?)').run(
      id,
      tenant,
      new Date().toISOString(),
    );
  }

  snapshotTenant(id: string): string | undefined {
    return (this.stmt('SELECT tenant FROM snapshots WHERE id = ?').get(id) as { tenant: string } | undefined)
      ?.tenant;
  }

  forgetSnapshot(id: string): void {
    this.stmt('DELETE FROM snapshots WHERE id = ?').run(id);
  }

  // ---- templates ----------------------------------------------------------------------------------

  /** Record (or replace, on a rebuild) a template the tenant built. */
  putTemplate(r: TemplateRow): void {
    this.stmt(
      `INSERT INTO templates (tenant, name, internal, digest, created_at, size_bytes) VALUES (?, ?, ?, ?, ?, ?)
         ON CONFLICT (tenant, name) DO UPDATE SET internal = excluded.internal, digest = excluded.digest,
           created_at = excluded.created_at, size_bytes = excluded.size_bytes`,
    ).run(r.tenant, r.name, r.internal, r.digest, r.createdAt, r.sizeBytes);
    this.event('template.built', r.tenant, null, { name: r.name, digest: r.digest });
  }

  getTemplate(tenant: string, name: string): TemplateRow | undefined {
    const r = this.stmt('SELECT * FROM templates WHERE tenant = ? AND name = ?').get(tenant, name) as
      RawTemplate | undefined;
    return r && templateRowOf(r);
  }

  templates(tenant: string): TemplateRow[] {
    return (
      this.stmt('SELECT * FROM templates WHERE tenant = ? ORDER BY name').all(tenant) as RawTemplate[]
    ).map(templateRowOf);
  }

  /** Whether `tenant` built a template whose layer is `digest`. */
  ownsTemplateDigest(tenant: string, digest: string): boolean {
    return !!this.stmt('SELECT 1 FROM templates WHERE tenant = ? AND digest = ?').get(tenant, digest);
  }

  /** Whether any tenant's template has this library (internal) name. */
  isTenantTemplate(internal: string): boolean {
    return !!this.stmt('SELECT 1 FROM templates WHERE internal = ?').get(internal);
  }

  forgetTemplate(tenant: string, name: string): void {
    this.stmt('DELETE FROM templates WHERE tenant = ? AND name = ?').run(tenant, name);
    this.event('template.removed', tenant, null, { name });
  }

  // ---- events -------------------------------------------------------------------------------------

  event(type: string, tenant: string | null, sandboxId: string | null, data: Record<string, unknown>): void {
    this.stmt('INSERT INTO events (at, type, tenant, sandbox_id, data) VALUES (?, ?, ?, ?, ?)').run(
      new Date().toISOString(),
      type,
      tenant,
      sandboxId,
      JSON.stringify(data),
    );
  }

  events(o: { sandboxId?: string } = {}): Array<{ seq: number; type: string; sandboxId: string | null }> {
    const rows = (
      o.sandboxId === undefined
        ? this.stmt('SELECT seq, type, sandbox_id FROM events ORDER BY seq').all()
        : this.stmt('SELECT seq, type, sandbox_id FROM events WHERE sandbox_id = ? ORDER BY seq').all(
            o.sandboxId,
          )
    ) as Array<{ seq: number; type: string; sandbox_id: string | null }>;
    return rows.map((r) => ({ seq: r.seq, type: r.type, sandboxId: r.sandbox_id }));
  }
}
