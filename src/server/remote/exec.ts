// An exec through a server: the NDJSON ExecEvent stream of the native API turned back into the
// library's ExecResult. Output is shaped on the client exactly as the library shapes it (head + tail
// kept, the full stream spilled to a file), so onStdout/onStderr see every byte and a truncated
// result still has its full output in a file: here the client's file, since the client received it.
import { lstatSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { randomBytes } from 'node:crypto';
import { AirlockError, ERROR_CODES, type AirlockErrorCode } from '../../core/errors.js';
import { OutputCapture } from '../../sandbox/output.js';
import type { ExecResult, KilledBy } from '../../sandbox/sandbox.js';
import type { ExecEvent } from '../contract.js';

export interface ShapeOptions {
  readonly maxOutputBytes: number;
  readonly spillDir: string;
  readonly maxSpillBytes: number;
  readonly budget: { left: number };
  readonly onStdout?: ((t: string) => void) | undefined;
  readonly onStderr?: ((t: string) => void) | undefined;
}

const KILLED_BY = new Set<string>(['timeout', 'ttl', 'oom', 'pids', 'killed']);

/** Where spill files of remote execs go unless the caller says: a 0700 dir of this user. */
export function defaultSpillDir(): string {
  const uid = typeof process.getuid === 'function' ? process.getuid() : 0;
  return join(tmpdir(), `airlock-remote-spill-${uid}`);
}

/**
 * The spill dir must be this user's own private directory: under a shared tmp dir another user could
 * have made it first (or a symlink by its name) to read or plant spilled output.
 */
export function checkSpillDir(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const st = lstatSync(dir);
  const uid = typeof process.getuid === 'function' ? process.getuid() : st.uid;
  if (!st.isDirectory() || st.uid !== uid || (st.mode & 0o077) !== 0) {
    throw new AirlockError(
      'PERMISSION_DENIED',
      `spill dir ${dir} is not a private directory of this user (mode 0700, owned by uid ${uid}); remove it or pass spillDir`,
      { field: 'spillDir' },
    );
  }
}

/** An AirlockError from an `error` event or error body (an unknown code becomes INTERNAL). */
export function remoteError(code: string, message: string, field?: string): AirlockError {
  const known = Object.hasOwn(ERROR_CODES, code) ? (code as AirlockErrorCode) : 'INTERNAL';
  return new AirlockError(known, known === code ? message : `${code}: ${message}`, {
    ...(field !== undefined ? { field } : {}),
  });
}

/**
 * Reads `events` to the end and returns the result. `aborted()` tells whether the caller's signal
 * ended the stream early: then the result is the one the library gives a killed exec (the server
 * kills a command whose stream was dropped).
 */
export async function shapeExec(
  events: AsyncIterable<ExecEvent>,
  o: ShapeOptions,
  hooks: { onStart?: (pid: string) => void; aborted: () => boolean },
): Promise<ExecResult> {
  const started = performance.now();
  const execId = randomBytes(6).toString('hex');
  const pipes = { stdout: new PassThrough(), stderr: new PassThrough() };
  const capture = (name: 'stdout' | 'stderr', onText?: (t: string) => void): OutputCapture =>
    new OutputCapture(pipes[name], {
      maxBytes: o.maxOutputBytes,
      maxSpillBytes: o.maxSpillBytes,
      budget: o.budget,
      spillPath: () => join(o.spillDir, `${execId}.${name}`),
      name,
      ...(onText ? { onText } : {}),
    });
  const out = capture('stdout', o.onStdout);
  const err = capture('stderr', o.onStderr);
  let exit: Extract<ExecEvent, { type: 'exit' }> | undefined;
  let failure: unknown;
  try {
    for await (const e of events) {
      if (e.type === 'start') hooks.onStart?.(e.pid);
      else if (e.type === 'stdout' || e.type === 'stderr') pipes[e.type].write(Buffer.from(e.data, 'base64'));
      else if (e.type === 'exit') {
        exit = e;
        break;
      } else {
        failure = remoteError(e.code, e.message);
        break;
      }
    }
  } catch (e) {
    if (!hooks.aborted()) failure = e;
  } finally {
    pipes.stdout.end();
    pipes.stderr.end();
  }
  const [so, se] = await Promise.all([out.finish(), err.finish()]);
  if (failure !== undefined) throw failure;
  if (!exit && !hooks.aborted()) {
    throw new AirlockError('INTERNAL', 'the server ended the exec stream without an exit event');
  }
  const spillPaths = {
    ...(so.spillPath ? { stdout: so.spillPath } : {}),
    ...(se.spillPath ? { stderr: se.spillPath } : {}),
  };
  const spillPath = so.spillPath ?? se.spillPath;
  const killedBy: KilledBy | undefined = exit
    ? exit.killedBy !== undefined && KILLED_BY.has(exit.killedBy)
      ? (exit.killedBy as KilledBy)
      : undefined
    : 'killed';
  return {
    exitCode: exit ? exit.exitCode : null,
    signal: (exit ? exit.signal : 'SIGKILL') as NodeJS.Signals | null,
    stdout: so.text,
    stderr: se.text,
    truncated: { stdout: so.truncated, stderr: se.truncated },
    ...(spillPath ? { spillPath, spillPaths } : {}),
    durationMs: exit ? exit.durationMs : Math.round((performance.now() - started) * 1000) / 1000,
    ...(killedBy ? { killedBy } : {}),
    oomKills: exit?.oomKills ?? 0,
  };
}
