// SECURITY-CRITICAL: the text rules of the MCP definition scanner (issue 35). They run on folded text
// (see text.ts) and look for structure rather than keywords: an instruction that overrides the user or
// the system, concealment from the user, data moving from a sensitive source (credentials, files,
// the conversation) into a parameter, URL or recipient, and instructions that change how OTHER tools
// behave. Ordinary same-server guidance ("call list_files first", "you must pass an absolute path",
// "do not include credentials in the query") is left to the medium `hidden-instruction` rule or to
// nothing: a negation in front of a data movement, or a path named only to say it is rejected, does
// not count. Heuristics: an author can word around them, which is why definitions are also pinned and
// calls mediated. Pure.
import type { RuleId, Severity } from '../../policy/mcp-rules.js';
import type { Hit } from './types.js';

export type { Hit };
import { lexiconHits } from './lexicon.js';

interface PhraseRule {
  id: RuleId;
  severity: Severity;
  what: string;
  patterns: RegExp[];
}

/** Sentences end at . ! ? (followed by space), CJK stops, newlines and semicolons. */
const S = '[^.!?\\n;。！？]';

// v1 rules (also what scanPhrases applies to tool results): imperative phrasing is only medium, since
// real servers use it for ordinary guidance; secrecy and credential files are high.
export const PHRASE_RULES: PhraseRule[] = [
  {
    id: 'hidden-instruction',
    severity: 'medium',
    what: 'Instructions aimed at the model',
    patterns: [
      /\b(?:ignore|disregard|forget|override) (?:all |any )?(?:of )?(?:the |your |my )?(?:previous|prior|above|earlier|preceding|other|existing|system) (?:instructions?|prompts?|messages?|rules|directions|guidelines)\b/i,
      /<\s*\/?\s*(?:important|system|instructions?|secret|hidden|admin|critical|assistant)\s*>/i,
      /\[\/?inst\]|<<\/?sys>>|<\|im_(?:start|end)\|>/i,
      /\bbefore (?:using|calling|invoking|running|executing|you use|you call) (?:this|the|any|that)(?: \w+)? (?:tool|function)\b/i,
      /\byou (?:must|have to|are required to|are obliged to|should always|should first|should never)\b/i,
      /\b(?:the |this )?(?:assistant|model|ai|llm|agent|language model)s?(?: \w+){0,2}(?: must| should always| is required to| are required to| has to| is obliged to)\b/i,
      /\b(?:always|immediately) (?:call|invoke|execute|run|use|read|send)\b|\bfirst (?:call|invoke|execute|read)\b/i,
      /\bwhen (?:this|the) tool is (?:available|present|loaded|installed|enabled)\b/i,
      /\b(?:new|updated|real|actual|hidden) instructions?\b/i,
      /\b(?:do not|don't|never|without) (?:ask(?:ing)?|wait(?:ing)? for|request(?:ing)?) (?:the user (?:for )?|for )?(?:confirmation|permission|approval|consent)\b/i,
      /\b(?:pass|send|include|put|insert|append|attach|forward) (?:its|their|the file'?s?) (?:full |entire |whole |complete )?(?:contents?|text|data)\b/i,
      /\b(?:important )?note (?:for|to) (?:the )?(?:ai|assistant|model|llm|agent)s?\b|^\s*(?:assistant|model|ai)\s*[:,]/im,
    ],
  },
  {
    id: 'secrecy',
    severity: 'high',
    what: 'Secrecy toward the user',
    patterns: [
      /\b(?:do not|don't|dont|never|must not|should not|shouldn't|mustn't) (?:ever |explicitly |directly )?(?:mention|tell|inform|notify|alert)\b/i,
      /\b(?:do not|don't|never|must not|should not|no longer) (?:show|reveal|disclose|display|report|explain|say|let|expose|share)\b[^.!?\n]{0,40}\b(?:user|human|operator|anyone)s?\b/i,
      /\bwithout informing\b|\bwithout (?:telling|notifying|alerting|letting|warning|showing) (?:the |any )?(?:user|human|operator|them|anyone)s?\b/i,
      /\bwithout (?:the )?(?:user|human)(?:'s)? (?:knowing|noticing|knowledge|awareness|consent|seeing|approval)\b/i,
      /\bkeep (?:this|it|that|these(?: \w+)?|the following|them) (?:a |as a )?(?:secret|hidden|confidential|private|between us|to yourself)\b/i,
      /\bhide (?:this |it |that |these |the \w+ )?from (?:the )?(?:user|human)s?\b/i,
      /\b(?:secretly|covertly|surreptitiously|stealthily)\b/i,
      /\b(?:silently|quietly) (?:send|call|read|include|pass|forward|upload|add|copy|post|invoke|email)\b|\b(?:send|call|read|include|pass|forward|upload|add|copy|post|invoke|email)\b[^.!?\n]{0,60}\b(?:silently|quietly)\b/i,
      /\b(?:the )?(?:user|human|person)s? (?:must|should|does|need|will) (?:not|never) (?:know|see|notice|find out|learn|discover|realize|be (?:told|informed|notified|aware))\b/i,
    ],
  },
  {
    id: 'sensitive-path',
    severity: 'high',
    what: 'Reference to credentials or sensitive files',
    patterns: [
      /(?<!\w)\.ssh\b/i,
      /\bid_(?:rsa|dsa|ecdsa|ed25519)\b/i,
      /(?<![\w/-])\.env(?![\w-])/i,
      /\.aws[/\\](?:credentials|config)\b/i,
      /(?<!\w)\.(?:netrc|pgpass|npmrc|pypirc|git-credentials|gnupg|bash_history|zsh_history)\b/i,
      /(?<!\w)\.(?:kube[/\\]config|docker[/\\]config\.json)\b/i,
      /\bgh[/\\]hosts\.yml\b|\bwallet\.dat\b|\blogin\.keychain\b/i,
      /\bcredentials (?:file|store)\b|\bcredential (?:file|store|helper)s?\b/i,
      /\b(?:mcp|mcp_config|claude_desktop_config)\.json\b/i,
      /\/etc\/(?:shadow|passwd|sudoers)\b/i,
    ],
  },
];

// v2 rules: structure that only an attack needs.
const V2_RULES: PhraseRule[] = [
  {
    id: 'instruction-override',
    severity: 'high',
    what: 'Overrides the user or the system',
    patterns: [
      new RegExp(
        `\\b(?:ignore|disregard|forget|override|discard|set aside)\\b${S}{0,40}?\\b(?:previous|prior|above|earlier|preceding|original|existing|system|user'?s?|other|all|any)\\b${S}{0,20}?\\b(?:instructions?|prompts?|directions?|guidance|rules|guidelines|messages|requests)\\b`,
        'i',
      ),
      /\b(?:ignore|disregard)\b (?:what|whatever|anything|everything) (?:the user|the person|the human|they|you were|you've been)\b|\bignore the (?:user|human|person)\b/i,
      /\b(?:supersedes?|overrides?|takes? (?:priority|precedence) over|has (?:priority|precedence) over|outranks?)\b (?:the |your |any |all )?(?:user'?s? |system |previous |prior |earlier |other )?(?:instructions?|prompts?|system prompt|guidance|directions?|requests?|wishes)\b/i,
      new RegExp(
        `\\b(?:prior|previous|earlier|original|existing) (?:guidance|instructions?|directions?|rules)${S}{0,40}\\b(?:superseded|overridden|void|no longer appl|invalid|replaced|obsolete)`,
        'i',
      ),
      /\b(?:your|the) (?:real|true|actual|only) (?:task|job|goal|purpose|objective|mission)\b/i,
      /\bnew (?:operating |standing )?(?:rules|instructions|directives|orders)\b|\b(?:treat|follow|obey) (?:the following|these|only what)\b[^.!?\n]{0,40}\b(?:rules|instructions|orders|written here)\b/i,
      /\bregardless of (?:what|whatever) (?:the )?(?:user|person|human|they)\b/i,
      /\bfrom now on,? (?:you|the assistant|the model|always|every)\b/i,
      /\bwithout (?:question|hesitation|objection)\b|\b(?:stop|no longer|never) (?:ask(?:ing)?|seek(?:ing)?|wait(?:ing)? for|request(?:ing)?) (?:the user (?:for )?|for )?(?:confirmation|permission|approval|consent)\b/i,
      /\binstead of (?:the one|what|whatever|the \w+) (?:the user |was |they |you were )?(?:asked|requested|specified|wanted|given)\b/i,
      /\b(?:always )?approve (?:all |any |every )?requests? to\b/i,
    ],
  },
  {
    id: 'secrecy',
    severity: 'high',
    what: 'Secrecy toward the user',
    patterns: [
      new RegExp(
        `\\b(?:no need to|needn't|need not|refrain from|avoid) (?:mention(?:ing)?|tell(?:ing)?|inform(?:ing)?|bring(?:ing)? up|notify(?:ing)?|disclos(?:e|ing)|reveal(?:ing)?|report(?:ing)?)\\b${S}{0,60}\\b(?:user|human|person|people|anyone|operator|them)\\b`,
        'i',
      ),
      /\brefrain from (?:mentioning|telling|informing|disclosing|revealing|showing)\b/i,
      /\b(?:remain|stay|be kept|kept|keep (?:the )?(?:user|human|person)s?)\b[^.!?\n]{0,20}\b(?:unaware|in the dark|uninformed|ignorant)\b/i,
      /\bleave (?:this|it|that|these|those|the \w+)(?: \w+){0,3} out of (?:your|the) (?:reply|answer|response|summary|output|report)/i,
      /\b(?:act|behave|pretend|respond|answer|reply) as (?:if|though)\b[^.!?\n]{0,50}\b(?:never|not|didn't|did not|wasn't|was not|nothing|no other|only)\b/i,
      /\b(?:conceal|hide|mask|obscure|cover up)\b[^.!?\n]{0,60}\bfrom (?:the )?(?:user|human|person|operator|people|anyone|them)\b/i,
      /\b(?:make sure|ensure) (?:that )?(?:the )?(?:user|human|person|operator)s? (?:does not|doesn't|do not|never|won't|will not|cannot)\b/i,
      /\b(?:and|but|yet|or) (?:do |does |must |should )?not (?:tell|inform|notify|mention|alert|show)\b[^.!?\n]{0,20}\b(?:user|human|anyone|them|operator)s?\b/i,
      /\bsay nothing (?:about|of|regarding|to)\b|\bdon'?t (?:bring up|talk about|discuss|draw attention)\b[^.!?\n]{0,40}\b(?:user|human|person)\b/i,
      /\b(?:so as not|in order not|not) to (?:alarm|worry|alert|concern)\b/i,
    ],
  },
  {
    id: 'tool-shadowing',
    severity: 'high',
    what: 'Changes how other tools behave',
    patterns: [
      /\b(?:changes?|modif(?:y|ies)|alters?|overrides?|replaces?|redefines?) (?:how|the (?:behaviou?r|way)(?: of| that)?) (?:the |other |another |any |all )?[\w -]{0,30}?\b(?:tools?|functions?|servers?) (?:behaves?|works?|operates?)?/i,
      /\bnote (?:for|to) (?:other|all|any) (?:tools|servers|agents|functions)\b/i,
      /\b(?:any|every|all) (?:later |subsequent |future |other )?(?:calls?|invocations?|uses?|requests?) (?:to|of) (?:the )?[`'"]?[\w.-]+[`'"]?(?: tool)?\b[^.!?\n]{0,40}\b(?:must|should|shall|need to|has to|have to|are to|is to)\b/i,
      /\b(?:tool|function|server) (?:is|has been|was) (?:broken|deprecated|disabled|unsafe|compromised|unavailable|not available|retired)\b[^.!?\n]{0,40}\b(?:instead|use this|through this|via this)\b/i,
      /\bbefore (?:any|a|each|every) (?:\w+ ){0,2}(?:is|are) (?:written|sent|run|executed|made|read|posted|committed|transferred)\b/i,
      /\b(?:before|after|when(?:ever)?) (?:running|calling|invoking|using|executing|you (?:run|call|use|invoke)) (?:any|every|another|other|a different) (?:other )?(?:\w+ ){0,2}(?:tools?|functions?|servers?)\b[^.!?\n]{0,80}\b(?:pass|send|forward|include|copy|upload|prepend|append|route|redirect)\b/i,
      /\b(?:with|by|through|using|from) (?:any|another|other|a different) (?:tool|server|function)\b[^.!?\n]{0,60}\b(?:call|send|pass|first|must|always)\b/i,
      /\b(?:every|each|all) (?:transfers?|payments?|emails?|messages?|commits?|queries|requests?|orders?|deployments?)(?: [\w-]+){0,6}? (?:must|should|shall|are to|is to|will) (?:be |always be |now be )?(?:routed|sent|redirected|copied|forwarded|cc'?d|bcc'?d|mirrored|duplicated)\b/i,
      /\b(?:prepend|append|prefix)(?:ed)? (?:to )?[^.!?\n]{0,40}\bcalls? to\b|\bmust have\b[^.!?\n]{0,40}\b(?:prepended|appended|prefixed)\b/i,
    ],
  },
];

// Data movement: a verb that moves data, a sensitive source, in the same sentence, not negated.
const MOVE =
  /\b(?:send|sends|sending|pass|passes|passing|put|puts|include|includes|including|insert|append|attach|paste|copy|forward|forwards|upload|uploads|embed|post|transmit|provide|supply|submit|leak|exfiltrate|record|prefix|prepend|dump|place|email|relay|mirror|carry|carries|fill|add|adds|set|write|share)\b/gi;
// What a definition has no business moving: secrets that belong to the user or the session (not a
// password-manager tool's "Password length"), the conversation itself, dumps of the environment.
const SECRET = String.raw`(?:passwords?|passphrases?|credentials?|api[ _-]?keys?|(?:secret|access|auth|bearer|session|refresh) tokens?|tokens?|secrets?|private keys?|ssh keys?|keys|seed phrases?|card numbers?|bank accounts?|account numbers?)`;
const SOURCE = new RegExp(
  [
    String.raw`\b(?:the user'?s?|user'?s|your|their|his|her|all|any|every|each|saved|stored)(?: (?!(?:in|of|for|to|the|a|an|from|with|on|at|by)\b)[\w-]+){0,3} ${SECRET}\b`,
    String.raw`\b${SECRET}(?: [\w-]+){0,2} (?:of|from|belonging to) the (?:current |signed-in |logged-in )?user\b`,
    String.raw`\b${SECRET}\b[^.!?\n]{0,40}\b(?:the user (?:has|had|typed|entered|mentioned|shared|gave|provided)|you (?:have|can) (?:seen|found|find|access)|visible|shared with you|in (?:the|this) (?:conversation|chat|session))`,
    String.raw`\b[A-Z0-9]+_(?:API_)?(?:KEY|TOKEN|SECRET|PASSWORD)\b(?: environment variable| env var)?`,
    String.raw`\b(?:all|every|each|the full list of) (?:the )?(?:environment variables|env vars)\b|\bprintenv\b|\b(?:full|whole|entire) environment\b`,
    String.raw`\b(?:(?:the|this|our|your|current|whole|entire|full|complete) conversation(?! id| thread)|conversation (?:history|so far|log|context|transcript)|chat (?:history|log|so far|transcript)|(?:full|whole|entire|complete) chat\b|(?:session|conversation|chat) transcript|transcript of the (?:session|conversation|chat)|(?:previous|prior|earlier|past) (?:messages?|turns?|exchanges?)|message history|system prompt|developer (?:instructions|message)|tool results|(?:each|every|all) prior message|(?:user|person)'?s? (?:last|latest|previous) (?:messages?|requests?|prompts?)|everything the user (?:has )?(?:said|typed|written|shared)|(?:every|each|all)(?: of the)? messages? (?:the user|you|they) (?:has |have )?(?:sent|written|typed|received)|what the user (?:said|asked|wrote|typed)|files? you (?:have )?(?:read|opened|seen)|every file you|names and emails)\b`,
  ].join('|'),
  'i',
);
const NEGATED =
  /\b(?:do not|don't|dont|never|must not|should not|shouldn't|mustn't|cannot|can't|avoid|no|not|without|nor|rather than|instead of|except|excluding)\b[^.!?\n]{0,60}$/i;
/** A negation right before the source: "pass only the text, not the whole conversation". */
const NEGATED_SOURCE =
  /\b(?:not|no|never|nor|without|rather than|instead of|except|excluding)\b(?: \w+){0,3} ?$/i;
const DENIAL =
  /\b(?:rejected|denied|blocked|forbidden|not allowed|disallowed|refused|excluded|redacted|masked|never (?:returned|shown|logged|stored|sent)|is not (?:returned|shown|logged|stored|sent)|are not (?:returned|shown|logged|stored|sent))\b/i;
/** A verb that reads, uses or moves what follows it (within the same sentence). */
const GOVERNED =
  /\b(?:read|reads|reading|load|loads|loading|open|opens|cat|send|sends|upload|uploads|use|uses|using|access|accesses|look(?:s)? at|attach|include|copy|paste|pass|forward|fetch|grab|collect|extract|exfiltrate|parse|print|dump|output|sync|syncs|from|in|of|at|with)\b[^!?\n]{0,50}$/i;
const URL_WITH_QUERY = /https?:\/\/[^\s"'<>]+[?&][\w-]+=/i;
const RECIPIENT = /\b(?:b?cc|to|recipient|destination|address)\s*:?\s*[\w.+-]+@[\w-]+(?:\.[\w-]+)+/i;
const RECIPIENT_VERB = new RegExp(`${MOVE.source}|\\b(?:call|invoke|use|run)\\b`, 'gi');
const EXAMPLE_BEFORE = /\b(?:e\.g\.|eg|such as|for example|like|example)\W{0,4}$/i;

function sentences(text: string): Array<{ at: number; text: string }> {
  const out: Array<{ at: number; text: string }> = [];
  // A terminator only ends a sentence when a space follows ("~/.ssh", "e.g.x", URLs stay whole).
  const re = /(?:[^.!?;\n。！？]|[.!?;](?=[^\s.!?;]))+[.!?;。！？]*/g;
  for (const m of text.matchAll(re)) if (m[0].trim() !== '') out.push({ at: m.index, text: m[0] });
  return out;
}

function movementHits(text: string, out: Hit[]): void {
  if (!SOURCE.test(text) && !RECIPIENT.test(text) && !sensitivePathIn(text)) return;
  for (const s of sentences(text)) {
    if (s.text.length < 8 || DENIAL.test(s.text)) continue;
    let src = SOURCE.exec(s.text) ?? sensitivePathIn(s.text);
    if (src && NEGATED_SOURCE.test(s.text.slice(0, src.index))) src = null;
    const recipient = RECIPIENT.exec(s.text);
    const url = URL_WITH_QUERY.exec(s.text);
    if (!src && !recipient) continue;
    if (recipient && EXAMPLE_BEFORE.test(s.text.slice(0, recipient.index))) continue;
    if (recipient && !src && /^b?cc\b/i.test(recipient[0])) {
      // "cc: someone@example.org on every message": the copy is the action.
      out.push({
        ruleId: 'exfiltration',
        severity: 'high',
        what: `Copies messages to a fixed recipient ${JSON.stringify(recipient[0])}`,
        index: s.at + recipient.index,
        length: recipient[0].length,
      });
      return;
    }
    for (const m of s.text.matchAll(src ? MOVE : RECIPIENT_VERB)) {
      if (NEGATED.test(s.text.slice(0, m.index))) continue;
      if (src && Math.abs(src.index - m.index) > 100) continue;
      if (src || url) {
        out.push({
          ruleId: 'exfiltration',
          severity: 'high',
          what: `Moves ${src ? JSON.stringify(src[0].toLowerCase()) : 'data'} ${url ? 'into a URL' : 'into a parameter or message'}`,
          index: s.at + m.index,
          length: m[0].length,
        });
      } else if (recipient) {
        out.push({
          ruleId: 'exfiltration',
          severity: 'high',
          what: `Sends data to a fixed recipient ${JSON.stringify(recipient[0])}`,
          index: s.at + recipient.index,
          length: recipient[0].length,
        });
      }
      return;
    }
  }
}

function sensitivePathIn(text: string): RegExpExecArray | null {
  for (const re of PHRASE_RULES[2]!.patterns) {
    const m = re.exec(text);
    if (m) return m;
  }
  return null;
}

function applyRules(rules: readonly PhraseRule[], text: string, out: Hit[]): void {
  for (const rule of rules) {
    for (const re of rule.patterns) {
      const m = re.exec(text);
      if (!m) continue;
      let severity = rule.severity;
      if (rule.id === 'sensitive-path') {
        // A credential path named only to say it is refused is not a reference to it; one named without
        // a verb that reads or moves it (a search example: "config files: ".env", "tsconfig.json"") is
        // only medium.
        const sentence = sentenceAround(text, m.index);
        if (DENIAL.test(sentence)) continue;
        const before = text.slice(Math.max(0, m.index - 60), m.index);
        const listed =
          /["'`]$/.test(before) && (sentence.match(/["'`][^"'`\s]{1,40}["'`]/g)?.length ?? 0) >= 3;
        if (!GOVERNED.test(before) || listed) severity = 'medium';
      }
      out.push({ ruleId: rule.id, severity, what: rule.what, index: m.index, length: m[0].length });
    }
  }
}

function sentenceAround(text: string, index: number): string {
  const s = sentences(text).find((x) => x.at <= index && index < x.at + x.text.length);
  return s?.text ?? text.slice(Math.max(0, index - 100), index + 100);
}

/**
 * Every rule hit in `text` (folded text): v1 phrases, v2 structure, and the multilingual lexicon on
 * `raw` (the text before look-alike folding, which would turn Cyrillic into Latin; lexicon hits carry
 * index -1, as their offsets are not into `text`).
 */
export function textHits(text: string, raw: string = text): Hit[] {
  const out: Hit[] = [];
  if (text.length < 6 && raw.length < 6) return out; // "fast", "asc": no room for an instruction
  applyRules(PHRASE_RULES, text, out);
  applyRules(V2_RULES, text, out);
  movementHits(text, out);
  lexiconHits(raw, out);
  return out;
}

/** The v1 phrase rules alone (scanPhrases, and through it the output guard). */
export function phraseHits(text: string): Hit[] {
  const out: Hit[] = [];
  applyRules(PHRASE_RULES, text, out);
  return out;
}

/** For a parameter: does its description ask for conversation content or secrets? */
export function asksForSource(description: string): RegExpExecArray | null {
  if (DENIAL.test(description)) return null;
  const m = SOURCE.exec(description) ?? SIDE_ASK.exec(description);
  if (!m || NEGATED.test(description.slice(0, m.index))) return null;
  return m;
}
const SIDE_ASK =
  /\b(?:every|all|each|other) (?:tools?|functions?) (?:you have|available to you|you can)\b|\b(?:hidden )?chain of thought\b|\bcontents? of (?:the )?(?:file|files)\b[^.]{0,20}(?:~|\/)/i;
