// The facade's exec/spawn and the backend's limit counters (src/sandbox/sandbox.ts spawnCounted):
// the reading is requested before the spawn (core/backend.ts: counters() takes it when called), the
// spawn does not wait for it, and a reading that fails after the spawn kills and reaps the process
// and is the answer. A fake backend: the layer under the one tested here.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { afterAll, describe, expect, it } from 'vitest';
import type { BackendProcess, BackendSandbox, LimitCounters, ProcessExit } from '../../src/core/backend.js';
import { SandboxSpecSchema } from '../../src/core/spec.js';
import { SandboxBase } from '../../src/sandbox/sandbox.js';

const spill = mkdtempSync(join(tmpdir(), 'airlock-exec-counters-'));
afterAll(() => rmSync(spill, { recursive: true, force: true }));

/** A backend whose counters() answers with `reading` (called at each request) and whose process exits 0 at once unless killed first. */
function fakeBackend(reading: () => Promise<LimitCounters>): {
  backend: BackendSandbox;
  calls: string[];
  procs: Array<{ killed: boolean; reaped: boolean }>;
} {
  const calls: string[] = [];
  const procs: Array<{ killed: boolean; reaped: boolean }> = [];
  const backend = {
    id: 'fake',
    hostUid: 100000,
    counters: () => {
      calls.push('counters');
      return reading();
    },
    spawn: async (): Promise<BackendProcess> => {
      calls.push('spawn');
      const state = { killed: false, reaped: false };
      procs.push(state);
      let exit!: (e: ProcessExit) => void;
      const exited = new Promise<ProcessExit>((r) => (exit = r));
      const stdout = new PassThrough();
      const stderr = new PassThrough();
      const p: BackendProcess = {
        stdout,
        stderr,
        stdin: null,
        exited: exited.then((e) => {
          state.reaped = true;
          return e;
        }),
        kill: () => {
          state.killed = true;
          stdout.end();
          stderr.end();
          exit({ exitCode: null, signal: 'SIGKILL' });
        },
      };
      // Exits by itself a little later, unless killed first.
      setTimeout(() => {
        if (state.killed) return;
        stdout.end();
        stderr.end();
        exit({ exitCode: 0, signal: null });
      }, 20);
      return p;
    },
    destroy: async () => {},
  } as unknown as BackendSandbox;
  return { backend, calls, procs };
}

function sandbox(backend: BackendSandbox): SandboxBase {
  return new SandboxBase(backend, SandboxSpecSchema.parse({ persistent: true }), {
    spillDir: spill,
    maxSpillBytes: 1 << 20,
    onGone: () => {},
  });
}

describe('exec and the limit counters (fake backend)', () => {
  it('requests the reading before the spawn, without waiting for it', async () => {
    let answer!: (c: LimitCounters) => void;
    let first = true;
    // The first reading (before) waits until answered below; the one after the exit answers at once.
    const { backend, calls } = fakeBackend(() => {
      if (!first) return Promise.resolve({ oomKills: 0, pidsLimitHits: 0 });
      first = false;
      return new Promise<LimitCounters>((r) => (answer = r));
    });
    const sbx = sandbox(backend);
    const done = sbx.exec(['true']);
    // The reading is still unanswered, and the spawn was already called, after it.
    await new Promise((r) => setTimeout(r, 5));
    expect(calls).toEqual(['counters', 'spawn']);
    answer({ oomKills: 0, pidsLimitHits: 0 });
    const r = await done;
    expect(r.exitCode).toBe(0);
    expect(calls.slice(0, 2)).toEqual(['counters', 'spawn']);
  });

  it('a reading that fails after the spawn kills and reaps the process, and is the answer (exec and spawn)', async () => {
    for (const how of ['exec', 'spawn'] as const) {
      let first = true;
      const { backend, procs } = fakeBackend(() => {
        if (!first) return Promise.resolve({ oomKills: 0, pidsLimitHits: 0 });
        first = false;
        return new Promise((_, reject) => setTimeout(() => reject(new Error('reading failed')), 5));
      });
      const sbx = sandbox(backend);
      const started = how === 'exec' ? sbx.exec(['true']) : sbx.spawn(['true']);
      await expect(started).rejects.toThrow('reading failed');
      expect(procs).toEqual([{ killed: true, reaped: true }]);
    }
  });

  it('a failed spawn is the answer, not the reading', async () => {
    const { backend } = fakeBackend(() => Promise.reject(new Error('reading failed')));
    (backend as { spawn: unknown }).spawn = () => Promise.reject(new Error('spawn failed'));
    await expect(sandbox(backend).exec(['true'])).rejects.toThrow('spawn failed');
  });
});
