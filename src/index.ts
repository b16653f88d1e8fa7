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
export type { EgressEvent, EgressProtocol } from './egress/events.js';
export type { Resolver, Dialer } from './egress/vet.js';
export {
  NetworkPolicySchema,
  EgressPolicySchema,
  SecretSpecSchema,
  decideHost,
  decideAddress,
  loadPolicyFile,
  parseEgressPolicy,
  type NetworkPolicy,
  type NetworkPolicyInput,
  type EgressPolicy,
  type EgressVerdict,
  type SecretSpec,
} from './policy/network.js';
export { scanDefinitions, highestSeverity, type Finding, type Severity, type ScanInput } from './mcp/scan.js';
