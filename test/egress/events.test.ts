// The egress audit events as a library user sees them: sbx.onEgress, sbx.egressEvents and
// ExecResult.egress, with the documented fields (src/egress/events.ts).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EgressEvent } from '../../src/egress/events.js';
import { canRunNamespaces } from '../helpers.js';
import { startEgressWorld, until, type EgressWorld } from './harness.js';
import { ALLOWED, assertPrivateNetns, DENIED } from './net.js';

assertPrivateNetns();

const policy = { allow: [ALLOWED.name] };
let world: EgressWorld;

beforeAll(async () => {
  if (canRunNamespaces) world = await startEgressWorld();
});

afterAll(async () => {
  await world?.close();
});

const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

describe.skipIf(!canRunNamespaces)('egress events', () => {
  it('onEgress receives an allow event with every field, and byte counts for a download and an upload', async () => {
    await world.withSandbox({ network: policy }, async (s) => {
      const got: EgressEvent[] = [];
      s.onEgress((e) => got.push(e));
      const t0 = Date.now();
      const r = await s.exec(`curl -sS -m 10 http://${ALLOWED.name}/download`);
      expect(r.exitCode, r.stderr).toBe(0);
      await until(() => got.length >= 1);
      expect(got).toHaveLength(1);
      const e = got[0]!;
      expect(e).toMatchObject({
        sandboxId: s.id,
        protocol: 'http',
        host: ALLOWED.name,
        port: 80,
        address: ALLOWED.address,
        decision: 'allow',
        reason: 'allowed by network.allow',
      });
      expect(e.time).toMatch(ISO);
      expect(Date.parse(e.time)).toBeGreaterThanOrEqual(t0 - 1000);
      expect(e.durationMs).toBeGreaterThanOrEqual(0);
      expect(e.code).toBeUndefined();
      expect(e.alert).toBeUndefined();
      expect(e.bytesDown).toBeGreaterThanOrEqual(Buffer.byteLength(r.stdout));
      expect(e.bytesDown).toBeGreaterThan(0);

      const body = 'x'.repeat(5000);
      const up = await s.exec(`curl -sS -m 10 --data-binary @- http://${ALLOWED.name}/upload`, {
        stdin: body,
      });
      expect(up.exitCode, up.stderr).toBe(0);
      await until(() => got.length >= 2);
      expect(got[1]).toMatchObject({ protocol: 'http', decision: 'allow' });
      expect(got[1]!.bytesUp).toBeGreaterThanOrEqual(body.length);
      expect(got[1]!.bytesDown).toBeGreaterThan(0);
    });
  });

  it('an HTTPS download through CONNECT counts bytes both ways', async () => {
    await world.withSandbox({ network: policy }, async (s) => {
      await s.files.write('/tmp/testca.pem', world.servers.ca.certPem);
      const got: EgressEvent[] = [];
      s.onEgress((e) => got.push(e));
      const r = await s.exec(`curl -sS -m 10 --cacert /tmp/testca.pem https://${ALLOWED.name}/tls`);
      expect(r.exitCode, r.stderr).toBe(0);
      await until(() => got.length >= 1);
      expect(got[0]).toMatchObject({ protocol: 'connect', host: ALLOWED.name, port: 443, decision: 'allow' });
      expect(got[0]!.bytesUp).toBeGreaterThan(0); // the TLS handshake and the request
      expect(got[0]!.bytesDown).toBeGreaterThan(Buffer.byteLength(r.stdout));
    });
  });

  it('a deny event: reason for the model, stable code, no address, zero bytes', async () => {
    await world.withSandbox({ network: policy }, async (s) => {
      const got: EgressEvent[] = [];
      s.onEgress((e) => got.push(e));
      await s.exec(`curl -sS -m 10 http://${DENIED.name}/`);
      await until(() => got.length >= 1);
      expect(got).toHaveLength(1);
      const e = got[0]!;
      expect(e).toMatchObject({
        sandboxId: s.id,
        protocol: 'http',
        host: DENIED.name,
        port: 80,
        decision: 'deny',
        code: 'not_allowed',
        reason:
          'blocked by Airlock egress policy: host denied.test is not in network.allow; ask the operator to allow it',
        bytesUp: 0,
        bytesDown: 0,
      });
      expect(e.address).toBeUndefined();
      expect(e.time).toMatch(ISO);
    });
  });

  it('unsubscribe stops delivery; egressEvents keeps everything; ExecResult.egress has only its exec', async () => {
    await world.withSandbox({ network: policy }, async (s) => {
      const got: EgressEvent[] = [];
      const off = s.onEgress((e) => got.push(e));
      s.onEgress(() => {
        throw new Error('a buggy listener');
      });
      const first = await s.exec(`curl -sS -m 10 http://${ALLOWED.name}/one`);
      expect(first.exitCode, first.stderr).toBe(0); // the throwing listener broke nothing
      await until(() => got.length >= 1);
      off();
      const second = await s.exec(`curl -sS -m 10 http://${DENIED.name}/two`);
      await until(() => s.egressEvents.length >= 2);
      expect(got.map((e) => e.decision)).toEqual(['allow']);
      expect(s.egressEvents.map((e) => [e.host, e.decision])).toEqual([
        [ALLOWED.name, 'allow'],
        [DENIED.name, 'deny'],
      ]);
      expect(first.egress?.map((e) => e.host)).toEqual([ALLOWED.name]);
      expect(second.egress?.map((e) => e.host)).toEqual([DENIED.name]);
    });
  });

  it('ExecResult.egress is absent without a network policy', async () => {
    await world.withSandbox({}, async (s) => {
      const r = await s.exec('true');
      expect(r.egress).toBeUndefined();
      expect(s.egressEvents).toEqual([]);
    });
  });
});
