// The MCP transport contract against the stdio entry point: the real `airlock mcp` CLI fronting the
// hostile fixture in a real sandbox. Raw bytes go to one CLI's stdin (newline framing, written as the
// case says); the guard cases use the official SDK client on a second CLI.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { JsonRpcId } from '../../src/mcp/frame.js';
import { canRunNamespaces, SKIP_REASON, TEST_STATE_DIR, TEST_UID_RANGE } from '../helpers.js';
import { FIXTURE, ROOT, startCli } from './harness.js';
import {
  transportContract,
  type AuditedFinding,
  type TransportUnderTest,
  type WireAnswer,
  type WireMessage,
} from './transport.contract.js';

const HOSTILE = FIXTURE('hostile-server.ts');
const DROPPED_LINE = '[airlock] dropped a broken frame from the client: ';
/** Longest wait for any one answer: far above the real figures, far below the test timeout. */
const ANSWER_TIMEOUT_MS = 30_000;

interface AuditLine {
  kind: string;
  method: string;
  server: string;
  tool?: string;
  decision: string;
  code?: string;
  findings?: Array<{ ruleId: string; location: string }>;
}
const readAudit = (path: string): AuditLine[] =>
  (existsSync(path) ? readFileSync(path, 'utf8') : '')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as AuditLine);

/** `airlock mcp` on raw pipes: every stdout line read with JSON.parse, collected in order. */
class RawCli {
  readonly child: ChildProcessWithoutNullStreams;
  readonly received: WireMessage[] = [];
  readonly exited: Promise<number | null>;
  stderr = '';
  /** stderr lines naming a dropped broken frame from the client. */
  droppedLines = 0;
  private out: Buffer = Buffer.alloc(0);
  private wake: (() => void) | undefined;

  constructor(args: string[]) {
    this.child = spawn(process.execPath, ['--import', 'tsx', `${ROOT}/src/cli/main.ts`, 'mcp', ...args], {
      cwd: ROOT,
      env: {
        PATH: process.env.PATH ?? '/usr/bin:/bin',
        HOME: process.env.HOME ?? '/root',
        AIRLOCK_STATE_DIR: TEST_STATE_DIR,
        AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
      },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    this.exited = new Promise((resolve) => this.child.on('close', (code) => resolve(code)));
    let errLine = '';
    this.child.stderr.setEncoding('utf8').on('data', (t: string) => {
      this.stderr = (this.stderr + t).slice(-8000);
      const lines = (errLine + t).split('\n');
      errLine = lines.pop()!;
      this.droppedLines += lines.filter((l) => l.startsWith(DROPPED_LINE)).length;
    });
    this.child.stdout.on('data', (chunk: Buffer) => {
      this.out = Buffer.concat([this.out, chunk]);
      let nl: number;
      while ((nl = this.out.indexOf(0x0a)) !== -1) {
        const line = this.out.subarray(0, nl).toString('utf8');
        this.out = this.out.subarray(nl + 1);
        // JSON.parse throws on a line that is not JSON: the gateway must never write one.
        this.received.push(JSON.parse(line) as WireMessage);
      }
      this.wake?.();
    });
  }

  async write(data: Buffer): Promise<void> {
    if (this.child.exitCode !== null) throw new Error(`airlock mcp exited: ${this.stderr}`);
    if (!this.child.stdin.write(data)) await once(this.child.stdin, 'drain');
  }

  /** Resolve once every id in `ids` was answered (fails after ANSWER_TIMEOUT_MS or if the CLI exits). */
  async answered(ids: readonly JsonRpcId[], from: number): Promise<void> {
    const deadline = Date.now() + ANSWER_TIMEOUT_MS;
    const missing = (): JsonRpcId[] =>
      ids.filter((id) => !this.received.slice(from).some((m) => m.id === id && m.method === undefined));
    while (missing().length > 0) {
      if (this.child.exitCode !== null) throw new Error(`airlock mcp exited: ${this.stderr}`);
      if (Date.now() > deadline)
        throw new Error(`no answer for ${JSON.stringify(missing())}: ${this.stderr}`);
      await Promise.race([
        new Promise<void>((r) => (this.wake = r)),
        this.exited,
        new Promise((r) => setTimeout(r, 1_000)),
      ]);
    }
  }
}

async function connectStdio(): Promise<TransportUnderTest> {
  const dir = mkdtempSync(join(tmpdir(), 'airlock-transport-'));
  const rawAudit = join(dir, 'raw-audit.jsonl');
  const sdkAudit = join(dir, 'sdk-audit.jsonl');
  const raw = new RawCli(['--audit-log', rawAudit, '--lockfile', join(dir, 'a.lock.json'), '--', ...HOSTILE]);
  const sdk = await startCli([
    '--audit-log',
    sdkAudit,
    '--lockfile',
    join(dir, 'b.lock.json'),
    '--',
    ...HOSTILE,
  ]);
  let fence = 0;

  /** Everything received after `from`, up to a fence ping written after the frames (excluded). */
  const exchange = async (write: () => Promise<void>, waitFor: readonly JsonRpcId[]): Promise<WireAnswer> => {
    const from = raw.received.length;
    await write();
    const fenceId = `fence-${++fence}`;
    await raw.write(Buffer.from(`{"jsonrpc":"2.0","id":"${fenceId}","method":"ping"}\n`));
    await raw.answered([...waitFor, fenceId], from);
    return { statuses: [], messages: raw.received.slice(from).filter((m) => m.id !== fenceId) };
  };

  const init = await exchange(
    () =>
      raw.write(
        Buffer.from(
          `${JSON.stringify({
            jsonrpc: '2.0',
            id: 'init',
            method: 'initialize',
            params: {
              protocolVersion: '2025-06-18',
              capabilities: {},
              clientInfo: { name: 'raw', version: '1' },
            },
          })}\n{"jsonrpc":"2.0","method":"notifications/initialized"}\n`,
        ),
      ),
    ['init'],
  );
  expect(init.messages[0]?.result, JSON.stringify(init)).toMatchObject({ protocolVersion: '2025-06-18' });

  return {
    client: sdk.client,
    tool: (name) => name,
    send: (chunks, waitFor = []) =>
      exchange(async () => {
        for (const c of chunks) {
          await raw.write(c);
          await new Promise((r) => setImmediate(r)); // its own write (no sync depends on it)
        }
        await raw.write(Buffer.from('\n'));
      }, waitFor),
    sendTogether: (frames, waitFor) =>
      exchange(() => raw.write(Buffer.concat(frames.flatMap((f) => [f, Buffer.from('\n')]))), waitFor),
    frameCodes: () =>
      readAudit(rawAudit)
        .filter((e) => e.kind === 'mcp' && e.method === 'frame' && e.server === '*')
        .map((e) => e.code ?? ''),
    audited: (): AuditedFinding[] =>
      readAudit(sdkAudit)
        .filter((e) => e.kind === 'mcp')
        .map((e) => ({
          ...(e.tool !== undefined ? { tool: e.tool } : {}),
          decision: e.decision,
          ...(e.code !== undefined ? { code: e.code } : {}),
          findings: (e.findings ?? []).map((f) => `${f.ruleId} ${f.location}`),
        })),
    async close() {
      await sdk.close();
      raw.child.stdin.end();
      const code = await Promise.race([
        raw.exited,
        new Promise((r) => setTimeout(() => r('timeout'), 30_000)),
      ]);
      if (code === 'timeout') raw.child.kill('SIGTERM');
      const frames = readAudit(rawAudit).filter((e) => e.method === 'frame' && e.server === '*').length;
      rmSync(dir, { recursive: true, force: true });
      expect(code, raw.stderr).toBe(0);
      // Every audited frame error is also named on stderr, one line each.
      expect(raw.droppedLines).toBe(frames);
    },
  };
}

if (!canRunNamespaces) {
  describe('mcp transport contract: stdio', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
} else {
  transportContract('stdio (airlock mcp)', connectStdio);
}
