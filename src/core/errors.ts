// Typed errors with stable string codes (STYLE.md habit 4). Callers branch on `code`, never on message
// text. The mapping from code to CLI exit code / HTTP status lives here and only here.

/** Every `AirlockError` code with its CLI exit code and HTTP status. */
export const ERROR_CODES = {
  INVALID_SPEC: { exit: 2, http: 400 },
  INVALID_ARGUMENT: { exit: 2, http: 400 },
  SANDBOX_NOT_FOUND: { exit: 3, http: 404 },
  SANDBOX_GONE: { exit: 3, http: 410 },
  BACKEND_UNAVAILABLE: { exit: 4, http: 503 },
  PERMISSION_DENIED: { exit: 4, http: 403 },
  FILE_NOT_FOUND: { exit: 1, http: 404 },
  FILE_TOO_LARGE: { exit: 1, http: 413 },
  /** No background process with that pid in the sandbox (the server's process table). */
  PROCESS_NOT_FOUND: { exit: 3, http: 404 },
  /** A request body or upload over the server's size cap: send less (or raise the cap). */
  REQUEST_TOO_LARGE: { exit: 1, http: 413 },
  CAPACITY_EXHAUSTED: { exit: 5, http: 503 },
  DISK_FULL: { exit: 1, http: 507 },
  ABORTED: { exit: 130, http: 499 },
  /** exec, spawn or files on a paused sandbox: `resume()` it first. */
  SANDBOX_PAUSED: { exit: 1, http: 409 },
  /** No snapshot with that id (digest) in this state dir. */
  SNAPSHOT_NOT_FOUND: { exit: 3, http: 404 },
  /** A snapshot a live sandbox (a fork) or a later snapshot still builds on: kill or remove those first. */
  SNAPSHOT_IN_USE: { exit: 1, http: 409 },
  /** No template with that name, and no layer with that digest, in this state dir. */
  TEMPLATE_NOT_FOUND: { exit: 3, http: 404 },
  /** A template step failed (non-zero exit, timeout, limit): see the step index and stderr tail. */
  TEMPLATE_BUILD_FAILED: { exit: 1, http: 422 },
  /** An allowlisted executable not found on the PATH of the source root (the message names the PATH searched). */
  EXECUTABLE_NOT_FOUND: { exit: 3, http: 404 },
  /** An allowlisted file that is neither an x86-64 ELF nor a `#!` script, or that cannot be read or parsed. */
  EXECUTABLE_INVALID: { exit: 1, http: 422 },
  /** A shared library an executable needs is not in the source root (the message names who needs it). */
  LIBRARY_NOT_FOUND: { exit: 1, http: 422 },
  /** A symlink in the source root that escapes the root (`..` past `/`) or loops: fix the image or layer. */
  ROOT_LINK_UNSAFE: { exit: 1, http: 422 },
  /** A JSON-RPC message that is not exactly one well-formed, unambiguous object (MCP gateway). */
  MCP_INVALID_MESSAGE: { exit: 1, http: 400 },
  /** A gateway config, lockfile or tool rule that cannot be used as written. */
  MCP_INVALID_CONFIG: { exit: 2, http: 400 },
  /** A tool call refused by policy: tool not allowed, argument rule, quarantined definition. */
  MCP_CALL_DENIED: { exit: 1, http: 403 },
  /** A per-session budget (steps, tokens, bytes, wall time, rate) is used up. */
  MCP_BUDGET_EXHAUSTED: { exit: 1, http: 429 },
  /** The sandboxed MCP server died, hung or broke the protocol. */
  MCP_SERVER_FAILED: { exit: 1, http: 502 },
  /** Missing or wrong bearer token, or a rejected Host/Origin (gateway HTTP). */
  UNAUTHORIZED: { exit: 4, http: 401 },
  /**
   * A tenant's quota (live sandboxes, memory, CPU, creates per minute) or the server's create queue is
   * full and did not free up within the request's queueTimeoutMs: retry after the Retry-After header.
   */
  QUOTA_EXCEEDED: { exit: 5, http: 429 },
  /**
   * sbx.workspace.diff() met a change a patch cannot carry (a special file, a name that is not
   * UTF-8): remove or rename it in the sandbox first.
   */
  WORKSPACE_DIFF_UNSUPPORTED: { exit: 1, http: 422 },
  /** Nothing listens on that port inside the sandbox (or it did not accept): start its server first. */
  PORT_UNREACHABLE: { exit: 1, http: 502 },
  /** An image reference that cannot be parsed (see docs/images.md for the accepted forms). */
  IMAGE_REF_INVALID: { exit: 2, http: 400 },
  /** No such image: not in the registry (or the cache, with pull "never"), or no such tag. */
  IMAGE_NOT_FOUND: { exit: 3, http: 404 },
  /** A blob (manifest, config, layer) whose bytes do not hash to the digest that named it. */
  IMAGE_DIGEST_MISMATCH: { exit: 1, http: 502 },
  /** The image has no linux/amd64 variant: the message lists the platforms it has. */
  IMAGE_PLATFORM_UNSUPPORTED: { exit: 1, http: 422 },
  /** The image (compressed or unpacked) is over maxImageBytes: raise the cap or pick a smaller image. */
  IMAGE_TOO_LARGE: { exit: 1, http: 413 },
  /** A layer entry that cannot be unpacked safely (path traversal, write through a link, …): named in the message. */
  IMAGE_LAYER_UNSAFE: { exit: 1, http: 422 },
  /** The registry refused the credentials (or asked for some and none were given). */
  IMAGE_AUTH_FAILED: { exit: 4, http: 401 },
  /** The registry answered something a well-formed registry does not (bad status, bad manifest, refused transport). */
  IMAGE_REGISTRY_ERROR: { exit: 1, http: 502 },
  /** An image whose layers a live sandbox uses: kill that sandbox first. */
  IMAGE_IN_USE: { exit: 1, http: 409 },
  /** The static analysis denied the code before it ran: the message and `findings` say which rule and why. */
  CODE_DENIED: { exit: 1, http: 422 },
  /** No code context with that id in the sandbox (or it was closed): create one with createCodeContext(). */
  CODE_CONTEXT_NOT_FOUND: { exit: 3, http: 404 },
  INTERNAL: { exit: 70, http: 500 },
} as const satisfies Record<string, { exit: number; http: number }>;

/** The stable string codes of `AirlockError`. */
export type AirlockErrorCode = keyof typeof ERROR_CODES;

const MARKER = Symbol.for('airlock.error');

/** The one error type Airlock throws: a stable `code`, a message that says what to fix, and for spec errors the offending `field`. */
export class AirlockError extends Error {
  readonly [MARKER] = true;
  readonly code: AirlockErrorCode;
  /** Dotted path of the offending field, for spec/argument errors. */
  readonly field: string | undefined;

  constructor(code: AirlockErrorCode, message: string, opts: { field?: string; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'AirlockError';
    this.code = code;
    this.field = opts.field;
  }

  /** Works across module copies (a symbol from the global registry, not `instanceof`). */
  static isInstance(e: unknown): e is AirlockError {
    return typeof e === 'object' && e !== null && (e as Record<symbol, unknown>)[MARKER] === true;
  }

  static is(e: unknown, code: AirlockErrorCode): e is AirlockError {
    return AirlockError.isInstance(e) && e.code === code;
  }

  toJSON(): { code: AirlockErrorCode; message: string; field?: string } {
    return this.field === undefined
      ? { code: this.code, message: this.message }
      : { code: this.code, message: this.message, field: this.field };
  }
}

/** The CLI exit code for an error (2 for bad input, 70 for internal errors, …). */
export function exitCodeFor(e: unknown): number {
  return AirlockError.isInstance(e) ? ERROR_CODES[e.code].exit : ERROR_CODES.INTERNAL.exit;
}

/** The HTTP status for an error. */
export function httpStatusFor(e: unknown): number {
  return AirlockError.isInstance(e) ? ERROR_CODES[e.code].http : ERROR_CODES.INTERNAL.http;
}
