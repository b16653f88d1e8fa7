// Literal secrets through the server API (the only secret form a remote client may send): the value
// reaches its bound host, never the sandbox, and is never written to disk with a snapshot; and the
// egress event stream of the REST API carries the sandbox's attempts.
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EgressEvent } from '../../src/index.js';
import { SKIP_REASON, canRunNamespaces } from '../helpers.js';
import { CALLER, collectExec, startServer, type TestServer } from '../server/native-support.js';
import { EGRESS_STATE_DIR, startEgressWorld, until, type EgressWorld } from './harness.js';
import { ALLOWED, DENIED, SECRET_HOST, assertPrivateNetns } from './net.js';

assertPrivateNetns();

const VALUE = `literal-secret-${randomBytes(8).toString('hex')}`;

describe.skipIf(!canRunNamespaces)(
  `server API: literal secrets and the egress stream (${SKIP_REASON})`,
  () => {
    let world: EgressWorld;
    let srv: TestServer;
    let id: string;
    beforeAll(async () => {
      world = await startEgressWorld();
      srv = await startServer(world.airlock);
      id = (
        await srv.api.create(
          {
            network: { allow: [ALLOWED.name, SECRET_HOST.name] },
            secrets: [{ name: 'TOKEN', value: VALUE, hosts: [SECRET_HOST.name] }],
          },
          CALLER,
        )
      ).id;
      await srv.api.writeFile(id, '/tmp/testca.pem', Buffer.from(world.servers.ca.certPem), CALLER);
    });
    afterAll(async () => {
      await srv?.api.kill(id, CALLER).catch(() => {});
      await srv?.close();
      await world?.close();
    });

    it('the sandbox sees a sentinel; the bound host gets the literal value', async () => {
      const env = await collectExec(srv.api.exec(id, { cmd: 'echo "$TOKEN"' }, CALLER));
      expect(env.stdout.toString()).toMatch(/^airlock_sentinel_/);
      expect(env.stdout.toString()).not.toContain(VALUE);
      const r = await collectExec(
        srv.api.exec(
          id,
          { cmd: `curl -sS -m 10 -H "Authorization: Bearer $TOKEN" https://${SECRET_HOST.name}/lit` },
          CALLER,
        ),
      );
      expect(r.exit?.exitCode, r.stderr.toString()).toBe(0);
      expect(world.servers.seen.findLast((q) => q.url === '/lit')?.headers.authorization).toBe(
        `Bearer ${VALUE}`,
      );
      expect(r.stdout.toString()).not.toContain(VALUE);
    });

    it('a snapshot record never holds the literal value', async () => {
      const snap = await srv.api.snapshot(id, CALLER);
      const record = readFileSync(join(EGRESS_STATE_DIR, 'layers', snap.id, 'snapshot.json'), 'utf8');
      expect(record).not.toContain(VALUE);
      expect(record).toContain(ALLOWED.name); // the rest of the spec is kept
      // A fork keeps the network but not the literal secret (its client passes it again if needed).
      const fork = await srv.api.create({ snapshot: snap.id }, CALLER);
      try {
        const env = await collectExec(srv.api.exec(fork.id, { cmd: 'echo "[$TOKEN]"' }, CALLER));
        expect(env.stdout.toString()).toBe('[]\n');
      } finally {
        await srv.api.kill(fork.id, CALLER);
        await srv.api.removeSnapshot(snap.id, CALLER);
      }
    });

    it('streams egress events: past ones, then live ones', async () => {
      const events: EgressEvent[] = [];
      const ctl = new AbortController();
      const reading = (async () => {
        for await (const e of srv.api.egressEvents(id, CALLER, ctl.signal)) events.push(e);
      })().catch(() => {});
      // the earlier request to the secret host is replayed
      await until(() => events.some((e) => e.host === SECRET_HOST.name && e.decision === 'allow'), 10_000);
      await collectExec(srv.api.exec(id, { cmd: `curl -sS -m 5 http://${DENIED.name}/ || true` }, CALLER));
      await until(() => events.some((e) => e.host === DENIED.name && e.decision === 'deny'), 10_000);
      ctl.abort();
      await reading;
      expect(events.every((e) => e.sandboxId === id)).toBe(true);
    });
  },
);
