// SOCKS5 on the proxy port: curl through it, a denied host, blocked literal addresses of every SOCKS
// address type, and a raw TCP echo (the "databases, git, ssh" case) through a handshake written by hand.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { canRunNamespaces } from '../helpers.js';
import { socks5, startEgressWorld, until, type EgressWorld } from './harness.js';
import { ALLOWED, assertPrivateNetns, DENIED } from './net.js';

assertPrivateNetns();

const policy = { allow: [ALLOWED.name, `${ALLOWED.name}:5432`] };

let world: EgressWorld;

beforeAll(async () => {
  if (canRunNamespaces) world = await startEgressWorld();
});

afterAll(async () => {
  await world?.close();
});

describe.skipIf(!canRunNamespaces)('SOCKS5', () => {
  it('curl --socks5-hostname reaches an allowed host; the event says socks5 + allow', async () => {
    await world.withSandbox({ network: policy }, async (s) => {
      const r = await s.exec(`curl -sS -m 10 --socks5-hostname 127.0.0.1:3128 http://${ALLOWED.name}/socks`);
      expect(r.exitCode, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout)).toMatchObject({ host: ALLOWED.name, url: '/socks' });
      await until(() => s.egressEvents.some((e) => e.protocol === 'socks5'));
      expect(s.egressEvents.find((e) => e.protocol === 'socks5')).toMatchObject({
        host: ALLOWED.name,
        port: 80,
        address: ALLOWED.address,
        decision: 'allow',
      });
    });
  });

  it('to a denied host: curl fails, and an egress event says socks5 + deny with the reason', async () => {
    await world.withSandbox({ network: policy }, async (s) => {
      const before = world.dialer.dials.length;
      const r = await s.exec(`curl -sS -m 10 --socks5-hostname 127.0.0.1:3128 http://${DENIED.name}/`);
      expect(r.exitCode).not.toBe(0);
      expect(r.stderr).toMatch(/not allowed|Connection not allowed by ruleset|SOCKS5/i);
      const deny = r.egress?.find((e) => e.protocol === 'socks5' && e.decision === 'deny');
      expect(deny).toMatchObject({
        host: DENIED.name,
        port: 80,
        code: 'not_allowed',
        reason:
          'blocked by Airlock egress policy: host denied.test is not in network.allow; ask the operator to allow it',
      });
      expect(world.dialer.dials.slice(before)).toEqual([]);
    });
  });

  it('a hand-written handshake gets a TCP echo from allowed.test:5432 (policy entry allowed.test:5432)', async () => {
    await world.withSandbox({ network: policy }, async (s) => {
      const payload = 'SELECT 1;\x00\x01\x02\xff binary-safe\r\n';
      const [o] = await socks5(s, [{ atyp: 'domain', host: ALLOWED.name, port: 5432, payload }]);
      expect(o).toMatchObject({ method: '0500', reply: 0, error: null });
      expect(o!.received).toBe(payload);
      await until(() => s.egressEvents.some((e) => e.port === 5432));
      const e = s.egressEvents.find((x) => x.port === 5432)!;
      expect(e).toMatchObject({ protocol: 'socks5', decision: 'allow', host: ALLOWED.name });
      expect(e.bytesUp).toBe(Buffer.byteLength(payload, 'latin1'));
      expect(e.bytesDown).toBe(Buffer.byteLength(payload, 'latin1'));
    });
  });

  it('curl telnet:// through SOCKS echoes too; port 5433 (not listed) is refused', async () => {
    await world.withSandbox({ network: policy }, async (s) => {
      const ok = await s.exec(
        `printf 'ping\\n' | curl -sS -m 1 --socks5-hostname 127.0.0.1:3128 telnet://${ALLOWED.name}:5432`,
      );
      expect(ok.stdout).toBe('ping\n'); // curl waits for more input until -m: its exit code says timeout
      const [no] = await socks5(s, [{ atyp: 'domain', host: ALLOWED.name, port: 5433, payload: 'x' }]);
      expect(no!.reply).toBe(2); // connection not allowed by ruleset
      const deny = s.egressEvents.find((e) => e.port === 5433);
      expect(deny).toMatchObject({ decision: 'deny', code: 'port_not_allowed' });
    });
  });

  it('blocked literal addresses of every SOCKS address type are refused (reply 2) before any dial', async () => {
    await world.withSandbox({ network: policy }, async (s) => {
      const before = world.dialer.dials.length;
      const targets = [
        { atyp: 'ipv4', host: '169.254.169.254', port: 80 },
        { atyp: 'ipv4', host: '127.0.0.1', port: 3128 },
        { atyp: 'ipv4', host: '10.0.0.1', port: 5432 },
        { atyp: 'ipv6', host: '::1', port: 80 },
        { atyp: 'ipv6', host: '::ffff:169.254.169.254', port: 80 },
        { atyp: 'ipv6', host: 'fd00::1', port: 443 },
        { atyp: 'domain', host: '2852039166', port: 80 },
        { atyp: 'domain', host: '0x7f.1', port: 80 },
        { atyp: 'domain', host: '127.0.0.1.', port: 80 },
        { atyp: 'domain', host: 'metadata.test', port: 80 }, // not allowed here: refused before resolving
      ] as const;
      const out = await socks5(s, targets);
      out.forEach((o, i) => {
        expect(o.method, JSON.stringify(targets[i])).toBe('0500');
        expect(o.reply, JSON.stringify(targets[i])).toBe(2);
      });
      expect(world.dialer.dials.slice(before)).toEqual([]);
      await until(() => s.egressEvents.length >= targets.length);
      expect(s.egressEvents.every((e) => e.protocol === 'socks5' && e.decision === 'deny')).toBe(true);
      expect(s.egressEvents.slice(0, 9).map((e) => e.code)).toEqual(Array(9).fill('blocked_address'));
    });
  });
});
