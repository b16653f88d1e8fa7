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

type Extra = { title?: string; _meta?: unknown; icons?: unknown; annotations?: unknown };
export interface ScanInput {
  tools?: Array<
    {
      name: string;
      description?: string;
      inputSchema?: unknown;
      outputSchema?: unknown;
    } & Extra
  >;
  prompts?: Array<
    {
      name: string;
      description?: string;
      arguments?: Array<{ name: string; title?: string; description?: string }>;
    } & Extra
  >;
  resources?: Array<{ name?: string; uri?: string; description?: string } & Extra>;
  resourceTemplates?: Array<{ name?: string; uriTemplate?: string; description?: string } & Extra>;
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
