// Shared by the preview-URL tests: the fixture servers (test/fixtures/preview/) started INSIDE a
// sandbox, each awaited until it prints "ready" (it listens), never by sleeping.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import { AirlockError } from '../../src/core/errors.js';
import type { Airlock } from '../../src/sandbox/airlock.js';
import type { Sandbox } from '../../src/sandbox/index.js';
import type { Caller, SandboxApi, SandboxView } from '../../src/server/contract.js';
import type { PreviewAccess } from '../../src/server/preview.js';

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

export type PortApi = Pick<Required<SandboxApi>, 'get' | 'connectPort'>;

/** get + connectPort over the real library, counting connections made and still open. */
export class LibraryPorts implements PortApi {
  readonly access = new Map<string, PreviewAccess>();
  connects = 0;
  readonly open = new Set<Duplex>();
  constructor(private readonly airlock: Airlock) {}
  private sbx(id: string): Sandbox {
    try {
      return this.airlock.get(id);
    } catch {
      throw new AirlockError('SANDBOX_NOT_FOUND', `no sandbox ${id}`);
    }
  }
  async get(id: string, _c?: Caller): Promise<SandboxView> {
    const s = this.sbx(id);
    const a = this.access.get(id);
    return {
      id,
      state: s.paused ? 'paused' : 'running',
      backend: s.info.backend,
      createdAt: s.info.createdAt.toISOString(),
      expiresAt: s.info.expiresAt?.toISOString() ?? null,
      metadata: {},
      ...a,
    };
  }
  async connectPort(id: string, port: number, _c: Caller, signal?: AbortSignal): Promise<Duplex> {
    this.connects++;
    const s = await this.sbx(id).connectPort(port, signal ? { signal } : {});
    this.open.add(s);
    s.once('close', () => this.open.delete(s));
    return s;
  }
  /** Resolves once every connection into a sandbox has closed. */
  async allClosed(): Promise<void> {
    await Promise.all(
      [...this.open].map((s) => new Promise((r) => (s.destroyed ? r(0) : s.once('close', r)))),
    );
  }
}

/** The one-port web app (page, /echo, /ws: test/fixtures/preview/browser_app.py) on `port` in `sbx`. */
export const startBrowserApp = (sbx: Sandbox, port: number): Promise<void> =>
  startFixture(sbx, 'browser_app.py', port);
