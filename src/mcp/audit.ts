// MCP audit events: one per call, verdict, quarantine and finding. The fields shared with egress
// events (sandboxId, time, decision, reason, code, bytesUp, bytesDown, durationMs) mean the same
// thing, so one audit store can keep both; `kind` tells them apart.
import { appendFileSync } from 'node:fs';
import type { CodeDecision, CodeFinding, CodeLanguage } from '../core/code.js';
import type { NetworkPolicy } from '../core/network-spec.js';
import type { EgressEvent } from '../egress/events.js';

export interface McpFindingRef {
  readonly ruleId: string;
  readonly severity: string;
  readonly location: string;
  readonly excerpt: string;
  readonly message: string;
}

/** An audit event of the MCP gateway. */
export interface McpAuditEvent {
  readonly kind: 'mcp';
  readonly sandboxId: string;
  readonly time: string;
  readonly server: string;
  readonly method: string;
  readonly tool?: string;
  readonly session?: string;
  readonly tenant?: string;
  readonly decision: 'allow' | 'deny' | 'quarantine' | 'warn' | 'error';
  readonly reason: string;
  /** Stable code for denials and errors (policy/budget codes, 'quarantined', 'frame_error', ...). */
  readonly code?: string;
  readonly bytesUp: number;
  readonly bytesDown: number;
  readonly durationMs: number;
  readonly findings?: readonly McpFindingRef[];
  readonly truncated?: boolean;
  readonly redactions?: number;
  /** Where the full (redacted) output of a truncated result was kept. */
  readonly spillRef?: string;
}

/** The static analysis's decision on one `sbx.runCode` (issue 34): deny means the code never ran. */
export interface CodeAuditEvent {
  readonly kind: 'code';
  readonly sandboxId: string;
  readonly time: string;
  readonly language: CodeLanguage;
  readonly decision: CodeDecision;
  readonly findings: readonly CodeFinding[];
  /** One line: the rules that denied or warned, each with its reason (empty when none did). */
  readonly reason: string;
  /** 'CODE_DENIED' when the decision is deny. */
  readonly code?: string;
  /** The code context it ran in (none: a one-shot run). */
  readonly context?: string;
}

/** A live sandbox's network policy was replaced (sbx.setNetworkPolicy). */
export interface NetworkAuditEvent {
  readonly kind: 'network';
  readonly sandboxId: string;
  readonly time: string;
  readonly decision: 'allow';
  /** One line: the new allow and deny lists. */
  readonly reason: string;
  /** No error code: a change is never a refusal (a refused change throws and is not recorded). */
  readonly code?: undefined;
  readonly previous: NetworkPolicy;
  readonly policy: NetworkPolicy;
}

/** One audit event (JSON line): a call, a verdict or a finding. */
export type AuditEvent =
  | McpAuditEvent
  | CodeAuditEvent
  | NetworkAuditEvent
  | (EgressEvent & { readonly kind: 'egress'; readonly server?: string });

export type AuditSink = (e: AuditEvent) => void;

/** Append every event as one JSON line to `path` (synchronously: an audit line is never lost to a crash). */
export function jsonlAuditSink(path: string): AuditSink {
  return (e) => appendFileSync(path, JSON.stringify(e) + '\n', { mode: 0o600 });
}

/** Fan out to several sinks; a failing sink never breaks the gateway or the other sinks. */
export function teeAudit(...sinks: ReadonlyArray<AuditSink | undefined>): AuditSink {
  const live = sinks.filter((s): s is AuditSink => s !== undefined);
  return (e) => {
    for (const s of live) {
      try {
        s(e);
      } catch {
        /* an audit sink's failure is its own */
      }
    }
  };
}

export function mcpEvent(
  fields: Omit<McpAuditEvent, 'kind' | 'time' | 'bytesUp' | 'bytesDown' | 'durationMs'> &
    Partial<Pick<McpAuditEvent, 'bytesUp' | 'bytesDown' | 'durationMs'>>,
): McpAuditEvent {
  return {
    kind: 'mcp',
    time: new Date().toISOString(),
    bytesUp: 0,
    bytesDown: 0,
    durationMs: 0,
    ...fields,
  };
}
