// When a sandboxed process is done, whatever started it (bwrap on the namespaces tier, runsc on
// gVisor): after its exit and after its output streams close.
import type { ChildProcess } from 'node:child_process';
import type { ProcessExit } from '../../core/backend.js';

/** How long an exec may hold its stdio open after its process tree is gone (fds handed to others). */
const STDIO_GRACE_MS = 500;

/** What childExited needs of a process: its output streams and an 'exit' (code, signal) event. */
export type ExitSource = Pick<ChildProcess, 'stdout' | 'stderr' | 'on'>;

/**
 * When a spawned sandbox process is done: after its exit (`onExit` runs then) and after its stdout
 * and stderr close — or STDIO_GRACE_MS later, since a process of another exec it handed them to
 * may hold them open (results and timeouts must still hold). A spawn error is exit 127.
 */
export function childExited(child: ExitSource, onExit: () => void): Promise<ProcessExit> {
  return new Promise<ProcessExit>((resolve) => {
    child.on('error', () => {
      onExit();
      resolve({ exitCode: 127, signal: null });
    });
    child.on('exit', (code, signal) => {
      onExit();
      const grace = setTimeout(() => {
        child.stdout?.destroy();
        child.stderr?.destroy();
      }, STDIO_GRACE_MS);
      let open = 2;
      const done = (): void => {
        if (--open > 0) return;
        clearTimeout(grace);
        resolve({ exitCode: code, signal });
      };
      for (const s of [child.stdout, child.stderr]) {
        if (!s || s.destroyed || s.readableEnded) done();
        else s.once('close', done);
      }
    });
  });
}
