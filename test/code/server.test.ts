// runCode and code contexts through a real `airlock serve` (front server, tenants, supervisor): the
// remote SDK's sbx.runCode unchanged, the NDJSON wire, tenant scoping, errors with their statuses,
// and the server's append-only event log. The Python SDK's run_code is tested by python/tests.
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { AirlockError, CodeDeniedError, RemoteAirlock } from '../../src/index.js';
import { Store } from '../../src/server/store.js';
import { NO_RESIDUE, SKIP_REASON, TEST_STATE_DIR, canRunNamespaces, settledResidue } from '../helpers.js';
import { call, newKey, startServe, stopServe, stopSupervisor, type Served } from '../server/serve-helpers.js';

const OBFUSCATED = 'import base64\nexec(base64.b64decode("cHJpbnQoMSk="))';

function storeEvents(sandboxId: string): string[] {
  const store = new Store(join(TEST_STATE_DIR, 'server.db'));
  try {
    return store.events({ sandboxId }).map((e) => e.type);
  } finally {
    store.close();
  }
}

describe.skipIf(!canRunNamespaces)(`runCode through airlock serve (${SKIP_REASON})`, () => {
  let s: Served;
  let keyA: string;
  let keyB: string;
  let remote: RemoteAirlock;

  beforeAll(async () => {
    await stopSupervisor();
    s = await startServe({});
    keyA = newKey('code-a').key;
    keyB = newKey('code-b').key;
    remote = new RemoteAirlock({ apiUrl: s.url, apiKey: keyA });
  }, 120_000);

  afterAll(async () => {
    await remote?.killAll();
    await remote?.close();
    if (s) expect(await stopServe(s)).toBe(0);
    await stopSupervisor();
    expect(await settledResidue(5000)).toEqual(NO_RESIDUE);
  }, 120_000);

  test('the remote SDK runs code unchanged: results, streaming, contexts, errors', async () => {
    const sbx = await remote.create({});
    const out: string[] = [];
    const r = await sbx.runCode('print("hi")\n6 * 7', { onStdout: (t) => out.push(t) });
    expect(r).toEqual({
      results: [{ isMainResult: true, text: '42' }],
      stdout: 'hi\n',
      stderr: '',
      error: null,
      findings: [],
    });
    expect(out.join('')).toBe('hi\n');
    const ctx = await sbx.createCodeContext({ language: 'javascript' });
    expect(ctx).toMatchObject({ language: 'javascript' });
    await sbx.runCode('let k = 20', { context: ctx });
    expect((await sbx.runCode('k + 1', { context: ctx })).results[0]).toEqual({
      isMainResult: true,
      text: '21',
    });
    expect(await sbx.listCodeContexts()).toEqual([ctx]);
    const err = await sbx.runCode('undefinedThing()', { context: ctx });
    expect(err.error?.name).toBe('ReferenceError');
    await expect(sbx.runCode('1', { context: ctx, language: 'python' })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
    });
    await sbx.closeCodeContext(ctx);
    await expect(sbx.runCode('k', { context: ctx })).rejects.toSatisfy((e) =>
      AirlockError.is(e, 'CODE_CONTEXT_NOT_FOUND'),
    );
    const timedOut = await sbx.runCode('import time\ntime.sleep(600)', { timeoutMs: 1000 });
    expect(timedOut.error?.name).toBe('TimeoutError');
    // Every allowed run is in the server's event log.
    expect(storeEvents(sbx.id).filter((t) => t === 'code.run').length).toBeGreaterThanOrEqual(4);
    await sbx.kill();
  });

  test('the wire: NDJSON events end with the Execution; another tenant sees nothing', async () => {
    const sbx = await remote.create({});
    const res = await call(s.url, keyA, 'POST', `/v1/sandboxes/${sbx.id}/code`, {
      code: 'echo one; echo two >&2',
      language: 'bash',
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('application/x-ndjson');
    const lines = (await res.text())
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { type: string; execution?: unknown });
    expect(lines.at(-1)).toEqual({
      type: 'end',
      execution: { results: [], stdout: 'one\n', stderr: 'two\n', error: null, findings: [] },
    });
    expect(lines.filter((l) => l.type === 'stdout')).toEqual([{ type: 'stdout', text: 'one\n' }]);
    // Tenant B: the sandbox does not exist for it, nor do its contexts.
    const ctx = await sbx.createCodeContext();
    for (const [method, path, body] of [
      ['POST', `/v1/sandboxes/${sbx.id}/code`, { code: '1' }],
      ['GET', `/v1/sandboxes/${sbx.id}/code/contexts`, undefined],
      ['POST', `/v1/sandboxes/${sbx.id}/code/contexts`, {}],
      ['DELETE', `/v1/sandboxes/${sbx.id}/code/contexts/${ctx.id}`, undefined],
    ] as const) {
      const r = await call(s.url, keyB, method, path, body);
      expect(r.status).toBe(404);
      expect(((await r.json()) as { error: { code: string } }).error.code).toBe('SANDBOX_NOT_FOUND');
    }
    // Bad input is a 400 naming the field; an unknown context a 404.
    const bad = await call(s.url, keyA, 'POST', `/v1/sandboxes/${sbx.id}/code`, {
      code: '1',
      language: 'ruby',
    });
    expect(bad.status).toBe(400);
    const unknown = await call(s.url, keyA, 'POST', `/v1/sandboxes/${sbx.id}/code`, {
      code: '1',
      context: 'ctx-x',
    });
    expect(unknown.status).toBe(404);
    expect(((await unknown.json()) as { error: { code: string } }).error.code).toBe('CODE_CONTEXT_NOT_FOUND');
    expect((await sbx.listCodeContexts()).map((c) => c.id)).toEqual([ctx.id]);
    await sbx.kill();
  });

  test('a denied run is 422 CODE_DENIED with its findings, and is logged', async () => {
    const sbx = await remote.create({ codePolicy: { rules: { 'obfuscated-exec': 'deny' } } });
    const res = await call(s.url, keyA, 'POST', `/v1/sandboxes/${sbx.id}/code`, { code: OBFUSCATED });
    expect(res.status).toBe(422);
    const body = (await res.json()) as { error: { code: string; findings: Array<{ rule: string }> } };
    expect(body.error.code).toBe('CODE_DENIED');
    expect(body.error.findings.map((f) => f.rule)).toContain('obfuscated-exec');
    const e = await sbx.runCode(OBFUSCATED).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(CodeDeniedError);
    expect((e as CodeDeniedError).findings.some((f) => f.rule === 'obfuscated-exec')).toBe(true);
    expect(storeEvents(sbx.id)).toContain('code.denied');
    await sbx.kill();
  });
});
