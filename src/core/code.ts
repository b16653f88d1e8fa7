// The code-execution seam (issue 34): the types of `sbx.runCode`, of stateful code contexts, of the
// static analysis that may stop code before it runs, and of the optional backend hook a tier with
// its own interpreters (the WASM tier) implements. Types and schemas only: the kernels live in
// src/sandbox/code/, the analysis in src/guard/code/, the WASM interpreters in src/backends/wasm/.
import { z } from 'zod';
import { AirlockError } from './errors.js';

/** The languages `runCode` accepts. */
export const CODE_LANGUAGES = ['python', 'javascript', 'typescript', 'bash'] as const;
/** One of `CODE_LANGUAGES`. */
export type CodeLanguage = (typeof CODE_LANGUAGES)[number];

/**
 * One rich result of a run, in E2B Code Interpreter's shape: the value of the last expression
 * (`isMainResult`), or an object the code displayed (a figure, a table). Each present field is one
 * representation of the same value.
 */
export interface CodeResult {
  /** text/plain (the repr of the value). */
  readonly text?: string;
  /** application/json. */
  readonly json?: unknown;
  /** image/png, base64. */
  readonly png?: string;
  /** image/svg+xml. */
  readonly svg?: string;
  /** text/html. */
  readonly html?: string;
  /** True for the value of the cell's last expression; false for what the code displayed. */
  readonly isMainResult: boolean;
}

/** An error the code raised (its own exception, not Airlock's): E2B's `{ name, value, traceback }`. */
export interface CodeError {
  /** The exception's type name, e.g. `ZeroDivisionError`, `TypeError`. */
  readonly name: string;
  /** Its message. */
  readonly value: string;
  /** The traceback as the language prints it. */
  readonly traceback: string;
}

/** What one `runCode` gives back. */
export interface Execution {
  readonly results: CodeResult[];
  readonly stdout: string;
  readonly stderr: string;
  /** The code's own error, or null when it ran to the end. */
  readonly error: CodeError | null;
  /** What the static analysis found (warn and allow findings; a deny never runs and throws CODE_DENIED). */
  readonly findings: CodeFinding[];
}

/** A stateful context: variables, imports and functions survive from one `runCode` to the next. */
export interface CodeContextRef {
  readonly id: string;
  readonly language: CodeLanguage;
}

/** Options of `sbx.runCode(code, opts)`. */
export interface RunCodeOptions {
  /** Default 'python'; with a context, the context's language (a different one is INVALID_ARGUMENT). */
  readonly language?: CodeLanguage;
  /** A context from `sbx.createCodeContext()`; without one, the code runs in a fresh one-shot context. */
  readonly context?: CodeContextRef;
  /** Kill the run after this long (the error is a timeout); default 60 s. */
  readonly timeoutMs?: number;
  readonly onStdout?: (chunk: string) => void;
  readonly onStderr?: (chunk: string) => void;
  readonly onResult?: (result: CodeResult) => void;
  readonly envs?: Readonly<Record<string, string>>;
  readonly signal?: AbortSignal;
  /** The analysis policy of this run (default: the sandbox spec's `codePolicy`). */
  readonly policy?: CodePolicy;
}

/** Options of `sbx.createCodeContext()`. */
export interface CreateCodeContextOptions {
  /** Default 'python'. */
  readonly language?: CodeLanguage;
  /** Working directory of the context's kernel (absolute, inside the sandbox). */
  readonly cwd?: string;
  /** Environment variables of the context's kernel. */
  readonly envs?: Readonly<Record<string, string>>;
}

// ---- Static analysis (src/guard/code/) ---------------------------------------------------------

/** How bad a finding is. */
export const CODE_SEVERITIES = ['high', 'medium', 'low'] as const;
export type CodeSeverity = (typeof CODE_SEVERITIES)[number];

/** What a policy does with a finding: deny stops the run, warn runs and reports, allow ignores. */
export const CODE_ACTIONS = ['deny', 'warn', 'allow'] as const;
export type CodeAction = (typeof CODE_ACTIONS)[number];

/** One thing the analysis found, with what the policy decided for it. */
export interface CodeFinding {
  /** Stable rule id, e.g. `obfuscated-exec` (docs/guides/code-analysis.md lists them). */
  readonly rule: string;
  readonly severity: CodeSeverity;
  /** Why it matters, written for the model that wrote the code (what to do instead). */
  readonly reason: string;
  /** 1-based position of the offending node. */
  readonly line: number;
  readonly column: number;
  /** The offending source text, cut to a short length. */
  readonly snippet: string;
  readonly action: CodeAction;
}

/**
 * The analysis policy (spec field `codePolicy`, or per call): an action per rule id, then per
 * severity. Defaults: high → deny, medium → warn, low → warn.
 */
export const CodePolicySchema = z
  .object({
    /** Action per rule id; wins over `severity`. */
    rules: z.record(z.string().regex(/^[a-z][a-z0-9-]{0,63}$/), z.enum(CODE_ACTIONS)).optional(),
    /** Action per severity. */
    severity: z.partialRecord(z.enum(CODE_SEVERITIES), z.enum(CODE_ACTIONS)).optional(),
    /** Turn the analysis off entirely (every run allowed, nothing reported). */
    disabled: z.boolean().optional(),
  })
  .strict();
/** The analysis policy (see `CodePolicySchema`). */
export type CodePolicy = z.infer<typeof CodePolicySchema>;

/** The analysis's verdict on one piece of code. */
export interface CodeVerdict {
  /** False when any finding's action is deny. */
  readonly allowed: boolean;
  readonly findings: CodeFinding[];
}

// ---- Backend hook (a tier with its own interpreters) -------------------------------------------

/** A run handed to a backend that implements `runCode` itself (the WASM tier). */
export interface BackendRunCodeRequest {
  readonly code: string;
  readonly language: CodeLanguage;
  /** The context to run in (created on first use); undefined for a one-shot context. */
  readonly contextId?: string;
  readonly timeoutMs: number;
  readonly envs: Readonly<Record<string, string>>;
  readonly onStdout?: (chunk: string) => void;
  readonly onStderr?: (chunk: string) => void;
  readonly onResult?: (result: CodeResult) => void;
  readonly signal?: AbortSignal;
}

/** What a backend's own `runCode` gives back (the sandbox layer adds the findings). */
export type BackendExecution = Omit<Execution, 'findings'>;

// ---- Denials and events --------------------------------------------------------------------------

/** What the analysis decided about one run: deny (it never ran), warn (it ran, with findings), allow. */
export type CodeDecision = 'allow' | 'warn' | 'deny';

/** The decision a verdict amounts to. */
export function codeDecision(v: CodeVerdict): CodeDecision {
  if (!v.allowed) return 'deny';
  return v.findings.some((f) => f.action === 'warn') ? 'warn' : 'allow';
}

/**
 * The CODE_DENIED error: the static analysis stopped the code before it ran. `findings` lists every
 * finding (the denying ones have action 'deny'); the message names each denying rule and its reason.
 */
export class CodeDeniedError extends AirlockError {
  readonly findings: CodeFinding[];
  /** `message`: as a server sent it (default: made from the findings). */
  constructor(findings: CodeFinding[], message?: string) {
    const denied = findings.filter((f) => f.action === 'deny');
    super(
      'CODE_DENIED',
      message ??
        `the code was not run: the static analysis denied it (${denied
          .map((f) => `rule ${f.rule} at line ${f.line}: ${f.reason}`)
          .join('; ')}). Change the code, or the sandbox's codePolicy if the rule does not apply`,
    );
    this.findings = findings;
  }

  override toJSON(): { code: 'CODE_DENIED'; message: string; findings: CodeFinding[] } {
    return { code: 'CODE_DENIED', message: this.message, findings: this.findings };
  }
}
