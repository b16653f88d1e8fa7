// SECURITY-CRITICAL: parses bytes from inside the sandbox (tests for src/egress/dns.ts)
//
// Queries are built with dns-packet, as a stub resolver would send them; responses are decoded with it.
// Garbage, responses, oversize packets and names that decode ambiguously cover the hostile side.
import dnsPacket from 'dns-packet';
import { describe, expect, it } from 'vitest';
import { blockedRange } from '../../src/core/address.js';
import {
  DEFAULT_SYNTHETIC_POOL,
  FakeDns,
  isSyntheticAddress,
  MAX_QUERY_BYTES,
  SYNTHETIC_TTL_SECONDS,
} from '../../src/egress/dns.js';

const ALLOWED = new Set(['allowed.test', 'api.allowed.test', 'other.test']);

function makeDns(pool?: string): { dns: FakeDns; asked: string[] } {
  const asked: string[] = [];
  const allows = (name: string): boolean => {
    asked.push(name);
    return ALLOWED.has(name);
  };
  return { dns: new FakeDns(pool === undefined ? { allows } : { allows, pool }), asked };
}

function query(
  name: string,
  type: dnsPacket.RecordType = 'A',
  extra: Partial<dnsPacket.Packet> = {},
): Buffer {
  return dnsPacket.encode({
    type: 'query',
    id: 0x1234,
    flags: dnsPacket.RECURSION_DESIRED,
    questions: [{ type, name, class: 'IN' }],
    ...extra,
  });
}

function ask(dns: FakeDns, q: Buffer): dnsPacket.DecodedPacket & { rcode?: string } {
  const out = dns.answer(q);
  if (out === undefined) throw new Error('query was dropped');
  return dnsPacket.decode(out) as dnsPacket.DecodedPacket & { rcode?: string };
}

const addressOf = (p: dnsPacket.DecodedPacket): string => {
  const a = p.answers?.[0];
  if (a?.type !== 'A') throw new Error(`no A answer: ${JSON.stringify(p)}`);
  return a.data;
};

describe('FakeDns: A and AAAA', () => {
  it('answers A for an allowed name with a synthetic address from the pool, TTL 5 s', () => {
    const { dns, asked } = makeDns();
    const r = ask(dns, query('allowed.test'));
    expect(r).toMatchObject({
      id: 0x1234,
      type: 'response',
      rcode: 'NOERROR',
      flag_qr: true,
      flag_aa: true,
      flag_rd: true,
      flag_ra: true,
      questions: [{ name: 'allowed.test', type: 'A', class: 'IN' }],
    });
    expect(r.answers).toEqual([
      {
        name: 'allowed.test',
        type: 'A',
        class: 'IN',
        ttl: SYNTHETIC_TTL_SECONDS,
        flush: false,
        data: expect.any(String),
      },
    ]);
    expect(isSyntheticAddress(addressOf(r))).toBe(true);
    expect(blockedRange(addressOf(r))).toMatch(/^benchmarking/);
    expect(asked).toEqual(['allowed.test']);
  });

  it('keeps one address per name, distinct across names, and maps it back with nameFor', () => {
    const { dns } = makeDns();
    const a1 = addressOf(ask(dns, query('allowed.test')));
    const b = addressOf(ask(dns, query('api.allowed.test')));
    const a2 = addressOf(ask(dns, query('allowed.test')));
    expect(a2).toBe(a1);
    expect(b).not.toBe(a1);
    expect(dns.nameFor(a1)).toBe('allowed.test');
    expect(dns.nameFor(b)).toBe('api.allowed.test');
  });

  it('asks with the canonical name and echoes the question as asked (0x20 case randomisation)', () => {
    const { dns, asked } = makeDns();
    const r = ask(dns, query('AlLoWeD.TeSt.'));
    expect(asked).toEqual(['allowed.test']);
    expect(r.questions?.[0]?.name).toBe('AlLoWeD.TeSt');
    expect(r.answers?.[0]?.name).toBe('AlLoWeD.TeSt');
    expect(addressOf(r)).toBe(addressOf(ask(dns, query('allowed.test'))));
  });

  it('answers AAAA and other types for an allowed name with NOERROR and no data', () => {
    const { dns } = makeDns();
    for (const type of ['AAAA', 'MX', 'TXT', 'CNAME', 'NS'] as const) {
      const r = ask(dns, query('allowed.test', type));
      expect(r, type).toMatchObject({ rcode: 'NOERROR', answers: [], questions: [{ type }] });
    }
    const https = Buffer.from(query('allowed.test'));
    https.writeUInt16BE(65, https.length - 4); // HTTPS (SVCB) records could carry address hints
    expect(ask(dns, https)).toMatchObject({ rcode: 'NOERROR', answers: [] });
    expect(dns.nameFor('198.18.0.1')).toBeUndefined(); // nothing was handed out
  });

  it('answers NXDOMAIN for every type of a name that is not allowed', () => {
    const { dns } = makeDns();
    for (const type of ['A', 'AAAA', 'TXT'] as const) {
      expect(ask(dns, query('denied.test', type)), type).toMatchObject({ rcode: 'NXDOMAIN', answers: [] });
    }
    expect(ask(dns, query('allowed.test.evil.test'))).toMatchObject({ rcode: 'NXDOMAIN' });
  });

  it('answers NXDOMAIN for numeric names and the root, without asking the policy', () => {
    const { dns, asked } = makeDns();
    for (const name of ['127.0.0.1', '0x7f.1', '.']) {
      expect(ask(dns, query(name)), name).toMatchObject({ rcode: 'NXDOMAIN' });
    }
    expect(asked).toEqual([]);
  });

  it('answers queries carrying an EDNS OPT record', () => {
    const { dns } = makeDns();
    const q = query('allowed.test', 'A', {
      additionals: [
        {
          type: 'OPT',
          name: '.',
          udpPayloadSize: 1232,
          flags: 0,
          extendedRcode: 0,
          ednsVersion: 0,
          flag_do: false,
          options: [],
        },
      ],
    });
    expect(ask(dns, q)).toMatchObject({ rcode: 'NOERROR', answers: [{ type: 'A' }] });
  });
});

describe('FakeDns: pool', () => {
  it('hands out the usable addresses of the pool, then fails gracefully', () => {
    const { dns } = makeDns('198.18.0.0/30');
    expect(addressOf(ask(dns, query('allowed.test')))).toBe('198.18.0.1');
    expect(addressOf(ask(dns, query('api.allowed.test')))).toBe('198.18.0.2');
    expect(ask(dns, query('other.test'))).toMatchObject({ rcode: 'SERVFAIL', answers: [] });
    expect(addressOf(ask(dns, query('allowed.test')))).toBe('198.18.0.1'); // old names still answer
    expect(dns.nameFor('198.18.0.3')).toBeUndefined();
  });

  it('rejects a pool that is not an IPv4 CIDR inside one blocked range', () => {
    const allows = (): boolean => true;
    for (const pool of ['8.8.8.0/24', '10.0.0.0/7', '0.0.0.0/1', 'fd00::/64', 'nonsense', '198.18.0.0/31']) {
      expect(() => new FakeDns({ allows, pool }), pool).toThrow(
        expect.objectContaining({ code: 'INVALID_ARGUMENT' }),
      );
    }
    expect(() => new FakeDns({ allows, pool: '10.99.0.0/16' })).not.toThrow();
  });

  it('caps its table per responder: new names get REFUSED (reported), known names keep their address', () => {
    const full: string[] = [];
    const mk = (): FakeDns =>
      new FakeDns({ allows: (n) => n.endsWith('.wild.test'), maxNames: 3, onTableFull: (n) => full.push(n) });
    const a = mk();
    const first = ['n1', 'n2', 'n3'].map((n) => addressOf(ask(a, query(`${n}.wild.test`))));
    expect(new Set(first).size).toBe(3);
    // Every new name after the cap, in any spelling, type or case: REFUSED, and the table does not grow.
    for (const n of ['n4.wild.test', 'N5.WILD.TEST.', 'n6.wild.test']) {
      expect(ask(a, query(n))).toMatchObject({ rcode: 'REFUSED', answers: [] });
    }
    expect(ask(a, query('n7.wild.test', 'AAAA')).rcode).toBe('NOERROR'); // no address needed for AAAA
    expect(a.size).toBe(3);
    expect(full).toEqual(['n4.wild.test', 'n5.wild.test', 'n6.wild.test']);
    // Names it knows keep their address (established connections and caches stay valid).
    expect(addressOf(ask(a, query('N2.wild.test')))).toBe(first[1]);
    expect(a.nameFor(first[2]!)).toBe('n3.wild.test');
    // Another responder (another sandbox) has its own table.
    const b = mk();
    expect(addressOf(ask(b, query('n4.wild.test')))).toMatch(/^198\.1[89]\./);
    // A reporter that throws does not break the answer.
    const c = new FakeDns({
      allows: () => true,
      maxNames: 1,
      onTableFull: () => {
        throw new Error('bug');
      },
    });
    ask(c, query('one.test'));
    expect(ask(c, query('two.test')).rcode).toBe('REFUSED');
  });

  it('rejects a maxNames that is not a positive integer, with a typed error', () => {
    for (const maxNames of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => new FakeDns({ allows: () => true, maxNames }), String(maxNames)).toThrow(
        expect.objectContaining({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/maxNames/) }),
      );
    }
  });

  it('isSyntheticAddress and nameFor accept other spellings and reject garbage', () => {
    expect(DEFAULT_SYNTHETIC_POOL).toBe('198.18.0.0/15');
    expect(isSyntheticAddress('198.19.255.1')).toBe(true);
    expect(isSyntheticAddress('198.20.0.1')).toBe(false);
    expect(isSyntheticAddress('10.0.0.1', '10.0.0.0/8')).toBe(true);
    expect(isSyntheticAddress('not an address')).toBe(false);
    expect(isSyntheticAddress('::1')).toBe(false);
    expect(isSyntheticAddress('198.18.0.1', 'garbage')).toBe(false);
    const { dns } = makeDns();
    const a = addressOf(ask(dns, query('allowed.test')));
    expect(
      dns.nameFor(
        a
          .split('.')
          .map((o) => `0x${Number(o).toString(16)}`)
          .join('.'),
      ),
    ).toBe('allowed.test');
    expect(dns.nameFor('garbage')).toBeUndefined();
  });
});

describe('FakeDns: malformed and hostile packets', () => {
  const header = (flags: number, qd = 1, an = 0, ns = 0, ar = 0): Buffer => {
    const b = Buffer.alloc(12);
    b.writeUInt16BE(0xbeef, 0);
    b.writeUInt16BE(flags, 2);
    [qd, an, ns, ar].forEach((n, i) => b.writeUInt16BE(n, 4 + 2 * i));
    return b;
  };
  const rcodeOf = (out: Buffer | undefined): number => (out === undefined ? -1 : out.readUInt16BE(2) & 0xf);

  it('drops packets too short for a header, responses and oversize packets', () => {
    const { dns } = makeDns();
    expect(dns.answer(Buffer.alloc(0))).toBeUndefined();
    expect(dns.answer(Buffer.from([1, 2, 3]))).toBeUndefined();
    expect(
      dns.answer(
        dnsPacket.encode({ type: 'response', id: 1, questions: [{ type: 'A', name: 'allowed.test' }] }),
      ),
    ).toBeUndefined();
    const big = Buffer.concat([query('allowed.test'), Buffer.alloc(MAX_QUERY_BYTES)]);
    expect(dns.answer(big)).toBeUndefined();
  });

  it('answers FORMERR, with the id, when only the header parses', () => {
    const { dns } = makeDns();
    const out = dns.answer(Buffer.concat([header(0x0100), Buffer.from([0x3f, 0x61])]));
    expect(out).toHaveLength(12);
    expect(out!.readUInt16BE(0)).toBe(0xbeef);
    expect(out!.readUInt16BE(2) & 0x8000).toBe(0x8000);
    expect(rcodeOf(out)).toBe(1);
  });

  it.each([
    ['no question', header(0x0100, 0)],
    [
      'two questions',
      Buffer.concat([
        header(0x0100, 2),
        query('allowed.test').subarray(12),
        query('denied.test').subarray(12),
      ]),
    ],
    ['answers in a query', Buffer.concat([header(0x0100, 1, 1), query('allowed.test').subarray(12)])],
    ['a truncated question', query('allowed.test').subarray(0, 20)],
    ['a question without type and class', query('allowed.test').subarray(0, -4)],
    [
      'a label with a dot inside',
      Buffer.concat([header(0), Buffer.from('\x09allowed.x\x04test\x00\x00\x01\x00\x01', 'latin1')]),
    ],
    ['a compressed question name', Buffer.concat([header(0), Buffer.from([0xc0, 0x00, 0, 1, 0, 1])])],
    [
      'invalid UTF-8 in a label',
      Buffer.concat([header(0), Buffer.from([2, 0xff, 0xfe, 4, 0x74, 0x65, 0x73, 0x74, 0, 0, 1, 0, 1])]),
    ],
    ['a reserved label type', Buffer.concat([header(0), Buffer.from([0x40, 0, 0, 1, 0, 1])])],
  ])('answers FORMERR for %s', (_what, packet) => {
    const { dns, asked } = makeDns();
    expect(rcodeOf(dns.answer(packet))).toBe(1);
    expect(asked).toEqual([]);
  });

  it('does not let a dot inside a label pass as an allowed name', () => {
    // One label "allowed.test" would decode to the string "allowed.test": it must not get an answer.
    const { dns, asked } = makeDns();
    const packet = Buffer.concat([header(0), Buffer.from('\x0callowed.test\x00\x00\x01\x00\x01', 'latin1')]);
    expect(rcodeOf(dns.answer(packet))).toBe(1);
    expect(asked).toEqual([]);
  });

  it('answers NOTIMP for other opcodes and REFUSED for other classes', () => {
    const { dns } = makeDns();
    const update = Buffer.from(query('allowed.test'));
    update.writeUInt16BE(5 << 11, 2);
    expect(rcodeOf(dns.answer(update))).toBe(4);
    const chaos = Buffer.from(query('version.bind', 'TXT'));
    chaos.writeUInt16BE(3, chaos.length - 2);
    expect(rcodeOf(dns.answer(chaos))).toBe(5);
  });

  it('answers SERVFAIL when the policy callback throws', () => {
    const dns = new FakeDns({
      allows: () => {
        throw new Error('boom');
      },
    });
    expect(rcodeOf(dns.answer(query('allowed.test')))).toBe(2);
  });

  it('never throws on random bytes', () => {
    const { dns } = makeDns();
    let seed = 99;
    const rand = (n: number): number => {
      seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
      return seed % n;
    };
    const valid = query('allowed.test');
    for (let i = 0; i < 3000; i++) {
      const buf =
        rand(2) === 0
          ? Buffer.from(Array.from({ length: rand(64) }, () => rand(256)))
          : Buffer.from(valid).map((b) => (rand(10) === 0 ? rand(256) : b));
      const out = dns.answer(Buffer.from(buf));
      if (out !== undefined) expect(out.readUInt16BE(2) & 0x8000).toBe(0x8000);
    }
  });
});
