// JavaScript on the WASM tier: QuickJS (quickjs-emscripten), one runtime per code context and per
// exec, each with the sandbox's memory limit and an interrupt handler that ends the run when it is
// told to stop or passes its deadline (QuickJS makes that interruption uncatchable). A runtime sees
// only what is given to it here: `console`. No require, no process, no fetch, no filesystem.
import type { QuickJSContext, QuickJSHandle, QuickJSRuntime, QuickJSWASMModule } from 'quickjs-emscripten';
import { CTL } from './protocol.js';

interface Vm {
  readonly rt: QuickJSRuntime;
  readonly ctx: QuickJSContext;
}

export interface CellOutcome {
  readonly result?: { text: string; json?: unknown; isMainResult: true };
  readonly error: { name: string; value: string; traceback: string } | null;
  readonly oom: boolean;
}

const enc = new TextEncoder();

function show(v: unknown): string {
  if (typeof v === 'string') return v;
  if (v === undefined) return 'undefined';
  try {
    return JSON.stringify(v) ?? String(v);
  } catch {
    return String(v);
  }
}

export class JsRunner {
  private readonly contexts = new Map<string, Vm>();
  private deadline = Number.POSITIVE_INFINITY;

  constructor(
    private readonly qjs: QuickJSWASMModule,
    private readonly ctl: Int32Array,
    private readonly memoryBytes: number,
    private readonly emit: (fd: 1 | 2, data: Uint8Array) => void,
  ) {}

  private make(): Vm {
    const rt = this.qjs.newRuntime();
    rt.setMemoryLimit(this.memoryBytes);
    rt.setMaxStackSize(1024 * 1024);
    rt.setInterruptHandler(() => Atomics.load(this.ctl, CTL.STOP) !== 0 || Date.now() > this.deadline);
    const ctx = rt.newContext();
    const con = ctx.newObject();
    for (const [name, fd] of [
      ['log', 1],
      ['info', 1],
      ['debug', 1],
      ['warn', 2],
      ['error', 2],
    ] as const) {
      const fn = ctx.newFunction(name, (...args: QuickJSHandle[]) => {
        this.emit(fd, enc.encode(`${args.map((h) => show(ctx.dump(h))).join(' ')}\n`));
      });
      ctx.setProp(con, name, fn);
      fn.dispose();
    }
    ctx.setProp(ctx.global, 'console', con);
    con.dispose();
    return { rt, ctx };
  }

  private static dispose(vm: Vm): void {
    vm.ctx.dispose();
    vm.rt.dispose();
  }

  /** Evaluate, run its promise jobs, and settle a returned promise. */
  private evaluate(vm: Vm, code: string, filename: string): { value?: unknown; error?: unknown } {
    const { ctx, rt } = vm;
    const r = ctx.evalCode(code, filename);
    if (r.error) {
      const error: unknown = ctx.dump(r.error);
      r.error.dispose();
      return { error };
    }
    const h = r.value;
    try {
      rt.executePendingJobs();
      const state = ctx.getPromiseState(h);
      if (state.type === 'fulfilled' && state.notAPromise) return { value: ctx.dump(h) };
      if (state.type === 'fulfilled') {
        const v: unknown = ctx.dump(state.value);
        state.value.dispose();
        return { value: v };
      }
      if (state.type === 'rejected') {
        const error: unknown = ctx.dump(state.error);
        state.error.dispose();
        return { error };
      }
      return { value: undefined };
    } finally {
      h.dispose();
    }
  }

  /** `node -e CODE` / `node file.js`: a fresh runtime; an uncaught error → exit 1. */
  runScript(code: string, filename: string): number {
    this.deadline = Number.POSITIVE_INFINITY;
    const vm = this.make();
    try {
      const { error } = this.evaluate(vm, code, filename);
      if (error === undefined) return 0;
      const e = describe(error);
      this.emit(2, enc.encode(`${e.traceback || `Uncaught ${e.name}: ${e.value}`}\n`));
      return 1;
    } finally {
      JsRunner.dispose(vm);
    }
  }

  /** One runCode cell in a context (created on first use; a one-shot one is dropped after). */
  runCell(code: string, contextId: string | undefined, deadline: number): CellOutcome {
    this.deadline = deadline;
    let vm = contextId === undefined ? undefined : this.contexts.get(contextId);
    if (!vm) {
      vm = this.make();
      if (contextId !== undefined) this.contexts.set(contextId, vm);
    }
    try {
      const { value, error } = this.evaluate(vm, code, '<cell>');
      if (error !== undefined) {
        const e = describe(error);
        return { error: e, oom: /out of memory/i.test(e.value) };
      }
      if (value === undefined) return { error: null, oom: false };
      const json =
        value !== null && typeof value === 'object'
          ? value
          : typeof value === 'number' || typeof value === 'boolean'
            ? value
            : undefined;
      return {
        result: { text: show(value), ...(json !== undefined ? { json } : {}), isMainResult: true },
        error: null,
        oom: false,
      };
    } finally {
      this.deadline = Number.POSITIVE_INFINITY;
      if (contextId === undefined) JsRunner.dispose(vm);
    }
  }

  close(contextId: string): void {
    const vm = this.contexts.get(contextId);
    if (!vm) return;
    this.contexts.delete(contextId);
    JsRunner.dispose(vm);
  }
}

/** A dumped QuickJS error (an object with name/message/stack, or any thrown value) → CodeError. */
function describe(e: unknown): { name: string; value: string; traceback: string } {
  if (e && typeof e === 'object') {
    const o = e as { name?: unknown; message?: unknown; stack?: unknown };
    const name = typeof o.name === 'string' ? o.name : 'Error';
    const value = typeof o.message === 'string' ? o.message : show(e);
    const stack = typeof o.stack === 'string' ? o.stack : '';
    return { name, value, traceback: `${name}: ${value}\n${stack}`.trimEnd() };
  }
  return { name: 'Error', value: show(e), traceback: `Uncaught ${show(e)}` };
}
