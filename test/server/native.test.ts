// The native REST API end to end: real sandboxes behind nativeRoutes(LocalSandboxApi), a real HTTP
// server on loopback, driven through RemoteSandboxApi (the client the front server and the SDK use).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/index.js';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, settledResidue, testAirlock } from '../helpers.js';
import { CALLER, bytesOf, collectExec, startServer, streamOf, type TestServer } from './native-support.js';

describe.skipIf(!canRunNamespaces).each(['tcp', 'unix'] as const)(
  `native REST API over %s (${SKIP_REASON})`,
  (transport) => {
    const airlock = testAirlock();
    let srv: TestServer;
    beforeAll(async () => {
      srv = await startServer(airlock, { unix: transport === 'unix' });
    });
    afterAll(async () => {
      await srv.close();
      await airlock.close();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    });

    it('creates, gets, lists by metadata and kills a sandbox', async () => {
      const api = srv.api;
      const a = await api.create({ metadata: { team: 'red' }, ttlMs: 120_000 }, CALLER);
      const b = await api.create({ metadata: { team: 'blue' } }, CALLER);
      try {
        expect(a).toMatchObject({ state: 'running', backend: 'namespaces', metadata: { team: 'red' } });
        expect(Date.parse(a.expiresAt!)).toBeGreaterThan(Date.parse(a.createdAt));
        expect((await api.get(a.id, CALLER)).id).toBe(a.id);
        const red = await api.list({ metadata: { team: 'red' } }, CALLER);
        expect(red.map((s) => s.id)).toEqual([a.id]);
        const all = (await api.list({}, CALLER)).map((s) => s.id);
        expect(all).toEqual(expect.arrayContaining([a.id, b.id]));
      } finally {
        await api.kill(a.id, CALLER);
        await api.kill(b.id, CALLER);
      }
      const gone = await api.get(a.id, CALLER).catch((e: unknown) => e);
      expect(AirlockError.is(gone, 'SANDBOX_NOT_FOUND')).toBe(true);
      expect((gone as AirlockError).field).toBe('id');
    });

    it('streams an exec: start first, output in order, exit last with the exit code', async () => {
      const { id } = await srv.api.create({}, CALLER);
      try {
        const r = await collectExec(
          srv.api.exec(id, { cmd: 'for i in 1 2 3; do echo out$i; echo err$i >&2; done; exit 7' }, CALLER),
        );
        expect(r.events[0]!.type).toBe('start');
        expect(r.events.at(-1)).toMatchObject({ type: 'exit', exitCode: 7, signal: null });
        expect(r.events.filter((e) => e.type === 'exit')).toHaveLength(1);
        expect(r.stdout.toString()).toBe('out1\nout2\nout3\n');
        expect(r.stderr.toString()).toBe('err1\nerr2\nerr3\n');
        // argv form, stdin, env and cwd
        const r2 = await collectExec(
          srv.api.exec(
            id,
            {
              cmd: ['/bin/sh', '-c', 'cat; echo "$FOO $(pwd)"'],
              stdin: 'piped\n',
              env: { FOO: 'bar' },
              cwd: '/tmp',
            },
            CALLER,
          ),
        );
        expect(r2.stdout.toString()).toBe('piped\nbar /tmp\n');
        expect(r2.exit?.exitCode).toBe(0);
      } finally {
        await srv.api.kill(id, CALLER);
      }
    });

    it('reports OOM kills in the exit event (killedBy oom; oomKills also when the parent lives on)', async () => {
      const { id } = await srv.api.create({ limits: { memoryBytes: 64 * 1024 * 1024 } }, CALLER);
      try {
        const dd = 'dd if=/dev/zero of=/dev/null bs=200M count=1';
        const killed = await collectExec(srv.api.exec(id, { cmd: dd.split(' '), timeoutMs: 30_000 }, CALLER));
        expect(killed.exit).toMatchObject({ killedBy: 'oom' });
        expect(killed.exit!.oomKills).toBeGreaterThanOrEqual(1);
        const child = await collectExec(
          srv.api.exec(id, { cmd: `${dd} 2>/dev/null; echo "child $?"`, timeoutMs: 30_000 }, CALLER),
        );
        expect([child.exit?.exitCode, child.exit?.killedBy, child.exit?.oomKills]).toEqual([0, undefined, 1]);
        expect((await collectExec(srv.api.exec(id, { cmd: 'true' }, CALLER))).exit?.oomKills).toBe(0);
      } finally {
        await srv.api.kill(id, CALLER);
      }
    });

    it('round-trips binary files (NUL, non-UTF-8) and streams them both ways', async () => {
      const { id } = await srv.api.create({}, CALLER);
      try {
        const bytes = Buffer.from([0, 1, 2, 0xff, 0xfe, 0x80, 0xc3, 0x28, 0, 10, 13, 0]);
        const big = Buffer.alloc(3 * 1024 * 1024 + 17);
        for (let i = 0; i < big.length; i++) big[i] = (i * 31 + (i >> 8)) & 0xff;
        const entry = await srv.api.writeFile(id, 'dir/a.bin', streamOf(bytes), CALLER);
        expect(entry).toMatchObject({
          path: '/workspace/dir/a.bin',
          name: 'a.bin',
          type: 'file',
          size: bytes.length,
        });
        expect(await bytesOf(await srv.api.readFile(id, '/workspace/dir/a.bin', CALLER))).toEqual(bytes);
        // many chunks, several MiB
        const chunks = Array.from({ length: 50 }, (_, i) =>
          big.subarray((i * big.length) / 50, ((i + 1) * big.length) / 50),
        );
        await srv.api.writeFile(id, '/tmp/big.bin', streamOf(...chunks), CALLER);
        expect((await bytesOf(await srv.api.readFile(id, '/tmp/big.bin', CALLER))).equals(big)).toBe(true);
        // an empty file
        await srv.api.writeFile(id, '/tmp/empty', streamOf(), CALLER);
        expect((await bytesOf(await srv.api.readFile(id, '/tmp/empty', CALLER))).length).toBe(0);
        // a missing file is a typed 404, not an empty body
        const missing = await srv.api.readFile(id, '/tmp/nope', CALLER).catch((e: unknown) => e);
        expect(AirlockError.is(missing, 'FILE_NOT_FOUND')).toBe(true);
      } finally {
        await srv.api.kill(id, CALLER);
      }
    });

    it('answers 404 SANDBOX_NOT_FOUND for an unknown id on every kind of route', async () => {
      const api = srv.api;
      const checks: Array<Promise<unknown>> = [
        api.get('nope', CALLER),
        api.kill('nope', CALLER),
        api.setTimeout('nope', 5000, CALLER),
        collectExec(api.exec('nope', { cmd: 'true' }, CALLER)),
        api.readFile('nope', '/tmp/x', CALLER),
        api.writeFile('nope', '/tmp/x', streamOf(Buffer.from('x')), CALLER),
        api.listDir('nope', '/tmp', CALLER),
      ];
      for (const p of checks) {
        const e = await p.catch((x: unknown) => x);
        expect(AirlockError.is(e, 'SANDBOX_NOT_FOUND')).toBe(true);
      }
    });
  },
);
