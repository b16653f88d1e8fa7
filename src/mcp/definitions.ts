// SECURITY-CRITICAL: what a client gets to see of an untrusted server's definitions. Every listing
// goes through the description scanner (scan.ts) and the pin check (pin.ts): a tool with a finding
// at or above the policy's quarantine severity, or one that changed, appeared or was renamed since
// it was pinned, is hidden from tools/list and its calls are refused with the reason, until the
// operator re-pins it. Findings below the threshold are warnings (audited, tool visible).
import type { Prompt, Tool } from '@modelcontextprotocol/sdk/types.js';
import { decideFinding, type ScanPolicy } from '../policy/mcp.js';
import { SessionPins, type ServerDefinitions, type ServerPin } from './pin.js';
import { ownerLabel, scanDefinitions, type Finding } from './scan.js';
import type { McpFindingRef } from './audit.js';

export interface GateResult {
  /** Tools the client may see and call (original, un-namespaced names). */
  readonly tools: Tool[];
  readonly prompts: Prompt[];
  /** Server instructions, unless they were quarantined. */
  readonly instructions?: string;
  /** Tool name → why it is quarantined. */
  readonly quarantined: ReadonlyMap<string, string>;
  /** Every finding of this listing (scanner and pin check), with the decision taken on it. */
  readonly findings: ReadonlyArray<McpFindingRef & { decision: 'quarantine' | 'warn' }>;
}

export class DefinitionGate {
  private readonly pins: SessionPins;

  constructor(
    readonly server: string,
    private readonly opts: {
      pinned?: ServerPin;
      scan: ScanPolicy;
      /** Tool names of the other servers behind the same endpoint (cross-server references). */
      otherToolNames?: () => readonly string[];
    },
  ) {
    this.pins = new SessionPins(opts.pinned, { serverName: server });
  }

  check(defs: ServerDefinitions): GateResult {
    const quarantined = new Map<string, string>();
    const findings: Array<McpFindingRef & { decision: 'quarantine' | 'warn' }> = [];
    const hiddenPrompts = new Set<string>();
    let instructionsHidden = false;

    const scan = scanDefinitions({
      tools: defs.tools,
      prompts: defs.prompts,
      resourceTemplates: defs.resourceTemplates,
      ...(defs.instructions !== undefined ? { instructions: defs.instructions } : {}),
      otherServersToolNames: this.opts.otherToolNames?.() ?? [],
    });
    const toolByLabel = new Map(defs.tools.map((t, i) => [`tools[${ownerLabel(t.name, i)}]`, t.name]));
    const promptByLabel = new Map(defs.prompts.map((p, i) => [`prompts[${ownerLabel(p.name, i)}]`, p.name]));
    for (const f of scan) {
      const decision = decideFinding(this.opts.scan, f.severity, f.ruleId);
      findings.push({ ...ref(f), decision });
      if (decision !== 'quarantine') continue;
      const owner = /^(tools|prompts)\[.*?\](?=\.|$)/.exec(f.location)?.[0] ?? f.location;
      const tool = toolByLabel.get(owner) ?? toolByLabel.get(longestOwner(f.location, toolByLabel));
      const prompt = promptByLabel.get(owner) ?? promptByLabel.get(longestOwner(f.location, promptByLabel));
      if (tool !== undefined) {
        if (!quarantined.has(tool))
          quarantined.set(
            tool,
            `tool ${tool} of server ${this.server} is quarantined: ${f.ruleId} (${f.severity}) at ${f.location}: ${f.message}`,
          );
      } else if (prompt !== undefined) hiddenPrompts.add(prompt);
      else if (f.location.startsWith('instructions')) instructionsHidden = true;
    }

    const observed = this.pins.observe(defs);
    for (const f of observed.findings) {
      // Pin findings (changed / added / renamed / widened) always quarantine; removals only inform.
      findings.push({ ...ref(f), decision: f.severity === 'high' ? 'quarantine' : 'warn' });
    }
    for (const [tool, reason] of observed.quarantined)
      if (!quarantined.has(tool)) quarantined.set(tool, reason);
    if (observed.diff.instructionsChanged) instructionsHidden = true;

    return {
      tools: defs.tools.filter((t) => !quarantined.has(t.name)),
      prompts: defs.prompts.filter((p) => !hiddenPrompts.has(p.name)),
      ...(defs.instructions !== undefined && !instructionsHidden ? { instructions: defs.instructions } : {}),
      quarantined,
      findings,
    };
  }
}

/** The longest label in `labels` that `location` starts with (labels may contain dots or brackets). */
function longestOwner(location: string, labels: ReadonlyMap<string, string>): string {
  let best = '';
  for (const l of labels.keys()) {
    if (l.length > best.length && (location === l || location.startsWith(l + '.'))) best = l;
  }
  return best;
}

function ref(f: Finding | McpFindingRef): McpFindingRef {
  return {
    ruleId: f.ruleId,
    severity: f.severity,
    location: f.location,
    excerpt: f.excerpt,
    message: f.message,
  };
}
