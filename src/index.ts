// Public API: named exports only.
import { Airlock as LocalAirlock, type AirlockOptions } from './sandbox/airlock.js';
import type { RemoteRuntimeOptions } from './sandbox/portable.js';
import type { RemoteAirlock } from './server/remote/airlock.js';

/**
 * How `new Airlock(opts)` is typed: without `apiUrl`, a runtime on this host (the library; needs
 * root); with `apiUrl` (and `apiKey`), a runtime on that server (the remote SDK's RemoteAirlock),
 * which takes only the options a client may set. One constructor, so code written against the library
 * points at a server by its options alone.
 */
export interface AirlockConstructor {
  /** A runtime on the server `opts.apiUrl`: the object made is a RemoteAirlock. */
  new <Url extends string>(opts: RemoteRuntimeOptions & { readonly apiUrl: Url }): RemoteAirlock;
  /** A runtime on this host: its state dir, backends, sandboxes, snapshots and templates. */
  new (opts?: AirlockOptions): LocalAirlock;
  readonly prototype: LocalAirlock;
}

/** The Airlock runtime: `new Airlock()` runs sandboxes here, `new Airlock({ apiUrl })` on a server. */
export const Airlock = LocalAirlock as AirlockConstructor;
/** A runtime on this host (what `new Airlock()` without apiUrl makes). */
export type Airlock = LocalAirlock;
export {
  Airlock as LocalAirlock,
  DEFAULT_STATE_DIR,
  Sandbox,
  Snapshot,
  defaultAirlock,
  type AirlockOptions,
  type SandboxRuntime,
  type Snapshots,
  type TemplateStore,
} from './sandbox/airlock.js';
export type {
  PortableFiles,
  PortableSandbox,
  PortableSandboxInfo,
  RemoteRuntime,
  RemoteRuntimeOptions,
} from './sandbox/portable.js';
export {
  RemoteAirlock,
  airlockFromEnv,
  type RemoteAirlockOptions,
  type RemoteSnapshots,
} from './server/remote/airlock.js';
export { RemoteSandbox, RemoteSnapshot, type RemoteSandboxInfo } from './server/remote/sandbox.js';
export type { RemoteFiles } from './server/remote/files.js';
export {
  RemoteTemplates,
  type RemoteTemplateBuildOptions,
  type RemoteTemplateInfo,
} from './server/templates-client.js';
export type { TemplateBuildRequest, TemplateEvent } from './server/contract.js';
export type { ExecResult, ExecOptions, ExecHandle, KilledBy, SandboxInfo } from './sandbox/sandbox.js';
export { MAX_FORK_COUNT, type ForkOptions, type SnapshotInfo } from './sandbox/snapshot.js';
export type { SnapshotParent, SnapshotRecord } from './core/snapshot.js';
export {
  Templates,
  TemplateBuildError,
  type TemplateInfo,
  type TemplateProgress,
  type TemplateBuildOptions,
  type TemplateStepEvent,
  type ResolvedTemplate,
} from './sandbox/templates.js';
export {
  TemplateFileSchema,
  loadTemplateFile,
  parseTemplate,
  parseTemplateYaml,
  templateSourceDigest,
  type Template,
  type TemplateInput,
  type TemplateStep,
} from './core/template.js';
export type { FileEntry } from './sandbox/files.js';
export type {
  SandboxWorkspace,
  WorkspaceChange,
  WorkspaceDiff,
  WorkspaceDiffOptions,
} from './sandbox/workspace.js';
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
  DIGEST_RE,
  MAX_LAYERS,
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
export {
  scanDefinitions,
  highestSeverity,
  type Finding,
  type Severity,
  type ScanInput,
} from './guard/scan.js';
export { GatewayCore, type GatewayOptions as McpGatewayOptions, type ServerSetup } from './mcp/gateway.js';
export { HttpFront, type HttpFrontOptions } from './mcp/http.js';
export type { McpSandbox, McpSandboxProvider, McpServerProcess } from './mcp/sandbox-provider.js';
export { gatewayFetch, type GatewayFetch, type GatewayFetchOptions } from './mcp/client-fetch.js';
export { serveStdio } from './mcp/stdio.js';
export { gatewaySetups, serverSetup } from './mcp/setup.js';
export {
  loadGatewayConfig,
  parseGatewayConfig,
  resolveTenants,
  type GatewayConfig,
  type McpServerConfig,
  type Boundary,
} from './mcp/config.js';
export {
  pinDefinitions,
  comparePins,
  formatDiff,
  readLockfile,
  writeLockfile,
  SessionPins,
  type ServerPin,
  type Lockfile,
} from './mcp/pin.js';
export { parseMessage, LineFramer, type JsonRpcMessage } from './mcp/frame.js';
export { guardToolResult, redactText, type GuardOptions, type GuardReport } from './guard/output.js';
export { findCredentials } from './guard/credentials.js';
export {
  analyzeCode,
  codeActionFor,
  CODE_RULES,
  CODE_RULE_IDS,
  MAX_CODE_BYTES,
  type CodeRule,
  type CodeRuleId,
} from './guard/code/index.js';
export { decideCall, compileToolRules, type CallVerdict, type ToolRules } from './policy/mcp.js';
export type { McpAuditEvent, AuditEvent, AuditSink, CodeAuditEvent } from './mcp/audit.js';
export { CODE_LANGUAGES, CodePolicySchema, CodeDeniedError } from './core/code.js';
export type {
  CodeLanguage,
  CodeResult,
  CodeError,
  Execution,
  CodeContextRef,
  RunCodeOptions,
  CreateCodeContextOptions,
  CodeFinding,
  CodePolicy,
  CodeVerdict,
  CodeDecision,
} from './core/code.js';
export {
  buildExecutableRoot,
  CLOSURE_MANIFEST,
  type ExecutableRootOptions,
  type ExecutableRoot,
  type ClosureManifest,
} from './images/closure.js';
export type { ClosureEntry, LinkMode } from './images/closure-write.privileged.js';
export type { MissingLibrary } from './images/closure-plan.js';
