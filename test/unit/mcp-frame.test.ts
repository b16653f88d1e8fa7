// The canonical JSON-RPC (MCP) frame parser: every rule with its stable code, ids recovered only when
// safe, values identical to JSON.parse for accepted input (differential test on generated documents),
// serialization that never emits what the parser would refuse, the stdio LineFramer under random chunk
// splits and oversized lines (bounded memory), and the seeded malformed corpus end to end. Inputs are
// written with \u escapes where the character is the point of the test.
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import {
  FRAME_ERROR_CODES,
  FRAME_LIMITS,
  JSONRPC_INVALID_REQUEST,
  JSONRPC_PARSE_ERROR,
  LineFramer,
  jsonRpcErrorFor,
  messageKind,
  parseMessage,
  serializeMessage,
  type FrameErrorCode,
  type FrameEvent,
  type JsonRpcMessage,
  type ParseResult,
} from '../../src/mcp/frame.js';
import { malformedCorpus, prng } from '../fixtures/mcp/malformed-corpus.js';

const MIB = 1024 * 1024;

function ok(r: ParseResult): JsonRpcMessage {
  if (!r.ok) throw new Error(`expected a message, got ${r.code}: ${r.reason}`);
  return r.message;
}

function rejected(
  input: string | Uint8Array,
  code: FrameErrorCode,
  opts?: Parameters<typeof parseMessage>[1],
) {
  const r = parseMessage(input, opts);
  expect(r.ok ? 'accepted' : r.code, r.ok ? '' : r.reason).toBe(code);
  if (r.ok) throw new Error('unreachable');
  return r;
}

/** Every object and array in the tree has the ordinary prototype: nothing exotic reaches a stage. */
function assertPlainTree(v: unknown): void {
  if (typeof v !== 'object' || v === null) return;
  if (Array.isArray(v)) {
    expect(Object.getPrototypeOf(v)).toBe(Array.prototype);
    v.forEach(assertPlainTree);
    return;
  }
  expect(Object.getPrototypeOf(v)).toBe(Object.prototype);
  Object.values(v).forEach(assertPlainTree);
}

const req = (rest: string): string => `{"jsonrpc":"2.0","id":7,${rest}}`;

describe('FRAME_LIMITS', () => {
  it('has the documented defaults', () => {
    expect(FRAME_LIMITS).toEqual({
      maxFrameBytes: 4 * MIB,
      maxDepth: 64,
      maxKeys: 10_000,
      maxStringBytes: 4 * MIB,
    });
    expect(Object.isFrozen(FRAME_LIMITS)).toBe(true);
  });

  it('refuses unusable limits with INVALID_ARGUMENT', () => {
    for (const bad of [{ maxDepth: 0 }, { maxDepth: 10_000 }, { maxFrameBytes: 1.5 }, { maxKeys: -1 }]) {
      expect(() => parseMessage('{}', bad)).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
      expect(() => new LineFramer(bad)).toThrow(AirlockError);
    }
  });
});

describe('parseMessage: valid messages', () => {
  const valid: Array<[string, string, ReturnType<typeof messageKind>]> = [
    ['request', '{"jsonrpc":"2.0","id":1,"method":"tools/list"}', 'request'],
    [
      'request with string id and params',
      '{"jsonrpc":"2.0","id":"a-1","method":"tools/call","params":{}}',
      'request',
    ],
    ['request with negative id', '{"jsonrpc":"2.0","id":-5,"method":"ping"}', 'request'],
    ['request with empty string id', '{"jsonrpc":"2.0","id":"","method":"ping"}', 'request'],
    ['notification', '{"jsonrpc":"2.0","method":"notifications/initialized"}', 'notification'],
    ['result', '{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}', 'result'],
    ['error', '{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"no","data":[1]}}', 'error'],
    ['error with id null', '{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"bad"}}', 'error'],
    ['error without id', '{"jsonrpc":"2.0","error":{"code":-32700,"message":"bad"}}', 'error'],
    ['whitespace everywhere', ' \t{ "jsonrpc" : "2.0" ,\r\n "id" : 1 , "method" : "ping" } \n', 'request'],
  ];

  it.each(valid)('%s', (_name, text, kind) => {
    const m = ok(parseMessage(text));
    expect(m).toEqual(JSON.parse(text));
    expect(messageKind(m)).toBe(kind);
    assertPlainTree(m);
    const fromBytes = parseMessage(Buffer.from(text, 'utf8'));
    expect(fromBytes).toEqual({ ok: true, message: m, bytes: Buffer.byteLength(text) });
  });

  it('reports the UTF-8 size in bytes for both input kinds', () => {
    const text = '{"jsonrpc":"2.0","method":"n","params":{"s":"\u00e9\u65e5\ud83c\udf0d"}}';
    expect(Buffer.byteLength(text)).toBe(text.length + 1 + 2 + 2);
    expect(parseMessage(text)).toMatchObject({ ok: true, bytes: Buffer.byteLength(text) });
    expect(parseMessage(new Uint8Array(Buffer.from(text)))).toMatchObject({
      ok: true,
      bytes: Buffer.byteLength(text),
    });
  });

  it('unescapes keys and values exactly as JSON.parse does', () => {
    const text = String.raw`{"jsonrpc":"2.0","id":"\u00e9","method":"tools/call","params":{"\u006e\u0061me":"x\ud83d\ude00\n\t\"\\\/\b\f\r\u0000","arguments":{"\u65E5\u672c":"\u65e5\u672c","A\u0301":1}}}`;
    const m = ok(parseMessage(text));
    expect(m).toEqual(JSON.parse(text));
    expect(m).toMatchObject({ id: '\u00e9', params: { name: 'x\u{1f600}\n\t"\\/\b\f\r\u0000' } });
    expect(Object.keys((m as unknown as { params: { arguments: object } }).params.arguments)).toEqual([
      '\u65e5\u672c',
      'A\u0301',
    ]);
  });

  it('converts numbers exactly as JSON.parse does (huge integers round, tiny ones underflow, -0 stays)', () => {
    const nums = [
      '12345678901234567890',
      '1e308',
      '1e-400',
      '-0',
      '-0.0',
      '0.1',
      '1E2',
      '5e-324',
      '123.456e-7',
    ];
    const text = `{"jsonrpc":"2.0","method":"n","params":{"v":[${nums.join(',')}]}}`;
    const m = ok(parseMessage(text)) as unknown as { params: { v: number[] } };
    expect(m).toEqual(JSON.parse(text));
    expect(m.params.v[0]).toBe(12345678901234567000);
    expect(m.params.v[2]).toBe(0);
    expect(Object.is(m.params.v[3], -0)).toBe(true);
  });

  it('makes keys such as constructor and toString plain own data properties', () => {
    const text =
      '{"jsonrpc":"2.0","method":"n","params":{"constructor":{"prototype":1},"toString":2,"hasOwnProperty":3}}';
    const m = ok(parseMessage(text)) as { params: Record<string, unknown> };
    expect(m).toEqual(JSON.parse(text));
    assertPlainTree(m);
    expect(Object.keys(m.params)).toEqual(['constructor', 'toString', 'hasOwnProperty']);
    expect(({} as Record<string, unknown>).prototype).toBeUndefined();
  });

  it('accepts U+2028, U+2029, DEL and escaped NUL inside strings (all valid JSON, all re-escaped safely)', () => {
    const text = '{"jsonrpc":"2.0","method":"n","params":{"s":"a\u2028b\u2029c\u007f\\u0000"}}';
    expect(ok(parseMessage(text))).toEqual(JSON.parse(text));
  });

  it('matches JSON.parse on 500 generated documents with random escapes and whitespace', () => {
    const rand = prng(42);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
    const ws = (): string => pick(['', '', ' ', '\n', '\t', '\r\n  ']);
    const hex = (n: number): string => {
      const h = n.toString(16).padStart(4, '0');
      return rand() < 0.5 ? h : h.toUpperCase();
    };
    const pool = [
      'a',
      'Z',
      '0',
      ' ',
      '"',
      '\\',
      '/',
      '\n',
      '\t',
      '\b',
      '\u0000',
      '\u00e9',
      '\u65e5',
      '\u{1f30d}',
    ];
    const shortEsc: Record<string, string> = {
      '"': '\\"',
      '\\': '\\\\',
      '/': '\\/',
      '\n': '\\n',
      '\t': '\\t',
      '\b': '\\b',
    };
    const str = (forKey: boolean): string => {
      let out = '"';
      const n = Math.floor(rand() * 8);
      for (let k = 0; k < n; k++) {
        const ch = pick(pool.filter((c) => !forKey || c !== '\u0000'));
        const cp = ch.codePointAt(0)!;
        const raw = cp >= 0x20 && ch !== '"' && ch !== '\\';
        const r = rand();
        if (r < 0.4 && raw) out += ch;
        else if (r < 0.7 && shortEsc[ch]) out += shortEsc[ch];
        else if (cp > 0xffff) out += `\\u${hex(ch.charCodeAt(0))}\\u${hex(ch.charCodeAt(1))}`;
        else out += `\\u${hex(cp)}`;
      }
      return `${out}"`;
    };
    const numbers = [
      '0',
      '-0',
      '7',
      '-12',
      '1.5',
      '1e2',
      '1E-2',
      '12345678901234567890',
      '1e308',
      '1e-400',
      '0.1',
    ];
    const value = (depth: number): string => {
      const r = rand();
      if (depth > 4 || r < 0.45) {
        const s = rand();
        return s < 0.4 ? pick(numbers) : s < 0.8 ? str(false) : pick(['true', 'false', 'null']);
      }
      if (r < 0.75) return object(depth + 1);
      const n = Math.floor(rand() * 4);
      return `[${ws()}${Array.from({ length: n }, () => value(depth + 1)).join(`${ws()},${ws()}`)}${ws()}]`;
    };
    // `${index}:` in front keeps keys distinct even after case folding.
    const object = (depth: number): string => {
      const n = Math.floor(rand() * 5);
      const members = Array.from(
        { length: n },
        (_, k) => `"${k}:${str(true).slice(1)}${ws()}:${ws()}${value(depth)}`,
      );
      return `{${ws()}${members.join(`${ws()},${ws()}`)}${ws()}}`;
    };
    for (let k = 0; k < 500; k++) {
      const text = `${ws()}{"jsonrpc":"2.0",${ws()}"id":${k},"method":"m","params":${object(2)}}${ws()}`;
      const expected: unknown = JSON.parse(text);
      expect(ok(parseMessage(text))).toEqual(expected);
      expect(ok(parseMessage(Buffer.from(text, 'utf8')))).toEqual(expected);
    }
  });
});

describe('parseMessage: rejections', () => {
  const cases: Array<[string, string | Buffer, FrameErrorCode]> = [
    // not JSON
    ['empty', '', 'not_json'],
    ['whitespace only', ' \r\n\t', 'not_json'],
    ['garbage', 'hello', 'not_json'],
    ['trailing garbage', '{"jsonrpc":"2.0","method":"n"}x', 'not_json'],
    ['two objects', '{"jsonrpc":"2.0","method":"n"}{"jsonrpc":"2.0","method":"n"}', 'not_json'],
    ['trailing comma', '{"jsonrpc":"2.0","method":"n",}', 'not_json'],
    ['single quotes', "{'jsonrpc':'2.0'}", 'not_json'],
    ['comment', '{"jsonrpc":"2.0","method":"n"} // hi', 'not_json'],
    ['raw newline in string', '{"jsonrpc":"2.0","method":"a\nb"}', 'not_json'],
    ['raw NUL in string', '{"jsonrpc":"2.0","method":"a\u0000b"}', 'not_json'],
    ['raw NUL between tokens', '{"jsonrpc":"2.0",\u0000"method":"n"}', 'not_json'],
    ['form feed as whitespace', '{"jsonrpc":"2.0",\f"method":"n"}', 'not_json'],
    ['NBSP as whitespace', '{"jsonrpc":"2.0",\u00a0"method":"n"}', 'not_json'],
    ['BOM (string input)', '\ufeff{"jsonrpc":"2.0","method":"n"}', 'not_json'],
    [
      'BOM (bytes)',
      Buffer.from([0xef, 0xbb, 0xbf, ...Buffer.from('{"jsonrpc":"2.0","method":"n"}')]),
      'not_json',
    ],
    ['invalid escape', '{"jsonrpc":"2.0","method":"\\x41"}', 'not_json'],
    ['short \\u escape', '{"jsonrpc":"2.0","method":"\\u12"}', 'not_json'],
    ['unterminated string', '{"jsonrpc":"2.0","method":"n', 'not_json'],
    ['leading zero', '{"jsonrpc":"2.0","id":01,"method":"n"}', 'not_json'],
    ['NaN', '{"jsonrpc":"2.0","id":NaN,"method":"n"}', 'not_json'],
    ['Infinity literal', '{"jsonrpc":"2.0","method":"n","params":{"x":Infinity}}', 'not_json'],
    ['truncated', '{"jsonrpc":"2.0","method":"n"', 'not_json'],
    // encoding
    ['invalid UTF-8 byte', Buffer.from([0x7b, 0xff, 0x7d]), 'invalid_utf8'],
    ['overlong encoding', Buffer.from([0x22, 0xc0, 0xaf, 0x22]), 'invalid_utf8'],
    ['UTF-8 encoded surrogate', Buffer.from([0x22, 0xed, 0xa0, 0x80, 0x22]), 'invalid_utf8'],
    ['truncated multibyte', Buffer.from([0x22, 0xe6, 0x97, 0x22]), 'invalid_utf8'],
    ['unpaired surrogate in string input', '{"jsonrpc":"2.0","method":"\ud800"}', 'invalid_utf8'],
    ['lone high surrogate escape', '{"jsonrpc":"2.0","method":"\\ud800"}', 'lone_surrogate'],
    ['lone low surrogate escape', '{"jsonrpc":"2.0","method":"\\udc00x"}', 'lone_surrogate'],
    ['high escape then non-surrogate', '{"jsonrpc":"2.0","method":"\\ud800\\u0041"}', 'lone_surrogate'],
    ['reversed pair', '{"jsonrpc":"2.0","method":"\\udc00\\ud800"}', 'lone_surrogate'],
    ['lone surrogate in a key', '{"jsonrpc":"2.0","method":"n","params":{"\\ud800":1}}', 'lone_surrogate'],
    // numbers that do not round-trip
    ['1e309', '{"jsonrpc":"2.0","method":"n","params":{"x":1e309}}', 'number_out_of_range'],
    ['-1e309', '{"jsonrpc":"2.0","method":"n","params":{"x":[-1e309]}}', 'number_out_of_range'],
    // keys
    ['duplicate top-level key', req('"method":"tools/list","method":"tools/call"'), 'duplicate_key'],
    ['duplicate nested key', req('"method":"x","params":{"a":{"b":1,"b":1}}'), 'duplicate_key'],
    ['duplicate via \\u escape', req('"method":"tools/list","\\u006dethod":"tools/call"'), 'duplicate_key'],
    ['duplicate via \\/ escape', req('"method":"x","params":{"a/b":1,"a\\/b":2}'), 'duplicate_key'],
    [
      'duplicate via surrogate-pair escape',
      req('"method":"x","params":{"\u{1f600}":1,"\\ud83d\\ude00":2}'),
      'duplicate_key',
    ],
    [
      'duplicate inside an array element',
      req('"method":"x","params":{"l":[{"k":1,"k":2}]}'),
      'duplicate_key',
    ],
    ['case variant top level', req('"method":"tools/list","Method":"tools/call"'), 'case_variant_key'],
    ['case variant via escape', req('"method":"tools/list","\\u004dethod":"tools/call"'), 'case_variant_key'],
    ['case variant nested', req('"method":"x","params":{"path":"/a","PATH":"/b"}'), 'case_variant_key'],
    ['case variant Kelvin sign', req('"method":"x","params":{"key":1,"\u212aey":2}'), 'case_variant_key'],
    ['__proto__ at top', req('"method":"x","__proto__":{}'), 'forbidden_key'],
    ['__proto__ nested', req('"method":"x","params":{"a":[{"__proto__":{"admin":true}}]}'), 'forbidden_key'],
    ['__proto__ escaped', req('"method":"x","params":{"\\u005f_proto__":1}'), 'forbidden_key'],
    ['NUL in a key', req('"method":"x","params":{"a\\u0000":1}'), 'forbidden_key'],
    // shape
    ['array (batch)', '[{"jsonrpc":"2.0","method":"n"}]', 'batch_unsupported'],
    ['empty array', '[]', 'batch_unsupported'],
    ['number', '42', 'not_object'],
    ['string', '"{}"', 'not_object'],
    ['null', 'null', 'not_object'],
    ['empty object', '{}', 'invalid_jsonrpc'],
  ];

  it.each(cases)('%s', (_name, input, code) => {
    rejected(input, code);
  });

  it('never throws for any single byte or short byte sequence', () => {
    for (let b = 0; b < 256; b++) expect(parseMessage(Buffer.from([b])).ok).toBe(false);
    const rand = prng(7);
    for (let k = 0; k < 2000; k++) {
      const buf = Buffer.from(
        Array.from({ length: 1 + Math.floor(rand() * 12) }, () => Math.floor(rand() * 256)),
      );
      expect(() => parseMessage(buf)).not.toThrow();
    }
  });

  it('checks the size before parsing: maxFrameBytes is inclusive, for bytes and strings', () => {
    const limit = 100;
    const head = '{"jsonrpc":"2.0","method":"x"';
    const exact = `${head}${' '.repeat(limit - head.length - 1)}}`;
    expect(exact.length).toBe(limit);
    ok(parseMessage(exact, { maxFrameBytes: limit }));
    ok(parseMessage(Buffer.from(exact), { maxFrameBytes: limit }));
    rejected(`${exact} `, 'oversized', { maxFrameBytes: limit });
    rejected(Buffer.from(`${exact} `), 'oversized', { maxFrameBytes: limit });
    // 98 UTF-16 units, but 2 bytes more in UTF-8: the limit is in bytes.
    const multi = `${head},"params":{"s":"${'\u00e9'.repeat(30)}"}}`;
    expect(multi.length).toBeLessThanOrEqual(limit);
    rejected(multi, 'oversized', { maxFrameBytes: limit });
    // Garbage over the limit is refused as oversized, not parsed.
    expect(rejected(Buffer.alloc(4 * MIB + 1, 0xff), 'oversized').reason).toContain(String(4 * MIB));
  });

  it('allows exactly maxDepth levels of nesting and refuses one more', () => {
    // The top-level object is level 1; params and the objects inside it are levels 2..n.
    const at = (levels: number): string =>
      `{"jsonrpc":"2.0","method":"x","params":${'{"a":'.repeat(levels - 1)}1${'}'.repeat(levels - 1)}}`;
    ok(parseMessage(at(64)));
    rejected(at(65), 'too_deep');
    ok(parseMessage(at(5), { maxDepth: 5 }));
    rejected(at(6), 'too_deep', { maxDepth: 5 });
    const arrays = (levels: number): string =>
      `{"jsonrpc":"2.0","method":"x","params":{"a":${'['.repeat(levels - 2)}${']'.repeat(levels - 2)}}}`;
    ok(parseMessage(arrays(64)));
    rejected(arrays(65), 'too_deep');
    // Far deeper than any stack: refused at level 65, no recursion beyond it.
    rejected(`{"a":${'['.repeat(1_000_000)}`, 'too_deep');
  });

  it('allows maxKeys members in one object and refuses one more', () => {
    const obj = (n: number): string =>
      `{"jsonrpc":"2.0","method":"x","params":{${Array.from({ length: n }, (_, k) => `"k${k}":0`).join(',')}}}`;
    ok(parseMessage(obj(10_000)));
    rejected(obj(10_001), 'too_many_keys');
    rejected(obj(4), 'too_many_keys', { maxKeys: 3 });
  });

  it('limits strings (keys and values) in UTF-8 bytes after unescaping', () => {
    const withValue = (s: string): string => `{"jsonrpc":"2.0","method":"x","params":{"s":"${s}"}}`;
    ok(parseMessage(withValue('a'.repeat(10)), { maxStringBytes: 10 }));
    rejected(withValue('a'.repeat(11)), 'string_too_long', { maxStringBytes: 10 });
    ok(parseMessage(withValue('\u00e9'.repeat(5)), { maxStringBytes: 10 }));
    rejected(withValue('\u00e9'.repeat(5) + 'a'), 'string_too_long', { maxStringBytes: 10 });
    // Six escape characters, one byte.
    ok(parseMessage(withValue('\\u0041'.repeat(10)), { maxStringBytes: 10 }));
    rejected(`{"jsonrpc":"2.0","method":"x","params":{"${'k'.repeat(11)}":1}}`, 'string_too_long', {
      maxStringBytes: 10,
    });
  });

  it('envelope rules: ids, params, results and errors', () => {
    const bad: Array<[string, string]> = [
      ['missing jsonrpc', '{"id":1,"method":"x"}'],
      ['jsonrpc 1.0', '{"jsonrpc":"1.0","id":1,"method":"x"}'],
      ['jsonrpc as number', '{"jsonrpc":2.0,"id":1,"method":"x"}'],
      ['request id null', '{"jsonrpc":"2.0","id":null,"method":"x"}'],
      ['id boolean', '{"jsonrpc":"2.0","id":true,"method":"x"}'],
      ['id float', '{"jsonrpc":"2.0","id":1.5,"method":"x"}'],
      ['id -0', '{"jsonrpc":"2.0","id":-0,"method":"x"}'],
      ['id beyond 2^53', '{"jsonrpc":"2.0","id":9007199254740993,"method":"x"}'],
      ['id object', '{"jsonrpc":"2.0","id":{},"method":"x"}'],
      ['method number', '{"jsonrpc":"2.0","id":1,"method":1}'],
      ['method empty', '{"jsonrpc":"2.0","id":1,"method":""}'],
      ['params array (positional)', '{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}'],
      ['params null', '{"jsonrpc":"2.0","method":"x","params":null}'],
      ['unknown member', '{"jsonrpc":"2.0","id":1,"method":"x","extra":true}'],
      ['result null', '{"jsonrpc":"2.0","id":1,"result":null}'],
      ['result with id null', '{"jsonrpc":"2.0","id":null,"result":{}}'],
      ['result without id', '{"jsonrpc":"2.0","result":{}}'],
      ['result and error', '{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"m"}}'],
      ['method and result', '{"jsonrpc":"2.0","id":1,"method":"x","result":{}}'],
      ['error code float', '{"jsonrpc":"2.0","id":1,"error":{"code":1.5,"message":"m"}}'],
      ['error without message', '{"jsonrpc":"2.0","id":1,"error":{"code":1}}'],
      ['error with extra member', '{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m","x":1}}'],
      ['error not an object', '{"jsonrpc":"2.0","id":1,"error":"boom"}'],
    ];
    for (const [name, text] of bad) {
      const r = rejected(text, 'invalid_jsonrpc');
      expect(r.reason, name).toMatch(/^invalid JSON-RPC message: /);
    }
    expect(
      rejected('{"jsonrpc":"2.0","id":1,"method":"x","extra":true}', 'invalid_jsonrpc').reason,
    ).toContain('"extra"');
    expect(
      rejected('{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}', 'invalid_jsonrpc').reason,
    ).toContain('$.params');
  });

  it('recovers the id of a request, so the caller can answer it', () => {
    const id = (text: string): unknown => {
      const r = parseMessage(text);
      return r.ok ? 'accepted' : r.id;
    };
    expect(id('{"jsonrpc":"2.0","id":5,"method":7}')).toBe(5);
    expect(id('{"jsonrpc":"1.0","id":"abc","method":"tools/call"}')).toBe('abc');
    expect(id('{"jsonrpc":"2.0","id":5,"method":"x","params":[1]}')).toBe(5);
    expect(id('{"jsonrpc":"2.0","id":5,"method":"x","extra":1}')).toBe(5);
    // Issue 30: a request the parser drops for ANY reason still carries its id, and is answered.
    expect(id('{"jsonrpc":"2.0","id":5,"method":"x","params":{"a":1,"a":2}}')).toBe(5); // duplicate key
    expect(id('{"jsonrpc":"2.0","id":5,"method":"x","params":{"a":1,"A":2}}')).toBe(5); // case variant
    expect(id('{"jsonrpc":"2.0","id":"q","method":"x","params":{"__proto__":{}}}')).toBe('q');
    expect(id('{"jsonrpc":"2.0","method":"x","params":{"s":"\\ud800"},"id":"late"}')).toBe('late');
    expect(id('{"jsonrpc":"2.0","id":6,"method":"x","n":1e400}')).toBe(6); // number out of range
    expect(id(`{"jsonrpc":"2.0","id":7,"method":"x","p":${'['.repeat(100)}${']'.repeat(100)}}`)).toBe(7);
    expect(id('\ufeff{"jsonrpc":"2.0","id":8,"method":"x"}')).toBe(8); // BOM
    expect(id('{"jsonrpc":"2.0","\\u0069d":9,"method":"x","bad":tru}')).toBe(9); // escaped key
    expect(id('{"jsonrpc":"2.0","id":5,"method":"x"')).toBe(5); // cut short after the id
    expect(id('{"jsonrpc":"2.0","id":5,"id":5,"method":"x","a":1,"a":1}')).toBe(5); // same id twice
    const bytes = Buffer.concat([
      Buffer.from('{"jsonrpc":"2.0","id":12,"method":"x","params":{"s":"'),
      Buffer.from([0xff]),
      Buffer.from('"}}'),
    ]);
    const utf8 = parseMessage(bytes);
    expect(utf8.ok ? 'accepted' : [utf8.code, utf8.id]).toEqual(['invalid_utf8', 12]);
    // Not recoverable: no method (a broken response must not be answered), an id readers could read
    // differently or not at all, a value cut short, a batch.
    expect(id('{"jsonrpc":"2.0","id":5,"result":null}')).toBeUndefined();
    expect(id('{"jsonrpc":"2.0","id":5}')).toBeUndefined();
    expect(id('{"jsonrpc":"2.0","id":1.5,"method":"x"}')).toBeUndefined();
    expect(id('{"jsonrpc":"2.0","id":1e400,"method":"x"}')).toBeUndefined();
    expect(id('{"jsonrpc":"2.0","id":"q\\ud800","method":"x"}')).toBeUndefined();
    expect(id('{"jsonrpc":"2.0","id":5,"id":6,"method":"x"}')).toBeUndefined();
    expect(id('{"jsonrpc":"2.0","id":5')).toBeUndefined();
    expect(id('{"jsonrpc":"2.0","method":"x","params":{"a":1,"a":2}}')).toBeUndefined();
    expect(id('[{"jsonrpc":"2.0","id":5,"method":"x"}]')).toBeUndefined();
  });

  it('recovers the id of a broken response separately (never answered, but its request can fail)', () => {
    const ids = (text: string): unknown => {
      const r = parseMessage(text);
      return r.ok ? 'accepted' : [r.id, r.responseId];
    };
    expect(ids('{"jsonrpc":"2.0","id":5,"result":null}')).toEqual([undefined, 5]);
    expect(ids('{"jsonrpc":"2.0","id":"s1","result":{"a":1,"a":2}}')).toEqual([undefined, 's1']);
    expect(ids('{"jsonrpc":"2.0","id":6,"error":{"code":1,"message":"\\udc00"}}')).toEqual([undefined, 6]);
    expect(ids('{"jsonrpc":"2.0","id":5,"id":7,"result":{}}')).toEqual([undefined, undefined]);
    expect(ids('{"jsonrpc":"2.0","id":5,"method":"x","result":{"a":1,"a":2}}')).toEqual([5, undefined]);
  });

  it('keeps reasons short, printable and free of long runs of the input', () => {
    const longKey = 'k'.repeat(5000);
    const inputs = [
      req(`"method":"x","params":{"${longKey}":1,"${longKey}":2}`),
      req(`"method":"x","params":{"${longKey}\\u001b[31m":{"${longKey}":{"a":1,"A":2}}}`),
      req(`"method":"x","params":{"${'\\u202e'.repeat(100)}":1,"${'\\u202e'.repeat(100)}":1}`),
      req(`"method":"x","${'e'.repeat(3000)}":1`),
      `{"a":${'{"b\\n\\u0007":'.repeat(80)}1${'}'.repeat(80)}}`,
      `{"jsonrpc":"2.0","id":1,"method":"x","params":{"s":"${'x'.repeat(100)}\u0007"}}`,
    ];
    for (const text of inputs) {
      const r = parseMessage(text);
      expect(r.ok).toBe(false);
      if (r.ok) continue;
      expect(r.reason.length).toBeLessThanOrEqual(200);
      expect(r.reason).toMatch(/^[\x20-\x7e]+$/);
      expect(r.reason).not.toMatch(/[ke]{30}/);
    }
  });
});

describe('jsonRpcErrorFor', () => {
  it('answers text-level failures with Parse error and shape failures with Invalid Request', () => {
    const parseErrors: FrameErrorCode[] = [
      'oversized',
      'invalid_utf8',
      'not_json',
      'lone_surrogate',
      'number_out_of_range',
      'duplicate_key',
      'case_variant_key',
      'forbidden_key',
      'too_deep',
      'too_many_keys',
      'string_too_long',
    ];
    const invalidRequests: FrameErrorCode[] = ['not_object', 'batch_unsupported', 'invalid_jsonrpc'];
    expect([...parseErrors, ...invalidRequests].sort()).toEqual([...FRAME_ERROR_CODES].sort());
    for (const code of parseErrors) {
      expect(jsonRpcErrorFor({ ok: false, code, reason: 'r' }).error.code).toBe(JSONRPC_PARSE_ERROR);
    }
    for (const code of invalidRequests) {
      expect(jsonRpcErrorFor({ ok: false, code, reason: 'r' }).error.code).toBe(JSONRPC_INVALID_REQUEST);
    }
    expect([JSONRPC_PARSE_ERROR, JSONRPC_INVALID_REQUEST]).toEqual([-32700, -32600]);
  });

  it('echoes a recovered id, else null, and is itself a valid message', () => {
    const r = parseMessage('{"jsonrpc":"2.0","id":"q1","method":5}');
    if (r.ok) throw new Error('expected failure');
    const answer = jsonRpcErrorFor(r);
    expect(answer).toEqual({ jsonrpc: '2.0', id: 'q1', error: { code: -32600, message: r.reason } });
    expect(ok(parseMessage(serializeMessage(answer)))).toEqual(answer);
    const noId = parseMessage('{"jsonrpc":');
    if (noId.ok) throw new Error('expected failure');
    expect(jsonRpcErrorFor(noId)).toEqual({
      jsonrpc: '2.0',
      id: null,
      error: { code: -32700, message: noId.reason },
    });
  });
});

describe('serializeMessage', () => {
  it('writes one line that parses back to the same message', () => {
    const msgs: JsonRpcMessage[] = [
      {
        jsonrpc: '2.0',
        id: 1,
        method: 'tools/call',
        params: { name: 'w', arguments: { s: 'a\nb\r\u2028\u0000"\\' } },
      },
      { jsonrpc: '2.0', method: 'notifications/progress', params: { progress: 0.5, emoji: '\u{1f30d}' } },
      { jsonrpc: '2.0', id: 'x', result: { content: [{ type: 'text', text: 'line1\nline2' }] } },
      { jsonrpc: '2.0', id: null, error: { code: -32700, message: 'bad', data: { n: -0 } } },
    ];
    for (const m of msgs) {
      const line = serializeMessage(m);
      expect(line.endsWith('\n')).toBe(true);
      expect(line.indexOf('\n')).toBe(line.length - 1);
      expect(line).not.toContain('\r');
      const back = ok(parseMessage(line));
      expect(back).toEqual(JSON.parse(JSON.stringify(m)));
    }
  });

  it('round-trips what parseMessage returns, byte for byte for canonical input', () => {
    const text =
      '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"\u65e5","arguments":{"n":12345678901234567000}}}';
    expect(serializeMessage(ok(parseMessage(text)))).toBe(`${text}\n`);
  });

  it('omits undefined object members like JSON.stringify', () => {
    const m = { jsonrpc: '2.0', id: 1, error: { code: 1, message: 'm', data: undefined } } as JsonRpcMessage;
    expect(serializeMessage(m)).toBe('{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m"}}\n');
  });

  it('refuses with MCP_INVALID_MESSAGE what it cannot write faithfully or what the parser would refuse', () => {
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    const params: Array<Record<string, unknown>> = [
      { x: Number.NaN },
      { x: Number.POSITIVE_INFINITY },
      { x: [1, undefined] },
      { x: () => 1 },
      { x: new Date(0) },
      { x: new Map() },
      { x: 1n },
      { x: Symbol('s') },
      cyclic,
      JSON.parse('{"__proto__":{"admin":true}}') as Record<string, unknown>,
      { path: 'a', PATH: 'b' },
      { s: '\ud800' },
      { ['k\u0000']: 1 },
      { s: 'x'.repeat(200) },
    ];
    for (const p of params) {
      const m = { jsonrpc: '2.0', id: 1, method: 'tools/call', params: p } as JsonRpcMessage;
      expect(() => serializeMessage(m, { maxStringBytes: 100 })).toThrow(
        expect.objectContaining({ code: 'MCP_INVALID_MESSAGE' }),
      );
    }
    const notEnvelope = { jsonrpc: '2.0', id: 1.5, method: 'x' } as JsonRpcMessage;
    expect(() => serializeMessage(notEnvelope)).toThrow(AirlockError);
  });
});

function collect(framer: LineFramer, chunks: readonly Buffer[], max = Infinity): FrameEvent[] {
  const events: FrameEvent[] = [];
  for (const c of chunks) {
    events.push(...framer.push(c));
    if (framer.bufferedBytes > max)
      throw new Error(`framer holds ${framer.bufferedBytes} bytes, over ${max}`);
  }
  events.push(...framer.end());
  return events;
}

function splitRandomly(buf: Buffer, rand: () => number, maxChunk: number): Buffer[] {
  const out: Buffer[] = [];
  for (let at = 0; at < buf.length;) {
    const n = 1 + Math.floor(rand() * maxChunk);
    out.push(buf.subarray(at, at + n));
    at += n;
  }
  return out;
}

const line = (m: object): string => `${JSON.stringify(m)}\n`;

describe('LineFramer', () => {
  it('splits on LF, strips one CR, ignores empty lines', () => {
    const a = { jsonrpc: '2.0', id: 1, method: 'a' };
    const b = { jsonrpc: '2.0', method: 'b' };
    const events = collect(new LineFramer(), [Buffer.from(`\n\r\n${JSON.stringify(a)}\r\n\n${line(b)}\n`)]);
    expect(events).toEqual([
      { kind: 'message', message: a, bytes: JSON.stringify(a).length },
      { kind: 'message', message: b, bytes: JSON.stringify(b).length },
    ]);
  });

  it('reports a blank-but-not-empty line and a broken line as errors, with ids when safe', () => {
    const events = collect(new LineFramer(), [
      Buffer.from(' \n{"jsonrpc":"2.0","id":9,"method":5}\n{"jsonrpc":"2.0","id":9,"method":"x","id":1}\n'),
    ]);
    expect(events.map((e) => (e.kind === 'error' ? [e.code, e.id] : e.kind))).toEqual([
      ['not_json', undefined],
      ['invalid_jsonrpc', 9],
      ['duplicate_key', undefined],
    ]);
    const second = events[1]!;
    if (second.kind !== 'error') throw new Error('expected error');
    expect(jsonRpcErrorFor(second)).toMatchObject({ id: 9, error: { code: -32600 } });
  });

  it('reassembles a message fed one byte at a time, including inside multibyte characters', () => {
    const m = { jsonrpc: '2.0', id: 'u', method: 'tools/call', params: { s: '\u00e9\u65e5\u{1f30d}\u2028' } };
    const bytes = Buffer.from(line(m));
    const chunks = Array.from(bytes, (b) => Buffer.from([b]));
    expect(collect(new LineFramer(), chunks)).toEqual([
      { kind: 'message', message: m, bytes: bytes.length - 1 },
    ]);
  });

  it('accepts plain Uint8Array chunks', () => {
    const m = { jsonrpc: '2.0', method: 'n' };
    const framer = new LineFramer();
    expect(framer.push(new Uint8Array(Buffer.from(line(m))))).toEqual([
      { kind: 'message', message: m, bytes: JSON.stringify(m).length },
    ]);
  });

  it('gives the same events for any split of the stream (deterministic random splits)', () => {
    const rand = prng(1234);
    const parts: string[] = [];
    for (let k = 0; k < 300; k++) {
      const r = rand();
      if (r < 0.7) {
        parts.push(
          line({
            jsonrpc: '2.0',
            id: k,
            method: 'tools/call',
            params: { s: `\u00e9${k}\u{1f30d}`.repeat(k % 7) },
          }),
        );
      } else if (r < 0.8) parts.push(`{"jsonrpc":"2.0","id":${k},"method":"x","params":{"a":1,"a":2}}\r\n`);
      else if (r < 0.9) parts.push('\n');
      else parts.push(`{"jsonrpc":"2.0","id":${k},"result":{"t":"\u65e5"}}\r\n`);
    }
    const stream = Buffer.from(parts.join(''));
    const whole = collect(new LineFramer(), [stream]);
    expect(whole.filter((e) => e.kind === 'message').length).toBeGreaterThan(200);
    for (let trial = 0; trial < 30; trial++) {
      const maxChunk = [1, 3, 17, 256, 4096][trial % 5]!;
      expect(collect(new LineFramer(), splitRandomly(stream, rand, maxChunk))).toEqual(whole);
    }
  });

  it('discards an oversized line without buffering it, reports it once, and recovers', () => {
    const max = 1024;
    const valid = { jsonrpc: '2.0', id: 1, method: 'after' };
    const huge = `{"jsonrpc":"2.0","id":0,"method":"x","params":{"s":"${'A'.repeat(20 * max)}"}}`;
    const stream = Buffer.from(`${huge}\n${line(valid)}`);
    for (const maxChunk of [1, 100, 5000, stream.length]) {
      const rand = prng(maxChunk);
      const framer = new LineFramer({ maxFrameBytes: max });
      const events = collect(framer, splitRandomly(stream, rand, maxChunk), max);
      expect(events).toEqual([
        { kind: 'error', code: 'oversized', reason: expect.stringContaining(String(max)) },
        { kind: 'message', message: valid, bytes: JSON.stringify(valid).length },
      ]);
      expect(framer.bufferedBytes).toBe(0);
    }
  });

  it('holds at most maxFrameBytes while a peer streams an endless line', () => {
    const framer = new LineFramer({ maxFrameBytes: 4096 });
    const chunk = Buffer.alloc(1000, 0x61);
    const events: FrameEvent[] = [];
    for (let k = 0; k < 10_000; k++) {
      events.push(...framer.push(chunk));
      expect(framer.bufferedBytes).toBeLessThanOrEqual(4096);
    }
    expect(events.map((e) => e.kind === 'error' && e.code)).toEqual(['oversized']);
    expect(framer.bufferedBytes).toBe(0);
    expect(framer.end()).toEqual([]);
  });

  it('counts the line (with any CR) against maxFrameBytes, inclusively', () => {
    const max = 64;
    const head = '{"jsonrpc":"2.0","method":"x"';
    const exact = `${head}${' '.repeat(max - head.length - 1)}}`;
    const ev = (s: string): Array<string | false> =>
      collect(new LineFramer({ maxFrameBytes: max }), [Buffer.from(s)]).map(
        (e) => e.kind === 'error' && e.code,
      );
    expect(ev(`${exact}\n`)).toEqual([false]);
    expect(ev(`${exact} \n`)).toEqual(['oversized']);
    expect(ev(`${exact}\r\n`)).toEqual(['oversized']);
    expect(ev(`${exact.slice(0, -2)}}\r\n`)).toEqual([false]);
  });

  it('end() parses a final line without newline, and says nothing after a discarded line', () => {
    const m = { jsonrpc: '2.0', method: 'last' };
    const framer = new LineFramer({ maxFrameBytes: 100 });
    expect(framer.push(Buffer.from(JSON.stringify(m)))).toEqual([]);
    expect(framer.end()).toEqual([{ kind: 'message', message: m, bytes: JSON.stringify(m).length }]);
    expect(framer.push(Buffer.from('{"jsonrpc":"2.0","meth'))).toEqual([]);
    expect(framer.end().map((e) => e.kind === 'error' && e.code)).toEqual(['not_json']);
    expect(framer.push(Buffer.alloc(200, 0x20)).map((e) => e.kind === 'error' && e.code)).toEqual([
      'oversized',
    ]);
    expect(framer.end()).toEqual([]);
    expect(framer.end()).toEqual([]);
    // Usable again after end().
    expect(framer.push(Buffer.from(line(m)))).toEqual([
      { kind: 'message', message: m, bytes: JSON.stringify(m).length },
    ]);
  });
});

describe('malformed corpus', () => {
  const corpus = malformedCorpus();
  const digest = (entries: ReturnType<typeof malformedCorpus>): string => {
    const h = createHash('sha256');
    for (const e of entries) h.update(e.name).update('\0').update(e.bytes).update('\0');
    return h.digest('hex');
  };

  it('has at least 10,000 entries, every category, and is deterministic per seed', () => {
    expect(corpus.length).toBeGreaterThanOrEqual(10_000);
    const categories = new Set(corpus.map((e) => e.name.split(':')[0]));
    for (const c of [
      'truncated',
      'mutation',
      'invalid-utf8',
      'lone-surrogate',
      'duplicate-key',
      'case-variant-key',
      'forbidden-key',
      'wrong-type',
      'batch',
      'number',
      'deep',
      'long-string',
      'too-many-keys',
      'control',
      'whitespace',
      'multiline',
      'bom',
      'not-object',
      'empty',
      'trailing',
      'syntax',
      'semantic',
    ]) {
      expect(categories, c).toContain(c);
    }
    expect(digest(malformedCorpus())).toBe(digest(corpus));
    expect(digest(malformedCorpus({ seed: 2 }))).not.toBe(digest(corpus));
    expect(malformedCorpus({ count: 500 })).toHaveLength(500);
    expect(malformedCorpus({ count: 15_000 })).toHaveLength(15_000);
  });

  it('parseMessage: never throws; rejects every entry except semantic:* ones, which it accepts', () => {
    const codes = new Set<string>();
    for (const e of corpus) {
      let r: ParseResult;
      try {
        r = parseMessage(e.bytes);
      } catch (err) {
        throw new Error(`${e.name}: parseMessage threw ${String(err)}`);
      }
      if (e.name.startsWith('semantic:')) {
        expect(r.ok, e.name).toBe(true);
        continue;
      }
      expect(r.ok, e.name).toBe(false);
      if (r.ok) continue;
      expect(FRAME_ERROR_CODES, e.name).toContain(r.code);
      codes.add(r.code);
      // The answer the gateway would send back is itself a valid, sendable message.
      const failure = r;
      expect(() => serializeMessage(jsonRpcErrorFor(failure)), e.name).not.toThrow();
    }
    expect([...codes].sort()).toEqual([...FRAME_ERROR_CODES].filter((c) => c !== 'string_too_long').sort());
  });

  it('LineFramer: never throws, never yields a message from a broken entry, memory stays bounded', () => {
    const rand = prng(99);
    const framer = new LineFramer();
    for (const e of corpus) {
      const bytes = Buffer.concat([e.bytes, Buffer.from('\n')]);
      const maxChunk = bytes.length > 64 * 1024 ? 64 * 1024 : 1 + Math.floor(rand() * 64);
      const events: FrameEvent[] = [];
      for (const c of splitRandomly(bytes, rand, maxChunk)) {
        try {
          events.push(...framer.push(c));
        } catch (err) {
          throw new Error(`${e.name}: LineFramer threw ${String(err)}`);
        }
        if (framer.bufferedBytes > FRAME_LIMITS.maxFrameBytes)
          throw new Error(`${e.name}: buffer over limit`);
      }
      expect(framer.bufferedBytes, e.name).toBe(0);
      const messages = events.filter((ev) => ev.kind === 'message').length;
      if (e.name.startsWith('semantic:')) {
        expect(messages, e.name).toBe(1);
        continue;
      }
      expect(messages, e.name).toBe(0);
      const nonEmptyLines = e.bytes
        .toString('latin1')
        .split('\n')
        .filter((l) => l.replace(/\r$/, '') !== '').length;
      expect(events.length, e.name).toBe(nonEmptyLines);
      for (const ev of events) if (ev.kind === 'error') expect(FRAME_ERROR_CODES).toContain(ev.code);
    }
    expect(framer.end()).toEqual([]);
  });
});
