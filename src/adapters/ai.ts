// The `airlock-sandbox/ai` entry: the adapters for agent frameworks (issue 34 part 4). The AI SDK 7
// sandbox session and tool set (types from `ai`, an optional peer dependency: nothing here loads it)
// and OpenAI function-calling definitions.
export {
  AirlockSandboxSession,
  airlockSandboxSession,
  createAirlockSandboxSession,
  SESSION_BASE_DIR,
  type AirlockSessionOptions,
  type SessionRuntime,
} from './ai-sdk/session.js';
export { airlockTools, AIRLOCK_TOOL_NAMES, type AirlockToolsOptions } from './ai-sdk/tools.js';
export {
  openAiTools,
  handleOpenAiToolCall,
  type OpenAiFunctionTool,
  type OpenAiToolCall,
  type OpenAiToolMessage,
  type OpenAiToolName,
  type OpenAiToolsOptions,
} from './openai.js';
export {
  ExecInputSchema,
  RunCodeInputSchema,
  ReadFileInputSchema,
  WriteFileInputSchema,
  ListFilesInputSchema,
  DEFAULT_MAX_OUTPUT_CHARS,
} from './tools.js';
