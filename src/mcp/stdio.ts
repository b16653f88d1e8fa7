// The gateway spoken over stdio: `airlock mcp -- <server>` is what an MCP client launches in place of
// the server, and `airlock gateway --stdio` fronts a whole config. One client session per process.
import type { Readable, Writable } from 'node:stream';
import { mcpEvent } from './audit.js';
import type { GatewayCore } from './gateway.js';
import { StreamTransport } from './transport.js';

export interface StdioOptions {
  /** A broken frame from the client (reported, answered if it had an id, never fatal). */
  readonly onFrameError?: (reason: string) => void;
  /** The client stopped reading and the session was closed (its buffered bytes hit the cap). */
  readonly onOverflow?: (reason: string) => void;
  readonly tenant?: string;
  /** Cap on bytes waiting for the client to read them (default DEFAULT_MAX_BUFFERED_BYTES). */
  readonly maxBufferedBytes?: number;
}

/** Serve one client session on `input`/`output`; resolves when the client goes away. */
export async function serveStdio(
  core: GatewayCore,
  input: Readable,
  output: Writable,
  opts: StdioOptions = {},
): Promise<void> {
  const transport = new StreamTransport(input, output, {
    answerBrokenRequests: true,
    ...(opts.maxBufferedBytes !== undefined ? { maxBufferedBytes: opts.maxBufferedBytes } : {}),
  });
  transport.onoverflow = (info) => {
    const reason = `the client is not reading: ${info.bufferedBytes} bytes wait for it (cap ${info.maxBufferedBytes}); session closed`;
    opts.onOverflow?.(reason);
    core.audit(
      mcpEvent({
        sandboxId: '',
        server: '*',
        method: 'transport',
        session: 'stdio',
        decision: 'error',
        code: 'client_overflow',
        reason,
      }),
    );
  };
  transport.onframeerror = (info) => {
    opts.onFrameError?.(info.reason);
    core.audit(
      mcpEvent({
        sandboxId: '',
        server: '*',
        method: 'frame',
        session: 'stdio',
        decision: 'error',
        code: `frame_${info.code}`,
        reason: `dropped a broken frame from the client: ${info.reason}`,
      }),
    );
  };
  const session = core.openSession('stdio', opts.tenant ?? 'local');
  // The SDK chains its own close handling after this one (Protocol.connect keeps a prior onclose).
  const ended = new Promise<void>((resolve) => (transport.onclose = resolve));
  await session.connect(transport);
  await ended;
  await session.close();
  // Nothing more is read from this client (the session may have ended without its EOF, e.g. on overflow).
  input.destroy();
}
