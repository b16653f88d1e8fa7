// SECURITY-CRITICAL: the output guard for every MCP server→client message that is not a tools/call
// result: notifications (logging, progress, resources/updated), the results of resources/read,
// prompts/get and completion/complete, and the params of server→client requests (sampling, elicitation).
// The same treatment as a tool result (output.ts), applied to any JSON tree:
// - every string value is a text slot: known values, sentinels, canaries and credential shapes are
//   redacted (also after normalising invisible characters), then what only shows when the slots are read
//   together (a value split over two items) withholds all the text; the text is cut to maxTextBytes as
//   one stream (the full redacted text goes to the spill); instruction-like text is flagged.
// - object keys are redacted and cut; `airlock/…` keys of any `_meta` are removed (only Airlock speaks
//   there); nesting deeper than GUARD_LIMITS.maxJsonDepth is replaced.
// - base64 under `blob` (resource contents) or `data` (image/audio content): decoded; text is redacted and
//   re-encoded, binary holding a known value or a credential shape is withheld (the item becomes a text
//   item or text resource saying so), all of it counted against maxBinaryBytes.
// Pure: no I/O beyond the caller's `spill`; the input is never mutated.
import {
  checkBytes,
  copyJson,
  GUARD_LIMITS,
  guardBase64,
  instructionFindings,
  isRecord,
  PROVENANCE_META_KEY,
  Redactor,
  segment,
  setOwn,
  splitHits,
  truncate,
  utf8Bytes,
  type GuardOptions,
  type GuardReport,
  type ProvenanceMeta,
  type Slot,
} from './output.js';

export interface MessageGuardOptions extends GuardOptions {
  /** Add `_meta['airlock/provenance']` to the top-level object (results; not notification params). */
  provenanceMeta?: boolean;
}

class Walker {
  readonly slots: Slot[] = [];
  readonly dropped: Array<{ location: string; reason: string }> = [];
  #binaryLeft: number;

  constructor(
    readonly redactor: Redactor,
    readonly maxBinaryBytes: number,
  ) {
    this.#binaryLeft = maxBinaryBytes;
  }

  #slot(text: string, location: string, put: (s: string) => void): void {
    put(text);
    this.slots.push({ location, item: undefined, text, put, gone: false });
  }

  #base64(data: string, location: string): { data: string } | { reason: string } {
    if (data.length > this.#binaryLeft)
      return { reason: `binary output over the ${this.maxBinaryBytes}-byte cap` };
    this.#binaryLeft -= data.length;
    return guardBase64(this.redactor, data, location);
  }

  /** A copy of `v` with its strings collected as slots (filled in later through their setters). */
  copy(v: unknown, location: string, depth = 0): unknown {
    return copyJson(
      v,
      location,
      this.redactor,
      this.dropped,
      {
        onString: (s, at, put, key) => {
          if (key !== undefined && STRUCTURAL.has(key)) put(this.redactor.redact(s, at));
          else this.#slot(s, at, put);
        },
        dropKey: (key, at) => at.endsWith('_meta') && key.startsWith('airlock/'),
        object: (src, at, d) => this.#binary(src, at, d),
      },
      depth,
    );
  }

  /** Base64 payloads: a resource's `blob`, an image or audio item's `data`. */
  #binary(
    src: Record<string, unknown>,
    location: string,
    depth: number,
  ): { value: unknown } | { verbatim: Record<string, unknown> } | undefined {
    const binaryKey =
      typeof src.blob === 'string'
        ? 'blob'
        : typeof src.data === 'string' && (src.type === 'image' || src.type === 'audio')
          ? 'data'
          : undefined;
    if (!binaryKey) return undefined;
    const at = location + segment(binaryKey);
    const verdict = this.#base64(src[binaryKey] as string, at);
    if ('reason' in verdict) {
      this.dropped.push({ location: at, reason: verdict.reason });
      const text = `[airlock: ${binaryKey === 'blob' ? 'resource blob' : `${String(src.type)} data`} at ${location} withheld: ${verdict.reason}]`;
      // The item keeps its identity (uri) but says why its bytes are gone.
      return {
        value:
          binaryKey === 'blob'
            ? this.copy({ ...pickUri(src), mimeType: 'text/plain', text }, location, depth)
            : { type: 'text', text },
      };
    }
    return { verbatim: { [binaryKey]: verdict.data } };
  }
}

/**
 * Fields whose values the protocol constrains (enums, identifiers): redacted, never truncated (an emptied
 * `role` or `type` would make the whole message invalid for the client).
 */
const STRUCTURAL = new Set([
  'type',
  'role',
  'mimeType',
  'uri',
  'level',
  'logger',
  'progressToken',
  'action',
  'method',
]);

const pickUri = (o: Record<string, unknown>): Record<string, unknown> =>
  typeof o.uri === 'string' ? { uri: o.uri } : {};

/**
 * Guard one server→client message body (a result or a notification's/request's params) from an
 * untrusted server. Returns the guarded copy and a report for the audit log (same shape as a tool
 * result's). `opts.provenance.tool` names the method (e.g. `resources/read`).
 */
export function guardMessage(
  value: unknown,
  opts: MessageGuardOptions,
  location = 'params',
): { value: unknown; report: GuardReport } {
  const maxText = checkBytes(opts.maxTextBytes, GUARD_LIMITS.defaultMaxTextBytes, 'maxTextBytes');
  const maxBinary = checkBytes(opts.maxBinaryBytes, GUARD_LIMITS.defaultMaxBinaryBytes, 'maxBinaryBytes');
  const redactor = new Redactor(opts);
  const w = new Walker(redactor, maxBinary);
  const out = w.copy(value, location);

  let originalTextBytes = 0;
  for (const s of w.slots) {
    originalTextBytes += utf8Bytes(s.text);
    s.text = redactor.redact(s.text, s.location);
    s.put(s.text);
  }
  const split = splitHits(
    redactor,
    w.slots.map((s) => s.text),
    location,
  );
  if (split.length > 0) {
    w.slots.forEach((s, i) => {
      s.text = i === 0 ? `${split.join(' ')} [airlock: all text was withheld]` : '';
      s.put(s.text);
    });
  }

  const total = w.slots.reduce((n, s) => n + utf8Bytes(s.text), 0);
  let spillRef: string | undefined;
  if (total > maxText) {
    if (opts.spill) spillRef = opts.spill(w.slots.map((s) => `--- ${s.location} ---\n${s.text}`).join('\n'));
    truncate(w.slots, total, maxText, spillRef);
  }

  let flagged = false;
  if (opts.flagInstructions !== false) {
    for (const s of w.slots) {
      instructionFindings(s.text, s.location).forEach((f, i) => {
        redactor.tally.add(`${s.location}\0instruction${i}`, f);
        flagged = true;
      });
    }
  }

  const truncated = total > maxText;
  const redactions = redactor.tally.total();
  if (opts.provenanceMeta && isRecord(out)) {
    const { server, tool, sandboxId, callId } = opts.provenance;
    const provenance: ProvenanceMeta = {
      server: String(server),
      tool: String(tool),
      ...(sandboxId !== undefined && { sandboxId: String(sandboxId) }),
      ...(callId !== undefined && { callId: String(callId) }),
      truncated,
      redacted: redactions > 0,
      redactions,
      flagged,
      ...(spillRef !== undefined && { spillRef }),
    };
    const meta = isRecord(out._meta) ? out._meta : {};
    setOwn(out, '_meta', { ...meta, [PROVENANCE_META_KEY]: provenance });
  }
  const report: GuardReport = {
    truncated,
    originalTextBytes,
    keptTextBytes: w.slots.reduce((n, s) => n + utf8Bytes(s.text), 0),
    redactions: redactor.tally.sortedRedactions(),
    findings: redactor.tally.sortedFindings(),
    dropped: w.dropped,
  };
  if (spillRef !== undefined) report.spillRef = spillRef;
  return { value: out, report };
}
