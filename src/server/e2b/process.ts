// The envd `process.Process` service (Connect RPC, JSON) over a SandboxApi.
//
// Every E2B command, foreground or background, is a background process of the SandboxApi: the SDK can
// connect to, kill or feed any command by pid, whichever way it was started. Semantics follow E2B's:
// the call's deadline (Connect-Timeout-Ms, the SDK's `timeoutMs`, 60 s by default, none for 0) kills
// the command and ends the stream with `deadline_exceeded`; a client that disconnects only stops
// following it (the SDK's `disconnect()`): the command runs on, bounded by that deadline and by the
// sandbox's own life, and the server keeps no state for the departed client.
import type { Hono } from 'hono';
import { AirlockError, type AirlockErrorCode } from '../../core/errors.js';
import { startAndFollow, type ExecEvent, type ProcessView } from '../contract.js';
import { EnvdError, envdErrorFrom, serverStream, unary } from './connect.js';
import {
  checkUser,
  e2bPath,
  envdError,
  rpcUser,
  SANDBOX_HOME,
  target,
  whileKeyActive,
  type EnvdDeps,
  type Target,
} from './envd.js';
import {
  EmptySchema,
  SelectorRequestSchema,
  SendInputRequestSchema,
  SendSignalRequestSchema,
  StartRequestSchema,
} from './schemas.js';

/** envd pids are uint32; SandboxApi pids are strings (decimal ones pass through unchanged). */
function toWirePid(pid: string): number {
  if (!/^[0-9]{1,9}$/.test(pid))
    throw new EnvdError('internal', `process id ${JSON.stringify(pid)} is not numeric`);
  return Number(pid);
}

function selectorPid(sel: { pid?: number | undefined; tag?: string | undefined }): string {
  if (sel.pid === undefined) {
    throw new EnvdError(
      'unimplemented',
      'selecting a process by tag is not supported by Airlock: select it by pid',
    );
  }
  return String(sel.pid);
}

/** envd's EndEvent for an exit, as Go's os.ProcessState would describe it. */
function endEvent(ev: Extract<ExecEvent, { type: 'exit' }>): Record<string, unknown> {
  // A signal wins over the code: inside the sandbox a killed command reports 128 + signal.
  if (ev.signal === null && ev.exitCode !== null) {
    const status = `exit status ${ev.exitCode}`;
    return { exitCode: ev.exitCode, exited: true, status, ...(ev.exitCode !== 0 ? { error: status } : {}) };
  }
  const sig = (ev.signal ?? 'SIGKILL').replace(/^SIG/, '').toLowerCase();
  const status = `signal: ${sig === 'kill' ? 'killed' : sig}`;
  return { exitCode: -1, exited: false, status, error: status };
}

/** A process's ExecEvents as envd ProcessEvent messages (the caller sends `start` itself). */
async function* processEvents(events: AsyncIterable<ExecEvent>, sandboxId: string): AsyncGenerator<unknown> {
  for await (const ev of events) {
    switch (ev.type) {
      case 'start':
        break;
      case 'stdout':
      case 'stderr':
        // ExecEvent data is already base64, as proto3 JSON wants bytes.
        yield { event: { data: { [ev.type]: ev.data } } };
        break;
      case 'exit':
        if (ev.killedBy === 'timeout') {
          throw new EnvdError('deadline_exceeded', 'the command ran past its timeoutMs and was killed');
        }
        yield { event: { end: endEvent(ev) } };
        return;
      case 'error':
        throw envdErrorFrom(new AirlockError(ev.code as AirlockErrorCode, ev.message), sandboxId);
    }
  }
}

function processInfo(p: ProcessView): Record<string, unknown> {
  const [cmd = '', ...args] = p.cmd;
  return { pid: toWirePid(p.pid), config: { cmd, args, envs: {} } };
}

export function mountProcess(app: Hono, deps: EnvdDeps): void {
  const P = '/process.Process/';
  const who = (c: Parameters<typeof target>[0]): Target => {
    checkUser(rpcUser(c));
    return target(c, deps);
  };

  app.post(
    `${P}Start`,
    serverStream(
      StartRequestSchema,
      async function* ({ req, timeoutMs, signal, c }) {
        const t = who(c);
        if (req.pty !== undefined)
          throw new EnvdError('unimplemented', 'PTY is not supported by Airlock: run commands without a pty');
        if (req.tag !== undefined)
          throw new EnvdError('unimplemented', 'process tags are not supported by Airlock');
        const exec = {
          cmd: [req.process.cmd, ...(req.process.args ?? [])],
          cwd: req.process.cwd === undefined ? SANDBOX_HOME : e2bPath(req.process.cwd),
          ...(req.process.envs ? { env: req.process.envs } : {}),
          ...(timeoutMs !== undefined ? { timeoutMs } : {}),
          // E2B: without `stdin: true` the command reads an empty stdin (it must not wait for input).
          ...(req.stdin ? {} : { stdin: '' }),
        };
        // One request to the supervisor (start, then follow), where the api offers it.
        const events = startAndFollow(deps.api, t.id, exec, t.caller, signal)[Symbol.asyncIterator]();
        const first = await events.next();
        if (first.done || first.value.type !== 'start')
          throw new EnvdError('internal', 'the process stream did not begin with its start');
        yield { event: { start: { pid: toWirePid(first.value.pid) } } };
        const rest = { [Symbol.asyncIterator]: () => events };
        yield* processEvents(whileKeyActive(deps, t, rest), t.id);
      },
      envdError,
      { event: { keepalive: {} } },
    ),
  );

  app.post(
    `${P}Connect`,
    serverStream(
      SelectorRequestSchema,
      async function* ({ req, signal, c }) {
        const t = who(c);
        const pid = selectorPid(req.process);
        const events = deps.api.connectProcess(t.id, pid, t.caller, signal)[Symbol.asyncIterator]();
        // Let an unknown pid fail before the start message (the SDK then reports it as not found).
        const first = await events.next();
        yield { event: { start: { pid: toWirePid(pid) } } };
        async function* all(): AsyncGenerator<ExecEvent> {
          if (first.done) return;
          yield first.value;
          for (let r = await events.next(); !r.done; r = await events.next()) yield r.value;
        }
        yield* processEvents(whileKeyActive(deps, t, all()), t.id);
      },
      envdError,
      { event: { keepalive: {} } },
    ),
  );

  app.post(
    `${P}List`,
    unary(
      EmptySchema,
      async (_req, c) => {
        const t = who(c);
        const procs = await deps.api.listProcesses(t.id, t.caller);
        return { processes: procs.filter((p) => p.running).map(processInfo) };
      },
      envdError,
    ),
  );

  app.post(
    `${P}SendInput`,
    unary(
      SendInputRequestSchema,
      async (req, c) => {
        const t = who(c);
        if (req.input.pty !== undefined)
          throw new EnvdError('unimplemented', 'PTY input is not supported by Airlock');
        await deps.api.sendStdin(
          t.id,
          selectorPid(req.process),
          req.input.stdin ?? new Uint8Array(0),
          t.caller,
        );
        return {};
      },
      envdError,
    ),
  );

  app.post(
    `${P}SendSignal`,
    unary(
      SendSignalRequestSchema,
      async (req, c) => {
        const t = who(c);
        const sig = req.signal;
        if (!(sig === 'SIGNAL_SIGKILL' || sig === 'SIGNAL_SIGTERM' || sig === 9 || sig === 15)) {
          throw new EnvdError(
            'invalid_argument',
            'signal: only SIGNAL_SIGKILL and SIGNAL_SIGTERM are supported',
          );
        }
        const pid = selectorPid(req.process);
        // envd forgets a process once it ended: signalling it then is "not found" (the SDK: false).
        const p = (await deps.api.listProcesses(t.id, t.caller)).find((x) => x.pid === pid);
        if (!p?.running) throw new EnvdError('not_found', `no running process ${pid} in sandbox ${t.id}`);
        await deps.api.killProcess(t.id, pid, t.caller);
        return {};
      },
      envdError,
    ),
  );

  app.post(
    `${P}CloseStdin`,
    unary(
      SelectorRequestSchema,
      async (req, c) => {
        const t = who(c);
        await deps.api.closeStdin(t.id, selectorPid(req.process), t.caller);
        return {};
      },
      envdError,
    ),
  );

  const refuse = (what: string) => () =>
    Promise.reject(new EnvdError('unimplemented', `${what} is not supported by Airlock (see docs/e2b.md)`));
  app.post(`${P}Update`, unary(EmptySchema, refuse('PTY resize (Update)'), envdError));
  app.post(`${P}StreamInput`, (c) =>
    Promise.resolve(
      c.json(
        { code: 'unimplemented', message: 'StreamInput is not supported by Airlock: use SendInput' },
        501,
      ),
    ),
  );
}
