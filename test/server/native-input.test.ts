// Bad input on the wire: malformed JSON, wrong types, unknown and forbidden fields (host mounts,
// host workspaces, layers, env:/file:/cmd: secret sources), oversized bodies, bad query strings. Each
// is a typed error with its status and the field named, and none creates anything.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CreateRequestSchema } from '../../src/server/contract.js';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, settledResidue, testAirlock } from '../helpers.js';
import { CALLER, startServer, type TestServer } from './native-support.js';

const airlock = testAirlock();

describe('CreateRequest (the only spec a remote client can send)', () => {
  const refused: Array<[string, unknown, string]> = [
    ['a host mount', { mounts: [{ hostPath: '/etc' }] }, 'mounts'],
    ['a host workspace', { workspace: { hostDir: '/root', mode: 'cow' } }, 'workspace'],
    ['snapshot layers', { layers: [`sha256:${'a'.repeat(64)}`] }, 'layers'],
    ['persistent', { persistent: true }, 'persistent'],
    ['canaries', { canaries: [{ name: 'X', kind: 'env' }] }, 'canaries'],
    [
      'an env: secret',
      { secrets: [{ name: 'T', value: { fromEnv: 'HOME' }, hosts: ['a.example.com'] }] },
      'secrets.0.value',
    ],
    [
      'a file: secret',
      { secrets: [{ name: 'T', value: { fromFile: '/etc/shadow' }, hosts: ['a.example.com'] }] },
      'secrets.0.value',
    ],
    [
      'a cmd: secret',
      { secrets: [{ name: 'T', value: { command: ['id'] }, hosts: ['a.example.com'] }] },
      'secrets.0.value',
    ],
    [
      'a source next to a literal',
      { secrets: [{ name: 'T', value: 'x', fromEnv: 'HOME', hosts: ['a.example.com'] }] },
      'secrets.0.fromEnv',
    ],
    ['a wrong type', { ttlMs: '1000' }, 'ttlMs'],
    ['a TTL too long', { ttlMs: 10 * 86_400_000 }, 'ttlMs'],
    ['an unknown limit', { limits: { memoryBytes: 1 << 30, swapBytes: 1 } }, 'limits.swapBytes'],
  ];
  for (const [what, body, field] of refused) {
    it(`refuses ${what} (field ${field})`, () => {
      const r = CreateRequestSchema.safeParse(body);
      expect(r.success).toBe(false);
      const issue = r.error!.issues[0]!;
      const path = [...issue.path, ...(issue.code === 'unrecognized_keys' ? [issue.keys[0]] : [])].join('.');
      expect(path).toBe(field);
    });
  }
});

describe.skipIf(!canRunNamespaces)(`native REST API: bad input on the wire (${SKIP_REASON})`, () => {
  let srv: TestServer;
  let id: string;
  beforeAll(async () => {
    srv = await startServer(airlock, { routes: { maxBodyBytes: 16 * 1024 } });
    id = (await srv.api.create({}, CALLER)).id;
  });
  afterAll(async () => {
    await srv.api.kill(id, CALLER).catch(() => {});
    await srv.close();
    await airlock.close();
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  });

  const send = async (
    method: string,
    path: string,
    body?: string | Uint8Array,
    headers: Record<string, string> = { 'content-type': 'application/json' },
  ): Promise<{ status: number; error: { code: string; message: string; field?: string } }> => {
    const res = await fetch(`${srv.url}${path}`, { method, body, headers });
    const json = (await res.json()) as { error: { code: string; message: string; field?: string } };
    return { status: res.status, error: json.error };
  };

  it('answers 400 naming the field, and creates nothing', async () => {
    const before = (await srv.api.list({}, CALLER)).length;
    const cases: Array<[string, string, string | undefined, number, string, string | undefined]> = [
      ['POST', '/v1/sandboxes', '{', 400, 'INVALID_ARGUMENT', 'body'],
      ['POST', '/v1/sandboxes', '[1,2]', 400, 'INVALID_ARGUMENT', 'body'],
      ['POST', '/v1/sandboxes', '{"ttlMs":"soon"}', 400, 'INVALID_SPEC', 'ttlMs'],
      ['POST', '/v1/sandboxes', '{"mounts":[{"hostPath":"/"}]}', 400, 'INVALID_SPEC', 'mounts'],
      ['POST', '/v1/sandboxes', '{"layers":[]}', 400, 'INVALID_SPEC', 'layers'],
      [
        'POST',
        '/v1/sandboxes',
        '{"workspace":{"hostDir":"/home","mode":"cow"}}',
        400,
        'INVALID_SPEC',
        'workspace',
      ],
      [
        'POST',
        '/v1/sandboxes',
        '{"secrets":[{"name":"T","value":{"fromEnv":"PATH"},"hosts":["a.example.com"]}]}',
        400,
        'INVALID_SPEC',
        'secrets.0.value',
      ],
      ['POST', '/v1/sandboxes', '{"network":{"allow":["*"]}}', 400, 'INVALID_SPEC', 'network.allow.0'],
      [
        'POST',
        '/v1/sandboxes',
        '{"network":{"allowPrivate":["10.0.0.1:22"]}}',
        403,
        'PERMISSION_DENIED',
        'network.allowPrivate',
      ],
      ['POST', '/v1/sandboxes', '{"template":"no-such-template"}', 404, 'TEMPLATE_NOT_FOUND', 'template'],
      ['POST', '/v1/sandboxes', '\u00ff\u00fe', 400, 'INVALID_ARGUMENT', 'body'],
      ['POST', `/v1/sandboxes/${id}/exec`, '{"cmd":5}', 400, 'INVALID_ARGUMENT', 'cmd'],
      ['POST', `/v1/sandboxes/${id}/exec`, '{"cmd":[]}', 400, 'INVALID_ARGUMENT', 'cmd'],
      ['POST', `/v1/sandboxes/${id}/exec`, '{"cmd":"true","shell":true}', 400, 'INVALID_ARGUMENT', 'shell'],
      ['POST', `/v1/sandboxes/${id}/exec`, '{"cmd":"true","cwd":"relative"}', 400, 'INVALID_ARGUMENT', 'cwd'],
      ['POST', `/v1/sandboxes/${id}/exec`, '{"cmd":["a\\u0000b"]}', 400, 'INVALID_ARGUMENT', 'command'],
      [
        'POST',
        `/v1/sandboxes/${id}/processes`,
        '{"cmd":"true","env":{"1X":"y"}}',
        400,
        'INVALID_ARGUMENT',
        'env.1X',
      ],
      ['POST', `/v1/sandboxes/${id}/timeout`, '{"ttlMs":-1}', 400, 'INVALID_ARGUMENT', 'ttlMs'],
      ['POST', `/v1/sandboxes/${id}/timeout`, '{}', 400, 'INVALID_ARGUMENT', 'ttlMs'],
      ['GET', `/v1/sandboxes/${id}/files`, undefined, 400, 'INVALID_ARGUMENT', 'path'],
      ['GET', `/v1/sandboxes/${id}/files?path=`, undefined, 400, 'INVALID_ARGUMENT', 'path'],
      ['GET', `/v1/sandboxes/${id}/files?path=%2Fetc%00x`, undefined, 400, 'INVALID_ARGUMENT', 'path'],
      ['GET', `/v1/sandboxes/${id}/processes/7/stream`, undefined, 404, 'PROCESS_NOT_FOUND', 'pid'],
      ['GET', '/v1/sandboxes/..%2F..%2Fetc', undefined, 404, 'SANDBOX_NOT_FOUND', 'id'],
      ['DELETE', '/v1/snapshots/nope', undefined, 400, 'INVALID_ARGUMENT', 'id'],
    ];
    for (const [method, path, body, status, code, field] of cases) {
      const r = await send(method, path, body);
      expect({ path, body, status: r.status, code: r.error.code, field: r.error.field }).toEqual({
        path,
        body,
        status,
        code,
        field,
      });
      expect(r.error.message.length).toBeGreaterThan(10);
    }
    expect((await srv.api.list({}, CALLER)).length).toBe(before);
  });

  it('answers 413 for a body over the cap, declared or streamed', async () => {
    const big = JSON.stringify({ cmd: 'true', env: { X: 'y'.repeat(32 * 1024) } });
    const declared = await send('POST', `/v1/sandboxes/${id}/exec`, big);
    expect([declared.status, declared.error.code]).toEqual([413, 'REQUEST_TOO_LARGE']);
    // chunked (no Content-Length): counted as it streams
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        for (let i = 0; i < 8; i++) c.enqueue(new TextEncoder().encode(' '.repeat(4096)));
        c.close();
      },
    });
    const res = await fetch(`${srv.url}/v1/sandboxes/${id}/processes/1/stdin`, {
      method: 'POST',
      body: stream,
      duplex: 'half',
    } as RequestInit);
    expect(res.status).toBe(413);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('REQUEST_TOO_LARGE');
  });

  it('never leaks internals in a 500', async () => {
    const { nativeRoutes } = await import('../../src/server/routes.js');
    const broken = new Proxy({} as Parameters<typeof nativeRoutes>[0], {
      get: () => async () => {
        throw new Error('secret internal detail /var/lib/airlock/x');
      },
    });
    const res = await nativeRoutes(broken).request('/v1/sandboxes/x');
    expect(res.status).toBe(500);
    expect(await res.json()).toEqual({ error: { code: 'INTERNAL', message: 'internal server error' } });
  });
});
