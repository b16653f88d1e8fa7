// Public API: named exports only.
export { Sandbox, defaultAirlock } from './sandbox/index.js';
export { Airlock, DEFAULT_STATE_DIR, type AirlockOptions } from './sandbox/airlock.js';
export type { ExecResult, ExecOptions, ExecHandle, KilledBy, SandboxInfo } from './sandbox/sandbox.js';
export type { FileEntry } from './sandbox/files.js';
export {
  AirlockError,
  ERROR_CODES,
  exitCodeFor,
  httpStatusFor,
  type AirlockErrorCode,
} from './core/errors.js';
export {
  parseSandboxSpec,
  SandboxSpecSchema,
  BACKEND_NAMES,
  type BackendName,
  type SandboxSpec,
  type SandboxSpecInput,
  type Limits,
} from './core/spec.js';
export type { BackendV1, BackendSandbox, BackendProcess, BackendProbe, Logger } from './core/backend.js';
export { parseBytes, parseDurationMs, formatBytes } from './core/units.js';
