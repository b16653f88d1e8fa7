// sbx.spawn() of a remote sandbox: a process with raw stdin/stdout/stderr streams (e.g. a stdio MCP
// server), made of the native API's background process (start, stdin writes, EOF, its event stream).
import { PassThrough, Writable } from 'node:stream';
import type { KilledBy, SandboxProcess } from '../../sandbox/sandbox.js';
import type { Caller, ExecRequest, SandboxApi } from '../contract.js';

const KILLED_BY = new Set<string>(['timeout', 'ttl', 'oom', 'pids', 'killed']);

export async function remoteSpawn(
  api: SandboxApi,
  caller: Caller,
  id: string,
  req: ExecRequest,
  signal: AbortSignal | undefined,
): Promise<SandboxProcess> {
  const pv = await api.startProcess(id, req, caller);
  const pid = pv.pid;
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  // Writes go one at a time (Writable serialises them), so the process reads them in order. A write
  // to a process that is gone is dropped: its exit says why (as EPIPE on a local pipe).
  const stdin = new Writable({
    write(chunk: Buffer, _enc, cb) {
      api.sendStdin(id, pid, chunk, caller).then(
        () => cb(),
        () => cb(),
      );
    },
    final(cb) {
      api.closeStdin(id, pid, caller).then(
        () => cb(),
        () => cb(),
      );
    },
  });
  const kill = (): Promise<void> => api.killProcess(id, pid, caller).catch(() => {});
  const onAbort = (): void => void kill();
  signal?.addEventListener('abort', onAbort, { once: true });
  const exited = (async () => {
    let exit: { exitCode: number | null; signal: NodeJS.Signals | null; killedBy?: KilledBy } = {
      exitCode: null,
      signal: 'SIGKILL',
      killedBy: 'killed',
    };
    try {
      for await (const e of api.connectProcess(id, pid, caller)) {
        if (e.type === 'stdout') stdout.write(Buffer.from(e.data, 'base64'));
        else if (e.type === 'stderr') stderr.write(Buffer.from(e.data, 'base64'));
        else if (e.type === 'exit') {
          exit = {
            exitCode: e.exitCode,
            signal: e.signal as NodeJS.Signals | null,
            ...(e.killedBy !== undefined && KILLED_BY.has(e.killedBy)
              ? { killedBy: e.killedBy as KilledBy }
              : {}),
          };
          break;
        }
      }
    } catch {
      /* the stream broke (the sandbox is gone): reported as killed */
    } finally {
      signal?.removeEventListener('abort', onAbort);
      stdout.end();
      stderr.end();
    }
    return exit;
  })();
  return {
    id: pid,
    stdin,
    stdout,
    stderr,
    exited,
    kill: async () => {
      await kill();
      await exited;
    },
  };
}
