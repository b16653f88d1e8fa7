// A sandbox connection refused by Airlock's fd budget (core/fd-budget.ts), the moment it is
// accepted and before anything of it is read: its fd is closed at once (a refused connection must
// not hold one), after a best-effort 503 that carries the reason (HTTP clients of the proxy show it;
// SOCKS and intercepted clients see the connection closed). The egress event carries the reason
// and the code `fd_budget`.
import type { Socket } from 'node:net';
import type { EgressEvent } from './events.js';

export function refuseForFds(
  sock: Socket,
  reason: string,
  emit: (e: Omit<EgressEvent, 'sandboxId' | 'time'>) => void,
): void {
  const body = `Airlock egress: ${reason}\n`;
  sock.on('error', () => {});
  sock.end(
    `HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  );
  sock.destroy();
  emit({
    // The proxy's port (HTTP, CONNECT or SOCKS5: not known before a byte is read) or interception.
    protocol: sock.localAddress === '127.0.0.1' ? 'http' : 'transparent-tcp',
    host: sock.localAddress ?? '',
    port: sock.localPort ?? 0,
    decision: 'deny',
    reason,
    code: 'fd_budget',
    bytesUp: 0,
    bytesDown: 0,
    durationMs: 0,
  });
}
