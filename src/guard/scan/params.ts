// SECURITY-CRITICAL: parameter and cross-server helpers of the MCP definition scanner: names that are
// typical side channels (`sidenote`, `context`, `notes`, ...), what such a parameter's description asks
// for, and mentions of tools that belong to OTHER servers behind the same gateway. Pure.
import type { Finding } from './types.js';
import type { Field } from './collect.js';
import { excerptOf, originalSpan, type Folded } from './text.js';

const CONVERSATION_ASK =
  /\b(?:conversation|chat(?: log| history)?|dialog(?:ue)?|transcript|(?:previous|prior|earlier) (?:messages|turns|prompts|responses)|message history|system prompt|(?:the )?user'?s? (?:messages?|requests?|prompts?|queries)|what the user (?:said|asked|wrote|typed)|context window|your instructions)\b/i;
const SECRET_ASK =
  /\b(?:secrets?|(?:api|secret|access|ssh|private|encryption|signing) ?keys?|(?:access|auth|bearer|api|session|refresh) ?tokens?|passwords?|passphrases?|credentials?|file contents?|contents? of (?:any |the |a |all |your )?(?:files?|\S*[/~]\S*)|env(?:ironment)? var(?:iable)?s?)\b|(?<!\w)\.env\b|(?<!\w)\.ssh\b/i;
const SIDE_CHANNEL_EXACT = new Set(['context', 'notes', 'note', 'feedback', 'memo', 'summary', 'remarks']);
const SIDE_CHANNEL_PART =
  /conversation|history|sidenote|summaryofchat|chatsummary|systemprompt|previousmessages|transcript|chatlog/;

export function isSideChannelName(name: string): boolean {
  const n = name.toLowerCase().replace(/[^a-z0-9]/g, '');
  return SIDE_CHANNEL_EXACT.has(n) || SIDE_CHANNEL_PART.test(n);
}

const escapeRegExp = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** Names of other servers' tools as they would appear in prose; plain words only when marked as tools. */
export function crossServerMatcher(names: readonly string[], own: ReadonlySet<string>): RegExp | undefined {
  const usable = [...new Set(names.map((n) => String(n).toLowerCase()))]
    .filter((n) => n.length >= 3 && !own.has(n))
    .sort((a, b) => b.length - a.length || (a < b ? -1 : 1));
  const compound = usable.filter((n) => /[^a-z]/.test(n)).map(escapeRegExp);
  const plain = usable.filter((n) => /^[a-z]+$/.test(n)).map(escapeRegExp);
  const alts: string[] = [];
  if (compound.length > 0) alts.push(`(?<![\\w-])(${compound.join('|')})(?![\\w-])`);
  if (plain.length > 0) {
    const p = plain.join('|');
    alts.push(
      `[\`'"](${p})[\`'"]`,
      `(?<![\\w-])(${p}) (?:tool|function)\\b`,
      `\\b(?:tool|function) (${p})(?![\\w-])`,
    );
  }
  return alts.length === 0 ? undefined : new RegExp(alts.join('|'), 'gi');
}

export function crossServerFinding(f: Field, folded: Folded, re: RegExp): Finding | undefined {
  const names = new Set<string>();
  let first: RegExpExecArray | undefined;
  for (const m of folded.text.matchAll(re)) {
    first ??= m;
    names.add(
      m
        .slice(1)
        .find((g) => g !== undefined)!
        .toLowerCase(),
    );
  }
  if (!first) return undefined;
  const [start, end] = originalSpan(f.text, folded, first.index, first[0].length);
  return {
    ruleId: 'cross-server-reference',
    severity: 'medium',
    location: f.location,
    excerpt: excerptOf(f.text, start, end),
    message: `Mentions tool(s) of another server: ${[...names].sort().join(', ')}`,
  };
}

/** v1: what a side-channel-named parameter's description asks for (secrets first, then conversation). */
export function v1SideChannelAsk(text: string): RegExpExecArray | null {
  return SECRET_ASK.exec(text) ?? CONVERSATION_ASK.exec(text);
}
