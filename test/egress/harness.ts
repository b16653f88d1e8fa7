// Helpers shared by the egress test files: a runtime wired to the test network, and small clients that
// run INSIDE a sandbox (python3, no libraries) and talk to the proxy byte for byte, so no HTTP client
// normalises a hostile host spelling or a malformed request before Airlock sees it.
// Only imported by test files that call assertPrivateNetns() first.
import { Airlock, type Sandbox } from '../../src/index.js';
import { TEST_UID_RANGE } from '../helpers.js';
import { guardedDialer, startTestServers, testResolver, type TestServers } from './net.js';

/** Per test run when AIRLOCK_TEST_STATE_DIR is set (parallel runs never share egress state). */
export const EGRESS_STATE_DIR =
  process.env.AIRLOCK_TEST_STATE_DIR !== undefined
    ? `${process.env.AIRLOCK_TEST_STATE_DIR}-egress`
    : '/var/tmp/airlock-egress-test';

export interface EgressWorld {
  readonly servers: TestServers;
  readonly resolver: ReturnType<typeof testResolver>;
  readonly dialer: ReturnType<typeof guardedDialer>;
  readonly airlock: Airlock;
  /** Run `f` in a fresh sandbox, killed afterwards whatever happens. */
  withSandbox<T>(spec: Parameters<Airlock['create']>[0], f: (s: Sandbox) => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

/** Test servers, the test resolver and guarded dialer, and an Airlock using them. */
export async function startEgressWorld(o: { secretEnv?: NodeJS.ProcessEnv } = {}): Promise<EgressWorld> {
  const servers = await startTestServers();
  const resolver = testResolver();
  const dialer = guardedDialer();
  const airlock = new Airlock({
    stateDir: EGRESS_STATE_DIR,
    uidRange: TEST_UID_RANGE,
    egress: { resolver, dialer, upstreamCa: [servers.ca.certPem] },
    secretEnv: o.secretEnv ?? {},
  });
  return {
    servers,
    resolver,
    dialer,
    airlock,
    async withSandbox(spec, f) {
      const s = await airlock.create(spec);
      try {
        return await f(s);
      } finally {
        await s.kill();
      }
    },
    async close() {
      await airlock.close();
      await servers.close();
    },
  };
}

/** Resolves once `pred` holds (events arrive when connections close), or after `timeoutMs`. */
export async function until(pred: () => boolean, timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!pred() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
}

// ---- raw conversations with the proxy ---------------------------------------------------------------

/**
 * One step of a conversation: send `send` (latin1, so any byte), or drip `drip` one byte every
 * `intervalMs` (stopping early once the proxy answers or closes), then read until `until` appears,
 * the proxy closes, or `timeoutS` passes.
 */
export interface RawStep {
  readonly send?: string;
  readonly drip?: string;
  readonly intervalMs?: number;
  readonly until?: string;
  readonly timeoutS?: number;
}

export interface RawConversation {
  /** What the proxy sent back after each step (latin1). */
  readonly steps: string[];
  /** The proxy closed (or reset) the connection. */
  readonly closed: boolean;
  readonly error: string | null;
  /** From connect to the end of the last step. */
  readonly ms: number;
  /** Per step: ms from connect until the proxy first answered or closed in that step (null: it did not). */
  readonly answeredAtMs: (number | null)[];
}

const RAW_PY = String.raw`
import json, select, socket, sys, time
spec = json.load(sys.stdin)
out = []
for conv in spec['conversations']:
    t0 = time.monotonic()
    res = {'steps': [], 'answeredAtMs': [], 'closed': False, 'error': None}
    try:
        s = socket.create_connection(('127.0.0.1', spec['port']), timeout=10)
        for step in conv:
            if step.get('send'):
                s.sendall(step['send'].encode('latin1'))
            if step.get('drip'):
                for ch in step['drip']:
                    try:
                        s.sendall(ch.encode('latin1'))
                    except OSError:
                        break
                    r, _, _ = select.select([s], [], [], step.get('intervalMs', 500) / 1000)
                    if r:
                        break
            buf = b''
            answered = None
            until = step.get('until')
            deadline = time.monotonic() + step.get('timeoutS', 10)
            while True:
                if until is not None and until.encode('latin1') in buf:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                s.settimeout(left)
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    break
                except (ConnectionResetError, BrokenPipeError):
                    chunk = b''
                if answered is None:
                    answered = (time.monotonic() - t0) * 1000
                if not chunk:
                    res['closed'] = True
                    break
                buf += chunk
            res['steps'].append(buf.decode('latin1'))
            res['answeredAtMs'].append(answered)
            if res['closed']:
                break
        s.close()
    except Exception as e:
        res['error'] = repr(e)
    res['ms'] = (time.monotonic() - t0) * 1000
    out.append(res)
print(json.dumps(out))
`;

/** Run conversations with the proxy (127.0.0.1:3128 inside the sandbox), one connection each, in order. */
export async function rawConversations(
  s: Sandbox,
  conversations: readonly (readonly RawStep[])[],
  o: { port?: number; timeoutMs?: number } = {},
): Promise<RawConversation[]> {
  const r = await s.exec(['python3', '-c', RAW_PY], {
    stdin: JSON.stringify({ port: o.port ?? 3128, conversations }),
    timeoutMs: o.timeoutMs ?? 120_000,
    maxOutputBytes: 10_000_000,
  });
  if (r.exitCode !== 0) throw new Error(`raw client failed (${r.exitCode}): ${r.stderr}`);
  return JSON.parse(r.stdout) as RawConversation[];
}

/** Send one raw request and read the reply until the proxy closes. */
export async function rawRequest(s: Sandbox, text: string): Promise<RawConversation> {
  const [c] = await rawConversations(s, [[{ send: text }]]);
  return c!;
}

/** The status code of an HTTP reply, or null. */
export function statusOf(reply: string): number | null {
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(reply);
  return m ? Number(m[1]) : null;
}

// ---- SOCKS5 by hand ---------------------------------------------------------------------------------

export interface Socks5Target {
  readonly atyp: 'domain' | 'ipv4' | 'ipv6';
  readonly host: string;
  readonly port: number;
  /** Sent after a successful reply; the answer is read back (at most `payload.length` bytes for an echo). */
  readonly payload?: string;
}

export interface Socks5Outcome {
  /** The method-selection reply, hex ("0500" = no authentication). */
  readonly method: string;
  /** The reply code (0 = succeeded, 2 = not allowed by ruleset, 4 = host unreachable), or null if none. */
  readonly reply: number | null;
  readonly received: string;
  readonly error: string | null;
}

const SOCKS_PY = String.raw`
import json, socket, struct, sys
out = []
def recv_exact(s, n):
    buf = b''
    while len(buf) < n:
        d = s.recv(n - len(buf))
        if not d:
            break
        buf += d
    return buf
for t in json.load(sys.stdin):
    r = {'method': '', 'reply': None, 'received': '', 'error': None}
    try:
        s = socket.create_connection(('127.0.0.1', 3128), timeout=10)
        s.sendall(b'\x05\x01\x00')
        r['method'] = recv_exact(s, 2).hex()
        if t['atyp'] == 'domain':
            addr = b'\x03' + bytes([len(t['host'])]) + t['host'].encode()
        elif t['atyp'] == 'ipv4':
            addr = b'\x01' + socket.inet_pton(socket.AF_INET, t['host'])
        else:
            addr = b'\x04' + socket.inet_pton(socket.AF_INET6, t['host'])
        s.sendall(b'\x05\x01\x00' + addr + struct.pack('>H', t['port']))
        head = recv_exact(s, 4)
        if len(head) == 4:
            r['reply'] = head[1]
            recv_exact(s, {1: 4, 4: 16}.get(head[3], 0) + 2)
        if r['reply'] == 0 and t.get('payload'):
            p = t['payload'].encode('latin1')
            s.sendall(p)
            r['received'] = recv_exact(s, len(p)).decode('latin1')
        s.close()
    except Exception as e:
        r['error'] = repr(e)
    out.append(r)
print(json.dumps(out))
`;

/** SOCKS5 CONNECT handshakes written by hand (no client library between the test and the proxy). */
export async function socks5(s: Sandbox, targets: readonly Socks5Target[]): Promise<Socks5Outcome[]> {
  const r = await s.exec(['python3', '-c', SOCKS_PY], { stdin: JSON.stringify(targets) });
  if (r.exitCode !== 0) throw new Error(`socks client failed (${r.exitCode}): ${r.stderr}`);
  return JSON.parse(r.stdout) as Socks5Outcome[];
}
