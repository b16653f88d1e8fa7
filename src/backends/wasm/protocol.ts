// The messages between a WASM sandbox (main thread) and its worker thread. The worker runs user code
// in the same JS realm as its own message loop, so what it sends is peer data: the main thread
// parses every message with zod (STYLE.md habit 3) and drops what does not fit.
import { z } from 'zod';
import type { CodeLanguage } from '../../core/code.js';

/** Slots of the shared control buffer (Int32Array over a SharedArrayBuffer). */
export const CTL = {
  /** Pyodide's interrupt buffer: 2 (SIGINT) raises KeyboardInterrupt at the next bytecode check. */
  PY_SIGNAL: 0,
  /** Non-zero: the running job must stop (QuickJS's interrupt handler reads it). */
  STOP: 1,
} as const;
export const CTL_SLOTS = 2;

/** What the main thread asks of a worker. */
export type ToWorker =
  | { readonly t: 'claim'; readonly memoryBytes: number }
  | {
      readonly t: 'exec';
      readonly id: number;
      readonly argv: readonly string[];
      readonly env: Readonly<Record<string, string>>;
      readonly cwd: string;
      readonly stdin: Uint8Array | null;
    }
  | {
      readonly t: 'code';
      readonly id: number;
      readonly language: CodeLanguage;
      readonly code: string;
      /** Undefined: a one-shot context, dropped after the run. */
      readonly contextId?: string;
      readonly env: Readonly<Record<string, string>>;
      readonly deadline: number;
    }
  | { readonly t: 'closeContext'; readonly id: number; readonly contextId: string };

const bytes = z.instanceof(Uint8Array);
const codeResult = z
  .object({
    text: z.string().optional(),
    json: z.unknown().optional(),
    png: z.string().optional(),
    svg: z.string().optional(),
    html: z.string().optional(),
    isMainResult: z.boolean(),
  })
  .strict();

/** What a worker sends back (parsed with this schema on arrival). */
export const FromWorkerSchema = z.discriminatedUnion('t', [
  z.object({ t: z.literal('ready'), versions: z.object({ python: z.string(), pyodide: z.string() }) }),
  z.object({ t: z.literal('failed'), message: z.string() }),
  /** From a snapshot-making worker: Pyodide's memory right after it loaded (nothing else ran). */
  z.object({ t: z.literal('snapshot'), data: bytes }),
  z.object({ t: z.literal('out'), id: z.number(), fd: z.union([z.literal(1), z.literal(2)]), data: bytes }),
  z.object({ t: z.literal('result'), id: z.number(), result: codeResult }),
  /** The job ended: exit code (exec) or the code's error (code). `stopped`: it obeyed a stop. */
  z.object({
    t: z.literal('done'),
    id: z.number(),
    exitCode: z.number().int(),
    stopped: z.boolean(),
    oom: z.boolean(),
    error: z.object({ name: z.string(), value: z.string(), traceback: z.string() }).nullable(),
  }),
]);
export type FromWorker = z.infer<typeof FromWorkerSchema>;
