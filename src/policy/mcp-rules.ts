// The ids and severities of the MCP definition scanner's findings (guard/scan.ts reports them,
// policy/mcp.ts decides what they mean). Here, below both, so policy never imports guard.

export type Severity = 'high' | 'medium' | 'low';

export const RULE_IDS = [
  'hidden-instruction',
  'secrecy',
  'sensitive-path',
  'cross-server-reference',
  'invisible-unicode',
  'bidi-override',
  'homoglyph-name',
  'side-channel-parameter',
  'excessive-length',
  'schema-too-large',
  'instruction-override',
  'exfiltration',
  'tool-shadowing',
  'hidden-markup',
  'encoded-payload',
  'annotation-mismatch',
  'invalid-definition',
] as const;
export type RuleId = (typeof RULE_IDS)[number];
