// `airlockTools(sbx)`: a ToolSet for the AI SDK's generateText/streamText (bash, runCode, readFile,
// writeFile) over one Airlock sandbox. Tools are plain objects (what the SDK's `tool()` returns), so
// only types come from `ai`. Inputs are the zod schemas of ../tools.ts; outputs are bounded JSON.
import type { Tool, ToolSet } from 'ai';
import type { PortableSandbox } from '../../sandbox/portable.js';
import {
  DEFAULT_MAX_OUTPUT_CHARS,
  ExecInputSchema,
  ReadFileInputSchema,
  RunCodeInputSchema,
  TOOL_DESCRIPTIONS,
  WriteFileInputSchema,
  hasRunCode,
  toolExecutors,
} from '../tools.js';

/** Options of `airlockTools`. */
export interface AirlockToolsOptions {
  /** Characters kept of each output field (stdout, stderr, a file); default 16000. */
  readonly maxOutputChars?: number;
  /**
   * Offer `runCode` (default: when the sandbox has runCode). False drops it; true offers it even so
   * (a call then answers that the sandbox cannot run code).
   */
  readonly runCode?: boolean;
}

/** The names of the tools `airlockTools` returns. */
export const AIRLOCK_TOOL_NAMES = ['bash', 'runCode', 'readFile', 'writeFile'] as const;

/**
 * Tools that act in `sbx` (local or remote): `bash` runs a shell command, `runCode` runs code through
 * `sbx.runCode` (when the sandbox has it), `readFile` and `writeFile` work on its files.
 */
export function airlockTools(sbx: PortableSandbox, opts: AirlockToolsOptions = {}): ToolSet {
  const run = toolExecutors(sbx, opts.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS);
  const tools: Record<string, Tool> = {
    bash: {
      description: TOOL_DESCRIPTIONS.exec,
      inputSchema: ExecInputSchema,
      execute: (input: unknown, o: { abortSignal?: AbortSignal }) => run.exec(input as never, o.abortSignal),
    } as Tool,
    readFile: {
      description: TOOL_DESCRIPTIONS.readFile,
      inputSchema: ReadFileInputSchema,
      execute: (input: unknown) => run.readFile(input as never),
    } as Tool,
    writeFile: {
      description: TOOL_DESCRIPTIONS.writeFile,
      inputSchema: WriteFileInputSchema,
      execute: (input: unknown) => run.writeFile(input as never),
    } as Tool,
  };
  if (opts.runCode ?? hasRunCode(sbx)) {
    tools.runCode = {
      description: TOOL_DESCRIPTIONS.runCode,
      inputSchema: RunCodeInputSchema,
      execute: (input: unknown, o: { abortSignal?: AbortSignal }) =>
        run.runCode(input as never, o.abortSignal),
    } as Tool;
  }
  return tools;
}
