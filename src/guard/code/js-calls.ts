// What JavaScript calls give back, for the data flow of javascript.ts, and the decoding of string
// literals. Pure.
import { UNKNOWN, carry, join, lit, withTaint, type Val } from './flow.js';
import { JS_DECODERS, JS_FILE, JS_NETWORK } from './js-names.js';

const ESCAPE = /\\(?:x([0-9a-fA-F]{2})|u\{([0-9a-fA-F]+)\}|u([0-9a-fA-F]{4})|([0-7]{1,3})|(\r?\n)|(.))/gs;
const SIMPLE: Record<string, string> = { n: '\n', t: '\t', r: '\r', b: '\b', f: '\f', v: '\v' };

export function unescapeJs(text: string): string {
  return text.replace(
    ESCAPE,
    (_m, x?: string, ub?: string, u?: string, o?: string, nl?: string, c?: string) => {
      const hex = x ?? ub ?? u;
      if (hex) return String.fromCodePoint(Math.min(parseInt(hex, 16), 0x10ffff));
      if (o) return String.fromCharCode(parseInt(o, 8));
      if (nl) return '';
      return c ? (SIMPLE[c] ?? c) : UNKNOWN;
    },
  );
}

/** What a call gives back: a decoded, fetched or read value (taints), a folded path, or its inputs' taint. */
export function callResultJs(
  q: string | undefined,
  receiver: Val | undefined,
  method: string | undefined,
  args: readonly Val[],
): Val {
  const arg0 = args[0];
  if (q === 'Buffer.from' && args[1]?.literal && /^(?:hex|base64|base64url)$/.test(args[1].text))
    return withTaint(carry(arg0), 'decoded');
  if (q && JS_DECODERS.has(q)) return withTaint(carry(...args), 'decoded');
  if (q === 'String.fromCharCode' || q === 'String.fromCodePoint')
    return withTaint(carry(...args), 'charcode');
  if (method === 'reverse') return withTaint(carry(receiver), 'decoded');
  if (q === 'util.promisify' && arg0?.ref) return arg0;
  if (q && JS_NETWORK.test(q)) return withTaint(carry(), 'network');
  if (q && JS_FILE.test(q)) return withTaint(carry(), 'file');
  if (q === 'readline.createInterface') return withTaint(carry(), 'input');
  if (q && /^(?:koffi\.load|ffi\.Library|ffi-napi\.Library)$/.test(q)) return withTaint(carry(), 'libc');
  if (q === 'os.homedir') return lit('~');
  if (q && /^path\.(?:posix\.)?(?:join|resolve)$/.test(q)) return join(args, '/');
  if (method === 'join' && receiver?.items && (arg0?.literal ?? true))
    return join(receiver.items, arg0?.text ?? ',');
  if (method === 'toString' && receiver) return carry(receiver);
  if (method === 'concat' && receiver) return join([receiver, ...args]);
  if (method && /^(?:trim|trimStart|trimEnd)$/.test(method) && receiver) return receiver;
  return carry(receiver, ...args);
}
