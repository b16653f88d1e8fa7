// S1's canned-answer stub: the floor under an SDK's create → exec → kill, with no server work and no
// sandbox. It runs in its own process (like the bare node:http server of bench/server.ts) on
// 127.0.0.1:0 and has two modes:
//   - record (at start): every request is forwarded to the real `airlock serve` (AIRLOCK_CANNED_TARGET),
//     and its answer (status, headers, whole body) is kept under "METHOD path?query" and passed back;
//   - replay (after POST /__canned/replay): each request is answered at once with the answer kept for
//     its key; an unknown key is a 599 that names it (the bench fails loudly, never measures a miss).
// The bench drives each SDK through one or two cycles in record mode, then times them in replay mode:
// the create answer names the recorded sandbox, so the SDK's later calls hit the same recorded paths.
// What replay costs is the SDK's own work, one loopback TCP round trip per call, and node:http.
// Run as a script: `node --import tsx bench/canned-server.ts`; prints its port on stdout.
import http from 'node:http';
import { fileURLToPath } from 'node:url';

interface Canned {
  readonly status: number;
  readonly headers: Record<string, string | string[]>;
  readonly body: Buffer;
}

/** Headers that describe one connection or one framing, not the answer: never replayed. */
const HOP_HEADERS = new Set(['connection', 'keep-alive', 'transfer-encoding', 'date', 'content-length']);

function readBody(req: http.IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.once('end', () => resolve(Buffer.concat(parts)));
    req.once('error', reject);
  });
}

function send(res: http.ServerResponse, a: Canned): void {
  res.writeHead(a.status, { ...a.headers, 'content-length': a.body.length });
  res.end(a.body);
}

/** Forward one request to `target` and keep its whole answer. */
async function forward(target: URL, req: http.IncomingMessage): Promise<Canned> {
  const body = await readBody(req);
  return new Promise((resolve, reject) => {
    const out = http.request(
      {
        host: target.hostname,
        port: target.port,
        method: req.method,
        path: req.url,
        headers: { ...req.headers, host: target.host },
      },
      (res) => {
        void readBody(res).then((b) => {
          const headers: Record<string, string | string[]> = {};
          for (const [k, v] of Object.entries(res.headers))
            if (v !== undefined && !HOP_HEADERS.has(k)) headers[k] = v;
          resolve({ status: res.statusCode ?? 500, headers, body: b });
        }, reject);
      },
    );
    out.once('error', reject);
    out.end(body);
  });
}

function main(): void {
  const target = new URL(process.env.AIRLOCK_CANNED_TARGET ?? '');
  const kept = new Map<string, Canned>();
  let replay = false;
  const server = http.createServer((req, res) => {
    const key = `${req.method} ${req.url}`;
    if (key === 'POST /__canned/replay') {
      replay = true;
      req.resume();
      return send(res, { status: 200, headers: {}, body: Buffer.from(String(kept.size)) });
    }
    if (replay) {
      const a = kept.get(key);
      req.resume();
      if (a) return send(res, a);
      return send(res, { status: 599, headers: {}, body: Buffer.from(`no canned answer for ${key}`) });
    }
    forward(target, req).then(
      (a) => {
        kept.set(key, a);
        send(res, a);
      },
      (e: Error) => send(res, { status: 502, headers: {}, body: Buffer.from(e.message) }),
    );
  });
  server.listen(0, '127.0.0.1', () => {
    process.stdout.write(`${(server.address() as { port: number }).port}\n`);
  });
  process.once('SIGTERM', () => process.exit(0));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) main();
