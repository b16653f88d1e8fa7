// `sbx.runCode` and code contexts (issue 34). Every run first goes through the static analysis
// (guard/code analyzeCode): a denied run never starts and throws CODE_DENIED; every decision is
// reported to the sandbox's code events and the audit sink. Then the code runs in the backend's own
// interpreters when the tier has them (BackendSandbox.runCode, the WASM tier), else in a kernel
// process inside the sandbox (kernel.ts), one per context, started on first use.
import { randomBytes } from 'node:crypto';
import {
  CODE_LANGUAGES,
  CodeDeniedError,
  codeDecision,
  type BackendExecution,
  type CodeContextRef,
  type CodeError,
  type CodeLanguage,
  type CreateCodeContextOptions,
  type Execution,
  type RunCodeOptions,
} from '../../core/code.js';
import type { BackendSandbox } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import { lazyRequire } from '../../core/lazy.js';
import { EnvSchema, parseOrThrow, type SandboxSpec } from '../../core/spec.js';
import type { CodeAuditEvent } from '../../mcp/audit.js';
import { Kernel, kernelKind, type KernelRun, type KernelSpawn } from './kernel.js';

// esbuild (CommonJS) is required on first TypeScript run: a dynamic import() would not work from the
// CLI's CommonJS bundle, which keeps esbuild external.
const esbuild = lazyRequire<typeof import('esbuild')>('esbuild');

/** Longest code accepted by one run. */
export const MAX_CODE_BYTES = 4 * 1024 * 1024;
/** Default of RunCodeOptions.timeoutMs. */
export const DEFAULT_CODE_TIMEOUT_MS = 60_000;
const MAX_TIMEOUT_MS = 24 * 3_600_000;
/** Contexts one sandbox may hold at once. */
export const MAX_CODE_CONTEXTS = 64;

/** What the runner needs of its sandbox. */
export interface CodeHost {
  readonly sandboxId: string;
  readonly spec: SandboxSpec;
  readonly backend: Pick<BackendSandbox, 'runCode' | 'closeCodeContext'>;
  readonly spawn: KernelSpawn;
  /** Throws SANDBOX_GONE / SANDBOX_PAUSED when the sandbox cannot run code now. */
  assertRunnable(): void;
  alive(): boolean;
  /** Every analysis decision (the sandbox's code events and the audit sink). */
  report(e: CodeAuditEvent): void;
}

interface Context {
  readonly ref: CodeContextRef;
  readonly cwd?: string;
  readonly envs: Readonly<Record<string, string>>;
  kernel?: Kernel;
  /** Runs of a context go one at a time, in call order. */
  queue: Promise<unknown>;
  closed: boolean;
}

export class CodeRunner {
  private readonly contexts = new Map<string, Context>();

  constructor(private readonly host: CodeHost) {}

  async create(opts: CreateCodeContextOptions = {}): Promise<CodeContextRef> {
    this.host.assertRunnable();
    const language = checkLanguage(opts.language ?? 'python');
    if (opts.cwd !== undefined && (typeof opts.cwd !== 'string' || !opts.cwd.startsWith('/'))) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        'cwd is an absolute path inside the sandbox, e.g. /workspace',
        {
          field: 'cwd',
        },
      );
    }
    const envs = parseOrThrow(EnvSchema, opts.envs ?? {}, 'code context envs', 'INVALID_ARGUMENT');
    if (this.contexts.size >= MAX_CODE_CONTEXTS) {
      throw new AirlockError(
        'CAPACITY_EXHAUSTED',
        `sandbox ${this.host.sandboxId} already has ${MAX_CODE_CONTEXTS} code contexts: close one first`,
      );
    }
    const ref: CodeContextRef = { id: `ctx-${randomBytes(8).toString('hex')}`, language };
    this.contexts.set(ref.id, {
      ref,
      ...(opts.cwd !== undefined ? { cwd: opts.cwd } : {}),
      envs,
      queue: Promise.resolve(),
      closed: false,
    });
    return ref;
  }

  list(): CodeContextRef[] {
    return [...this.contexts.values()].map((c) => ({ ...c.ref }));
  }

  /** Close a context: its kernel is killed and its state is gone. Idempotent for a known id. */
  async close(ctx: CodeContextRef | string): Promise<void> {
    const id = typeof ctx === 'string' ? ctx : ctx?.id;
    const c = typeof id === 'string' ? this.contexts.get(id) : undefined;
    if (!c) throw notFound(this.host.sandboxId, id);
    c.closed = true;
    this.contexts.delete(c.ref.id);
    await c.kernel?.kill();
    await this.host.backend.closeCodeContext?.(c.ref.id);
  }

  /** The sandbox is dying: its kernels die with it (through its spawn); forget the contexts. */
  dispose(): void {
    for (const c of this.contexts.values()) c.closed = true;
    this.contexts.clear();
  }

  async run(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    this.host.assertRunnable();
    if (typeof code !== 'string') {
      throw new AirlockError('INVALID_ARGUMENT', 'code is a string of source code', { field: 'code' });
    }
    if (Buffer.byteLength(code) > MAX_CODE_BYTES) {
      throw new AirlockError('INVALID_ARGUMENT', `code is longer than ${MAX_CODE_BYTES} bytes: send less`, {
        field: 'code',
      });
    }
    const timeoutMs = opts.timeoutMs ?? DEFAULT_CODE_TIMEOUT_MS;
    if (!Number.isInteger(timeoutMs) || timeoutMs <= 0 || timeoutMs > MAX_TIMEOUT_MS) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `timeoutMs is a whole number of ms from 1 to ${MAX_TIMEOUT_MS}`,
        {
          field: 'timeoutMs',
        },
      );
    }
    const envs = parseOrThrow(EnvSchema, opts.envs ?? {}, 'runCode envs', 'INVALID_ARGUMENT');
    let ctx: Context | undefined;
    let language: CodeLanguage;
    if (opts.context !== undefined) {
      const id: unknown = opts.context?.id;
      ctx = typeof id === 'string' ? this.contexts.get(id) : undefined;
      if (!ctx) throw notFound(this.host.sandboxId, id);
      language = ctx.ref.language;
      if (opts.language !== undefined && opts.language !== language) {
        throw new AirlockError(
          'INVALID_ARGUMENT',
          `context ${ctx.ref.id} runs ${language}, not ${String(opts.language)}: omit language or use a ${String(opts.language)} context`,
          { field: 'language' },
        );
      }
    } else {
      language = checkLanguage(opts.language ?? 'python');
    }
    if (opts.signal?.aborted) throw new AirlockError('ABORTED', 'runCode aborted before it started');

    // The gate: nothing below runs unless the analysis allows it.
    const policy = opts.policy ?? this.host.spec.codePolicy ?? {};
    // Loaded on first use: the analysis (tree-sitter and its grammars) is no part of a plain exec's start-up.
    const { analyzeCode } = await import('../../guard/code/index.js');
    const verdict = await analyzeCode(code, language, policy);
    this.host.report({
      kind: 'code',
      sandboxId: this.host.sandboxId,
      time: new Date().toISOString(),
      language,
      decision: codeDecision(verdict),
      findings: verdict.findings,
      reason: verdict.findings
        .filter((f) => f.action !== 'allow')
        .map((f) => `${f.action} ${f.rule}: ${f.reason}`)
        .join('; '),
      ...(verdict.allowed ? {} : { code: 'CODE_DENIED' }),
      ...(ctx ? { context: ctx.ref.id } : {}),
    });
    if (!verdict.allowed) throw new CodeDeniedError(verdict.findings);

    let source = code;
    if (language === 'typescript') {
      const t = await transpile(code);
      if ('error' in t)
        return { results: [], stdout: '', stderr: '', error: t.error, findings: verdict.findings };
      source = t.code;
    }
    const exec = ctx
      ? await this.inContext(ctx, source, envs, timeoutMs, opts)
      : await this.oneShot(language, source, envs, timeoutMs, opts);
    return { ...exec, findings: verdict.findings };
  }

  private inContext(
    ctx: Context,
    code: string,
    envs: Readonly<Record<string, string>>,
    timeoutMs: number,
    opts: RunCodeOptions,
  ): Promise<BackendExecution> {
    const next = ctx.queue.then(async () => {
      if (ctx.closed) throw notFound(this.host.sandboxId, ctx.ref.id);
      this.host.assertRunnable();
      if (this.host.backend.runCode) {
        return this.host.backend.runCode({
          ...backendRequest(code, ctx.ref.language, envs, timeoutMs, opts),
          contextId: ctx.ref.id,
        });
      }
      if (!ctx.kernel?.alive) {
        ctx.kernel = await Kernel.start((a, o) => this.host.spawn(a, o), kernelKind(ctx.ref.language), {
          ...(ctx.cwd !== undefined ? { cwd: ctx.cwd } : {}),
          envs: ctx.envs,
        });
        if (ctx.closed) await ctx.kernel.kill(); // closed while it started
      }
      return this.outcome(
        await ctx.kernel.run({ code, envs, timeoutMs, ...callbacks(opts) }),
        ctx.ref.language,
      );
    });
    ctx.queue = next.catch(() => {});
    return next;
  }

  private async oneShot(
    language: CodeLanguage,
    code: string,
    envs: Readonly<Record<string, string>>,
    timeoutMs: number,
    opts: RunCodeOptions,
  ): Promise<BackendExecution> {
    if (this.host.backend.runCode) {
      return this.host.backend.runCode(backendRequest(code, language, envs, timeoutMs, opts));
    }
    const kernel = await Kernel.start((a, o) => this.host.spawn(a, o), kernelKind(language), {});
    try {
      return this.outcome(await kernel.run({ code, envs, timeoutMs, ...callbacks(opts) }), language);
    } finally {
      await kernel.kill();
    }
  }

  /** A kernel's run → the Execution, or the typed error of a sandbox that died under it. */
  private outcome(run: KernelRun, language: CodeLanguage): BackendExecution {
    const lost = 'the context was restarted: its state (variables, imports, functions) is lost';
    if (run.end === 'done') return run.execution;
    if (!this.host.alive()) {
      throw new AirlockError('SANDBOX_GONE', `sandbox ${this.host.sandboxId} was killed while the code ran`);
    }
    const e = run.execution;
    if (
      run.end === 'exited' &&
      (run.exitCode === 127 || run.exitCode === 126) &&
      e.results.length === 0 &&
      /airlock: [^\n]*(not found|permission denied)/.test(e.stderr)
    ) {
      throw new AirlockError(
        'BACKEND_UNAVAILABLE',
        `cannot run ${language} in sandbox ${this.host.sandboxId}: its root has no ${interpreterOf(language)} (${e.stderr.trim()})`,
      );
    }
    const error = {
      timeout: {
        name: 'TimeoutError',
        value: `the run did not finish in its timeoutMs; it was killed and ${lost}`,
      },
      aborted: { name: 'AbortError', value: `the run was aborted; it was killed and ${lost}` },
      exited: {
        name: 'KernelExited',
        value: `the kernel exited (status ${String(run.exitCode)}) during the run; ${lost}`,
      },
      protocol: {
        name: 'KernelProtocolError',
        value: `the kernel broke the protocol (${run.detail ?? ''}); it was killed and ${lost}`,
      },
    }[run.end];
    return { ...e, error: { ...error, traceback: e.error?.traceback ?? '' } };
  }
}

function backendRequest(
  code: string,
  language: CodeLanguage,
  envs: Readonly<Record<string, string>>,
  timeoutMs: number,
  opts: RunCodeOptions,
) {
  return {
    code,
    language,
    envs,
    timeoutMs,
    ...callbacks(opts),
    ...(opts.signal ? { signal: opts.signal } : {}),
  };
}

function callbacks(opts: RunCodeOptions) {
  return {
    ...(opts.onStdout ? { onStdout: opts.onStdout } : {}),
    ...(opts.onStderr ? { onStderr: opts.onStderr } : {}),
    ...(opts.onResult ? { onResult: opts.onResult } : {}),
    ...(opts.signal ? { signal: opts.signal } : {}),
  };
}

function checkLanguage(language: unknown): CodeLanguage {
  if (!(CODE_LANGUAGES as readonly unknown[]).includes(language)) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `language must be one of ${CODE_LANGUAGES.join(', ')}, not ${JSON.stringify(language)}`,
      { field: 'language' },
    );
  }
  return language as CodeLanguage;
}

function notFound(sandboxId: string, id: unknown): AirlockError {
  return new AirlockError(
    'CODE_CONTEXT_NOT_FOUND',
    `sandbox ${sandboxId} has no code context ${JSON.stringify(id)} (it was closed, or belongs to another sandbox): create one with createCodeContext()`,
    { field: 'context' },
  );
}

function interpreterOf(language: CodeLanguage): string {
  return language === 'python' ? 'python3' : language === 'bash' ? 'sh' : 'node';
}

/**
 * TypeScript → JavaScript with esbuild's transform (types are stripped, not checked: a type error is
 * not an error). Code that does not parse is the run's own SyntaxError, as in the other languages.
 */
async function transpile(code: string): Promise<{ code: string } | { error: CodeError }> {
  const { transform } = esbuild();
  try {
    const r = await transform(code, { loader: 'ts', target: 'node20', logLevel: 'silent' });
    return { code: r.code };
  } catch (e) {
    const errors = (
      e as { errors?: Array<{ text: string; location?: { line: number; column: number } | null }> }
    ).errors;
    if (!Array.isArray(errors) || errors.length === 0) throw e; // not the code's fault: esbuild failed
    const first = errors[0];
    const where = first?.location
      ? ` (line ${first.location.line}, column ${first.location.column + 1})`
      : '';
    const value = `${first?.text ?? 'the TypeScript does not parse'}${where}`;
    return { error: { name: 'SyntaxError', value, traceback: `SyntaxError: ${value}` } };
  }
}
