// `airlock mcp-server` over stdio: one MCP session on stdin/stdout. It ends when the client closes
// stdin (or the transport fails); the session's sandboxes are killed before this resolves.
import type { Readable, Writable } from 'node:stream';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { AirlockMcpSession, type AirlockMcpServerOptions } from './session.js';

/** Serve one session on `stdin`/`stdout` until the client goes or `signal` aborts. */
export async function serveMcpStdio(
  opts: AirlockMcpServerOptions,
  stdin: Readable,
  stdout: Writable,
  signal?: AbortSignal,
): Promise<void> {
  const session = new AirlockMcpSession(opts);
  const transport = new StdioServerTransport(stdin, stdout);
  const ended = new Promise<void>((resolve) => {
    transport.onclose = () => resolve();
    stdin.once('end', () => resolve());
    stdin.once('close', () => resolve());
    stdin.once('error', () => resolve());
    stdout.once('error', () => resolve());
    signal?.addEventListener('abort', () => resolve(), { once: true });
  });
  try {
    await session.server.connect(transport);
    await ended;
  } finally {
    await session.close();
  }
}
