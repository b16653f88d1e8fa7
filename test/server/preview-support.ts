// Shared by the preview-URL tests: the fixture servers (test/fixtures/preview/) started INSIDE a
// sandbox, each awaited until it prints "ready" (it listens), never by sleeping.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Sandbox } from '../../src/sandbox/index.js';

const FIXTURES = join(import.meta.dirname, '..', 'fixtures', 'preview');

/** Run fixture `file` (python3 file PORT) in `sbx`; resolves once it listens on `port`. */
async function startFixture(sbx: Sandbox, file: string, port: number): Promise<void> {
  await sbx.files.write(`/tmp/${file}`, readFileSync(join(FIXTURES, file), 'utf8'));
  let ready!: () => void;
  const listening = new Promise<void>((r) => (ready = r));
  let out = '';
  const h = await sbx.exec(['python3', `/tmp/${file}`, String(port)], {
    background: true,
    onStdout: (t) => {
      out += t;
      if (out.includes('ready')) ready();
    },
  });
  await Promise.race([
    listening,
    h.wait().then((r) => {
      throw new Error(`${file} exited before it listened: ${r.exitCode} ${r.stderr}`);
    }),
  ]);
}

/** The HTTP server (GET /hello, POST /echo, GET /stream, GET /headers) on `port` inside `sbx`. */
export const startHttpServer = (sbx: Sandbox, port: number): Promise<void> =>
  startFixture(sbx, 'http_server.py', port);

/** The WebSocket echo server on `port` inside `sbx`. */
export const startWsEcho = (sbx: Sandbox, port: number): Promise<void> =>
  startFixture(sbx, 'ws_echo.py', port);
