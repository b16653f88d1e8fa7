// Finding and starting the per-host supervisor (see supervisor.ts and docs/server.md): where its
// socket, log and state live, asking it who it is, and `ensureSupervisor`, which starts one detached
// when none answers. The front server and `airlock supervisor` share this file.
import { spawn } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';

/** GET /v1/supervisor: who answers on the socket. A new bootId means every older sandbox is gone. */
export const SupervisorInfoSchema = z.object({
  bootId: z.string().min(1),
  pid: z.number().int().positive(),
  startedAt: z.string(),
});
export type SupervisorInfo = z.infer<typeof SupervisorInfoSchema>;

/** The supervisor's files in a state dir. */
export function supervisorPaths(stateDir: string): { socket: string; log: string } {
  return { socket: join(stateDir, 'supervisor.sock'), log: join(stateDir, 'supervisor.log') };
}

/** GET /v1/supervisor over the socket; undefined when nothing (or something else) answers. */
export function supervisorInfo(socketPath: string, timeoutMs = 2000): Promise<SupervisorInfo | undefined> {
  return new Promise((resolve) => {
    const req = request({ socketPath, path: '/v1/supervisor', method: 'GET', timeout: timeoutMs }, (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (c: Buffer) => {
        size += c.length;
        if (size > 4096)
          req.destroy(); // an info body is tiny
        else chunks.push(c);
      });
      res.on('end', () => {
        if (res.statusCode !== 200) return resolve(undefined);
        try {
          const parsed = SupervisorInfoSchema.safeParse(JSON.parse(Buffer.concat(chunks).toString('utf8')));
          resolve(parsed.success ? parsed.data : undefined);
        } catch {
          resolve(undefined);
        }
      });
      res.on('error', () => resolve(undefined));
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(undefined));
    req.end();
  });
}

export interface EnsureSupervisorOptions {
  /**
   * The argv that runs the airlock CLI (without the `supervisor` arguments), e.g.
   * [process.execPath, ...process.execArgv, process.argv[1]] from the CLI itself.
   */
  readonly command: readonly string[];
  /** Environment of the supervisor (default: this process's); AIRLOCK_UID_RANGE is read from it. */
  readonly env?: NodeJS.ProcessEnv;
  /** How long to wait for a started supervisor to answer (default 30 s). */
  readonly timeoutMs?: number;
}

/**
 * The supervisor of `stateDir`: the one that answers on its socket, or a new one started detached
 * (its own session, stdio to supervisor.log, not a child this process waits for) once it answers.
 * Two callers racing both start one; the supervisor's lock lets only one of them serve.
 */
export async function ensureSupervisor(
  stateDir: string,
  o: EnsureSupervisorOptions,
): Promise<SupervisorInfo> {
  const { socket, log } = supervisorPaths(stateDir);
  const running = await supervisorInfo(socket);
  if (running) return running;
  const [exe, ...args] = o.command;
  if (!exe)
    throw new AirlockError('INVALID_ARGUMENT', 'ensureSupervisor needs the airlock command', {
      field: 'command',
    });
  const fd = openSync(log, 'a', 0o600);
  let exited: number | null | undefined;
  try {
    const child = spawn(exe, [...args, 'supervisor', '--state-dir', stateDir], {
      detached: true, // setsid: neither our signals nor our exit reach it
      stdio: ['ignore', fd, fd],
      env: o.env ?? process.env,
    });
    child.on('exit', (code) => (exited = code));
    child.on('error', () => (exited = -1));
    child.unref();
  } finally {
    closeSync(fd);
  }
  const deadline = Date.now() + (o.timeoutMs ?? 30_000);
  for (;;) {
    const info = await supervisorInfo(socket);
    if (info) return info;
    if (exited !== undefined || Date.now() > deadline) {
      // Exited: lost a start race (another supervisor now answers) or failed; its log says which.
      const again = await supervisorInfo(socket);
      if (again) return again;
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        `the airlock supervisor for ${stateDir} did not start (${exited === undefined ? 'no answer in time' : `exit ${exited}`}); see ${log}: ${tail(log)}`,
      );
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

function tail(path: string): string {
  try {
    return readFileSync(path, 'utf8').trimEnd().split('\n').slice(-3).join(' | ');
  } catch {
    return '(no log)';
  }
}
