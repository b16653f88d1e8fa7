// runCode and code contexts on the wire (issue 34): the request and event schemas of
// POST /v1/sandboxes/:id/code (NDJSON) and /v1/sandboxes/:id/code/contexts, the server side that turns
// `sbx.runCode`'s callbacks into that stream, and the client side that turns it back into an
// Execution. A run the static analysis denies is an ordinary error response before the stream
// starts: 422 CODE_DENIED with `findings` in the error body (http-errors.ts sends toJSON()).
import { z } from 'zod';
import {
  CODE_ACTIONS,
  CODE_LANGUAGES,
  CODE_SEVERITIES,
  CodePolicySchema,
  type CodeContextRef,
  type CodeResult,
  type Execution,
  type RunCodeOptions,
} from '../core/code.js';
import { AirlockError } from '../core/errors.js';

export const CodeFindingSchema = z.object({
  rule: z.string(),
  severity: z.enum(CODE_SEVERITIES),
  reason: z.string(),
  line: z.number(),
  column: z.number(),
  snippet: z.string(),
  action: z.enum(CODE_ACTIONS),
});

export const CodeResultSchema = z.object({
  text: z.string().optional(),
  json: z.unknown().optional(),
  png: z.string().optional(),
  svg: z.string().optional(),
  html: z.string().optional(),
  isMainResult: z.boolean(),
});

export const CodeErrorSchema = z.object({ name: z.string(), value: z.string(), traceback: z.string() });

export const ExecutionSchema = z.object({
  results: z.array(CodeResultSchema),
  stdout: z.string(),
  stderr: z.string(),
  error: CodeErrorSchema.nullable(),
  findings: z.array(CodeFindingSchema),
});

/** POST /v1/sandboxes/:id/code. */
export const RunCodeRequestSchema = z
  .object({
    code: z.string().max(4 * 1024 * 1024),
    /** Default python; with a context, the context's language. */
    language: z.enum(CODE_LANGUAGES).optional(),
    /** A context id from POST …/code/contexts. */
    context: z.string().min(1).max(100).optional(),
    timeoutMs: z.number().int().positive().max(86_400_000).optional(),
    envs: z.record(z.string(), z.string()).optional(),
    /** The analysis policy of this run (default: the sandbox's codePolicy). */
    policy: CodePolicySchema.optional(),
  })
  .strict();
export type RunCodeRequest = z.infer<typeof RunCodeRequestSchema>;

/** POST /v1/sandboxes/:id/code/contexts. */
export const CreateCodeContextRequestSchema = z
  .object({
    language: z.enum(CODE_LANGUAGES).optional(),
    cwd: z.string().min(1).max(4096).optional(),
    envs: z.record(z.string(), z.string()).optional(),
  })
  .strict();
export type CreateCodeContextRequest = z.infer<typeof CreateCodeContextRequestSchema>;

export const CodeContextViewSchema = z.object({ id: z.string(), language: z.enum(CODE_LANGUAGES) });

/**
 * One line of a run's NDJSON stream: stdout/stderr text and results as the code produces them (for
 * the callbacks), then `end` with the whole Execution (bounded as the library bounds it). An error
 * after the stream started is a last line {type:"error",code,message}.
 */
export const CodeEventSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('stdout'), text: z.string() }),
  z.object({ type: z.literal('stderr'), text: z.string() }),
  z.object({ type: z.literal('result'), result: CodeResultSchema }),
  z.object({ type: z.literal('end'), execution: ExecutionSchema }),
  z.object({ type: z.literal('error'), code: z.string(), message: z.string(), field: z.string().optional() }),
]);
export type CodeEvent = z.infer<typeof CodeEventSchema>;

/** Streamed text of one run beyond which stdout/stderr events stop (the `end` Execution still has its own bound). */
export const MAX_STREAMED_CODE_BYTES = 8 * 1024 * 1024;

/** What the server-side stream needs of a sandbox. */
export interface CodeRunnable {
  runCode(code: string, opts: RunCodeOptions): Promise<Execution>;
}

/**
 * Run `req` on `sbx` as a stream of events. The first item is produced only once the run has passed
 * the analysis and produced something, so a denial (or a bad request) throws before the stream starts.
 * Aborting `signal` (the client went away) aborts the run.
 */
export async function* runCodeEvents(
  sbx: CodeRunnable,
  req: RunCodeRequest,
  context: CodeContextRef | undefined,
  signal?: AbortSignal,
): AsyncGenerator<CodeEvent> {
  const queue: CodeEvent[] = [];
  let wake: (() => void) | undefined;
  let streamed = 0;
  const push = (e: CodeEvent): void => {
    queue.push(e);
    wake?.();
  };
  const text = (type: 'stdout' | 'stderr') => (t: string) => {
    streamed += t.length;
    if (streamed <= MAX_STREAMED_CODE_BYTES) push({ type, text: t });
  };
  let done = false;
  let failure: { e: unknown } | undefined;
  const run = sbx
    .runCode(req.code, {
      ...(req.language !== undefined ? { language: req.language } : {}),
      ...(context ? { context } : {}),
      ...(req.timeoutMs !== undefined ? { timeoutMs: req.timeoutMs } : {}),
      ...(req.envs !== undefined ? { envs: req.envs } : {}),
      ...(req.policy !== undefined ? { policy: req.policy } : {}),
      ...(signal ? { signal } : {}),
      onStdout: text('stdout'),
      onStderr: text('stderr'),
      onResult: (r) => push({ type: 'result', result: r }),
    })
    .then(
      (execution) => push({ type: 'end', execution }),
      (e: unknown) => {
        failure = { e };
        wake?.();
      },
    )
    .finally(() => {
      done = true;
      wake?.();
    });
  try {
    for (;;) {
      const e = queue.shift();
      if (e) {
        yield e;
        if (e.type === 'end') return;
        continue;
      }
      if (failure) throw failure.e;
      if (done) return;
      await new Promise<void>((r) => (wake = r));
      wake = undefined;
    }
  } finally {
    await run;
  }
}

/**
 * The client side: read a run's events to its `end` (calling the callbacks on the way) and return
 * its Execution. An error line (or a stream that ends without `end`) throws.
 */
export async function executionFromEvents(
  events: AsyncIterable<CodeEvent>,
  opts: Pick<RunCodeOptions, 'onStdout' | 'onStderr' | 'onResult'>,
): Promise<Execution> {
  const call = <T>(f: ((v: T) => void) | undefined, v: T): void => {
    try {
      f?.(v);
    } catch {
      /* the caller's bug; the run goes on */
    }
  };
  for await (const e of events) {
    if (e.type === 'stdout') call(opts.onStdout, e.text);
    else if (e.type === 'stderr') call(opts.onStderr, e.text);
    else if (e.type === 'result') call(opts.onResult, e.result as CodeResult);
    else if (e.type === 'end') return e.execution as Execution;
  }
  throw new AirlockError('INTERNAL', 'the server ended the code stream without its result');
}
