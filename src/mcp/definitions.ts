// SECURITY-CRITICAL: what a client gets to see of an untrusted server's definitions. Every listing
// goes through the description scanner (scan.ts) and the pin check (pin.ts): a tool with a finding
// at or above the policy's quarantine severity, or one that changed, appeared or was renamed since
// it was pinned, is hidden from tools/list and its calls are refused with the reason, until the
// operator re-pins it. Findings below the threshold are warnings (audited, tool visible).
import { createHash } from 'node:crypto';
import type { Prompt, Resource, ResourceTemplate, Tool } from '@modelcontextprotocol/sdk/types.js';
import { decideFinding, type ScanPolicy } from '../policy/mcp.js';
import { canonicalJson, SessionPins, type ServerDefinitions, type ServerPin } from './pin.js';
import { ownerLabel, scanDefinitions, type Finding } from '../guard/scan.js';
import type { McpFindingRef } from './audit.js';

export interface GateResult {
  /** Tools the client may see and call (original, un-namespaced names). */
  readonly tools: Tool[];
  readonly prompts: Prompt[];
  /** Resource templates and resources the client may see (the others are hidden, their reads refused). */
  readonly resourceTemplates: ResourceTemplate[];
  readonly resources: Resource[];
  /** Resource URI → why it is hidden (scanner finding, or changed / new since the session pinned it). */
  readonly hiddenResources: ReadonlyMap<string, string>;
  /** Server instructions, unless they were quarantined. */
  readonly instructions?: string;
  /** Tool name → why it is quarantined. */
  readonly quarantined: ReadonlyMap<string, string>;
  /** Every finding of this listing (scanner and pin check), with the decision taken on it. */
  readonly findings: ReadonlyArray<McpFindingRef & { decision: 'quarantine' | 'warn' }>;
}

/** The fields of a concrete resource that are pinned (its `size` may change with its content). */
const RESOURCE_FIELDS = ['uri', 'name', 'title', 'description', 'mimeType', 'annotations', 'icons'] as const;

function resourceHash(r: Resource): string {
  const picked = Object.fromEntries(RESOURCE_FIELDS.filter((f) => r[f] !== undefined).map((f) => [f, r[f]]));
  try {
    return createHash('sha256').update(canonicalJson(picked)).digest('hex');
  } catch {
    return 'unhashable';
  }
}

export class DefinitionGate {
  private readonly pins: SessionPins;
  /**
   * Concrete resources as first listed in this session (uri → hash): the lockfile pins tools, prompts
   * and templates; a resource listing is pinned here on first use, so a resource whose description
   * or name changes later (or a new one) is hidden until the session restarts.
   */
  private resourcePins: Map<string, string> | undefined;

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

  check(defs: ServerDefinitions & { resources?: readonly unknown[] }): GateResult {
    const resources = (defs.resources ?? []).filter(
      (r): r is Resource =>
        typeof r === 'object' && r !== null && typeof (r as { uri?: unknown }).uri === 'string',
    );
    const hiddenResources = new Map<string, string>();
    const hiddenTemplates = new Set<string>();
    const quarantined = new Map<string, string>();
    const findings: Array<McpFindingRef & { decision: 'quarantine' | 'warn' }> = [];
    const hiddenPrompts = new Set<string>();
    let instructionsHidden = false;

    const scan = scanDefinitions({
      tools: defs.tools,
      prompts: defs.prompts,
      resourceTemplates: defs.resourceTemplates,
      resources,
      ...(defs.instructions !== undefined ? { instructions: defs.instructions } : {}),
      otherServersToolNames: this.opts.otherToolNames?.() ?? [],
    });
    const toolByLabel = new Map(defs.tools.map((t, i) => [`tools[${ownerLabel(t.name, i)}]`, t.name]));
    const promptByLabel = new Map(defs.prompts.map((p, i) => [`prompts[${ownerLabel(p.name, i)}]`, p.name]));
    const templateByLabel = new Map(
      defs.resourceTemplates.map((t, i) => [
        `resourceTemplates[${ownerLabel(t.name ?? t.uriTemplate, i)}]`,
        t.uriTemplate,
      ]),
    );
    const resourceByLabel = new Map(
      resources.map((r, i) => [`resources[${ownerLabel(r.name ?? r.uri, i)}]`, r.uri]),
    );
    for (const f of scan) {
      // A definition the MCP SDK rejects is never served, whatever the policy says of the rule: one such
      // tool in a listing makes an SDK client reject the whole tools/list.
      const decision =
        f.ruleId === 'invalid-definition'
          ? 'quarantine'
          : decideFinding(this.opts.scan, f.severity, f.ruleId);
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
      else if (f.location.startsWith('resourceTemplates[')) {
        const t = templateByLabel.get(longestOwner(f.location, templateByLabel));
        if (t !== undefined) hiddenTemplates.add(t);
      } else if (f.location.startsWith('resources[')) {
        const uri = resourceByLabel.get(longestOwner(f.location, resourceByLabel));
        if (uri !== undefined && !hiddenResources.has(uri))
          hiddenResources.set(
            uri,
            `resource ${uri} of server ${this.server} is quarantined: ${f.ruleId} (${f.severity}) at ${f.location}: ${f.message}`,
          );
      } else if (f.location.startsWith('instructions')) instructionsHidden = true;
    }

    const observed = this.pins.observe(defs);
    for (const f of observed.findings) {
      // Pin findings (changed / added / renamed / widened) always quarantine; removals only inform.
      findings.push({ ...ref(f), decision: f.severity === 'high' ? 'quarantine' : 'warn' });
    }
    for (const [tool, reason] of observed.quarantined)
      if (!quarantined.has(tool)) quarantined.set(tool, reason);
    if (observed.diff.instructionsChanged) instructionsHidden = true;
    // Prompts and templates that changed, appeared, were renamed or are listed twice: hidden, like tools.
    const moved = (d: {
      changed: Array<{ name: string }>;
      added: string[];
      renamed: Array<{ to: string }>;
      duplicated: string[];
    }): string[] => [
      ...d.changed.map((c) => c.name),
      ...d.added,
      ...d.renamed.map((r) => r.to),
      ...d.duplicated,
    ];
    for (const name of moved(observed.diff.prompts)) hiddenPrompts.add(name);
    for (const key of moved(observed.diff.resourceTemplates)) hiddenTemplates.add(key);

    // Concrete resources: pinned on first use in this session.
    const now = new Map(resources.map((r) => [r.uri, resourceHash(r)]));
    this.resourcePins ??= now;
    for (const [uri, hash] of now) {
      const pinned = this.resourcePins.get(uri);
      if (pinned === hash || hiddenResources.has(uri)) continue;
      const reason =
        pinned === undefined
          ? `resource ${uri} of server ${this.server} is new since this session pinned the listing; start a new session (or re-pin) to use it`
          : `resource ${uri} of server ${this.server} changed (name, description or other metadata) since this session pinned it; start a new session (or re-pin) to use it`;
      hiddenResources.set(uri, reason);
      findings.push({
        ruleId: pinned === undefined ? 'definition-added' : 'definition-changed',
        severity: 'high',
        location: `resources[${uri}]`,
        excerpt: uri.slice(0, 120),
        message: reason,
        decision: 'quarantine',
      });
    }

    return {
      tools: defs.tools.filter((t) => !quarantined.has(t.name)),
      prompts: defs.prompts.filter((p) => !hiddenPrompts.has(p.name)),
      resourceTemplates: defs.resourceTemplates.filter(
        (t) => !hiddenTemplates.has(t.uriTemplate) && !hiddenTemplates.has(t.name),
      ),
      resources: resources.filter((r) => !hiddenResources.has(r.uri)),
      hiddenResources,
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
