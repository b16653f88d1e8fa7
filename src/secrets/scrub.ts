// SECURITY-CRITICAL: removes the real values Airlock inserted into a request from what the upstream
// sends back, so a sandbox never reads a credential back through a reflecting server. It knows every
// exact value Airlock inserted (each real secret value, each whole header value it built, and the
// base64 token inside a Basic header it re-encoded) and finds each of them in the forms a client
// can trivially undo:
//   - verbatim, upper/lower/mixed ASCII case, reversed (values of 8+ bytes), and as UTF-16 (LE, BE);
//   - hex (any case), base64 and base64url at any byte alignment, also wrapped or split by whitespace;
//   - behind escapes, one level deep and mixed freely: percent-encoding (also %25XX, twice encoded, and
//     %uXXXX), JSON / JS escapes (\uXXXX with surrogate pairs, \xXX, \" \\ \/), HTML character
//     references (&#DDD; &#xHH; &amp; &lt; &gt; &quot; &apos;) and quoted-printable (=XX, soft breaks);
//     hex and base64 are also found behind those escapes.
// A verbatim reflection becomes what the sandbox itself sent (the sentinel, or its own header value);
// any other form becomes a marker `airlock_redacted_<name>`. Streams are scrubbed across chunk
// boundaries: the tail that could still start a match is held back until more bytes (or the end)
// arrive. Compressed bodies are decoded before they reach this (egress/content-coding.ts).
// NOT covered (residual risk, docs/threat-model.md): an upstream that transforms a value in any other
// way (encryption, arbitrary re-encoding, a partial or character-by-character reflection) defeats
// any scrubber; bind secrets only to hosts that do not reflect them.

/** One value Airlock inserted into a request, and what a verbatim reflection of it becomes. */
export interface ScrubValue {
  /** Secret name (for the marker). */
  readonly name: string;
  /** The exact text Airlock inserted (a real value, or a whole header value it built). */
  readonly value: string;
  /** What the sandbox reads instead of a verbatim reflection (its sentinel / its own header value). */
  readonly replacement: string;
}

/**
 * Canonical characters held back beyond the longest needle: an escape cut in half at the end of a
 * chunk (up to 11) plus the group a base64 match takes on either side (4).
 */
const PARTIAL_ESCAPE_MARGIN = 16;
const BASE64_CHAR = /[A-Za-z0-9+/_=-]/;
/** Whitespace runs up to this long are skipped inside a match (a line break and an indent). */
const MAX_SKIPPED_SPACE = 8;
/** At most this many bytes are held back while waiting for a match to complete. */
export const MAX_SCRUB_CARRY_BYTES = 256 * 1024;
/** Reversed spellings are looked for only for values at least this long (shorter ones are noise). */
const MIN_REVERSED_BYTES = 8;
/** Base64 pieces shorter than this are not looked for (they would match unrelated text). */
const MIN_BASE64_CORE = 8;

/**
 * Lower case of a binary string (one char per byte). Every Latin-1 character lower-cases to one
 * Latin-1 character, so offsets stay the same; needles and haystacks fold the same way.
 */
function fold(s: string): string {
  return s.toLowerCase();
}

/** The part of base64(x + token + y) that depends only on the token, with the token at `offset` mod 3. */
function base64Core(token: Buffer, offset: number): string {
  const b64 = Buffer.concat([Buffer.alloc(offset), token]).toString('base64');
  return b64.slice(Math.ceil(offset / 3) * 4, Math.floor((offset + token.length) / 3) * 4);
}

interface Needle {
  readonly text: string;
  /** Searched in the lower-cased view. */
  readonly folded: boolean;
  /** The verbatim value (a match of exactly these bytes gets the replacement, not the marker). */
  readonly verbatim: boolean;
  readonly entry: number;
}

/** A canonical view of a binary string: text[i] came from source[start[i], end[i]). */
interface View {
  readonly text: string;
  readonly start: Int32Array;
  readonly end: Int32Array;
  /** Source offset after the last point no match can span (a long whitespace run), or 0. */
  readonly barrier?: number;
}

const NAMED_ENTITIES: Record<string, string> = { amp: '&', lt: '<', gt: '>', quot: '"', apos: "'" };
const HEX2 = /^[0-9a-fA-F]{2}$/;

/** UTF-8 bytes of a code point as a binary string (a lone surrogate or out-of-range becomes nothing). */
function utf8Of(cp: number): string {
  if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return '';
  return Buffer.from(String.fromCodePoint(cp), 'utf8').toString('latin1');
}

/** One escape at s[i], decoded: [bytes, length in source], or undefined if s[i] starts none. */
function escapeAt(s: string, i: number): [string, number] | undefined {
  const c = s[i];
  if (c === '%') {
    if (s.startsWith('%25', i) && HEX2.test(s.slice(i + 3, i + 5))) {
      return [String.fromCharCode(parseInt(s.slice(i + 3, i + 5), 16)), 5];
    }
    if (HEX2.test(s.slice(i + 1, i + 3)))
      return [String.fromCharCode(parseInt(s.slice(i + 1, i + 3), 16)), 3];
    const m = /^%u([0-9a-fA-F]{4})/.exec(s.slice(i, i + 6));
    if (m) return [utf8Of(parseInt(m[1]!, 16)), 6];
    return undefined;
  }
  if (c === '\\') {
    const n = s[i + 1];
    if (n === 'u') {
      const m = /^\\u([0-9a-fA-F]{4})(?:\\u([dD][c-fC-F][0-9a-fA-F]{2}))?/.exec(s.slice(i, i + 12));
      if (!m) return undefined;
      const hi = parseInt(m[1]!, 16);
      if (m[2] !== undefined && hi >= 0xd800 && hi <= 0xdbff) {
        const lo = parseInt(m[2], 16);
        return [utf8Of(0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)), 12];
      }
      return [utf8Of(hi), 6];
    }
    if (n === 'x' && HEX2.test(s.slice(i + 2, i + 4))) {
      return [String.fromCharCode(parseInt(s.slice(i + 2, i + 4), 16)), 4];
    }
    if (n === '"' || n === '\\' || n === '/' || n === "'") return [n, 2];
    return undefined;
  }
  if (c === '&') {
    const m = /^&(?:#([0-9]{1,7})|#[xX]([0-9a-fA-F]{1,6})|(amp|lt|gt|quot|apos));/.exec(s.slice(i, i + 12));
    if (!m) return undefined;
    if (m[1] !== undefined) return [utf8Of(Number(m[1])), m[0].length];
    if (m[2] !== undefined) return [utf8Of(parseInt(m[2], 16)), m[0].length];
    return [NAMED_ENTITIES[m[3]!]!, m[0].length];
  }
  if (c === '=') {
    // Quoted-printable: =XX, and soft line breaks (=CRLF / =LF) that stand for nothing.
    if (s.startsWith('=\r\n', i)) return ['', 3];
    if (s.startsWith('=\n', i)) return ['', 2];
    if (HEX2.test(s.slice(i + 1, i + 3)))
      return [String.fromCharCode(parseInt(s.slice(i + 1, i + 3), 16)), 3];
  }
  return undefined;
}

function rawView(s: string): View {
  const start = new Int32Array(s.length);
  const end = new Int32Array(s.length);
  for (let i = 0; i < s.length; i++) {
    start[i] = i;
    end[i] = i + 1;
  }
  return { text: s, start, end };
}

/** The view with escapes decoded; the same view when `s` holds no character that starts one. */
function decodedView(s: string, raw: View): View {
  if (!/[%\\&=]/.test(s)) return raw;
  // An escape never decodes to more bytes than it is long, so the output fits in s.length.
  const out = Buffer.alloc(s.length);
  const start = new Int32Array(s.length);
  const end = new Int32Array(s.length);
  let n = 0;
  for (let i = 0; i < s.length;) {
    const c = s.charCodeAt(i);
    // Only %, \, & and = start an escape.
    const e = c === 0x25 || c === 0x5c || c === 0x26 || c === 0x3d ? escapeAt(s, i) : undefined;
    if (e === undefined) {
      out[n] = c;
      start[n] = i;
      end[n++] = i + 1;
      i += 1;
      continue;
    }
    const [bytes, len] = e;
    for (let j = 0; j < bytes.length; j++) {
      out[n] = bytes.charCodeAt(j);
      start[n] = i;
      end[n++] = i + len;
    }
    i += len;
  }
  return { text: out.toString('latin1', 0, n), start: start.subarray(0, n), end: end.subarray(0, n) };
}

/** ASCII whitespace: space, \t, \n, \v, \f, \r. */
const isSpace = (c: number): boolean => c === 0x20 || (c >= 0x09 && c <= 0x0d);

/**
 * The view without whitespace runs (base64 wrapped at 76 columns, hex split into groups); or `v` itself.
 * A run longer than MAX_SKIPPED_SPACE stays (as one space, which no needle contains): a match then
 * spans a bounded number of source bytes, so the tail held back between chunks stays small.
 */
function compactView(v: View): View {
  if (!/[ \t\n\v\f\r]/.test(v.text)) return v;
  const out = Buffer.alloc(v.text.length);
  const start = new Int32Array(v.text.length);
  const end = new Int32Array(v.text.length);
  let n = 0;
  let barrier = 0;
  for (let i = 0; i < v.text.length;) {
    if (!isSpace(v.text.charCodeAt(i))) {
      out[n] = v.text.charCodeAt(i);
      start[n] = v.start[i]!;
      end[n++] = v.end[i]!;
      i++;
      continue;
    }
    let j = i;
    while (j < v.text.length && isSpace(v.text.charCodeAt(j))) j++;
    if (j - i > MAX_SKIPPED_SPACE) {
      out[n] = 0x20;
      start[n] = v.start[i]!;
      end[n++] = barrier = v.end[j - 1]!;
    }
    i = j;
  }
  return {
    text: out.toString('latin1', 0, n),
    start: start.subarray(0, n),
    end: end.subarray(0, n),
    barrier,
  };
}

interface Span {
  start: number;
  end: number;
  /** Index into entries when the span is exactly one verbatim value; -1: use the marker. */
  verbatim: number;
  entry: number;
}

/** Finds and replaces inserted values. One per response (it is cheap); holds no stream state itself. */
export class Scrubber {
  readonly #entries: ReadonlyArray<{ name: string; value: string; replacement: string }>;
  readonly #needles: readonly Needle[];
  readonly #longest: number;

  constructor(values: readonly ScrubValue[]) {
    // Binary strings (one char per byte) throughout, so every offset is a byte offset.
    const entries = values
      .filter((v) => v.value.length > 0)
      .map((v) => ({
        name: v.name,
        value: Buffer.from(v.value, 'utf8').toString('latin1'),
        replacement: v.replacement,
      }));
    this.#entries = entries;
    const needles: Needle[] = [];
    entries.forEach((e, entry) => {
      const bytes = Buffer.from(e.value, 'latin1');
      needles.push({ text: fold(e.value), folded: true, verbatim: true, entry });
      needles.push({ text: bytes.toString('hex'), folded: true, verbatim: false, entry });
      // UTF-16 (a body in charset utf-16, or a JS/Windows string dumped as bytes), both byte orders.
      const utf16 = Buffer.from(bytes.toString('utf8'), 'utf16le');
      needles.push({ text: fold(utf16.toString('latin1')), folded: true, verbatim: false, entry });
      needles.push({
        text: fold(Buffer.from(utf16).swap16().toString('latin1')),
        folded: true,
        verbatim: false,
        entry,
      });
      if (bytes.length >= MIN_REVERSED_BYTES) {
        // Reversed by characters (as `rev` or a string reversal does), then as bytes.
        const reversed = Buffer.from([...bytes.toString('utf8')].reverse().join(''), 'utf8');
        needles.push({ text: fold(reversed.toString('latin1')), folded: true, verbatim: false, entry });
      }
      const cores = [0, 1, 2].map((o) => base64Core(bytes, o)).filter((c) => c.length >= MIN_BASE64_CORE);
      const all = new Set([...cores, ...cores.map((c) => c.replace(/\+/g, '-').replace(/\//g, '_'))]);
      for (const c of all) needles.push({ text: c, folded: false, verbatim: false, entry });
    });
    this.#needles = needles;
    this.#longest = Math.max(0, ...needles.map((n) => n.text.length));
  }

  /** Nothing to look for: callers may skip scrubbing altogether. */
  get empty(): boolean {
    return this.#entries.length === 0;
  }

  /** Scrub one complete text (a header value, a status message). Binary string in, binary string out. */
  scrubText(s: string): string {
    if (this.empty) return s;
    const { out } = this.#scrub(s, true);
    return out;
  }

  /** A scrubber for one streamed body: push() each chunk, then end(); concatenated outputs are the body. */
  stream(): { push(chunk: Buffer): Buffer; end(): Buffer } {
    let carry = '';
    return {
      push: (chunk: Buffer): Buffer => {
        if (this.empty) return chunk;
        const r = this.#scrub(carry + chunk.toString('latin1'), false);
        carry = r.carry;
        return Buffer.from(r.out, 'latin1');
      },
      end: (): Buffer => {
        const r = this.#scrub(carry, true);
        carry = '';
        return Buffer.from(r.out, 'latin1');
      },
    };
  }

  /** Replace every complete match; unless `final`, hold back the tail a match could still start in. */
  #scrub(s: string, final: boolean): { out: string; carry: string } {
    if (s.length === 0) return { out: '', carry: '' };
    const raw = rawView(s);
    const decoded = decodedView(s, raw);
    const views = [...new Set([raw, compactView(raw), decoded, compactView(decoded)])];
    const spans: Span[] = [];
    let cut = s.length;
    for (const v of views) {
      const folded = fold(v.text);
      for (const n of this.#needles) {
        const hay = n.folded ? folded : v.text;
        for (let i = hay.indexOf(n.text); i !== -1; i = hay.indexOf(n.text, i + 1)) {
          let first = i;
          let last = i + n.text.length - 1;
          if (!n.folded) {
            // A base64 core leaves out the groups the value shares with its neighbours (up to 2 of
            // its bytes at each end): take one group more on each side.
            for (let k = 0; k < 4 && first > 0 && BASE64_CHAR.test(v.text[first - 1]!); k++) first--;
            for (let k = 0; k < 4 && last + 1 < v.text.length && BASE64_CHAR.test(v.text[last + 1]!); k++) {
              last++;
            }
          }
          const start = v.start[first]!;
          const end = v.end[last]!;
          const exact = n.verbatim && s.slice(start, end) === this.#entries[n.entry]!.value;
          spans.push({ start, end, verbatim: exact ? n.entry : -1, entry: n.entry });
        }
      }
      if (!final) {
        // A match not yet complete starts within the last (longest - 1) canonical characters, plus a
        // margin for an escape cut in half at the end of the buffer.
        const k = v.text.length - (this.#longest - 1) - PARTIAL_ESCAPE_MARGIN;
        // Nothing pending can start before a barrier (no needle spans one).
        cut = Math.min(cut, Math.max(k <= 0 ? 0 : v.start[k]!, v.barrier ?? 0));
      }
    }
    if (!final && s.length - cut > MAX_SCRUB_CARRY_BYTES) cut = s.length - MAX_SCRUB_CARRY_BYTES;
    const merged = mergeSpans(spans);
    // A match that began before the cut is complete (it was found): emit it whole.
    for (const m of merged) if (m.start < cut && m.end > cut) cut = m.end;
    let out = '';
    let at = 0;
    for (const m of merged) {
      if (m.start >= cut) break;
      out += s.slice(at, m.start);
      out +=
        m.verbatim >= 0
          ? Buffer.from(this.#entries[m.verbatim]!.replacement, 'utf8').toString('latin1')
          : `airlock_redacted_${this.#entries[m.entry]!.name.toLowerCase()}`;
      at = m.end;
    }
    out += s.slice(at, cut);
    return { out, carry: s.slice(cut) };
  }
}

/**
 * Overlapping matches become one span. It keeps a verbatim replacement only when one verbatim match
 * covers the whole span (e.g. a whole header value, which contains the secret value).
 */
function mergeSpans(spans: Span[]): Span[] {
  // Same start: the longest first, and of equal spans a verbatim one first.
  spans.sort((a, b) => a.start - b.start || b.end - a.end || b.verbatim - a.verbatim);
  const out: Span[] = [];
  for (const sp of spans) {
    const last = out[out.length - 1];
    if (last && sp.start < last.end) {
      if (sp.end > last.end) {
        last.end = sp.end;
        last.verbatim = -1;
      }
      continue;
    }
    out.push({ ...sp });
  }
  return out;
}
