// Malformed frames against both entry points of the MCP gateway: the seeded corpus of >= 10,000 broken
// JSON-RPC messages (test/fixtures/mcp/malformed-corpus.ts) written as raw bytes to the real
// `airlock mcp` CLI (stdio) and POSTed one by one to the Streamable HTTP gateway. No crash, no hang:
// every message is answered (a JSON-RPC error when it carried a usable request id) or dropped with a
// logged reason, and the session keeps working (pings between the broken frames, a listing at the end).
// Expectations are computed per line with parseMessage, the one parser both entry points use; the
// corpus is built against an independent oracle (JSON.parse), and this file checks every byte the
// gateway writes back with JSON.parse too.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FRAME_LIMITS, parseMessage, type JsonRpcId, type ParseResult } from '../../src/mcp/frame.js';
import type { Airlock } from '../../src/sandbox/airlock.js';
import { malformedCorpus, type CorpusEntry } from '../fixtures/mcp/malformed-corpus.js';
import {
  canRunNamespaces,
  NO_RESIDUE,
  residue,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  testAirlock,
} from '../helpers.js';
import { FIXTURE, ROOT, startGateway, type TestGateway } from './harness.js';

const PROTOCOL_VERSION = '2025-06-18';
const PING_EVERY = 500;
/** Longest wait for any one answer: far above the real figures (ms), far below the test timeout. */
const ANSWER_TIMEOUT_MS = 30_000;
const HTTP_IN_FLIGHT = 16;
/** Every how many-th corpus entry goes over HTTP without an mcp-session-id. */
const HTTP_NO_SESSION_EVERY = 8;

// ---- expectations -------------------------------------------------------------------------------

type Outcome =
  | { kind: 'frame_error'; code: string; id?: JsonRpcId } // logged; answered too when it has an id
  | { kind: 'request'; id: JsonRpcId } // a valid request the session must answer with an error
  | { kind: 'other_message' } // a valid response or notification: nothing to answer
  | { kind: 'blank' }; // an empty line: no message at all on a line-delimited stream

function outcomeOf(r: ParseResult): Outcome {
  if (!r.ok)
    return r.id === undefined
      ? { kind: 'frame_error', code: r.code }
      : { kind: 'frame_error', code: r.code, id: r.id };
  const m = r.message;
  return 'method' in m && 'id' in m ? { kind: 'request', id: m.id } : { kind: 'other_message' };
}

/** The stdio lines of one entry written with a trailing '\n', as the newline framing splits them. */
function stdioLines(bytes: Buffer): Buffer[] {
  const lines: Buffer[] = [];
  let start = 0;
  for (;;) {
    const nl = bytes.indexOf(0x0a, start);
    lines.push(bytes.subarray(start, nl === -1 ? bytes.length : nl));
    if (nl === -1) return lines;
    start = nl + 1;
  }
}

function stdioOutcomes(entry: CorpusEntry): Outcome[] {
  return stdioLines(entry.bytes).map((raw) => {
    // One trailing CR is part of the line ending (and of the frame-size limit).
    if (raw.length > FRAME_LIMITS.maxFrameBytes) return { kind: 'frame_error', code: 'oversized' };
    const line = raw.length > 0 && raw[raw.length - 1] === 0x0d ? raw.subarray(0, raw.length - 1) : raw;
    return line.length === 0 ? { kind: 'blank' } : outcomeOf(parseMessage(line));
  });
}

const idKey = (id: unknown): string => JSON.stringify(id);
const sortedKeys = (ids: readonly unknown[]): string[] => ids.map(idKey).sort();
function tally(codes: readonly string[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const c of codes) out[c] = (out[c] ?? 0) + 1;
  return out;
}

// ---- an independent check of what the gateway writes back ------------------------------------------

interface WireMessage {
  jsonrpc: '2.0';
  id?: JsonRpcId | null;
  method?: string;
  result?: Record<string, unknown>;
  error?: { code: number; message: string };
}

/** JSON.parse (not the gateway's parser) plus the JSON-RPC 2.0 envelope rules; the reason if invalid. */
function checkWire(text: string): { ok: true; msg: WireMessage } | { ok: false; why: string } {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    return { ok: false, why: `not JSON: ${(e as Error).message}` };
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return { ok: false, why: 'not an object' };
  const m = v as Record<string, unknown>;
  const isId = (x: unknown): boolean => typeof x === 'string' || Number.isSafeInteger(x);
  if (m.jsonrpc !== '2.0') return { ok: false, why: 'jsonrpc is not "2.0"' };
  if ('method' in m) {
    if (typeof m.method !== 'string' || m.method === '') return { ok: false, why: 'bad method' };
    if ('id' in m && !isId(m.id)) return { ok: false, why: 'bad request id' };
    if ('params' in m && (typeof m.params !== 'object' || m.params === null || Array.isArray(m.params)))
      return { ok: false, why: 'bad params' };
    return { ok: true, msg: m as unknown as WireMessage };
  }
  if ('result' in m === 'error' in m) return { ok: false, why: 'needs exactly one of result and error' };
  if ('result' in m) {
    if (!isId(m.id)) return { ok: false, why: 'result without a usable id' };
    if (typeof m.result !== 'object' || m.result === null || Array.isArray(m.result))
      return { ok: false, why: 'result is not an object' };
    return { ok: true, msg: m as unknown as WireMessage };
  }
  if ('id' in m && m.id !== null && !isId(m.id)) return { ok: false, why: 'bad error id' };
  const err = m.error as Record<string, unknown> | null;
  if (
    typeof err !== 'object' ||
    err === null ||
    !Number.isSafeInteger(err.code) ||
    typeof err.message !== 'string'
  )
    return { ok: false, why: 'bad error object' };
  return { ok: true, msg: m as unknown as WireMessage };
}

const rssKiB = (pid: number): number =>
  Number(/^VmRSS:\s+(\d+)\s+kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? NaN);
const hwmKiB = (pid: number): number =>
  Number(/^VmHWM:\s+(\d+)\s+kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? NaN);

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}

// ---- stdio: the real `airlock mcp` CLI on raw pipes --------------------------------------------------

const DROPPED_LINE = '[airlock] dropped a broken frame from the client: ';

class CliProcess {
  readonly child: ChildProcessWithoutNullStreams;
  /** Every stdout line that is not valid JSON-RPC, with the reason. */
  readonly invalid: Array<{ line: string; why: string }> = [];
  /** Responses whose id is not one of the test's own. */
  readonly corpusResponses: WireMessage[] = [];
  readonly notifications: WireMessage[] = [];
  droppedLines = 0;
  stderrTail = '';
  readonly exited: Promise<number | null>;
  private readonly waiters = new Map<string, (m: WireMessage) => void>();
  private readonly own = new Map<string, WireMessage>();
  private out: Buffer = Buffer.alloc(0);
  private err = '';

  constructor(args: string[], cwd: string) {
    this.child = spawn(process.execPath, ['--import', 'tsx', `${ROOT}/src/cli/main.ts`, 'mcp', ...args], {
      cwd,
      env: {
        PATH: process.env.PATH ?? '/usr/bin:/bin',
        HOME: process.env.HOME ?? '/root',
        AIRLOCK_STATE_DIR: TEST_STATE_DIR,
        AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
      },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    this.exited = new Promise((resolve) => this.child.on('close', (code) => resolve(code)));
    this.child.stdout.on('data', (b: Buffer) => this.onStdout(b));
    this.child.stderr.setEncoding('utf8').on('data', (t: string) => this.onStderr(t));
  }

  private onStdout(b: Buffer): void {
    this.out = this.out.length ? Buffer.concat([this.out, b]) : b;
    let nl: number;
    while ((nl = this.out.indexOf(0x0a)) !== -1) {
      const line = this.out.subarray(0, nl).toString('utf8');
      this.out = this.out.subarray(nl + 1);
      const c = checkWire(line);
      if (!c.ok) {
        this.invalid.push({ line: line.slice(0, 200), why: c.why });
        continue;
      }
      // The gateway never writes what its own parser would refuse.
      const strict = parseMessage(line);
      if (!strict.ok) this.invalid.push({ line: line.slice(0, 200), why: `parseMessage: ${strict.reason}` });
      const m = c.msg;
      if (m.method !== undefined) {
        this.notifications.push(m);
        continue;
      }
      const waiter = this.waiters.get(idKey(m.id));
      if (waiter && !this.own.has(idKey(m.id))) {
        this.own.set(idKey(m.id), m);
        waiter(m);
      } else this.corpusResponses.push(m);
    }
  }

  private onStderr(t: string): void {
    this.err += t;
    const lines = this.err.split('\n');
    this.err = lines.pop()!;
    for (const l of lines) {
      if (l.startsWith(DROPPED_LINE)) this.droppedLines++;
      else this.stderrTail = `${this.stderrTail}${l}\n`.slice(-8000);
    }
  }

  async write(data: Buffer | string): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null)
      throw new Error(
        `airlock mcp exited (${this.child.exitCode ?? this.child.signalCode}): ${this.stderrTail}`,
      );
    if (this.child.stdin.write(data)) return;
    await Promise.race([
      once(this.child.stdin, 'drain'),
      this.exited.then((code) => {
        throw new Error(`airlock mcp exited (${code}) while the test was writing: ${this.stderrTail}`);
      }),
    ]);
  }

  /** Send a request of the test's own and wait for its response. */
  async call(id: string, method: string, params?: Record<string, unknown>): Promise<WireMessage> {
    const answered = new Promise<WireMessage>((resolve) => this.waiters.set(idKey(id), resolve));
    await this.write(`${JSON.stringify({ jsonrpc: '2.0', id, method, ...(params ? { params } : {}) })}\n`);
    return withTimeout(
      Promise.race([
        answered,
        this.exited.then((code): never => {
          throw new Error(`airlock mcp exited (${code}) before answering ${method}: ${this.stderrTail}`);
        }),
      ]),
      ANSWER_TIMEOUT_MS,
      `${method} (${id}) over stdio`,
    );
  }
}

const NEWLINE = Buffer.from('\n');

/** The CLI in `dir`, fronting the hostile fixture, initialized (initialize + initialized). */
async function startInitializedCli(dir: string, auditLog: string, server: string[]): Promise<CliProcess> {
  const cli = new CliProcess(
    ['--audit-log', auditLog, '--lockfile', join(dir, 'airlock.lock.json'), '--', ...server],
    ROOT,
  );
  try {
    const init = await cli.call('init', 'initialize', {
      protocolVersion: PROTOCOL_VERSION,
      capabilities: {},
      clientInfo: { name: 'malformed-test', version: '1' },
    });
    expect(init.result, JSON.stringify(init)).toMatchObject({ protocolVersion: PROTOCOL_VERSION });
    await cli.write(`${JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' })}\n`);
    return cli;
  } catch (e) {
    await stopCli(cli);
    throw e;
  }
}

/** Make sure the CLI is gone (SIGTERM if it still runs). */
async function stopCli(cli: CliProcess): Promise<void> {
  if (cli.child.exitCode !== null || cli.child.signalCode !== null) return;
  cli.child.stdin.destroy();
  cli.child.kill('SIGTERM');
  await withTimeout(cli.exited, ANSWER_TIMEOUT_MS, 'airlock mcp to exit on SIGTERM').catch(() => {});
}

interface AuditLine {
  kind: string;
  method: string;
  server: string;
  decision: string;
  code?: string;
}
const readAudit = (path: string): AuditLine[] =>
  (existsSync(path) ? readFileSync(path, 'utf8') : '')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as AuditLine);

// ---- HTTP: raw requests on a keep-alive agent ------------------------------------------------------

interface HttpAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  contentType: string;
  body: string;
  /** JSON-RPC messages in the body (a JSON body, or the data: lines of an SSE stream). */
  messages: Array<{ ok: true; msg: WireMessage } | { ok: false; why: string }>;
}

function post(
  agent: Agent,
  port: number,
  headers: Record<string, string>,
  body: Buffer | string,
): Promise<HttpAnswer> {
  return withTimeout(
    new Promise<HttpAnswer>((resolve, reject) => {
      const req = request(
        {
          agent,
          host: '127.0.0.1',
          port,
          path: '/mcp',
          method: 'POST',
          headers: {
            host: `127.0.0.1:${port}`,
            'content-type': 'application/json',
            accept: 'application/json, text/event-stream',
            'content-length': String(Buffer.byteLength(body)),
            ...headers,
          },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('error', reject);
          res.on('end', () => {
            const text = Buffer.concat(chunks).toString('utf8');
            const contentType = String(res.headers['content-type'] ?? '');
            const payloads = contentType.startsWith('text/event-stream')
              ? text
                  .split('\n')
                  .filter((l) => l.startsWith('data:'))
                  .map((l) => l.slice(5).trim())
                  .filter((l) => l.length > 0)
              : text.length > 0
                ? [text]
                : [];
            resolve({
              status: res.statusCode ?? 0,
              headers: res.headers,
              contentType,
              body: text,
              messages: payloads.map(checkWire),
            });
          });
        },
      );
      req.on('error', reject);
      req.end(body);
    }),
    ANSWER_TIMEOUT_MS,
    'an HTTP POST to the gateway',
  );
}

/** Run `f` over `items` with at most `n` in flight. */
async function pool<T>(
  items: readonly T[],
  n: number,
  f: (item: T, index: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const k = next++;
      await f(items[k]!, k);
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
}

// ---- the suite --------------------------------------------------------------------------------------

if (!canRunNamespaces) {
  describe('mcp malformed frames', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
} else {
  describe('mcp malformed frames', () => {
    const corpus = malformedCorpus();
    const [NODE, ...HOSTILE_ARGS] = FIXTURE('hostile-server.ts');

    afterAll(() => {
      expect(residue()).toEqual(NO_RESIDUE);
    });

    it('the corpus holds at least 10,000 broken messages', () => {
      expect(corpus.length).toBeGreaterThanOrEqual(10_000);
      const semantic = corpus.filter((e) => e.name.startsWith('semantic:'));
      expect(semantic.length).toBeGreaterThan(0);
      // Everything that is not `semantic:` is refused by the parser, whole and line by line.
      for (const e of corpus) {
        const whole = parseMessage(e.bytes);
        if (e.name.startsWith('semantic:')) expect(whole.ok, e.name).toBe(true);
        else expect(whole.ok, e.name).toBe(false);
      }
    });

    describe('stdio: airlock mcp', () => {
      let dir: string;
      beforeAll(() => {
        dir = mkdtempSync(join(tmpdir(), 'airlock-malformed-'));
      });
      afterAll(() => rmSync(dir, { recursive: true, force: true }));

      it('answers or logs every broken line, keeps the session alive and its memory bounded', async () => {
        const auditLog = join(dir, 'audit.jsonl');
        const cli = await startInitializedCli(dir, auditLog, [NODE!, ...HOSTILE_ARGS]);
        try {
          const pid = cli.child.pid!;
          const rssBefore = rssKiB(pid);

          const started = performance.now();
          let pings = 0;
          for (const [k, e] of corpus.entries()) {
            await cli.write(Buffer.concat([e.bytes, NEWLINE]));
            if ((k + 1) % PING_EVERY === 0) {
              const pong = await cli.call(`ping-${k + 1}`, 'ping');
              expect(pong, `ping after entry ${k + 1} (${e.name})`).toMatchObject({ result: {} });
              pings++;
            }
          }
          const list = await cli.call('final-list', 'tools/list');
          const wallMs = performance.now() - started;
          const tools = (list.result?.tools ?? []) as Array<{ name: string }>;
          expect(
            tools.map((t) => t.name),
            JSON.stringify(list).slice(0, 500),
          ).toContain('echo');
          const rssAfter = rssKiB(pid);
          const rssPeak = hwmKiB(pid);
          expect(cli.child.exitCode).toBeNull();
          expect(cli.child.signalCode).toBeNull();

          // Expectations, line by line, from the parser the CLI uses.
          const outcomes = corpus.map(stdioOutcomes);
          const flat = outcomes.flat();
          const frameErrors = flat.filter((o) => o.kind === 'frame_error');
          const answerable = flat.flatMap((o) =>
            (o.kind === 'frame_error' && o.id !== undefined) || o.kind === 'request' ? [o.id] : [],
          );
          // Every entry is accounted for: a logged frame error or a request the session answers, except
          // the zero-byte entry (a blank line is no message) and valid responses/notifications (below).
          const unaccounted = corpus.filter(
            (_, k) => !outcomes[k]!.some((o) => o.kind === 'frame_error' || o.kind === 'request'),
          );
          expect(unaccounted.map((e) => e.name).sort()).toEqual(
            corpus
              .filter((e, k) => e.bytes.length === 0 || outcomes[k]!.every((o) => o.kind === 'other_message'))
              .map((e) => e.name)
              .sort(),
          );
          expect(unaccounted.map((e) => e.name)).toContain('empty:zero-bytes');

          // Close stdin: the CLI ends the session and exits cleanly; every byte it wrote is read.
          cli.child.stdin.end();
          const code = await withTimeout(
            cli.exited,
            ANSWER_TIMEOUT_MS,
            'airlock mcp to exit after stdin closed',
          );
          expect(code, cli.stderrTail).toBe(0);

          expect(cli.invalid, 'stdout lines that are not valid JSON-RPC').toEqual([]);
          // Exactly one error response per answerable line, with its id; never a result.
          expect(cli.corpusResponses.filter((m) => m.error === undefined)).toEqual([]);
          expect(sortedKeys(cli.corpusResponses.map((m) => m.id))).toEqual(sortedKeys(answerable));
          // Exactly one audit event and one stderr line per broken line, with the parser's code.
          const frameEvents = readAudit(auditLog).filter(
            (e) => e.kind === 'mcp' && e.method === 'frame' && e.server === '*',
          );
          expect(frameEvents.every((e) => e.code?.startsWith('frame_'))).toBe(true);
          expect(tally(frameEvents.map((e) => e.code!))).toEqual(
            tally(frameErrors.map((o) => `frame_${(o as { code: string }).code}`)),
          );
          expect(cli.droppedLines).toBe(frameErrors.length);
          expect(frameEvents.length).toBe(frameErrors.length);
          expect(cli.corpusResponses.length).toBe(answerable.length);

          // Memory stays bounded: the framer holds at most one 4 MiB line; 11 MB of junk went through.
          const growMiB = (rssAfter - rssBefore) / 1024;
          console.info(
            `stdio: ${corpus.length} entries (${flat.length} lines, ${frameErrors.length} frame errors, ` +
              `${answerable.length} answered) + ${pings} pings in ${(wallMs / 1000).toFixed(1)} s; ` +
              `VmRSS ${(rssBefore / 1024).toFixed(0)} -> ${(rssAfter / 1024).toFixed(0)} MiB ` +
              `(peak ${(rssPeak / 1024).toFixed(0)} MiB)`,
          );
          expect(growMiB).toBeLessThan(256);
        } finally {
          await stopCli(cli);
        }
        expect(residue()).toEqual(NO_RESIDUE);
      }, 600_000);

      it(`logs every valid message it drops unanswered`, async () => {
        // Valid responses to ids nobody asked and notifications nobody handles: JSON-RPC forbids an
        // answer, so the reason must be in the log.
        const drops = corpus.filter((e) => stdioOutcomes(e).every((o) => o.kind === 'other_message'));
        expect(drops.length).toBeGreaterThan(0);
        const auditLog = join(dir, 'drops.jsonl');
        const cli = await startInitializedCli(dir, auditLog, [NODE!, ...HOSTILE_ARGS]);
        try {
          for (const e of drops) await cli.write(Buffer.concat([e.bytes, NEWLINE]));
          expect(await cli.call('after-drops', 'ping')).toMatchObject({ result: {} });
          const logged = readAudit(auditLog).filter(
            (e) => e.kind === 'mcp' && e.decision === 'error' && e.method !== 'frame',
          );
          expect(logged, JSON.stringify(logged)).toHaveLength(drops.length);
          expect(cli.corpusResponses).toEqual([]);
        } finally {
          await stopCli(cli);
        }
      }, 120_000);
    });

    describe('http: the Streamable HTTP gateway', () => {
      let airlock: Airlock;
      let gw: TestGateway;
      let agent: Agent;
      let sessionId: string;
      let auth: Record<string, string>;

      beforeAll(async () => {
        airlock = testAirlock();
        gw = await startGateway(airlock, {
          h: { command: NODE, args: HOSTILE_ARGS, airlock: { boundary: 'per-server', namespace: false } },
        });
        agent = new Agent({ keepAlive: true, maxSockets: HTTP_IN_FLIGHT });
        auth = { authorization: `Bearer ${gw.tokens.alice}` };
        const init = await post(
          agent,
          gw.port,
          auth,
          JSON.stringify({
            jsonrpc: '2.0',
            id: 'init',
            method: 'initialize',
            params: {
              protocolVersion: PROTOCOL_VERSION,
              capabilities: {},
              clientInfo: { name: 'malformed-test', version: '1' },
            },
          }),
        );
        expect(init.status, init.body).toBe(200);
        expect(init.messages, init.body).toMatchObject([{ ok: true, msg: { id: 'init', result: {} } }]);
        sessionId = String(init.headers['mcp-session-id']);
        expect(sessionId).toMatch(/^[0-9a-f-]{36}$/);
        const initialized = await post(
          agent,
          gw.port,
          { ...auth, 'mcp-session-id': sessionId, 'mcp-protocol-version': PROTOCOL_VERSION },
          JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }),
        );
        expect(initialized.status, initialized.body).toBe(202);
      }, 120_000);

      afterAll(async () => {
        agent?.destroy();
        await gw?.close();
        await airlock?.killAll();
      }, 60_000);

      it('answers every broken body with a 4xx JSON-RPC error, never a 5xx or a hang', async () => {
        const session = { ...auth, 'mcp-session-id': sessionId, 'mcp-protocol-version': PROTOCOL_VERSION };
        const failures: string[] = [];
        const framesBefore = gw.events.filter((e) => e.kind === 'mcp' && e.method === 'http').length;
        const expectedFrameCodes: string[] = [];
        let statuses: Record<string, number> = {};
        const check = async (e: CorpusEntry, withSession: boolean): Promise<void> => {
          const r = await post(agent, gw.port, withSession ? session : auth, e.bytes);
          statuses = { ...statuses, [r.status]: (statuses[r.status] ?? 0) + 1 };
          const fail = (why: string): void =>
            void failures.push(
              `${e.name} (${withSession ? 'session' : 'no session'}): ${why}; ${r.status} ${r.body.slice(0, 200)}`,
            );
          if (r.status >= 500 || r.status < 200) return fail('status');
          const bad = r.messages.find((m) => !m.ok);
          if (bad && !bad.ok) return fail(`invalid JSON-RPC in the answer: ${bad.why}`);
          const msgs = r.messages.flatMap((m) => (m.ok ? [m.msg] : []));
          if (e.bytes.length > FRAME_LIMITS.maxFrameBytes) {
            expectedFrameCodes.push('frame_oversized');
            if (r.status !== 413 || msgs.length !== 1 || !msgs[0]!.error)
              fail('oversized body not refused with 413');
            return;
          }
          const parsed = parseMessage(e.bytes);
          if (!parsed.ok) {
            expectedFrameCodes.push(`frame_${parsed.code}`);
            const invalidRequest = ['not_object', 'batch_unsupported', 'invalid_jsonrpc'].includes(
              parsed.code,
            );
            const m = msgs[0];
            if (r.status !== 400 || msgs.length !== 1 || !m?.error)
              return fail('broken frame not answered with 400 + error');
            if (m.error.code !== (invalidRequest ? -32600 : -32700)) fail(`error code ${m.error.code}`);
            if (idKey(m.id) !== idKey(parsed.id ?? null))
              fail(`id ${idKey(m.id)}, expected ${idKey(parsed.id ?? null)}`);
            return;
          }
          // A valid envelope (semantic:): a request gets a JSON-RPC error, anything else 202.
          const o = outcomeOf(parsed);
          if (msgs.some((m) => m.result !== undefined)) return fail('a semantic entry got a result');
          if (!withSession || o.kind !== 'request') {
            if (!withSession && !(r.status >= 400 && r.status < 500 && msgs.length === 1 && msgs[0]!.error))
              fail('no 4xx + JSON-RPC error without a session');
            if (withSession && r.status !== 202) fail('a response/notification was not accepted with 202');
            return;
          }
          const answered = msgs.some((m) => m.error && idKey(m.id) === idKey(o.id));
          const refused = r.status >= 400 && r.status < 500 && msgs.length === 1 && msgs[0]!.error;
          if (!answered && !refused) fail('request not answered with an error');
        };

        const started = performance.now();
        await pool(corpus, HTTP_IN_FLIGHT, (e, k) =>
          check(e, k % HTTP_NO_SESSION_EVERY !== HTTP_NO_SESSION_EVERY - 1),
        );
        // The valid envelopes once more each way, one at a time (their ids repeat: no two in flight).
        for (const e of corpus.filter((x) => x.name.startsWith('semantic:'))) {
          await check(e, true);
          await check(e, false);
        }
        const wallMs = performance.now() - started;
        const total = corpus.length + 2 * corpus.filter((x) => x.name.startsWith('semantic:')).length;
        console.info(
          `http: ${total} POSTs, ${HTTP_IN_FLIGHT} in flight on keep-alive, in ${(wallMs / 1000).toFixed(1)} s ` +
            `(${((total / wallMs) * 1000).toFixed(0)} req/s); statuses ${JSON.stringify(statuses)}`,
        );
        expect(failures.slice(0, 20), `${failures.length} failures`).toEqual([]);

        // One audit event per broken frame (the parser's code), none lost.
        const frames = gw.events
          .filter((e) => e.kind === 'mcp' && e.method === 'http')
          .slice(framesBefore)
          .flatMap((e) => (e.kind === 'mcp' && e.code?.startsWith('frame_') ? [e.code] : []));
        expect(tally(frames)).toEqual(tally(expectedFrameCodes));

        // The session still works.
        const pong = await post(agent, gw.port, session, '{"jsonrpc":"2.0","id":"after","method":"ping"}');
        expect(pong.status, pong.body).toBe(200);
        expect(pong.messages).toEqual([{ ok: true, msg: { jsonrpc: '2.0', id: 'after', result: {} } }]);
        const c = await gw.client('bob');
        expect((await c.listTools()).tools.map((t) => t.name)).toContain('echo');
      }, 600_000);

      it(`keeps no gateway session for an initialize that did not initialize`, async () => {
        const inits = corpus.filter((e) => {
          const r = parseMessage(e.bytes);
          return r.ok && 'method' in r.message && r.message.method === 'initialize';
        });
        expect(inits.length).toBeGreaterThan(0);
        const leaked = (): number => gw.core.sessionCount - gw.front.sessionCount;
        const before = leaked();
        for (const e of inits) {
          const r = await post(agent, gw.port, auth, e.bytes);
          expect(r.status, r.body).toBe(400);
        }
        expect(leaked()).toBe(before);
      });

      it(`answers a request whose id is already in flight in its session`, async () => {
        const session = { ...auth, 'mcp-session-id': sessionId, 'mcp-protocol-version': PROTOCOL_VERSION };
        const call = (ms: number): string =>
          JSON.stringify({
            jsonrpc: '2.0',
            id: 'dup',
            method: 'tools/call',
            params: { name: 'sleep', arguments: { ms } },
          });
        const first = post(agent, gw.port, session, call(1_000));
        await new Promise((r) => setTimeout(r, 200)); // the first call is running on the server
        const second = await post(agent, gw.port, session, call(0));
        // The reuse is refused (or answered) without taking the first request's answer.
        expect(second.messages.length, second.body).toBe(1);
        const a = await first; // post() fails after ANSWER_TIMEOUT_MS: a hang fails here
        expect(a.messages, a.body).toMatchObject([
          { ok: true, msg: { id: 'dup', result: { content: [{ type: 'text', text: 'slept 1000 ms' }] } } },
        ]);
      }, 60_000);
    });
  });
}
