// SECURITY-CRITICAL: reads the real secret values (env, file, vault-style command) on the host, outside
// every sandbox. A value must never appear in an error message, an error's cause, or a log line: errors
// name the secret and the field (`secrets.<name>.value.*`) and say how to fix it, nothing more.
import { execFile } from 'node:child_process';
import { constants as fsConstants } from 'node:fs';
import { open } from 'node:fs/promises';
import { isAbsolute } from 'node:path';
import { AirlockError, type AirlockErrorCode } from '../core/errors.js';
import type { SecretValue } from '../policy/network.js';

/** A secret file or command output larger than this is refused (a token is a few hundred bytes). */
export const MAX_SECRET_BYTES = 64 * 1024;
/** How long a `command` source may run before it is killed. */
export const DEFAULT_SECRET_COMMAND_TIMEOUT_MS = 10_000;

export interface ResolveSecretOptions {
  /** The environment `fromEnv` reads and `command` runs with; default process.env. */
  env?: NodeJS.ProcessEnv;
  /** Kill a `command` source after this long; default 10 s. */
  timeoutMs?: number;
  /** The secret's name, used only in error messages and the error's `field`. */
  name?: string;
  signal?: AbortSignal;
}

const STDERR_LINE_MAX = 200;

/**
 * Resolve where a secret's real value comes from. `fromEnv`: the variable must be set and non-empty.
 * `fromFile`: an absolute path to a regular file of at most 64 KiB; trailing newlines are trimmed.
 * `command`: argv run without a shell (execFile), killed after `timeoutMs`; stdout, trimmed, is the value.
 */
export async function resolveSecretValue(v: SecretValue, opts: ResolveSecretOptions = {}): Promise<string> {
  const label = opts.name === undefined ? 'secret' : `secret ${opts.name}`;
  const field = (source: string): string =>
    opts.name === undefined ? `value.${source}` : `secrets.${opts.name}.value.${source}`;
  const fail = (code: AirlockErrorCode, source: string, message: string, cause?: unknown): AirlockError =>
    new AirlockError(code, `${label} (${field(source)}): ${message}`, { field: field(source), cause });

  if (opts.signal?.aborted) {
    throw new AirlockError('ABORTED', `${label}: resolving the value was aborted`);
  }

  if ('fromEnv' in v) {
    const value = (opts.env ?? process.env)[v.fromEnv];
    if (value === undefined) {
      throw fail(
        'INVALID_SPEC',
        'fromEnv',
        `environment variable ${v.fromEnv} is not set; export ${v.fromEnv} in the environment that starts ` +
          'Airlock, or read the value with fromFile or command instead',
      );
    }
    if (value === '') {
      throw fail('INVALID_SPEC', 'fromEnv', `environment variable ${v.fromEnv} is set but empty`);
    }
    return value;
  }

  if ('fromFile' in v) return readSecretFile(v.fromFile, fail);

  // A value the (remote) caller sent as is; checked for control characters like every value.
  if ('literal' in v) return v.literal;

  return runSecretCommand(v.command, opts, fail);
}

type Fail = (code: AirlockErrorCode, source: string, message: string, cause?: unknown) => AirlockError;

async function readSecretFile(path: string, fail: Fail): Promise<string> {
  if (!isAbsolute(path)) {
    throw fail('INVALID_SPEC', 'fromFile', `"${path}" is not an absolute path; write the full path`);
  }
  let handle;
  try {
    // O_NONBLOCK: a FIFO must not hang us before fstat can reject it (no effect on regular files).
    handle = await open(path, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK | fsConstants.O_NOCTTY);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw fail('FILE_NOT_FOUND', 'fromFile', `file ${path} does not exist`, e);
    if (code === 'EACCES' || code === 'EPERM') {
      throw fail('PERMISSION_DENIED', 'fromFile', `cannot read ${path}: permission denied`, e);
    }
    throw fail('INVALID_SPEC', 'fromFile', `cannot open ${path} (${code ?? 'error'})`, e);
  }
  try {
    const st = await handle.stat();
    if (!st.isFile()) throw fail('INVALID_SPEC', 'fromFile', `${path} is not a regular file`);
    if (st.size > MAX_SECRET_BYTES) {
      throw fail('FILE_TOO_LARGE', 'fromFile', `${path} is larger than 64 KiB; is it the right file?`);
    }
    // Read one byte past the limit: the file may have grown since fstat.
    const buf = Buffer.alloc(MAX_SECRET_BYTES + 1);
    let total = 0;
    for (;;) {
      const { bytesRead } = await handle.read(buf, total, buf.length - total, null);
      if (bytesRead === 0) break;
      total += bytesRead;
      if (total > MAX_SECRET_BYTES) {
        throw fail('FILE_TOO_LARGE', 'fromFile', `${path} is larger than 64 KiB; is it the right file?`);
      }
    }
    const value = buf
      .subarray(0, total)
      .toString('utf8')
      .replace(/[\r\n]+$/, '');
    buf.fill(0);
    if (value === '') throw fail('INVALID_SPEC', 'fromFile', `${path} is empty`);
    return value;
  } finally {
    await handle.close();
  }
}

function runSecretCommand(argv: readonly string[], opts: ResolveSecretOptions, fail: Fail): Promise<string> {
  const [program, ...args] = argv;
  if (program === undefined || program === '') {
    return Promise.reject(fail('INVALID_SPEC', 'command', 'command must name a program, e.g. ["vault", …]'));
  }
  const timeoutMs = opts.timeoutMs ?? DEFAULT_SECRET_COMMAND_TIMEOUT_MS;
  // Only the program is named in errors: later arguments may carry credentials of their own.
  const shown = JSON.stringify(program);
  return new Promise((resolve, reject) => {
    execFile(
      program,
      args,
      {
        shell: false,
        env: opts.env ?? process.env,
        timeout: timeoutMs,
        killSignal: 'SIGKILL',
        maxBuffer: MAX_SECRET_BYTES,
        encoding: 'utf8',
        windowsHide: true,
        signal: opts.signal,
      },
      (err, stdout, stderr) => {
        const value = stdout.trim();
        if (err) {
          // Never attach `err` as the cause: execFile errors carry stdout (the value) as a property.
          const e = err as NodeJS.ErrnoException & { killed?: boolean; signal?: string | null };
          if (e.name === 'AbortError') {
            reject(new AirlockError('ABORTED', `secret command ${shown} was aborted`));
          } else if (e.code === 'ENOENT') {
            reject(
              fail('INVALID_SPEC', 'command', `program ${shown} not found; use an absolute path or fix PATH`),
            );
          } else if (e.code === 'EACCES') {
            reject(fail('PERMISSION_DENIED', 'command', `program ${shown} is not executable`));
          } else if (e.code === 'ERR_CHILD_PROCESS_STDIO_MAXBUFFER') {
            reject(fail('FILE_TOO_LARGE', 'command', `${shown} printed more than 64 KiB`));
          } else if (e.killed && e.signal === 'SIGKILL') {
            reject(fail('INVALID_SPEC', 'command', `${shown} did not finish within ${timeoutMs} ms`));
          } else {
            const status =
              typeof e.code === 'number' ? `exited with code ${e.code}` : `was killed (${e.signal})`;
            const line = firstLine(stderr, value);
            reject(
              fail('INVALID_SPEC', 'command', `${shown} ${status}${line ? `: ${line}` : ' (no stderr)'}`),
            );
          }
          return;
        }
        if (value === '') {
          reject(fail('INVALID_SPEC', 'command', `${shown} printed nothing on stdout`));
          return;
        }
        resolve(value);
      },
    );
  });
}

/** The first non-empty stderr line, cut short, with anything the command printed on stdout removed. */
function firstLine(stderr: string, stdout: string): string {
  let line = stderr.split('\n').find((l) => l.trim() !== '') ?? '';
  const printed = [stdout, ...stdout.split('\n').map((l) => l.trim())].filter((s) => s.length >= 8);
  for (const s of printed) line = line.split(s).join('[redacted]');
  // eslint-disable-next-line no-control-regex
  line = line.replace(/[\x00-\x1f\x7f]/g, ' ').trim();
  return line.length > STDERR_LINE_MAX ? `${line.slice(0, STDERR_LINE_MAX)}…` : line;
}
