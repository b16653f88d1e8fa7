// SECURITY-CRITICAL: tool annotations that contradict the tool's own description (issue 35). A client
// may skip confirmation for a tool marked read-only or non-destructive, so a server that marks
// "Permanently deletes every object" as `readOnlyHint: true` lies to get past the user. The check reads
// the description's leading verb (what the tool does), not every verb it mentions ("never deletes
// anything" and "Runs a read-only query" stay quiet). Pure.
import type { Severity } from '../../policy/mcp-rules.js';
import type { Finding, ScanInput } from './types.js';
import { isRecord, label, list } from './collect.js';
import { excerptOf, fold } from './text.js';

const ADVERB =
  '(?:(?:permanently|irreversibly|completely|immediately|forcibly|recursively|automatically|quickly|safely|also)\\s+)?';
const DESTRUCTIVE =
  'delete|deletes|remove|removes|erase|erases|wipe|wipes|drop|drops|purge|purges|destroy|destroys|truncate|truncates|overwrite|overwrites|kill|kills|terminate|terminates|revoke|revokes|format|formats';
const EXTERNAL =
  'send|sends|transfer|transfers|publish|publishes|post|posts|email|emails|pay|pays|charge|charges|upload|uploads|deploy|deploys|tweet|tweets';
const WRITE = 'execute|executes|write|writes|modify|modifies|move|moves';
const lead = (verbs: string) => new RegExp(`^[^\\p{L}]*${ADVERB}(${verbs})\\b`, 'iu');
const DESTRUCTIVE_LEAD = lead(DESTRUCTIVE);
const EXTERNAL_LEAD = lead(EXTERNAL);
const ANY_WRITE_LEAD = lead(`${DESTRUCTIVE}|${EXTERNAL}|${WRITE}`);
/** Descriptions that say what the verb means here ("Runs a read-only query", "Preview the deletion"). */
const SOFTENED =
  /\bread[- ]?only\b|\bdry[- ]?run\b|\bpreview\b|\bsimulat|\bwithout (?:modifying|changing|deleting)\b|\bdoes not (?:modify|change|delete)\b/i;

export function annotationFindings(input: ScanInput): Finding[] {
  const out: Finding[] = [];
  list(input.tools).forEach((tool, i) => {
    const a = tool?.annotations;
    if (!isRecord(a) || typeof tool.description !== 'string') return;
    const text = fold(tool.description).text.trim();
    if (SOFTENED.test(text)) return;
    const owner = `tools[${label(tool.name, i)}]`;
    const flag = (
      hint: string,
      value: boolean,
      m: RegExpExecArray,
      says: string,
      severity: Severity = 'high',
    ) =>
      out.push({
        ruleId: 'annotation-mismatch',
        severity,
        location: `${owner}.annotations.${hint}`,
        excerpt: excerptOf(text, 0, Math.min(text.length, m[0].length + 40)),
        message: `Annotation ${hint}: ${value} contradicts the description, which says the tool ${says} (${JSON.stringify(m[1]!.toLowerCase())}); clients may skip confirmation because of this hint`,
      });
    const any = ANY_WRITE_LEAD.exec(text);
    if (a.readOnlyHint === true && any) flag('readOnlyHint', true, any, 'changes or sends something');
    const destructive = DESTRUCTIVE_LEAD.exec(text);
    if (a.destructiveHint === false && destructive)
      flag('destructiveHint', false, destructive, 'destroys data');
    const external = EXTERNAL_LEAD.exec(text);
    // "Outside" is fuzzy (a server's own service?): medium.
    if (a.openWorldHint === false && external)
      flag('openWorldHint', false, external, 'reaches outside', 'medium');
  });
  return out;
}
