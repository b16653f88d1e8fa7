// SECURITY-RELEVANT: the one supervisor route beyond the native API, for the sandboxes of the MCP
// gateway that `airlock serve` mounts at /mcp (server/mcp.ts). An MCP server needs its own package
// files bound read-only into its sandbox (mcp/command.ts decides which, from the operator's gateway
// config), which a CreateRequest can never carry: remote clients send no host paths. This route takes
// them, so it lives only on the supervisor's socket (root-only, 0600, whose one client is the front
// server) and never on the front server's API. What it accepts is still narrow: read-only mounts and
// the operator's workspace, literal secrets only (the front server resolves the config's fromEnv/
// fromFile/command sources in its own process; the supervisor reads nothing of its own for a client),
// no layers or templates. The library validates every field again (SandboxSpecSchema).
import { request } from 'node:http';
import { Hono } from 'hono';
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import type { SandboxSpecInput } from '../core/spec.js';
import { parseOrThrow } from '../core/validate.js';
import type { Airlock } from '../sandbox/airlock.js';
import { errorFrom, parsePeer, readAll } from './client.js';
import { SandboxViewSchema } from './contract.js';
import { errorResponse } from './http-errors.js';
import { sandboxView } from './local.js';
import { readCapped } from './streams.js';

export const MCP_SANDBOX_ROUTE = '/v1/supervisor/mcp-sandboxes';

const StrMap = z.record(z.string(), z.string());

/** What the front server sends to start one MCP server's sandbox. */
export const McpSandboxRequestSchema = z
  .object({
    backend: z.enum(['namespaces', 'gvisor']).optional(),
    ttlMs: z.number().int().min(1000).max(86_400_000).optional(),
    limits: z.record(z.string(), z.number()).optional(),
    /** The operator's workspace for this server (validated by the library's WorkspaceSchema). */
    workspace: z.record(z.string(), z.string()).optional(),
    network: z.record(z.string(), z.unknown()).optional(),
    env: StrMap.optional(),
    metadata: StrMap.optional(),
    /** Read-only binds of the server's own files (the library's MountSchema checks each source). */
    mounts: z
      .array(z.object({ hostPath: z.string().min(1), path: z.string().min(1) }).strict())
      .max(16)
      .optional(),
    secrets: z
      .array(
        z
          .object({
            name: z.string().min(1),
            value: z.object({ literal: z.string().min(1) }).strict(),
            hosts: z.array(z.string().min(1)).min(1),
            body: z.boolean().optional(),
            insecureHttp: z.boolean().optional(),
          })
          .strict(),
      )
      .optional(),
  })
  .strict();
export type McpSandboxRequest = z.infer<typeof McpSandboxRequestSchema>;

const Pairs = z.array(z.object({ name: z.string(), value: z.string() }));
/** The sandbox, and what the gateway's output guard must scrub from what its server says. */
export const McpSandboxCreatedSchema = z.object({
  sandbox: SandboxViewSchema,
  redaction: z.object({ secrets: Pairs, sentinels: Pairs, canaries: Pairs }),
});
export type McpSandboxCreated = z.infer<typeof McpSandboxCreatedSchema>;

/** The supervisor side: POST MCP_SANDBOX_ROUTE creates the sandbox in the supervisor's Airlock. */
export function mcpSupervisorRoutes(airlock: Airlock): Hono {
  const app = new Hono();
  app.post(MCP_SANDBOX_ROUTE, async (c) => {
    try {
      const bytes = await readCapped(c.req.raw, 1024 * 1024, 'request body');
      let json: unknown;
      try {
        json = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes));
      } catch {
        throw new AirlockError('INVALID_ARGUMENT', 'the request body is not valid JSON', { field: 'body' });
      }
      const req = parseOrThrow(McpSandboxRequestSchema, json, 'MCP sandbox request');
      const sbx = await airlock.create(req as SandboxSpecInput);
      const body: McpSandboxCreated = {
        sandbox: sandboxView(sbx),
        redaction: airlock.redactionSetFor(sbx.id),
      };
      return c.json(body, 201);
    } catch (e) {
      return errorResponse(e);
    }
  });
  return app;
}

/** The front server side: the same request over the supervisor's socket (the native client's decoding). */
export function createMcpSandbox(socketPath: string, req: McpSandboxRequest): Promise<McpSandboxCreated> {
  const payload = Buffer.from(JSON.stringify(req));
  return new Promise<McpSandboxCreated>((resolve, reject) => {
    const r = request(
      {
        socketPath,
        path: MCP_SANDBOX_ROUTE,
        method: 'POST',
        headers: { 'content-type': 'application/json', 'content-length': String(payload.length) },
      },
      (res) => {
        readAll(res, 4 * 1024 * 1024)
          .then((b) => {
            const text = b.toString('utf8');
            if (res.statusCode !== 201) throw errorFrom(res.statusCode ?? 0, text);
            return parsePeer(McpSandboxCreatedSchema, text, 'MCP sandbox');
          })
          .then(resolve, reject);
      },
    );
    r.on('error', (e) =>
      reject(
        new AirlockError('BACKEND_UNAVAILABLE', `cannot reach the airlock supervisor: ${e.message}`, {
          cause: e,
        }),
      ),
    );
    r.end(payload);
  });
}
