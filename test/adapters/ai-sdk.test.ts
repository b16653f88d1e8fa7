// The AI SDK 7 provider: Experimental_SandboxSession over a real namespaces sandbox, local (the library)
// and remote (the remote SDK against a real server on loopback), driven by the real `ai` package:
// generateText with its mock language model (ai/test) calling airlockTools in a tool loop, and a
// custom tool reaching the session through experimental_sandbox.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateText, stepCountIs, type Experimental_SandboxSession, type ModelMessage } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { z } from 'zod';
import { RemoteAirlock, Sandbox, type Airlock } from '../../src/index.js';
import {
  AirlockSandboxSession,
  airlockSandboxSession,
  airlockTools,
  createAirlockSandboxSession,
} from '../../src/adapters/ai.js';
import { expectError } from '../contract/support.js';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, settledResidue, testAirlock } from '../helpers.js';
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import { serve } from '@hono/node-server';
import { Airlock as LocalAirlock } from '../../src/index.js';
import { LocalSandboxApi } from '../../src/server/local.js';
import { attachPortRoute } from '../../src/server/port-route.js';
import { nativeRoutes } from '../../src/server/routes.js';
import { TEST_STATE_DIR, TEST_UID_RANGE } from '../helpers.js';

interface TestServer {
  readonly url: string;
  readonly airlock: LocalAirlock;
  close(): Promise<void>;
}

/** A real native-API server on loopback (as test/server/remote-support.ts), with the port route. */
async function startTestServer(): Promise<TestServer> {
  const airlock = new LocalAirlock({ stateDir: TEST_STATE_DIR, uidRange: TEST_UID_RANGE, warmPool: 0 });
  const api = new LocalSandboxApi(airlock);
  const server = await new Promise<Server>((resolve) => {
    const s = serve({ fetch: nativeRoutes(api).fetch, hostname: '127.0.0.1', port: 0 }, () =>
      resolve(s as Server),
    );
  });
  attachPortRoute(server, { api, caller: () => ({ tenant: 'default' }) });
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    airlock,
    close: async () => {
      await airlock.killAll();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/** A model reply that calls one tool. */
function toolCall(id: string, toolName: string, input: unknown) {
  return {
    content: [{ type: 'tool-call' as const, toolCallId: id, toolName, input: JSON.stringify(input) }],
    finishReason: { unified: 'tool-calls' as const, raw: undefined },
    usage: USAGE,
    warnings: [],
  };
}
function text(t: string) {
  return {
    content: [{ type: 'text' as const, text: t }],
    finishReason: { unified: 'stop' as const, raw: undefined },
    usage: USAGE,
    warnings: [],
  };
}
const USAGE = {
  inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 1, text: 1, reasoning: undefined },
};

/** The tool results in a prompt the model received, by tool call id. */
function toolResults(prompt: readonly unknown[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const m of prompt as ModelMessage[]) {
    if (m.role !== 'tool') continue;
    for (const p of m.content) {
      if (p.type === 'tool-result') out[p.toolCallId] = (p.output as { value: unknown }).value;
    }
  }
  return out;
}

async function drain(s: ReadableStream<Uint8Array>): Promise<string> {
  return new Response(s).text();
}

describe.skipIf(!canRunNamespaces)(`AI SDK sandbox session, local (${SKIP_REASON})`, () => {
  let airlock: Airlock;
  let session: AirlockSandboxSession;
  beforeAll(async () => {
    airlock = testAirlock();
    session = await createAirlockSandboxSession({ airlock, spec: {}, ports: [8000] });
  });
  afterAll(async () => {
    await session?.stop();
    await airlock?.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });

  it('runs commands in /workspace, with env and exit codes, and describes itself', async () => {
    const r = await session.run({ command: 'pwd; echo "$GREETING" >&2; exit 3', env: { GREETING: 'hi' } });
    expect(r).toEqual({ exitCode: 3, stdout: '/workspace\n', stderr: 'hi\n' });
    await session.run({ command: 'mkdir -p sub' });
    expect((await session.run({ command: 'pwd', workingDirectory: 'sub' })).stdout).toBe('/workspace/sub\n');
    expect(session.description).toContain('no network');
    expect(session.description).toContain('8000');
    // It runs in the sandbox, not here: the sandbox's uid is not this process's.
    expect((await session.run({ command: 'id -u' })).stdout.trim()).not.toBe(String(process.getuid!()));
  });

  it('writes and reads files in every variant, with line ranges, stat, listing and delete', async () => {
    await session.writeTextFile({ path: 'a/b.txt', content: 'one\ntwo\nthree\nfour' });
    expect(await session.readTextFile({ path: '/workspace/a/b.txt' })).toBe('one\ntwo\nthree\nfour');
    expect(await session.readTextFile({ path: 'a/b.txt', startLine: 2, endLine: 3 })).toBe('two\nthree');
    expect(await session.readTextFile({ path: 'a/b.txt', startLine: 3, endLine: 99 })).toBe('three\nfour');
    const bytes = new Uint8Array([0, 1, 2, 255, 254]);
    await session.writeBinaryFile({ path: 'bin.dat', content: bytes });
    expect(await session.readBinaryFile({ path: 'bin.dat' })).toEqual(bytes);
    await session.writeFile({
      path: 'streamed.txt',
      content: new ReadableStream({
        start(c) {
          c.enqueue(new TextEncoder().encode('part1-'));
          c.enqueue(new TextEncoder().encode('part2'));
          c.close();
        },
      }),
    });
    expect(await drain((await session.readFile({ path: 'streamed.txt' }))!)).toBe('part1-part2');
    // Missing files are null, not errors.
    expect(await session.readFile({ path: 'nope' })).toBeNull();
    expect(await session.readTextFile({ path: 'nope' })).toBeNull();
    expect(await session.stat({ path: 'nope' })).toBeNull();
    expect(await session.listDirectory({ path: 'nope' })).toBeNull();
    expect(await session.stat({ path: 'bin.dat' })).toEqual({ type: 'file', size: 5 });
    expect((await session.stat({ path: 'a' }))?.type).toBe('directory');
    await session.run({ command: 'ln -s a/b.txt link && ln -s /nowhere dangling' });
    // stat follows links; listDirectory reports them as links.
    expect(await session.stat({ path: 'link' })).toEqual({ type: 'file', size: 18 });
    expect(await session.stat({ path: 'dangling' })).toBeNull();
    const entries = await session.listDirectory({ path: '.' });
    expect(entries).toEqual(
      expect.arrayContaining([
        { name: 'a', type: 'directory' },
        { name: 'bin.dat', type: 'file' },
        { name: 'link', type: 'symlink' },
      ]),
    );
    await expectError(session.listDirectory({ path: 'bin.dat' }), 'INVALID_ARGUMENT', 'path');
    // deleteFile removes a link itself (never its target), refuses a directory, says false when missing.
    expect(await session.deleteFile({ path: 'link' })).toBe(true);
    expect(await session.readTextFile({ path: 'a/b.txt' })).toContain('one');
    expect(await session.deleteFile({ path: 'link' })).toBe(false);
    await expectError(session.deleteFile({ path: 'a' }), 'INVALID_ARGUMENT', 'path');
    await expectError(session.writeTextFile({ path: 'a', content: 'x' }), 'INVALID_ARGUMENT', 'path');
    await expectError(
      session.readTextFile({ path: 'a/b.txt', startLine: 0 }),
      'INVALID_ARGUMENT',
      'startLine',
    );
    await expectError(
      session.writeTextFile({ path: 'x', content: 'y', encoding: 'latin1' }),
      'INVALID_ARGUMENT',
    );
    await expectError(session.readTextFile({ path: 'bad\0path' }), 'INVALID_ARGUMENT', 'path');
    // A name with shell syntax is a name, not a command.
    await session.writeTextFile({ path: '$(touch pwned); x', content: 'ok' });
    expect(await session.readTextFile({ path: '$(touch pwned); x' })).toBe('ok');
    expect(await session.stat({ path: 'pwned' })).toBeNull();
  });

  it('spawns processes with streamed output, stdin, wait, kill and abort', async () => {
    const p = await session.spawn({ command: 'cat; echo done >&2; exit 4', stdin: true });
    const w = p.stdin.getWriter();
    await w.write(new TextEncoder().encode('hello '));
    await w.write(new TextEncoder().encode('world'));
    await w.close();
    const [out, err, exit] = await Promise.all([drain(p.stdout), drain(p.stderr), p.wait()]);
    expect({ out, err, exit }).toEqual({ out: 'hello world', err: 'done\n', exit: { exitCode: 4 } });

    // Without stdin: no stdin property, and the process sees EOF at once.
    const q = await session.spawn({ command: 'cat; echo eof' });
    expect('stdin' in q).toBe(false);
    expect(await drain(q.stdout)).toBe('eof\n');
    expect((await q.wait()).exitCode).toBe(0);

    const long = await session.spawn({ command: 'sleep 300' });
    await long.kill();
    await long.kill(); // idempotent
    expect((await long.wait()).exitCode).toBeGreaterThan(128);

    const ac = new AbortController();
    const aborted = await session.spawn({ command: 'sleep 300', abortSignal: ac.signal });
    ac.abort(new Error('stop it'));
    await expect(aborted.wait()).rejects.toThrow('stop it');
    await expect(session.spawn({ command: 'true', abortSignal: ac.signal })).rejects.toThrow('stop it');
  });

  it('gives a loopback URL for a port a server in the sandbox listens on', async () => {
    await session.writeTextFile({ path: 'site/index.html', content: 'served from the sandbox' });
    const server = await session.spawn({
      command: 'exec python3 -m http.server 8000 --bind 127.0.0.1 --directory site',
    });
    try {
      const url = await session.getPortUrl(8000);
      expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      expect(await session.getPortUrl(8000)).toBe(url); // one listener per port
      let body = '';
      for (let i = 0; i < 100 && body === ''; i++) {
        body = await fetch(`${url}/index.html`)
          .then((r) => (r.ok ? r.text() : ''))
          .catch(() => '');
        if (body === '') await new Promise((r) => setTimeout(r, 100));
      }
      expect(body).toBe('served from the sandbox');
      expect(session.ports).toEqual([8000]);
      // A port nothing listens on: the connection is refused (reset), never another port's server.
      const other = await session.getPortUrl(8001);
      await expect(fetch(other)).rejects.toThrow();
      await expectError(session.getPortUrl(0), 'INVALID_ARGUMENT', 'port');
      await expectError(session.getPortUrl(70000), 'INVALID_ARGUMENT', 'port');
    } finally {
      await server.kill();
    }
  });

  it('setNetworkPolicy on a sandbox made with no network: null is a no-op, a policy is a typed error', async () => {
    await session.setNetworkPolicy(null); // it has none: still none
    const e = await expectError(
      session.setNetworkPolicy({ allow: ['example.com'] }),
      'INVALID_ARGUMENT',
      'network',
    );
    expect(e.message).toContain('create it with a network policy');
    await expectError(session.setNetworkPolicy({ allow: ['*'] }), 'INVALID_ARGUMENT');
  });

  it('setNetworkPolicy changes a live sandbox: its own DNS answers follow the new policy, each change is an event', async () => {
    // Only the sandbox's own DNS responder (127.0.0.1:53 in its netns) is asked: no traffic leaves.
    const netSession = await createAirlockSandboxSession({ airlock, spec: { network: { allow: [] } } });
    try {
      const changes: string[][] = [];
      (netSession.sandbox as Sandbox).onNetworkPolicy((e) => changes.push([...e.policy.allow]));
      const resolve = async () =>
        (
          await netSession.run({ command: 'a=$(getent hosts example.com) && echo "${a%% *}" || echo none' })
        ).stdout.trim();
      expect(await resolve()).toBe('none');
      await netSession.setNetworkPolicy({ allow: ['example.com'] });
      expect(await resolve()).toMatch(/^198\.1[89]\./);
      expect((netSession.sandbox as Sandbox).spec.network?.allow).toEqual(['example.com']);
      await netSession.setNetworkPolicy(null); // no network access: an empty allow list
      expect(await resolve()).toBe('none');
      expect(changes).toEqual([['example.com'], []]);
    } finally {
      await netSession.stop();
    }
  });

  it('drives a real tool loop: generateText calls airlockTools and the results reach the model', async () => {
    const model = new MockLanguageModelV4({
      doGenerate: [
        toolCall('c1', 'writeFile', { path: 'notes/plan.txt', content: 'step one\nstep two' }),
        toolCall('c2', 'bash', { command: 'wc -l < notes/plan.txt; cat notes/plan.txt; exit 7' }),
        toolCall('c3', 'readFile', { path: 'notes/plan.txt', startLine: 2 }),
        toolCall('c4', 'readFile', { path: 'missing.txt' }),
        toolCall('c5', 'bash', { command: 'yes x | head -c 100000' }),
        text('all done'),
      ],
    });
    const tools = airlockTools(session.sandbox, { maxOutputChars: 2000 });
    expect(Object.keys(tools).sort()).toEqual(
      typeof (Sandbox.prototype as { runCode?: unknown }).runCode === 'function'
        ? ['bash', 'readFile', 'runCode', 'writeFile']
        : ['bash', 'readFile', 'writeFile'],
    );
    const r = await generateText({ model, tools, prompt: 'make a plan', stopWhen: stepCountIs(10) });
    expect(r.text).toBe('all done');
    expect(model.doGenerateCalls).toHaveLength(6);
    // Each call's prompt holds the results of the tools called before it.
    const seen = toolResults(model.doGenerateCalls[5]!.prompt);
    expect(seen.c1).toEqual({ path: '/workspace/notes/plan.txt', bytes: 17 });
    expect(seen.c2).toEqual({ exitCode: 7, stdout: '1\nstep one\nstep two', stderr: '' });
    expect(seen.c3).toEqual({ content: 'step two', totalLines: 2 });
    expect(seen.c4).toMatchObject({ error: { code: 'FILE_NOT_FOUND' } });
    const big = seen.c5 as { stdout: string };
    expect(big.stdout.length).toBeLessThanOrEqual(2000);
    expect(big.stdout).toMatch(/characters cut/);
    expect(toolResults(model.doGenerateCalls[2]!.prompt)).toEqual({ c1: seen.c1, c2: seen.c2 });
    // The model was offered the tools with JSON Schemas made from the zod schemas.
    const offered = model.doGenerateCalls[0]!.tools!.map((t) => t.name).sort();
    expect(offered).toEqual(Object.keys(tools).sort());
  });

  it('rejects tool input that does not fit the schema (the model sees the error, nothing runs)', async () => {
    const model = new MockLanguageModelV4({
      doGenerate: [toolCall('bad', 'bash', { command: 'touch /workspace/ran', extra: 1 }), text('ok')],
    });
    await generateText({
      model,
      tools: airlockTools(session.sandbox),
      prompt: 'x',
      stopWhen: stepCountIs(3),
    });
    const prompt = model.doGenerateCalls[1]!.prompt as ModelMessage[];
    const part = prompt.flatMap((m) => (m.role === 'tool' ? m.content : []))[0] as {
      output: { type: string };
    };
    expect(part.output.type).toBe('error-text');
    expect(await session.stat({ path: 'ran' })).toBeNull();
  });

  it('runCode tool returns results and stdout to the model', async () => {
    const model = new MockLanguageModelV4({
      doGenerate: [
        toolCall('r1', 'runCode', { code: 'print("hi")\n1 + 41', language: 'python' }),
        text('ok'),
      ],
    });
    await generateText({
      model,
      tools: airlockTools(session.sandbox),
      prompt: 'x',
      stopWhen: stepCountIs(3),
    });
    const out = toolResults(model.doGenerateCalls[1]!.prompt).r1 as {
      stdout: string;
      results: Array<{ text?: string }>;
    };
    expect(out.stdout).toBe('hi\n');
    expect(out.results.map((x) => x.text)).toContain('42');
  });

  it('is the experimental_sandbox that generateText hands to tools', async () => {
    let got: Experimental_SandboxSession | undefined;
    const model = new MockLanguageModelV4({
      doGenerate: [toolCall('s1', 'uname', {}), text('ok')],
    });
    await generateText({
      model,
      prompt: 'x',
      experimental_sandbox: session,
      stopWhen: stepCountIs(3),
      tools: {
        uname: {
          inputSchema: z.object({}),
          execute: async (_input: unknown, o: { experimental_sandbox?: Experimental_SandboxSession }) => {
            got = o.experimental_sandbox;
            return (await o.experimental_sandbox!.run({ command: 'uname -s' })).stdout;
          },
        },
      },
    });
    expect(got).toBe(session);
    expect(toolResults(model.doGenerateCalls[1]!.prompt).s1).toBe('Linux\n');
  });

  it('stop kills the sandbox and closes its port listeners', async () => {
    const s = airlockSandboxSession(await Sandbox.create({}, { airlock }));
    const url = await s.getPortUrl(9000);
    await s.stop();
    expect(s.sandbox.alive).toBe(false);
    await expect(fetch(url)).rejects.toThrow();
    await expectError(s.getPortUrl(9000), 'SANDBOX_GONE');
    await s.stop(); // idempotent
  });
});

describe.skipIf(!canRunNamespaces)(`AI SDK sandbox session, remote (${SKIP_REASON})`, () => {
  let server: TestServer;
  let remote: RemoteAirlock;
  beforeAll(async () => {
    server = await startTestServer();
    remote = new RemoteAirlock({ apiUrl: server.url });
  });
  afterAll(async () => {
    await remote?.killAll();
    await remote?.close();
    await server?.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });

  it('runs, spawns, reads and writes on a server, with ports through its port route', async () => {
    const session = await createAirlockSandboxSession({ airlock: remote, spec: {} });
    try {
      expect(server.airlock.list().map((s) => s.id)).toEqual([session.sandbox.id]);
      expect(await session.run({ command: 'echo remote; exit 2' })).toEqual({
        exitCode: 2,
        stdout: 'remote\n',
        stderr: '',
      });
      await session.writeTextFile({ path: 'r.txt', content: 'a\nb\nc' });
      expect(await session.readTextFile({ path: 'r.txt', startLine: 2, endLine: 2 })).toBe('b');
      expect(await session.readBinaryFile({ path: 'missing' })).toBeNull();
      expect(await session.listDirectory({ path: '/workspace' })).toEqual([{ name: 'r.txt', type: 'file' }]);
      const p = await session.spawn({ command: 'cat', stdin: true });
      const w = p.stdin.getWriter();
      await w.write(new TextEncoder().encode('piped'));
      await w.close();
      expect(await drain(p.stdout)).toBe('piped');
      expect(await p.wait()).toEqual({ exitCode: 0 });

      const web = await session.spawn({ command: 'exec python3 -m http.server 8000 --bind 127.0.0.1' });
      const url = await session.getPortUrl(8000);
      let status = 0;
      for (let i = 0; i < 100 && status !== 200; i++) {
        status = await fetch(`${url}/r.txt`)
          .then((r) => r.status)
          .catch(() => 0);
        if (status !== 200) await new Promise((r) => setTimeout(r, 100));
      }
      expect(status).toBe(200);
      await web.kill();

      // The network policy changes on the server too (PUT /v1/sandboxes/:id/network).
      await expectError(session.setNetworkPolicy({ allow: ['example.com'] }), 'INVALID_ARGUMENT', 'network');

      // Without its runtime a remote session cannot reach ports, and says what to pass.
      const bare = airlockSandboxSession(session.sandbox);
      expect((await expectError(bare.getPortUrl(8000), 'INVALID_ARGUMENT', 'airlock')).message).toContain(
        '{ airlock: remoteAirlock }',
      );
    } finally {
      await session.stop();
    }
    expect(server.airlock.list()).toEqual([]);
  });

  it('setNetworkPolicy reaches a remote sandbox: the server swaps its policy', async () => {
    const session = await createAirlockSandboxSession({ airlock: remote, spec: { network: { allow: [] } } });
    try {
      await session.setNetworkPolicy({ allow: ['example.com'] });
      expect(server.airlock.get(session.sandbox.id).spec.network?.allow).toEqual(['example.com']);
      const r = await session.run({
        command: 'a=$(getent hosts example.com) && echo "${a%% *}" || echo none',
      });
      expect(r.stdout.trim()).toMatch(/^198\.1[89]\./);
      await session.setNetworkPolicy(null);
      expect(server.airlock.get(session.sandbox.id).spec.network?.allow).toEqual([]);
    } finally {
      await session.stop();
    }
  });
});
