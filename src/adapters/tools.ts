// The agent-facing tools every adapter offers (the AI SDK tool set, OpenAI function calling, the MCP
// server): one zod input schema per tool and one executor per tool over a sandbox, local or remote.
// Each executor returns a bounded, model-readable object: output cut to a size (head and tail kept,
// the cut named), exit codes, and Airlock's own refusals (a missing file, code the analysis denied) as
// `{ error }` the model can act on, rather than an exception that ends the agent's loop.
import { z } from 'zod';
import { CODE_LANGUAGES, type Execution, type RunCodeOptions } from '../core/code.js';
import { AirlockError } from '../core/errors.js';
import type { PortableSandbox } from '../sandbox/portable.js';

/** Characters of each text field a tool result keeps by default (stdout, stderr, a file's content). */
export const DEFAULT_MAX_OUTPUT_CHARS = 16_000;

const path = z
  .string()
  .min(1)
  .max(4096)
  .refine((p) => !p.includes('\0'), 'paths hold no NUL')
  .describe('Path inside the sandbox; relative paths are under /workspace');
const timeoutMs = z
  .number()
  .int()
  .min(1)
  .max(600_000)
  .optional()
  .describe('Kill it after this many milliseconds (default 60000)');

/** `bash` / `exec`: one shell command. */
export const ExecInputSchema = z
  .object({
    command: z.string().min(1).max(100_000).describe('Shell command, run with /bin/sh -c'),
    cwd: path.optional().describe('Working directory (default /workspace)'),
    timeoutMs,
  })
  .strict();

/** `runCode` / `run_code`: a piece of code in one of the kernel languages. */
export const RunCodeInputSchema = z
  .object({
    code: z.string().min(1).max(1_000_000).describe('The code to run'),
    language: z.enum(CODE_LANGUAGES).optional().describe('Default python'),
    timeoutMs,
  })
  .strict();

/** `readFile` / `read_file`: a text file, optionally a line range. */
export const ReadFileInputSchema = z
  .object({
    path,
    startLine: z.number().int().min(1).optional().describe('1-based first line (default 1)'),
    endLine: z.number().int().min(1).optional().describe('1-based last line, inclusive (default: the end)'),
  })
  .strict();

/** `writeFile` / `write_file`: create or replace a text file (parent directories are made). */
export const WriteFileInputSchema = z
  .object({ path, content: z.string().max(10_000_000).describe('The whole new content') })
  .strict();

/** `list_files`: the entries of one directory. */
export const ListFilesInputSchema = z
  .object({ path: path.optional().describe('Directory (default /workspace)') })
  .strict();

export type ExecInput = z.infer<typeof ExecInputSchema>;
export type RunCodeInput = z.infer<typeof RunCodeInputSchema>;
export type ReadFileInput = z.infer<typeof ReadFileInputSchema>;
export type WriteFileInput = z.infer<typeof WriteFileInputSchema>;
export type ListFilesInput = z.infer<typeof ListFilesInputSchema>;

/** Descriptions written for the model. */
export const TOOL_DESCRIPTIONS = {
  exec: 'Run a shell command in an isolated Linux sandbox and return its exit code, stdout and stderr (long output is cut in the middle).',
  runCode:
    'Run code (python, javascript, typescript or bash) in the sandbox and return its results, stdout, stderr and error. Code is checked by a static analysis first; a refused run says why.',
  readFile: 'Read a text file from the sandbox (optionally a range of lines).',
  writeFile: 'Create or replace a text file in the sandbox (parent directories are created).',
  listFiles: 'List the entries of a directory in the sandbox.',
} as const;

/** A sandbox that may offer runCode (the library's Sandbox once the code-execution surface is in). */
export type CodeCapable = PortableSandbox & {
  runCode?: (code: string, opts?: RunCodeOptions) => Promise<Execution>;
};

/** Whether `sbx` can run code through `runCode`. */
export function hasRunCode(sbx: PortableSandbox): boolean {
  return typeof (sbx as CodeCapable).runCode === 'function';
}

/** Airlock's refusal, as a tool result: the code and a message that says what to do. */
export interface ToolError {
  readonly error: { readonly code: string; readonly message: string; readonly findings?: unknown };
}

export interface ExecOutput {
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
  /** What ended it early (timeout, oom, …), when something did. */
  readonly killedBy?: string;
}

export interface RunCodeOutput {
  readonly results: ReadonlyArray<Record<string, unknown>>;
  readonly stdout: string;
  readonly stderr: string;
  readonly error: { readonly name: string; readonly value: string; readonly traceback: string } | null;
  readonly findings: ReadonlyArray<{ rule: string; severity: string; reason: string; line: number }>;
}

/** `text` cut to `max` characters: its head and tail, with how much was left out between them. */
export function clip(text: string, max: number): string {
  if (text.length <= max) return text;
  const marker = (n: number): string => `\n…[${n} characters cut]…\n`;
  const keep = Math.max(0, max - marker(text.length).length);
  const head = Math.ceil(keep / 2);
  const tail = keep - head;
  return text.slice(0, head) + marker(text.length - keep) + (tail > 0 ? text.slice(-tail) : '');
}

/** The shell exit status of a result: its code, or 128 + the signal number. */
function statusOf(exitCode: number | null, signal: NodeJS.Signals | null): number {
  if (exitCode !== null) return exitCode;
  const n = signal ? (SIGNALS[signal] ?? 9) : 9;
  return 128 + n;
}
const SIGNALS: Partial<Record<NodeJS.Signals, number>> = { SIGKILL: 9, SIGTERM: 15, SIGINT: 2, SIGPIPE: 13 };

/** Runs `f`; an AirlockError becomes a `{ error }` result, anything else is rethrown. */
export async function asToolResult<T>(f: () => Promise<T>): Promise<T | ToolError> {
  try {
    return await f();
  } catch (e) {
    if (!AirlockError.isInstance(e)) throw e;
    const findings = (e as { findings?: unknown }).findings;
    return { error: { code: e.code, message: e.message, ...(findings !== undefined ? { findings } : {}) } };
  }
}

/** Executors of the tools over one sandbox, each result bounded by `maxOutputChars`. */
export function toolExecutors(
  sbx: PortableSandbox,
  maxOutputChars = DEFAULT_MAX_OUTPUT_CHARS,
  hooks: { onExecution?: (x: Execution) => void } = {},
) {
  const max = maxOutputChars;
  return {
    async exec(input: ExecInput, signal?: AbortSignal): Promise<ExecOutput | ToolError> {
      const i = ExecInputSchema.parse(input);
      return asToolResult(async () => {
        const r = await sbx.exec(['/bin/sh', '-c', i.command], {
          ...(i.cwd !== undefined ? { cwd: absolute(i.cwd) } : {}),
          ...(i.timeoutMs !== undefined ? { timeoutMs: i.timeoutMs } : {}),
          // Keep a little more than is shown: the clip below then names how much there was.
          maxOutputBytes: Math.max(4096, max * 4),
          ...(signal ? { signal } : {}),
        });
        return {
          exitCode: statusOf(r.exitCode, r.signal),
          stdout: clip(r.stdout, max),
          stderr: clip(r.stderr, max),
          ...(r.killedBy ? { killedBy: r.killedBy } : {}),
        };
      });
    },

    async runCode(input: RunCodeInput, signal?: AbortSignal): Promise<RunCodeOutput | ToolError> {
      const i = RunCodeInputSchema.parse(input);
      const runCode = (sbx as CodeCapable).runCode;
      if (typeof runCode !== 'function') {
        return {
          error: {
            code: 'INVALID_ARGUMENT',
            message: 'this sandbox has no runCode; run the code with the exec tool instead',
          },
        };
      }
      return asToolResult(async () => {
        const x = await runCode.call(sbx, i.code, {
          language: i.language ?? 'python',
          ...(i.timeoutMs !== undefined ? { timeoutMs: i.timeoutMs } : {}),
          ...(signal ? { signal } : {}),
        });
        hooks.onExecution?.(x); // the unshaped Execution (airlock mcp-server sends its figures)
        return shapeExecution(x, max);
      });
    },

    async readFile(input: ReadFileInput): Promise<{ content: string; totalLines: number } | ToolError> {
      const i = ReadFileInputSchema.parse(input);
      return asToolResult(async () => {
        const text = await sbx.files.read(absolute(i.path), { maxBytes: 64 * 1024 * 1024 });
        const lines = text.split('\n');
        const from = (i.startLine ?? 1) - 1;
        const to = i.endLine ?? lines.length;
        const picked =
          i.startLine === undefined && i.endLine === undefined ? text : lines.slice(from, to).join('\n');
        return { content: clip(picked, max), totalLines: lines.length };
      });
    },

    async writeFile(input: WriteFileInput): Promise<{ path: string; bytes: number } | ToolError> {
      const i = WriteFileInputSchema.parse(input);
      return asToolResult(async () => {
        const p = absolute(i.path);
        await sbx.files.write(p, i.content);
        return { path: p, bytes: Buffer.byteLength(i.content) };
      });
    },

    async listFiles(
      input: ListFilesInput,
    ): Promise<{ entries: Array<{ name: string; type: string; size: number }>; more?: number } | ToolError> {
      const i = ListFilesInputSchema.parse(input);
      return asToolResult(async () => {
        const all = await sbx.files.list(absolute(i.path ?? '/workspace'));
        const LIMIT = 500;
        const entries = all.slice(0, LIMIT).map((e) => ({ name: e.name, type: e.type, size: e.size }));
        return all.length > LIMIT ? { entries, more: all.length - LIMIT } : { entries };
      });
    },
  };
}

/** A tool-executor set (the shape `toolExecutors` returns). */
export type ToolExecutors = ReturnType<typeof toolExecutors>;

/** A path inside the sandbox, made absolute against /workspace (the base every adapter uses). */
export function absolute(p: string): string {
  if (p.includes('\0')) throw new AirlockError('INVALID_ARGUMENT', 'paths hold no NUL', { field: 'path' });
  return p.startsWith('/') ? p : `/workspace/${p}`;
}

/** An Execution as a model reads it: text fields clipped, images named by size rather than inlined. */
export function shapeExecution(x: Execution, max: number): RunCodeOutput {
  return {
    results: x.results.map((r) => {
      const o: Record<string, unknown> = { isMainResult: r.isMainResult };
      if (r.text !== undefined) o.text = clip(r.text, max);
      if (r.json !== undefined) {
        const j = JSON.stringify(r.json);
        o.json = j.length <= max ? r.json : clip(j, max);
      }
      if (r.html !== undefined) o.html = clip(r.html, max);
      if (r.png !== undefined) o.png = `[image/png, ${Math.floor((r.png.length * 3) / 4)} bytes]`;
      if (r.svg !== undefined) o.svg = `[image/svg+xml, ${r.svg.length} characters]`;
      return o;
    }),
    stdout: clip(x.stdout, max),
    stderr: clip(x.stderr, max),
    error: x.error
      ? { name: x.error.name, value: clip(x.error.value, max), traceback: clip(x.error.traceback, max) }
      : null,
    findings: x.findings.map((f) => ({ rule: f.rule, severity: f.severity, reason: f.reason, line: f.line })),
  };
}
