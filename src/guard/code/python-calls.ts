// What Python calls give back, for the data flow of python.ts: a module (`__import__('os')`), a
// decoded, fetched or read value (taints), a folded path (`os.path.join(Path.home(), '.ssh')`), or
// the taint of their inputs. Also the decoding of string literals and the names that carry taint.
// Pure.
import { UNKNOWN, UNKNOWN_VAL, carry, join, lit, withTaint, type Taint, type Val } from './flow.js';
import { DECODERS, NETWORK_PREFIXES, normalise } from './python-names.js';

const ESCAPE =
  /\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|([0-7]{1,3})|N\{[^}]*\}|(\r?\n)|(.))/gs;
const SIMPLE: Record<string, string> = {
  n: '\n',
  t: '\t',
  r: '\r',
  '0': '\0',
  a: '\x07',
  b: '\b',
  f: '\f',
  v: '\v',
};

/** A Python string literal's escapes decoded (not for raw strings). */
export function unescapePython(text: string): string {
  return text.replace(
    ESCAPE,
    (_m, x?: string, u?: string, U?: string, o?: string, nl?: string, c?: string) => {
      const hex = x ?? u ?? U;
      if (hex) return String.fromCodePoint(Math.min(parseInt(hex, 16), 0x10ffff));
      if (o) return String.fromCharCode(parseInt(o, 8));
      if (nl) return '';
      if (c) return SIMPLE[c] ?? c;
      return UNKNOWN;
    },
  );
}

export const TAINT_BY_NAME: Record<string, Taint[]> = {
  'os.environ': ['env', 'envdump'],
  'os.environb': ['env', 'envdump'],
  'sys.argv': ['input'],
  'sys.stdin': ['file'],
};

/** Analyse one Python syntax tree. */
/** The value a qualified name refers to (`os.environ` carries the environment's taint). */
export function pyRef(ref: string, extra: Partial<Val> = {}): Val {
  const q = normalise(ref);
  const t = TAINT_BY_NAME[q];
  return { text: UNKNOWN, literal: false, taint: new Set(t ?? []), ref: q, ...extra };
}

/** What a call gives back: a module, a decoded or fetched value, a folded path, or its inputs' taint. */
export function callResult(
  q: string | undefined,
  receiver: Val | undefined,
  method: string | undefined,
  pos: readonly Val[],
  all: readonly Val[],
): Val {
  const refVal = pyRef;
  const arg0 = pos[0];
  if (q === '__import__' || q === 'importlib.import_module')
    return arg0?.literal ? refVal(arg0.text.split('.')[0]!) : UNKNOWN_VAL;
  if (q === 'globals' || q === 'locals' || (q === 'vars' && pos.length === 0)) return refVal('globals()');
  if (q === 'vars' && arg0?.ref === 'builtins') return refVal('builtins.__dict__');
  if (q === 'getattr' && pos.length >= 2) {
    const [obj, name] = [pos[0]!, pos[1]!];
    if (obj.ref && name.literal) return refVal(`${obj.ref}.${name.text}`, { hidden: true, taint: obj.taint });
    return carry(obj);
  }
  if (q && DECODERS.has(q)) return withTaint(carry(...all), 'decoded');
  if (q === 'chr' || q === 'unichr') return withTaint(carry(...all), 'charcode');
  if ((q === 'bytes' || q === 'bytearray') && arg0?.items && arg0.items.length > 3)
    return withTaint(carry(arg0), 'charcode');
  if (q === 'map' && pos[0]?.ref === 'chr') return withTaint(carry(...all), 'charcode');
  if (method === 'decode' || method === 'encode') {
    const codec = arg0?.text.toLowerCase().replace(/[-_]/g, '') ?? '';
    const t = carry(receiver, ...all);
    return /^(?:rot13|hex|base64|zlib|bz2|uu|unicodeescape|punycode)$/.test(codec)
      ? withTaint(t, 'decoded')
      : t;
  }
  if (q && NETWORK_PREFIXES.some((p) => q.startsWith(p))) return withTaint(carry(), 'network');
  if (
    q === 'open' ||
    q === 'io.open' ||
    q === 'codecs.open' ||
    q === 'os.read' ||
    q === 'fileinput.input' ||
    method === 'read_text' ||
    method === 'read_bytes' ||
    method === 'open'
  ) {
    return withTaint(carry(receiver), 'file');
  }
  if (q === 'input' || q === 'raw_input' || q === 'getpass.getpass') return withTaint(carry(), 'input');
  if (q === 'os.getenv' || q === 'os.environ.get' || q === 'os.getenvb')
    return { text: arg0?.text === 'HOME' ? '~' : UNKNOWN, literal: false, taint: new Set<Taint>(['env']) };
  if (
    q &&
    /^(?:ctypes\.(?:CDLL|PyDLL|cdll\.LoadLibrary|CDLL)|ctypes\.cdll\.\w+|ctypes\.LibraryLoader)$/.test(q)
  )
    return withTaint(carry(), 'libc');
  if (method === 'dlopen') return withTaint(carry(), 'libc');
  if (q === 'ctypes.util.find_library') return lit(`lib${arg0?.text ?? ''}`);
  // Paths.
  if (q === 'os.path.join' || q === 'posixpath.join') return join(pos, '/');
  if (q === 'pathlib.Path' || q === 'Path' || q === 'pathlib.PosixPath' || q === 'PurePath')
    return pos.length ? join(pos, '/') : lit('.');
  if (q === 'pathlib.Path.home' || q === 'Path.home' || (q === 'os.path.expanduser' && arg0?.text === '~'))
    return lit('~');
  if (
    q &&
    /^os\.path\.(?:expanduser|expandvars|abspath|realpath|normpath)$|^os\.fspath$|^str$/.test(q) &&
    arg0
  )
    return arg0.items ? carry(arg0) : arg0;
  if (method === 'joinpath' && receiver) return join([receiver, ...pos], '/');
  if (
    method &&
    /^(?:expanduser|resolve|absolute|strip|rstrip|lstrip)$/.test(method) &&
    receiver &&
    pos.length === 0
  )
    return receiver;
  if (method === 'format' && receiver?.literal) {
    let i = 0;
    const text = receiver.text.replace(/\{[^{}]*\}/g, () => pos[i++]?.text ?? UNKNOWN);
    return { text, literal: all.every((v) => v.literal), taint: carry(receiver, ...all).taint };
  }
  if (method === 'join' && receiver?.literal && arg0) {
    if (arg0.items) return join(arg0.items, receiver.text);
    return carry(receiver, arg0);
  }
  if (q === 'compile') return carry(arg0);
  return carry(receiver, ...all);
}
