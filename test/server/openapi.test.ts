// The OpenAPI document and the routes nativeRoutes serves are the same set, and the document's
// schemas are the contract's (a field the contract requires is required in the document).
import { describe, expect, it } from 'vitest';
import type { SandboxApi } from '../../src/server/contract.js';
import { openApiDocument, openApiPath } from '../../src/server/openapi.js';
import { nativeRoutes } from '../../src/server/routes.js';

// A SandboxApi no route is called on here: only the route table is looked at.
const unused = new Proxy({} as SandboxApi, {
  get: () => () => {
    throw new Error('not called');
  },
});

type Doc = {
  openapi: string;
  paths: Record<
    string,
    Record<string, { requestBody?: { content: Record<string, { schema: Record<string, unknown> }> } }>
  >;
};

describe('openapi.json', () => {
  const app = nativeRoutes(unused);
  const served = new Set(
    app.routes
      .filter((r) => r.path !== '/openapi.json' && r.method !== 'ALL')
      .map((r) => `${r.method.toLowerCase()} ${openApiPath(r.path)}`),
  );
  const doc = openApiDocument() as unknown as Doc;
  const documented = new Set(
    Object.entries(doc.paths).flatMap(([p, ops]) => Object.keys(ops).map((m) => `${m} ${p}`)),
  );

  it('documents exactly the routes nativeRoutes serves', () => {
    expect(doc.openapi).toBe('3.1.0');
    expect(served.size).toBeGreaterThanOrEqual(25);
    expect([...served].sort()).toEqual([...documented].sort());
  });

  it('is served at /openapi.json', async () => {
    const res = await app.request('/openapi.json');
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual(doc);
  });

  it("carries the contract's request schemas (strict, required fields)", () => {
    const create = doc.paths['/v1/sandboxes']!.post!.requestBody!.content['application/json']!.schema;
    expect(create.additionalProperties).toBe(false);
    expect(Object.keys(create.properties as object)).toEqual(
      expect.arrayContaining(['template', 'snapshot', 'ttlMs', 'secrets', 'metadata']),
    );
    expect(Object.keys(create.properties as object)).not.toContain('mounts');
    const exec = doc.paths['/v1/sandboxes/{id}/exec']!.post!.requestBody!.content['application/json']!.schema;
    expect(exec.required).toEqual(['cmd']);
  });
});
