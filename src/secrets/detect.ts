// SECURITY-CRITICAL: finds a token (a sentinel or a canary) in outgoing bytes, also when the sandbox
// encoded it: any case, hex, base64 / base64url at any byte alignment (also wrapped across lines), and
// percent-encoding up to three levels deep. This is the exfiltration alarm; a determined program can
// always transform a token beyond recognition (which is why values are only swapped for bound hosts).

/** How many rounds of percent-decoding are tried (%2561 → %61 → a). */
const PERCENT_ROUNDS = 3;

/** Bytes as a string, one char per byte, so every search below is byte-exact. */
function asBinary(text: string | Buffer): string {
  return typeof text === 'string' ? text : text.toString('latin1');
}

function percentDecode(s: string): string {
  return s.replace(/%([0-9a-fA-F]{2})/g, (_, h: string) => String.fromCharCode(parseInt(h, 16)));
}

export interface Haystack {
  /** The text and each distinct percent-decoding of it. */
  readonly forms: readonly string[];
  /** The same, lower-cased. */
  readonly lower: readonly string[];
  /** The same, whitespace removed (base64 wrapped at 76 columns, or split by a client). */
  readonly compact: readonly string[];
}

/** Prepare text once for many Needle.foundIn calls. */
export function prepareHaystack(text: string | Buffer): Haystack {
  const forms = [asBinary(text)];
  for (let i = 0; i < PERCENT_ROUNDS; i++) {
    const last = forms[forms.length - 1]!;
    if (!last.includes('%')) break;
    const next = percentDecode(last);
    if (next === last) break;
    forms.push(next);
  }
  return {
    forms,
    lower: forms.map((f) => f.toLowerCase()),
    compact: forms.map((f) => f.replace(/\s+/g, '')),
  };
}

/**
 * The part of base64(x + token + y) that depends only on the token, for the token starting at byte
 * `offset` mod 3 of the encoded stream: the 4-character groups whose 3 bytes all belong to the token.
 */
function base64Core(token: Buffer, offset: number): string {
  const b64 = Buffer.concat([Buffer.alloc(offset), token]).toString('base64');
  const firstGroup = Math.ceil(offset / 3);
  const endGroup = Math.floor((offset + token.length) / 3);
  return b64.slice(firstGroup * 4, endGroup * 4);
}

/** One token and its encoded spellings. */
export class Needle {
  readonly #lower: string;
  readonly #hex: string;
  readonly #base64: readonly string[];

  constructor(token: string) {
    const bytes = Buffer.from(token, 'utf8');
    this.#lower = bytes.toString('latin1').toLowerCase();
    this.#hex = bytes.toString('hex');
    const cores = [0, 1, 2].map((o) => base64Core(bytes, o)).filter((c) => c.length >= 8);
    const url = cores.map((c) => c.replace(/\+/g, '-').replace(/\//g, '_'));
    this.#base64 = [...new Set([...cores, ...url])];
  }

  foundIn(h: Haystack): boolean {
    if (h.lower.some((f) => f.includes(this.#lower) || f.includes(this.#hex))) return true;
    return h.compact.some((f) => this.#base64.some((b) => f.includes(b)));
  }
}
