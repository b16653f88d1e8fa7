// The WASM tier: pure compute in this process's worker threads. Python runs in Pyodide (CPython
// compiled to WebAssembly), JavaScript in QuickJS; the only filesystem is in memory and there is no
// network. The boundary is V8 and WebAssembly (user code makes no system calls), inside the Airlock
// process: see docs/wasm.md and the threat model. One warm worker (interpreters loaded, nothing of a
// user's) is kept ready so that a create does not pay the interpreters' load.
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type {
  BackendContext,
  BackendProbe,
  BackendSandbox,
  BackendV1,
  PreparePlan,
  ProbeCheck,
  ReapReport,
} from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import type { BackendName, SandboxSpec } from '../../core/spec.js';
import { checkHostDir, checkMountSource, realpathOr } from '../host/workspace.js';
import { WasmSandbox } from './sandbox.js';
import { WasmThread, makeSnapshot } from './thread.js';

export interface WasmOptions {
  /** Warm workers kept loaded (0 or 1; default 1). */
  readonly warmPool?: number;
}

/** What the tier cannot do, as the typed error a create gets. */
function unsupported(spec: SandboxSpec): string | undefined {
  if (spec.network) return 'network policies (the wasm tier has no network at all)';
  if (spec.secrets.length) return 'secrets (they are swapped at egress, and the wasm tier has no network)';
  if (spec.workspace.mode !== 'empty')
    return `workspace mode '${spec.workspace.mode}' (its filesystem is in memory: no host dirs)`;
  if (spec.mounts.length) return 'mounts (its filesystem is in memory: no host dirs)';
  if (spec.layers?.length) return 'snapshot layers (the wasm tier takes no snapshots)';
  if (spec.rootfs || spec.image !== undefined)
    return 'images (it runs Pyodide and QuickJS, not a root filesystem)';
  return undefined;
}

export class WasmBackend implements BackendV1 {
  readonly specificationVersion = 'v1' as const;
  readonly name: BackendName = 'wasm';
  private readonly poolSize: number;
  private warm: Promise<WasmThread> | undefined;
  private learnedMemory: number | undefined;
  private probed: Promise<BackendProbe> | undefined;
  private closed = false;
  /** Made once, on first need; undefined when it failed (workers then load Pyodide the slow way). */
  private snapshot: Promise<SharedArrayBuffer | undefined> | undefined;

  constructor(
    private readonly ctx: BackendContext,
    opts: WasmOptions = {},
  ) {
    this.poolSize = Math.min(1, opts.warmPool ?? 1);
  }

  probe(): Promise<BackendProbe> {
    this.probed ??= (async () => {
      const checks: ProbeCheck[] = [];
      const req = createRequire(import.meta.url);
      for (const pkg of ['pyodide', 'quickjs-emscripten']) {
        try {
          const v = (req(`${pkg}/package.json`) as { version: string }).version;
          checks.push({ name: pkg, ok: true, detail: `${pkg} ${v}` });
        } catch {
          checks.push({
            name: pkg,
            ok: false,
            detail: `the ${pkg} package is missing: reinstall airlock-sandbox`,
          });
        }
      }
      if (checks.every((c) => c.ok)) {
        // Cheap proofs that both interpreters can load here (a full Pyodide load takes seconds and
        // happens at the first create): Pyodide's module compiles and its stdlib is there; QuickJS
        // instantiates (its module holds no user code in this thread).
        try {
          const dir = dirname(req.resolve('pyodide'));
          const wasm = readFileSync(join(dir, 'pyodide.asm.wasm'));
          const WA = (globalThis as unknown as { WebAssembly: { compile(b: Uint8Array): Promise<unknown> } })
            .WebAssembly;
          await WA.compile(wasm);
          if (!existsSync(join(dir, 'python_stdlib.zip')))
            throw new Error(`${dir}/python_stdlib.zip is missing`);
          const { getQuickJS } = await import('quickjs-emscripten');
          const vm = (await getQuickJS()).newContext();
          vm.dispose();
          checks.push({
            name: 'interpreters',
            ok: true,
            detail: 'Pyodide (Python) and QuickJS (JavaScript) load',
          });
        } catch (e) {
          checks.push({ name: 'interpreters', ok: false, detail: (e as Error).message });
        }
      }
      const failed = checks.filter((c) => !c.ok);
      return failed.length
        ? { available: false, reason: failed.map((c) => `${c.name}: ${c.detail}`).join('; '), checks }
        : { available: true, checks };
    })();
    return this.probed;
  }

  private snapshotBuffer(): Promise<SharedArrayBuffer | undefined> {
    this.snapshot ??= makeSnapshot(this.ctx.logger).catch((e: unknown) => {
      this.ctx.logger.warn(
        { err: (e as Error).message },
        'no Pyodide snapshot: wasm workers load it in full',
      );
      return undefined;
    });
    return this.snapshot;
  }

  private async newThread(memoryBytes: number): Promise<WasmThread> {
    return new WasmThread(memoryBytes, this.ctx.logger, await this.snapshotBuffer());
  }

  /** A loaded thread for `memoryBytes`: the warm one when it fits, else a new one. */
  private async thread(memoryBytes: number): Promise<WasmThread> {
    let t = await this.warm;
    this.warm = undefined;
    if (!t || t.memoryBytes !== memoryBytes || !t.alive) {
      void t?.terminate();
      t = await this.newThread(memoryBytes);
    }
    try {
      await t.ready;
    } catch (e) {
      await t.terminate();
      throw e;
    }
    t.send({ t: 'claim', memoryBytes });
    return t;
  }

  private refill(): void {
    if (this.closed || this.poolSize < 1 || this.warm) return;
    this.warm = this.newThread(this.learnedMemory ?? 512 * 1024 * 1024);
  }

  prepare(_plan: PreparePlan): void {
    this.refill();
  }

  /** Resolves once the warm worker (if one is being made) has loaded its interpreters. */
  async whenWarm(): Promise<void> {
    await (await this.warm)?.ready.catch(() => {});
  }

  async create(spec: SandboxSpec, signal?: AbortSignal): Promise<BackendSandbox> {
    // Bad host dirs and mounts are INVALID_SPEC on every tier (checked as the host state does), before
    // this tier says it has no host dirs at all.
    const stateDir = realpathOr(this.ctx.stateDir);
    if (spec.workspace.hostDir !== undefined) checkHostDir(spec.workspace.hostDir, stateDir);
    spec.mounts.forEach((m, i) => checkMountSource(m.hostPath, stateDir, i));
    const no = unsupported(spec);
    if (no)
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        `the wasm backend does not support ${no}; use the namespaces or gvisor backend for it`,
      );
    if (signal?.aborted) throw new AirlockError('ABORTED', 'create aborted');
    const memoryBytes = spec.limits.memoryBytes;
    this.learnedMemory = memoryBytes;
    const t = await this.thread(memoryBytes);
    this.refill();
    if (this.closed) {
      await t.terminate();
      throw new AirlockError('BACKEND_UNAVAILABLE', 'the wasm backend is closed');
    }
    return new WasmSandbox(t, () => this.thread(memoryBytes));
  }

  async close(): Promise<void> {
    this.closed = true;
    const t = this.warm;
    this.warm = undefined;
    await (await t)?.terminate();
    // A snapshot being made finishes on its own (its worker ends after handing it over).
    await this.snapshot;
  }

  /** Worker threads die with their process: a crashed Airlock leaves nothing of this tier behind. */
  reapOrphans(): Promise<ReapReport> {
    return Promise.resolve({ sandboxes: 0 });
  }
}
