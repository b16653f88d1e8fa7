// The shapes the MCP definition scanner reads and reports (re-exported by guard/scan.ts), apart so the
// scanner's parts can share them without importing one another.
import type { RuleId, Severity } from '../../policy/mcp-rules.js';

export interface Finding {
  ruleId: RuleId;
  severity: Severity;
  /** Where, e.g. `tools[read_file].inputSchema.properties.path.description`; invisible chars escaped. */
  location: string;
  /** At most 120 chars around the match; invisible and control chars shown as `\u{...}`. */
  excerpt: string;
  /** What was found and why it matters, for the user and for the model. */
  message: string;
}

/** What a server says about itself; every string anywhere in it is scanned (title, _meta, icons too). */
export interface ScanInput {
  tools?: Array<{
    name: string;
    title?: string;
    description?: string;
    inputSchema?: unknown;
    outputSchema?: unknown;
    annotations?: unknown;
    _meta?: unknown;
    icons?: unknown;
  }>;
  prompts?: Array<{
    name: string;
    title?: string;
    description?: string;
    arguments?: Array<{ name: string; title?: string; description?: string }>;
    _meta?: unknown;
    icons?: unknown;
  }>;
  resources?: Array<{
    name?: string;
    uri?: string;
    title?: string;
    description?: string;
    annotations?: unknown;
    _meta?: unknown;
    icons?: unknown;
  }>;
  resourceTemplates?: Array<{
    name?: string;
    uriTemplate?: string;
    title?: string;
    description?: string;
    annotations?: unknown;
    _meta?: unknown;
    icons?: unknown;
  }>;
  instructions?: string;
  /** Tool names of the other servers behind the same gateway (plain or namespaced). */
  otherServersToolNames?: readonly string[];
}

export interface Hit {
  ruleId: RuleId;
  severity: Severity;
  /** What the rule found, for the finding's message. */
  what: string;
  index: number;
  length: number;
}
