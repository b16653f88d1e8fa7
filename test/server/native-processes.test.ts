// Background processes, stdin, connect/replay, kill, and what a client that goes away leaves behind,
// through the real REST API and RemoteSandboxApi.
import { readFileSync, readdirSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/index.js';
import type { ExecEvent } from '../../src/server/contract.js';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, settledResidue, testAirlock } from '../helpers.js';
import { MAX_RUNNING_PROCESSES } from '../../src/server/local-processes.js';
import { CALLER, collectExec, startServer, streamOf, type TestServer } from './native-support.js';

const airlock = testAirlock();

/** Host pids whose command line is exactly argv (the host sees every sandbox process). */
function hostPids(argv: string[]): number[] {
  const want = argv.join('\0') + '\0';
  return readdirSync('/proc')
    .filter((p) => /^\d+$/.test(p))
    .filter((p) => {
      try {
        return readFileSync(`/proc/${p}/cmdline`, 'utf8') === want;
      } catch {
        return false;
      }
    })
    .map(Number);
}

async function until(cond: () => boolean | Promise<boolean>, what: string, maxMs = 15_000): Promise<void> {
  for (let waited = 0; !(await cond()); waited += 50) {
    if (waited > maxMs) throw new Error(`gave up waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const text = (events: ExecEvent[], type: 'stdout' | 'stderr'): string =>
  Buffer.concat(events.flatMap((e) => (e.type === type ? [Buffer.from(e.data, 'base64')] : []))).toString();

describe.skipIf(!canRunNamespaces)(`native REST API: processes (${SKIP_REASON})`, () => {
  let srv: TestServer;
  let id: string;
  beforeAll(async () => {
    srv = await startServer(airlock, { local: { processOutputBytes: 64 * 1024 } });
    id = (await srv.api.create({ ttlMs: 300_000 }, CALLER)).id;
  });
  afterAll(async () => {
    await srv.api.kill(id, CALLER).catch(() => {});
    await srv.close();
    await airlock.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });

  it('starts a background process, feeds its stdin, and connects to its output and exit', async () => {
    const p = await srv.api.startProcess(
      id,
      { cmd: 'read line; echo got:$line; echo oops >&2; exit 3' },
      CALLER,
    );
    expect(p).toMatchObject({ running: true, exitCode: null, cmd: ['/bin/sh', '-c', expect.any(String)] });
    expect((await srv.api.listProcesses(id, CALLER)).map((x) => x.pid)).toContain(p.pid);
    await srv.api.sendStdin(id, p.pid, Buffer.from('hello\n'), CALLER);
    const r = await collectExec(srv.api.connectProcess(id, p.pid, CALLER));
    expect(r.events[0]).toEqual({ type: 'start', pid: p.pid });
    expect(r.stdout.toString()).toBe('got:hello\n');
    expect(r.stderr.toString()).toBe('oops\n');
    expect(r.exit).toMatchObject({ exitCode: 3 });
    const listed = (await srv.api.listProcesses(id, CALLER)).find((x) => x.pid === p.pid);
    expect(listed).toMatchObject({ running: false, exitCode: 3 });
    // connecting after the exit replays everything, then the exit
    const again = await collectExec(srv.api.connectProcess(id, p.pid, CALLER));
    expect(again.stdout.toString()).toBe('got:hello\n');
    expect(again.exit).toMatchObject({ exitCode: 3 });
    // its stdin is closed now
    const late = await srv.api.sendStdin(id, p.pid, Buffer.from('x'), CALLER).catch((e: unknown) => e);
    expect(AirlockError.is(late, 'INVALID_ARGUMENT')).toBe(true);
  });

  it('closes stdin (EOF) and passes binary stdin through unchanged', async () => {
    const p = await srv.api.startProcess(id, { cmd: ['/usr/bin/od', '-An', '-tx1'] }, CALLER);
    await srv.api.sendStdin(id, p.pid, Buffer.from([0, 0xff, 0x0a]), CALLER);
    await srv.api.closeStdin(id, p.pid, CALLER);
    const r = await collectExec(srv.api.connectProcess(id, p.pid, CALLER));
    expect(r.stdout.toString().trim()).toBe('00 ff 0a');
    expect(r.exit?.exitCode).toBe(0);
  });

  it('replays output kept so far to a second client, then follows live; kill ends it', async () => {
    const p = await srv.api.startProcess(
      id,
      { cmd: 'echo early; read x; echo "late:$x"; exec sleep 1001.25' },
      CALLER,
    );
    // First client: read until "early", then go away.
    const first = srv.api.connectProcess(id, p.pid, CALLER);
    for await (const e of first) if (e.type === 'stdout' && text([e], 'stdout').includes('early')) break;
    // Second client: replay has "early"; then live "late:…" after stdin.
    const seen: ExecEvent[] = [];
    const second = (async () => {
      for await (const e of srv.api.connectProcess(id, p.pid, CALLER)) {
        seen.push(e);
        if (text(seen, 'stdout').includes('early') && seen.length === 2) {
          await srv.api.sendStdin(id, p.pid, Buffer.from('now\n'), CALLER);
        }
      }
    })();
    await until(() => text(seen, 'stdout').includes('late:now'), 'live output');
    await until(() => hostPids(['sleep', '1001.25']).length === 1, 'the sleep');
    await srv.api.killProcess(id, p.pid, CALLER);
    await second;
    expect(text(seen, 'stdout')).toBe('early\nlate:now\n');
    expect(seen.at(-1)).toMatchObject({ type: 'exit', signal: 'SIGKILL', killedBy: 'killed' });
    expect(hostPids(['sleep', '1001.25'])).toEqual([]);
  });

  it('keeps only the newest output of a chatty process (bounded ring)', async () => {
    const p = await srv.api.startProcess(
      id,
      { cmd: "head -c 1000000 /dev/zero | tr '\\0' a; echo; echo END; exec sleep 1001.5" },
      CALLER,
    );
    let out = '';
    // Wait until the process has written everything (END), following live.
    for await (const e of srv.api.connectProcess(id, p.pid, CALLER)) {
      if (e.type === 'stdout') out += text([e], 'stdout');
      if (out.includes('END')) break;
    }
    // A new client gets the newest output only: at most the cap (64 KiB of base64 per stream).
    let replay = '';
    for await (const e of srv.api.connectProcess(id, p.pid, CALLER)) {
      if (e.type === 'stdout') replay += text([e], 'stdout');
      if (replay.includes('END')) break;
    }
    expect(replay.endsWith('END\n')).toBe(true);
    expect(replay.length).toBeLessThanOrEqual(64 * 1024);
    await srv.api.killProcess(id, p.pid, CALLER);
  });

  it('keeps the tail of one write bigger than the cap (the newest output is never dropped whole)', async () => {
    // One write of ~60 KB raw is ~80 KB of base64, over the 64 KiB cap: the ring keeps its end.
    const p = await srv.api.startProcess(
      id,
      {
        cmd:
          "head -c 60000 /dev/zero | tr '\\0' b > /tmp/one; echo END >> /tmp/one; " +
          'dd if=/tmp/one bs=70000 count=1 status=none; exec sleep 1001.75',
      },
      CALLER,
    );
    await until(() => hostPids(['sleep', '1001.75']).length === 1, 'the write');
    let replay = '';
    for await (const e of srv.api.connectProcess(id, p.pid, CALLER)) {
      if (e.type === 'stdout') replay += text([e], 'stdout');
      if (replay.includes('END')) break;
    }
    expect(replay.endsWith('bbbbEND\n')).toBe(true);
    expect(replay.length).toBeLessThanOrEqual(48 * 1024);
    await srv.api.killProcess(id, p.pid, CALLER);
  });

  it('answers PROCESS_NOT_FOUND for an unknown pid on every process route', async () => {
    for (const p of [
      collectExec(srv.api.connectProcess(id, '999', CALLER)),
      srv.api.sendStdin(id, '999', Buffer.from('x'), CALLER),
      srv.api.closeStdin(id, '999', CALLER),
      srv.api.killProcess(id, '999', CALLER),
      srv.api.killProcess(id, '../1', CALLER),
    ]) {
      const e = await p.catch((x: unknown) => x);
      expect(AirlockError.is(e, 'PROCESS_NOT_FOUND')).toBe(true);
    }
  });

  it('kills a foreground exec whose client went away mid-stream', async () => {
    const ctl = new AbortController();
    const events = srv.api.exec(id, { cmd: 'echo started; exec sleep 1002.5' }, CALLER, ctl.signal);
    let got = '';
    const done = (async () => {
      for await (const e of events) {
        got += e.type === 'stdout' ? text([e], 'stdout') : '';
        if (got.includes('started')) ctl.abort();
      }
    })();
    const err = await done.catch((e: unknown) => e);
    expect(AirlockError.is(err, 'ABORTED')).toBe(true);
    await until(() => hostPids(['sleep', '1002.5']).length === 0, 'the exec to be killed');
    // A client that simply stops reading (breaks out of the loop) also kills it.
    for await (const e of srv.api.exec(id, { cmd: 'echo x; exec sleep 1003.5' }, CALLER)) {
      if (e.type === 'stdout') break;
    }
    await until(() => hostPids(['sleep', '1003.5']).length === 0, 'the second exec to be killed');
  });

  it('runs concurrent execs on one sandbox, each with its own output', async () => {
    const results = await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        collectExec(srv.api.exec(id, { cmd: ['/bin/sh', '-c', `echo n$0; exit $0`, String(i)] }, CALLER)),
      ),
    );
    results.forEach((r, i) => {
      expect(r.stdout.toString()).toBe(`n${i}\n`);
      expect(r.exit?.exitCode).toBe(i);
    });
  });

  it('refuses more than the most background processes at once (CAPACITY_EXHAUSTED)', async () => {
    const started: string[] = [];
    const running = (await srv.api.listProcesses(id, CALLER)).filter((p) => p.running).length;
    try {
      let err: unknown;
      for (let i = 0; i < 40 && !err; i++) {
        const p = await srv.api.startProcess(id, { cmd: 'exec sleep 1005.5' }, CALLER).catch((e: unknown) => {
          err = e;
          return undefined;
        });
        if (p) started.push(p.pid);
      }
      expect(AirlockError.is(err, 'CAPACITY_EXHAUSTED')).toBe(true);
      expect(started.length).toBe(MAX_RUNNING_PROCESSES - running);
    } finally {
      for (const pid of started) await srv.api.killProcess(id, pid, CALLER);
    }
    await until(() => hostPids(['sleep', '1005.5']).length === 0, 'the sleeps to go');
  });

  it('streams egress events of a sandbox until it dies; an unknown id is a 404', async () => {
    const other = await srv.api.create({}, CALLER);
    const seen: unknown[] = [];
    const reading = (async () => {
      for await (const e of srv.api.egressEvents(other.id, CALLER)) seen.push(e);
    })();
    await srv.api.kill(other.id, CALLER);
    await reading; // ends (no error) when the sandbox is gone
    expect(seen).toEqual([]); // no network, no attempts
    const unknown = await (async () => {
      for await (const _ of srv.api.egressEvents('nope', CALLER)) void _;
    })().catch((e: unknown) => e);
    expect(AirlockError.is(unknown, 'SANDBOX_NOT_FOUND')).toBe(true);
  });

  it('times an exec out (killedBy timeout) and cuts output at maxOutputBytes', async () => {
    const r = await collectExec(srv.api.exec(id, { cmd: 'exec sleep 1004.5', timeoutMs: 300 }, CALLER));
    expect(r.exit).toMatchObject({ killedBy: 'timeout', signal: 'SIGKILL' });
    const big = await collectExec(
      srv.api.exec(id, { cmd: 'head -c 100000 /dev/zero', maxOutputBytes: 1000 }, CALLER),
    );
    expect(big.stdout.length).toBe(1000);
    expect(big.exit?.exitCode).toBe(0);
  });

  it('startAndFollow: one request starts a process and follows it; leaving early stops only the following', async () => {
    const r = await collectExec(
      srv.api.startAndFollow(id, { cmd: 'echo one; echo two >&2; exit 4' }, CALLER),
    );
    expect(r.events[0]).toEqual({ type: 'start', pid: expect.any(String) });
    expect([r.stdout.toString(), r.stderr.toString(), r.exit?.exitCode]).toEqual(['one\n', 'two\n', 4]);
    const pid = (r.events[0] as { pid: string }).pid;
    // It is a background process like any other: listed, and its output replayed on connect.
    expect((await srv.api.listProcesses(id, CALLER)).find((x) => x.pid === pid)).toMatchObject({
      exitCode: 4,
    });
    expect((await collectExec(srv.api.connectProcess(id, pid, CALLER))).stdout.toString()).toBe('one\n');

    // A client that leaves after the start (its connection closes) leaves the process running: it
    // still reads its stdin and exits on its own.
    const ctl = new AbortController();
    let started: string | undefined;
    for await (const e of srv.api.startAndFollow(id, { cmd: 'read l; echo got:$l' }, CALLER, ctl.signal)) {
      if (e.type === 'start') started = e.pid;
      break;
    }
    expect(started).toBeDefined();
    expect((await srv.api.listProcesses(id, CALLER)).find((x) => x.pid === started)).toMatchObject({
      running: true,
    });
    await srv.api.sendStdin(id, started!, Buffer.from('late\n'), CALLER);
    const rest = await collectExec(srv.api.connectProcess(id, started!, CALLER));
    expect([rest.stdout.toString(), rest.exit?.exitCode]).toEqual(['got:late\n', 0]);
  });

  it('startAndFollow: an unknown sandbox and a bad body are plain typed errors, before any line', async () => {
    const unknown = await collectExec(srv.api.startAndFollow('sbx-nope', { cmd: 'true' }, CALLER)).catch(
      (e: unknown) => e,
    );
    expect(AirlockError.is(unknown, 'SANDBOX_NOT_FOUND')).toBe(true);
    const res = await fetch(`${srv.url}/v1/sandboxes/${id}/processes/stream`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ cmd: 42 }),
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { code: string; field?: string } }).error).toMatchObject({
      code: 'INVALID_ARGUMENT',
      field: expect.stringMatching(/^cmd/),
    });
  });

  it("a short exec's start and exit travel together: one response with a length; a slow one streams", async () => {
    // A hold long enough for any short command on a loaded host (the default is EXEC_START_HOLD_MS).
    const held = await startServer(airlock, { routes: { execStartHoldMs: 60_000 } });
    const post = (url: string, cmd: string): Promise<Response> =>
      fetch(`${url}/v1/sandboxes/${id}/exec`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ cmd }),
      });
    try {
      // No output: start and exit (output is never held: it goes as soon as it comes).
      const short = await post(held.url!, 'exit 5');
      expect(short.headers.get('content-length')).not.toBeNull();
      expect(short.headers.get('transfer-encoding')).toBeNull();
      const lines = (await short.text())
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as ExecEvent);
      expect(lines.map((e) => e.type)).toEqual(['start', 'exit']);
      expect(lines[1]).toMatchObject({ exitCode: 5 });
    } finally {
      await held.close();
    }
    // A command that cannot end before the test lets it: the headers and start come once the hold
    // (default) is over, then the rest streams (chunked) when it ends.
    const gate = `/tmp/gate-${Date.now()}`;
    const slow = await post(srv.url!, `while [ ! -e ${gate} ]; do sleep 0.05; done; echo late`);
    expect(slow.headers.get('transfer-encoding')).toBe('chunked');
    await srv.api.writeFile(id, gate, streamOf(Buffer.from('go')), CALLER);
    const events = (await slow.text())
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as ExecEvent);
    expect(events.map((e) => e.type)).toEqual(['start', 'stdout', 'exit']);
    expect(text(events, 'stdout')).toBe('late\n');
  });
});
