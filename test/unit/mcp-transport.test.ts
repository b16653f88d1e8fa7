// StreamTransport on in-memory streams: messages in through the canonical parser, out one line each,
// and backpressure from a slow peer. No sandboxes, no timing assertions.
import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import { StreamTransport } from '../../src/mcp/transport.js';

const request = (id: number, text: string): JSONRPCMessage => ({
  jsonrpc: '2.0',
  id,
  method: 'tools/call',
  params: { name: 'echo', arguments: { text } },
});

describe('StreamTransport', () => {
  it('delivers each parsed line to onmessage', async () => {
    const input = new PassThrough();
    const t = new StreamTransport(input, new PassThrough());
    const got: JSONRPCMessage[] = [];
    t.onmessage = (m) => void got.push(m);
    await t.start();
    input.write(`${JSON.stringify(request(1, 'a'))}\n${JSON.stringify(request(2, 'b'))}\n`);
    await new Promise((r) => setImmediate(r));
    expect(got).toEqual([request(1, 'a'), request(2, 'b')]);
  });

  it('waits for one drain however many sends a slow peer holds up, and settles them all', async () => {
    // 40 sends of 2 KB in one turn: past the 16 KiB buffer each write says "wait for drain".
    const output = new PassThrough({ highWaterMark: 16 * 1024 });
    const t = new StreamTransport(new PassThrough(), output);
    await t.start();
    const warnings: string[] = [];
    const onWarning = (w: Error): void => void warnings.push(`${w.name}: ${w.message}`);
    process.on('warning', onWarning);
    try {
      let settled = 0;
      const sends = Array.from({ length: 40 }, (_, i) =>
        t.send(request(i, 'x'.repeat(2000))).then(() => void settled++),
      );
      await new Promise((r) => setImmediate(r)); // the transport uncorks after the turn
      expect(output.listenerCount('drain')).toBe(1);
      expect(settled).toBeLessThan(40);
      // The peer reads: every send settles, each line intact and in order.
      let text = '';
      output.on('data', (c: Buffer) => (text += c.toString()));
      await Promise.all(sends);
      const lines = text.trimEnd().split('\n');
      expect(lines.map((l) => (JSON.parse(l) as { id: number }).id)).toEqual(
        Array.from({ length: 40 }, (_, i) => i),
      );
      await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
      expect(warnings).toEqual([]);
      expect(output.listenerCount('drain')).toBe(0);
    } finally {
      process.off('warning', onWarning);
    }
  });

  it('fails the sends a slow peer held up when the transport closes, instead of leaving them pending', async () => {
    const output = new PassThrough({ highWaterMark: 1024 });
    const t = new StreamTransport(new PassThrough(), output);
    await t.start();
    const sends = Array.from({ length: 5 }, (_, i) => t.send(request(i, 'y'.repeat(2000))));
    await new Promise((r) => setImmediate(r));
    await t.close();
    // They fail rather than hang (a hang would fail the test by its timeout).
    const results = await Promise.allSettled(sends);
    expect(results.filter((r) => r.status === 'rejected').length).toBeGreaterThan(0);
    for (const r of results)
      if (r.status === 'rejected') expect(String(r.reason)).toMatch(/transport closed/);
    await expect(t.send(request(9, 'z'))).rejects.toThrow(/transport closed/);
  });

  it('caps the bytes a peer that stops reading holds: closes with onoverflow, never grows past it', async () => {
    const output = new PassThrough({ highWaterMark: 1024 });
    const t = new StreamTransport(new PassThrough(), output, { maxBufferedBytes: 64 * 1024 });
    await t.start();
    const overflows: Array<{ bufferedBytes: number; maxBufferedBytes: number }> = [];
    t.onoverflow = (i) => void overflows.push(i);
    let closed = false;
    t.onclose = () => void (closed = true);
    const sends: Array<Promise<void>> = [];
    let peak = 0;
    for (let i = 0; i < 200 && !closed; i++) {
      sends.push(t.send(request(i, 'f'.repeat(2000))));
      peak = Math.max(peak, output.writableLength);
    }
    const results = await Promise.allSettled(sends);
    expect(overflows).toHaveLength(1);
    expect(overflows[0]!.maxBufferedBytes).toBe(64 * 1024);
    expect(closed).toBe(true);
    expect(peak).toBeLessThanOrEqual(64 * 1024);
    const refused = results.filter((r) => r.status === 'rejected');
    expect(refused.length).toBeGreaterThan(0);
    const reasons = refused.map((r) => String((r as PromiseRejectedResult).reason));
    expect(reasons.filter((r) => /the peer is not reading: \d+ bytes wait for it/.test(r))).toHaveLength(1);
    expect(results.length).toBeLessThan(200);
  });

  it('answers a broken request that carries an id by default, and fails our request a broken answer was for', async () => {
    const input = new PassThrough();
    const output = new PassThrough();
    const t = new StreamTransport(input, output);
    const got: JSONRPCMessage[] = [];
    t.onmessage = (m) => void got.push(m);
    let written = '';
    output.on('data', (c: Buffer) => (written += c.toString()));
    await t.start();
    input.write('{"jsonrpc":"2.0","id":"r1","method":"roots/list","params":{"a":1,"a":2}}\n');
    input.write('{"jsonrpc":"2.0","id":7,"result":{"content":[],"content":[]}}\n');
    await new Promise((r) => setImmediate(r));
    await new Promise((r) => setImmediate(r));
    const answer = JSON.parse(written.trim()) as { id: unknown; error: { code: number } };
    expect(answer).toMatchObject({ id: 'r1', error: { code: -32700 } });
    expect(got).toHaveLength(1);
    expect(got[0]).toMatchObject({ id: 7, error: { code: -32700 } });
    expect(JSON.stringify(got[0])).toMatch(/Airlock dropped the peer's answer: duplicate key/);
  });
});
