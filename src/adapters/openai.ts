// OpenAI function calling: `openAiTools()` gives the `tools` array of a Chat Completions (or
// Responses) request, with each function's parameters as JSON Schema generated from the same zod
// schemas the other adapters use; `handleOpenAiToolCall(sbx, call)` runs one call the model made and
// returns the message to send back. No OpenAI client is needed: these are plain JSON shapes.
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import { parseOrThrow } from '../core/validate.js';
import type { PortableSandbox } from '../sandbox/portable.js';
import {
  DEFAULT_MAX_OUTPUT_CHARS,
  ExecInputSchema,
  ListFilesInputSchema,
  ReadFileInputSchema,
  RunCodeInputSchema,
  TOOL_DESCRIPTIONS,
  WriteFileInputSchema,
  toolExecutors,
} from './tools.js';

/** One entry of the `tools` array of a Chat Completions request. */
export interface OpenAiFunctionTool {
  readonly type: 'function';
  readonly function: {
    readonly name: string;
    readonly description: string;
    readonly parameters: Record<string, unknown>;
  };
}

/** A tool call as the model returns it (`choices[0].message.tool_calls[i]`). */
export interface OpenAiToolCall {
  readonly id: string;
  readonly type?: 'function';
  readonly function: { readonly name: string; readonly arguments: string };
}

/** The message answering one tool call (append it to the conversation). */
export interface OpenAiToolMessage {
  readonly role: 'tool';
  readonly tool_call_id: string;
  /** The tool's result as JSON text. */
  readonly content: string;
}

const SCHEMAS = {
  bash: { schema: ExecInputSchema, description: TOOL_DESCRIPTIONS.exec },
  runCode: { schema: RunCodeInputSchema, description: TOOL_DESCRIPTIONS.runCode },
  readFile: { schema: ReadFileInputSchema, description: TOOL_DESCRIPTIONS.readFile },
  writeFile: { schema: WriteFileInputSchema, description: TOOL_DESCRIPTIONS.writeFile },
  listFiles: { schema: ListFilesInputSchema, description: TOOL_DESCRIPTIONS.listFiles },
} as const;

/** The function names `openAiTools` offers. */
export type OpenAiToolName = keyof typeof SCHEMAS;

/** Options of `openAiTools` and `handleOpenAiToolCall`. */
export interface OpenAiToolsOptions {
  /** Offer `runCode` (default true: a sandbox without runCode answers a call with an error). */
  readonly runCode?: boolean;
  /** Characters kept of each output field (default 16000). */
  readonly maxOutputChars?: number;
}

/** The function definitions, JSON Schema draft 2020-12 from the zod schemas (zod's toJSONSchema). */
export function openAiTools(opts: OpenAiToolsOptions = {}): OpenAiFunctionTool[] {
  return (Object.keys(SCHEMAS) as OpenAiToolName[])
    .filter((name) => name !== 'runCode' || opts.runCode !== false)
    .map((name) => {
      const { $schema: _drop, ...parameters } = z.toJSONSchema(SCHEMAS[name].schema, { io: 'input' });
      return { type: 'function', function: { name, description: SCHEMAS[name].description, parameters } };
    });
}

/**
 * Run one tool call in `sbx`. Arguments that are not JSON or do not fit the schema, and an unknown
 * function name, are INVALID_ARGUMENT errors (naming the field); what the sandbox refuses (a missing
 * file, denied code) comes back inside the message as `{ error }` for the model to act on.
 */
export async function handleOpenAiToolCall(
  sbx: PortableSandbox,
  call: OpenAiToolCall,
  opts: OpenAiToolsOptions & { signal?: AbortSignal } = {},
): Promise<OpenAiToolMessage> {
  const name = call?.function?.name;
  if (typeof name !== 'string' || !Object.hasOwn(SCHEMAS, name)) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `unknown tool "${String(name).slice(0, 64)}"; the tools are ${Object.keys(SCHEMAS).join(', ')}`,
      { field: 'function.name' },
    );
  }
  if (name === 'runCode' && opts.runCode === false) {
    throw new AirlockError('INVALID_ARGUMENT', 'runCode is not offered (runCode: false)', {
      field: 'function.name',
    });
  }
  let raw: unknown;
  try {
    raw = JSON.parse(typeof call.function.arguments === 'string' ? call.function.arguments : '');
  } catch {
    throw new AirlockError('INVALID_ARGUMENT', `the arguments of ${name} are not JSON`, {
      field: 'function.arguments',
    });
  }
  const tool = name as OpenAiToolName;
  const input = parseOrThrow(SCHEMAS[tool].schema, raw, `${tool} arguments`, 'INVALID_ARGUMENT');
  const run = toolExecutors(sbx, opts.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS);
  let result: unknown;
  switch (tool) {
    case 'bash':
      result = await run.exec(input as z.infer<typeof ExecInputSchema>, opts.signal);
      break;
    case 'runCode':
      result = await run.runCode(input as z.infer<typeof RunCodeInputSchema>, opts.signal);
      break;
    case 'readFile':
      result = await run.readFile(input as z.infer<typeof ReadFileInputSchema>);
      break;
    case 'writeFile':
      result = await run.writeFile(input as z.infer<typeof WriteFileInputSchema>);
      break;
    case 'listFiles':
      result = await run.listFiles(input as z.infer<typeof ListFilesInputSchema>);
      break;
  }
  return { role: 'tool', tool_call_id: call.id, content: JSON.stringify(result) };
}
