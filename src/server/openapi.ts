// The OpenAPI 3.1 document of the native REST API, generated from the route table (route-table.ts)
// and the contract's zod schemas (z.toJSONSchema): nothing in it is written by hand twice.
import { z } from 'zod';
import { ErrorBodySchema } from './contract.js';
import { NATIVE_ROUTES, type RouteDoc } from './route-table.js';

type Json = Record<string, unknown>;

/** Hono `:param` → OpenAPI `{param}`. */
export function openApiPath(honoPath: string): string {
  return honoPath.replace(/:([A-Za-z_][A-Za-z0-9_]*)/g, '{$1}');
}

const schemaOf = (s: z.ZodType, io: 'input' | 'output'): Json => {
  const { $schema: _drop, ...rest } = z.toJSONSchema(s, { io, unrepresentable: 'any' }) as Json;
  return rest;
};

function operation(r: RouteDoc): Json {
  const params: Json[] = [...r.path.matchAll(/:([A-Za-z_][A-Za-z0-9_]*)/g)].map((m) => ({
    name: m[1],
    in: 'path',
    required: true,
    schema: { type: 'string' },
  }));
  if (r.query) {
    const q = schemaOf(r.query, 'input') as { properties?: Record<string, Json>; required?: string[] };
    for (const [name, schema] of Object.entries(q.properties ?? {})) {
      params.push({ name, in: 'query', required: q.required?.includes(name) ?? false, schema });
    }
  }
  if (r.method === 'get' && r.path === '/v1/sandboxes') {
    params.push({
      name: 'metadata.KEY',
      in: 'query',
      required: false,
      description: 'Only sandboxes whose metadata KEY equals the value (repeat for more keys)',
      schema: { type: 'string' },
    });
  }
  const op: Json = {
    operationId: `${r.method}${r.path.replace(/[/:]+([a-z])/g, (_m, c: string) => c.toUpperCase())}`,
    summary: r.summary,
    ...(params.length ? { parameters: params } : {}),
  };
  if (r.body) {
    op.requestBody = {
      required: true,
      content:
        r.body.kind === 'json'
          ? { 'application/json': { schema: schemaOf(r.body.schema, 'input') } }
          : { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } },
    };
  }
  const res = r.response;
  const ok: Json =
    res.kind === 'json'
      ? { description: 'OK', content: { 'application/json': { schema: schemaOf(res.schema, 'output') } } }
      : res.kind === 'ndjson'
        ? {
            description: 'A stream of JSON lines; `schema` is the schema of one line',
            content: { 'application/x-ndjson': { schema: schemaOf(res.item, 'output') } },
          }
        : res.kind === 'bytes'
          ? {
              description: 'The bytes',
              content: { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } },
            }
          : res.kind === 'upgrade'
            ? {
                description: `Switching protocols to ${res.protocol}: the connection carries raw bytes from here on`,
              }
            : res.kind === 'mcp'
              ? {
                  description:
                    'MCP Streamable HTTP: JSON-RPC messages as one JSON body or a text/event-stream; errors are JSON-RPC errors',
                  content: {
                    'application/json': { schema: { type: 'object' } },
                    'text/event-stream': { schema: { type: 'string' } },
                  },
                }
              : { description: 'Done' };
  op.responses = {
    [String(res.status)]: ok,
    default: {
      description: 'An error: its status is the one of its code',
      content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } },
    },
  };
  return op;
}

/**
 * The whole document (built on every call: cheap, and never stale). `extra`: routes a server serves
 * beside the native API (e.g. /mcp on `airlock serve` with an MCP config).
 */
export function openApiDocument(
  o: { title?: string; version?: string; extra?: readonly RouteDoc[] } = {},
): Json {
  const paths: Record<string, Json> = {};
  for (const r of [...NATIVE_ROUTES, ...(o.extra ?? [])]) {
    const p = (paths[openApiPath(r.path)] ??= {});
    p[r.method] = operation(r);
  }
  return {
    openapi: '3.1.0',
    info: { title: o.title ?? 'Airlock sandbox API', version: o.version ?? '1' },
    paths,
    components: {
      schemas: { Error: schemaOf(ErrorBodySchema, 'output') },
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } },
    },
    security: [{ bearer: [] }],
  };
}
