// The native gate (core/native-gate.ts): a process that exits while one of Airlock's koffi worker
// threads (the launcher, the fd relay) is still starting must exit with its own status, never abort.
// Before the gate, `airlock doctor` aborted (exit 134, "napi_throw") in about one run in eight here.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { closeGate, enterNative, leaveNative } from '../../src/core/native-gate.js';
import { canRunNamespaces, SKIP_REASON } from '../helpers.js';

const ROOT = join(import.meta.dirname, '..', '..');

/** Run `script` (an ES module, from source through tsx); its exit status and stderr. */
function runScript(script: string): Promise<{ code: number | null; signal: string | null; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      cwd: ROOT,
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code, signal) => resolve({ code, signal, stderr }));
  });
}

/** Both ways Node ends a process: process.exit(7), and the event loop running dry (exit code 7). */
const EXITS = ['process.exit(7);', 'process.exitCode = 7; for (const t of timers) clearTimeout(t);'];

/** Run each script, four at a time; every one must exit 7, with nothing on stderr (no abort). */
async function allExitCleanly(scripts: string[]): Promise<void> {
  const results: { code: number | null; signal: string | null; stderr: string }[] = [];
  for (let i = 0; i < scripts.length; i += 4) {
    results.push(...(await Promise.all(scripts.slice(i, i + 4).map(runScript))));
  }
  for (const r of results) expect(r).toEqual({ code: 7, signal: null, stderr: '' });
}

describe('the native gate', () => {
  it('lets a worker in only while open, and closes only once the worker has left', () => {
    const gate = new Int32Array(new SharedArrayBuffer(8));
    expect(enterNative(gate, 1)).toBe(true);
    expect(closeGate(gate, 1, 0)).toBe(false); // busy: not closed within the (zero) wait
    leaveNative(gate, 1);
    expect(closeGate(gate, 1, 0)).toBe(true);
    expect(enterNative(gate, 1)).toBe(false); // closed: no native work starts any more
    expect(closeGate(gate, 1, 0)).toBe(true); // closing twice is fine
    expect(gate[0]).toBe(0); // other slots untouched
  });

  it('a main thread waiting to close wakes as soon as the worker leaves', async () => {
    const gate = new Int32Array(new SharedArrayBuffer(4));
    expect(enterNative(gate, 0)).toBe(true);
    const { Worker } = await import('node:worker_threads');
    // The worker leaves the gate 50 ms from now, while this thread blocks in closeGate.
    const w = new Worker(
      `const { workerData } = require('node:worker_threads');
       const g = new Int32Array(workerData);
       setTimeout(() => { Atomics.store(g, 0, 0); Atomics.notify(g, 0); }, 50);`,
      { eval: true, workerData: gate.buffer },
    );
    await new Promise((r) => w.once('online', r));
    expect(closeGate(gate, 0, 30_000)).toBe(true);
    expect(gate[0]).toBe(2);
    await w.terminate();
  });

  it.skipIf(!canRunNamespaces)(
    `a process exiting while the launcher thread loads koffi exits with its own status (${SKIP_REASON})`,
    async () => {
      // The worker is the only thread that loads koffi here: the process ends 0–8 ms after koffi.node
      // shows in its maps, i.e. while the worker registers it and binds libc. Without the gate every
      // such exit aborted at 0–2 ms, and most did at 4–8 ms.
      const scripts = [0, 0, 1, 1, 2, 4, 8, 8].flatMap((ms) =>
        EXITS.map(
          (exit) => `import { readFileSync } from 'node:fs';
            import { Launcher } from './src/backends/host/launcher.privileged.ts';
            const timers = [setTimeout(() => {}, 60_000)];
            Launcher.warm();
            const poll = () =>
              readFileSync('/proc/self/maps', 'utf8').includes('koffi')
                ? timers.push(setTimeout(() => { ${exit} }, ${ms}))
                : setImmediate(poll);
            poll();`,
        ),
      );
      await allExitCleanly(scripts);
    },
  );

  it('a process exiting while the fd relay worker starts exits with its own status', async () => {
    // Koffi is loaded on the main thread first here, so there is no sign of the worker's own load to
    // wait for: exits are spread over the worker's start-up from source (~150–500 ms).
    const scripts = [0, 150, 250, 300, 350, 400, 450, 550].flatMap((ms) =>
      EXITS.map(
        (exit) => `import { FdRelay } from './src/egress/relay.privileged.ts';
          const timers = [setTimeout(() => {}, 60_000)];
          FdRelay.create({ info() {}, warn() {}, error() {}, debug() {} }).warm();
          timers.push(setTimeout(() => { ${exit} }, ${ms}));`,
      ),
    );
    await allExitCleanly(scripts);
  });
});
