// Templates on `airlock serve` (a real server, its real supervisor, real sandboxes): a build's NDJSON
// progress stream in order, sandboxes created from the template, per-tenant names (another tenant
// cannot see, use, delete or build on it), bad definitions refused naming the field, a client that
// disconnects mid-build leaves nothing (no sandbox, no layer), quotas, the remote TypeScript SDK, and
// templates that survive a restart of `airlock serve`.
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { Sandbox as E2bSandbox, Template as E2bTemplate } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { TemplateEvent } from '../../src/server/contract.js';
import { RemoteSandboxApi } from '../../src/server/client.js';
import { RemoteAirlock } from '../../src/server/remote/airlock.js';
import { supervisorPaths } from '../../src/server/supervisor-client.js';
import { Store } from '../../src/server/store.js';
import { internalTemplateName } from '../../src/server/templates.js';
import {
  canRunNamespaces,
  NO_RESIDUE,
  residue,
  settledResidue,
  SKIP_REASON,
  TEST_STATE_DIR,
} from '../helpers.js';
import { create, exec, kill } from './serve-api.js';
import {
  call,
  newKey,
  startServe,
  stopServe,
  stopSupervisor,
  waitFor,
  type Served,
} from './serve-helpers.js';

/** POST /v1/templates and read the whole NDJSON stream. */
async function build(
  url: string,
  key: string,
  def: unknown,
): Promise<{ status: number; events: TemplateEvent[]; body: unknown }> {
  const r = await call(url, key, 'POST', '/v1/templates', def);
  const text = await r.text();
  if (r.status !== 200) return { status: r.status, events: [], body: JSON.parse(text) as unknown };
  const events = text
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as TemplateEvent);
  return { status: 200, events, body: undefined };
}

async function refused(
  url: string,
  key: string,
  def: unknown,
): Promise<{ status: number; code: string; field?: string; message: string }> {
  const r = await build(url, key, def);
  expect(r.status, JSON.stringify(r.events)).not.toBe(200);
  const e = (r.body as { error: { code: string; field?: string; message: string } }).error;
  return { status: r.status, ...e };
}

const layers = (): string[] => {
  const d = join(TEST_STATE_DIR, 'layers');
  return existsSync(d) ? readdirSync(d).sort() : [];
};

/**
 * Nothing of a build is left while the supervisor runs: it has no live sandbox and no sandbox process
 * runs. (Its warm slot keeps one prepared sandbox dir: that is the pool, not a leak; the final check
 * after the supervisor stops sees everything.)
 */
async function quiet(): Promise<true | undefined> {
  const sup = new RemoteSandboxApi({ socketPath: supervisorPaths(TEST_STATE_DIR).socket });
  try {
    return (
      ((await sup.list({}, { tenant: 'test' })).length === 0 && residue().processes.length === 0) || undefined
    );
  } finally {
    sup.close();
  }
}

const decode = (events: TemplateEvent[], index: number, stream: 'stdout' | 'stderr'): string =>
  Buffer.concat(
    events
      .filter((e) => e.type === 'step-output' && e.index === index && e.stream === stream)
      .map((e) => Buffer.from((e as { data: string }).data, 'base64')),
  ).toString('utf8');

// Fresh tenants each run (the state dir, and so the store, outlives a run).
const run = randomBytes(4).toString('hex');
const tenantA = `tpl-a-${run}`;
// Contents unique to the run: layers are content-addressed, and a layer another template shares
// is kept (and so is no longer "in use" when one of them is deleted).
const A_TEXT = `from tenant a ${run}\n`;
const B_TEXT = `from tenant b ${run}\n`;

describe.skipIf(!canRunNamespaces)(`airlock serve: templates (${SKIP_REASON})`, () => {
  let s: Served;
  let keyA: string;
  let keyB: string;
  beforeAll(async () => {
    await stopSupervisor();
    s = await startServe();
    keyA = newKey(tenantA).key;
    keyB = newKey(`tpl-b-${run}`).key;
  }, 120_000);
  afterAll(async () => {
    if (s) await stopServe(s);
    await stopSupervisor();
    expect(await settledResidue(5000)).toEqual(NO_RESIDUE);
  }, 120_000);

  let built: TemplateEvent[] = [];

  it('a build streams its progress in order: start, files, each step (output, duration), layer, done', async () => {
    const r = await build(s.url, keyA, {
      name: 'base-a',
      files: [{ path: 'a.txt', content: A_TEXT }],
      steps: [
        { run: 'echo hello-out; echo hello-err >&2; cp /workspace/a.txt /workspace/b.txt' },
        // Far more output than a step may send: it is cut at the bound and the step says so.
        { run: "head -c 200000 /dev/zero | tr '\\0' x" },
      ],
    });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    built = r.events;
    const types = r.events.map((e) => e.type).filter((t) => t !== 'step-output');
    expect(types).toEqual([
      'start',
      'files',
      'step-started',
      'step-finished',
      'step-started',
      'step-finished',
      'layer',
      'done',
    ]);
    expect(r.events[0]).toEqual({ type: 'start', name: 'base-a', steps: 2 });
    // Output of a step comes between its start and its end.
    const at = (pred: (e: TemplateEvent) => boolean): number => r.events.findIndex(pred);
    const out0 = at((e) => e.type === 'step-output' && e.index === 0);
    expect(out0).toBeGreaterThan(at((e) => e.type === 'step-started' && e.index === 0));
    expect(out0).toBeLessThan(at((e) => e.type === 'step-finished' && e.index === 0));
    expect(decode(r.events, 0, 'stdout')).toBe('hello-out\n');
    expect(decode(r.events, 0, 'stderr')).toBe('hello-err\n');
    const fin = r.events.filter((e) => e.type === 'step-finished') as Array<
      Extract<TemplateEvent, { type: 'step-finished' }>
    >;
    expect(fin.map((f) => [f.index, f.exitCode, f.truncated])).toEqual([
      [0, 0, false],
      [1, 0, true],
    ]);
    for (const f of fin) expect(f.durationMs).toBeGreaterThanOrEqual(0);
    const big = decode(r.events, 1, 'stdout');
    expect(big.length).toBe(64 * 1024);
    expect(big).toMatch(/^x+$/);
    const layer = r.events.find((e) => e.type === 'layer') as { digest: string };
    const done = r.events.at(-1) as Extract<TemplateEvent, { type: 'done' }>;
    expect(done.template.name).toBe('base-a'); // the tenant's name, never the internal one
    expect(done.template.digest).toBe(layer.digest);
    expect(done.template.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
  });

  it('list and get show it to its tenant; a sandbox created from it has its files', async () => {
    const list = (await (await call(s.url, keyA, 'GET', '/v1/templates')).json()) as Array<{ name: string }>;
    expect(list.map((t) => t.name)).toEqual(['base-a']);
    const one = (await (await call(s.url, keyA, 'GET', '/v1/templates/base-a')).json()) as { digest: string };
    expect(one.digest).toBe((built.at(-1) as { template: { digest: string } }).template.digest);
    const sbx = await create(s.url, keyA, { template: 'base-a' });
    expect((sbx as unknown as { template: string }).template).toBe('base-a');
    expect((await exec(s.url, keyA, sbx.id, ['cat', '/workspace/b.txt'])).stdout).toBe(A_TEXT);
    // By digest, the tenant's own template is a base too.
    const byDigest = await create(s.url, keyA, { template: one.digest });
    expect((await exec(s.url, keyA, byDigest.id, ['cat', '/workspace/a.txt'])).stdout).toBe(A_TEXT);
    // A template a sandbox runs on is not deleted under it.
    const busy = await call(s.url, keyA, 'DELETE', '/v1/templates/base-a');
    expect(busy.status).toBe(409);
    await kill(s.url, keyA, sbx.id);
    await kill(s.url, keyA, byDigest.id);
  });

  it("a tenant builds on its own template by name; the library's internal names never show", async () => {
    const r = await build(s.url, keyA, {
      name: 'child-a',
      base: 'base-a',
      steps: [{ run: 'cat /workspace/b.txt' }],
    });
    expect(r.events.at(-1)?.type, JSON.stringify(r.events.at(-1))).toBe('done');
    expect(decode(r.events, 0, 'stdout')).toBe(A_TEXT);
    expect(JSON.stringify(r.events)).not.toMatch(/tn-[0-9a-f]{16}/);
    // A failure's message names the caller's own names too.
    const bad = await build(s.url, keyA, { name: 'child-bad', base: 'base-a', steps: [{ run: 'exit 9' }] });
    expect(bad.events.at(-1)?.type).toBe('error');
    expect(JSON.stringify(bad.events)).not.toMatch(/tn-[0-9a-f]{16}/);
    expect((await call(s.url, keyA, 'DELETE', '/v1/templates/child-a')).status).toBe(204);
  });

  it('another tenant cannot see, use, build on or delete it: 404 exactly as for a name that does not exist', async () => {
    const digest = (built.at(-1) as { template: { digest: string } }).template.digest;
    expect(await (await call(s.url, keyB, 'GET', '/v1/templates')).json()).toEqual([]);
    const theirs = await call(s.url, keyB, 'GET', '/v1/templates/base-a');
    const none = await call(s.url, keyB, 'GET', '/v1/templates/no-such-a');
    expect([theirs.status, none.status]).toEqual([404, 404]);
    const [e1, e2] = [
      (await theirs.json()) as { error: { code: string; message: string } },
      (await none.json()) as { error: { code: string; message: string } },
    ];
    expect(e1.error.code).toBe('TEMPLATE_NOT_FOUND');
    expect(e1.error.message.replace('base-a', 'X')).toBe(e2.error.message.replace('no-such-a', 'X'));
    expect((await call(s.url, keyB, 'DELETE', '/v1/templates/base-a')).status).toBe(404);
    // As a create's template: by name, by the library's internal name, by digest.
    for (const template of ['base-a', internalTemplateName(tenantA, 'base-a'), digest]) {
      const r = await call(s.url, keyB, 'POST', '/v1/sandboxes', { template });
      expect(r.status, template).toBe(404);
      expect(((await r.json()) as { error: { code: string } }).error.code).toBe('TEMPLATE_NOT_FOUND');
    }
    // As a build's base.
    for (const base of ['base-a', internalTemplateName(tenantA, 'base-a'), digest]) {
      const e = await refused(s.url, keyB, { name: 'on-a', base });
      expect([e.status, e.code, e.field]).toEqual([404, 'TEMPLATE_NOT_FOUND', 'base']);
    }
    // B's own template of the same name is B's: each tenant's sandboxes see their own.
    const b = await build(s.url, keyB, {
      name: 'base-a',
      files: [{ path: 'a.txt', content: B_TEXT }],
    });
    expect(b.events.at(-1)?.type).toBe('done');
    const sb = await create(s.url, keyB, { template: 'base-a' });
    const sa = await create(s.url, keyA, { template: 'base-a' });
    expect((await exec(s.url, keyB, sb.id, ['cat', '/workspace/a.txt'])).stdout).toBe(B_TEXT);
    expect((await exec(s.url, keyA, sa.id, ['cat', '/workspace/a.txt'])).stdout).toBe(A_TEXT);
    await kill(s.url, keyB, sb.id);
    await kill(s.url, keyA, sa.id);
    // B deleting its own leaves A's.
    expect((await call(s.url, keyB, 'DELETE', '/v1/templates/base-a')).status).toBe(204);
    expect((await call(s.url, keyB, 'GET', '/v1/templates/base-a')).status).toBe(404);
    expect((await call(s.url, keyA, 'GET', '/v1/templates/base-a')).status).toBe(200);
  });

  it('bad definitions: 400 naming the field (host paths, mounts, secrets, bad steps, too many), 413 over the cap', async () => {
    const cases: Array<[unknown, string, number?]> = [
      [{ name: 'x', files: [{ path: 'a', from: '/etc/shadow' }] }, 'files.0.from'],
      [{ name: 'x', files: [{ path: 'a', content: 'c', hostPath: '/etc' }] }, 'files.0.hostPath'],
      [{ name: 'x', mounts: [{ source: '/', target: '/host' }] }, 'mounts'],
      [{ name: 'x', secrets: [{ name: 'K', value: { env: 'HOME' }, hosts: ['example.com'] }] }, 'secrets'],
      [{ name: 'x', steps: [{ run: 'true', secrets: [] }] }, 'steps.0.secrets'],
      [{ name: 'x', files: [{ path: '/etc/passwd', content: 'root' }] }, 'files.0.path'],
      [{ name: 'x', files: [{ path: '../up', content: 'c' }] }, 'files.0.path'],
      [{ name: 'x', steps: [{ run: '' }] }, 'steps.0.run'],
      [{ name: 'x', steps: [{ run: 'true', timeoutMs: 5 }] }, 'steps.0.timeoutMs'],
      [{ name: 'x', steps: [{ run: 'true', network: { allow: ['*'] } }] }, 'steps.0.network.allow.0'],
      [{ name: 'x', steps: Array.from({ length: 65 }, () => ({ run: 'true' })) }, 'steps'],
      [{ name: 'X Y' }, 'name'],
      [{ name: 'host' }, 'name'],
      [{ name: 'a'.repeat(41) }, 'name'],
      [
        { name: 'x', steps: [{ run: 'true', network: { allowPrivate: ['10.0.0.1:5432'] } }] },
        'steps.0.network.allowPrivate',
        403,
      ],
      [{ name: 'x', files: [{ path: 'big', content: 'x'.repeat(1024 * 1024 + 1) }] }, 'files.0.content'],
    ];
    for (const [def, field, status = 400] of cases) {
      const e = await refused(s.url, keyA, def);
      expect([e.status, e.field], `${JSON.stringify(def).slice(0, 120)} → ${e.message}`).toEqual([
        status,
        field,
      ]);
    }
    const huge = await build(s.url, keyA, {
      name: 'x',
      files: [{ path: 'a', content: 'x'.repeat(5 * 1024 * 1024) }],
    });
    expect(huge.status).toBe(413);
    // Nothing was built or recorded by any of them.
    expect(((await (await call(s.url, keyA, 'GET', '/v1/templates')).json()) as unknown[]).length).toBe(1);
  });

  it('a failing step ends the stream with an error naming it; nothing is kept', async () => {
    const before = layers();
    const r = await build(s.url, keyA, {
      name: 'broken',
      steps: [
        { run: `echo ${run} > /workspace/r` },
        { run: 'echo nope >&2; exit 3', network: { allow: ['example.com'] } },
      ],
    });
    expect(r.status).toBe(200);
    const last = r.events.at(-1) as { type: string; code: string; field: string; message: string };
    expect(last).toMatchObject({ type: 'error', code: 'TEMPLATE_BUILD_FAILED', field: 'steps.1' });
    expect(last.message).toMatch(/exited 3.*nope/s);
    expect(r.events.find((e) => e.type === 'step-finished' && e.index === 1)).toMatchObject({ exitCode: 3 });
    expect((await call(s.url, keyA, 'GET', '/v1/templates/broken')).status).toBe(404);
    expect(layers()).toEqual(before); // the first segment's layer was removed with the build
    await waitFor(quiet, 'the build sandbox to go');
  });

  it('a client that disconnects mid-build cancels it: no sandbox, no layer, no template left', async () => {
    const before = layers();
    const ctl = new AbortController();
    const r = await fetch(`${s.url}/v1/templates`, {
      method: 'POST',
      headers: { authorization: `Bearer ${keyA}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        name: 'gone',
        steps: [
          { run: `echo ${run} > /workspace/one` },
          { run: 'echo started; sleep 600', network: { allow: ['example.com'] } },
        ],
      }),
      signal: ctl.signal,
    });
    expect(r.status).toBe(200);
    // Read until the long step has started and printed (so a layer and a sandbox exist), then leave.
    const reader = r.body!.getReader();
    let text = '';
    while (!/"step-output","index":1/.test(text)) {
      const { done, value } = await reader.read();
      if (done) throw new Error(`stream ended early: ${text}`);
      text += Buffer.from(value).toString('utf8');
    }
    expect(text).toMatch(/"type":"layer"/); // the first segment was captured
    ctl.abort();
    await waitFor(quiet, 'the build sandbox to go');
    await waitFor(() => JSON.stringify(layers()) === JSON.stringify(before) || undefined, 'the layer to go');
    expect((await call(s.url, keyA, 'GET', '/v1/templates/gone')).status).toBe(404);
  });

  it("a build counts against the tenant's quota: full → 429 with Retry-After before the stream starts", async () => {
    const keyC = newKey(`tpl-c-${run}`).key;
    const store = new Store(join(TEST_STATE_DIR, 'server.db'));
    try {
      store.setQuota(`tpl-c-${run}`, { maxSandboxes: 1 });
    } finally {
      store.close();
    }
    const sbx = await create(s.url, keyC, {});
    const r = await call(s.url, keyC, 'POST', '/v1/templates', { name: 'q', queueTimeoutMs: 0 });
    expect(r.status).toBe(429);
    expect(r.headers.get('retry-after')).toMatch(/^\d+$/);
    expect(((await r.json()) as { error: { code: string } }).error.code).toBe('QUOTA_EXCEEDED');
    await kill(s.url, keyC, sbx.id);
    const ok = await build(s.url, keyC, { name: 'q' });
    expect(ok.events.at(-1)?.type).toBe('done');
    expect((await call(s.url, keyC, 'DELETE', '/v1/templates/q')).status).toBe(204);
  });

  it('the remote TypeScript SDK: templates.build with onProgress (library phases) and onEvent, list, inspect, remove', async () => {
    const remote = new RemoteAirlock({ apiUrl: s.url, apiKey: keyB });
    try {
      const phases: string[] = [];
      const outputs: string[] = [];
      const info = await remote.templates.build(
        {
          name: 'sdk-b',
          files: [{ path: 'f', content: `sdk ${run}\n` }],
          steps: [{ run: 'cat /workspace/f' }],
        },
        {
          onProgress: (p) => phases.push(p.phase),
          onEvent: (e) => {
            if (e.type === 'step-output') outputs.push(Buffer.from(e.data, 'base64').toString());
          },
        },
      );
      expect(phases).toEqual(['start', 'files', 'step', 'layer', 'done']);
      expect(outputs.join('')).toBe(`sdk ${run}\n`);
      expect(info.name).toBe('sdk-b');
      expect(info.createdAt).toBeInstanceOf(Date);
      expect((await remote.templates.list()).map((t) => t.name)).toEqual(['sdk-b']);
      expect((await remote.templates.inspect('sdk-b')).digest).toBe(info.digest);
      const sbx = await remote.create({ template: 'sdk-b' });
      expect((await sbx.exec(['cat', '/workspace/f'])).stdout).toBe(`sdk ${run}\n`);
      await sbx.kill();
      await expect(remote.templates.inspect('base-a')).rejects.toMatchObject({ code: 'TEMPLATE_NOT_FOUND' });
      await expect(remote.templates.build({ name: 'bad', steps: [{ run: 'exit 1' }] })).rejects.toMatchObject(
        { code: 'TEMPLATE_BUILD_FAILED', field: 'steps.0' },
      );
      await remote.templates.remove('sdk-b');
      expect(await remote.templates.list()).toEqual([]);
    } finally {
      await remote.close();
    }
  });

  it("the e2b SDK: Sandbox.create(name) runs the tenant's own template; Template.build names what to use instead", async () => {
    const env = {
      E2B_API_URL: `${s.url}/e2b`,
      E2B_SANDBOX_URL: `${s.url}/e2b/envd`,
      E2B_DOMAIN: 'airlock-tpl.invalid',
    };
    Object.assign(process.env, env);
    try {
      const sbx = await E2bSandbox.create('base-a', { apiKey: keyA, timeoutMs: 60_000 });
      try {
        expect((await sbx.commands.run('cat /workspace/b.txt')).stdout).toBe(A_TEXT);
      } finally {
        await sbx.kill();
      }
      // Another tenant's template name is not found through E2B either.
      await expect(E2bSandbox.create('base-a', { apiKey: keyB })).rejects.toThrow(/not found|no template/i);
      await expect(
        E2bTemplate.build(E2bTemplate().fromImage('ubuntu:22.04').runCmd('true'), 'e2b-built', {
          apiKey: keyA,
        }),
      ).rejects.toThrow(/POST \/v1\/templates/);
    } finally {
      for (const k of Object.keys(env)) delete process.env[k];
    }
  });

  it('templates survive a restart of airlock serve (kill -9): listed, and sandboxes start from them', async () => {
    await stopServe(s, 'SIGKILL');
    s = await startServe();
    expect(
      ((await (await call(s.url, keyA, 'GET', '/v1/templates')).json()) as Array<{ name: string }>).map(
        (t) => t.name,
      ),
    ).toEqual(['base-a']);
    const sbx = await create(s.url, keyA, { template: 'base-a' });
    expect((await exec(s.url, keyA, sbx.id, ['cat', '/workspace/b.txt'])).stdout).toBe(A_TEXT);
    await kill(s.url, keyA, sbx.id);
    expect((await call(s.url, keyB, 'GET', '/v1/templates/base-a')).status).toBe(404);
    expect((await call(s.url, keyA, 'DELETE', '/v1/templates/base-a')).status).toBe(204);
    expect(await (await call(s.url, keyA, 'GET', '/v1/templates')).json()).toEqual([]);
  });
});
