// The kernel protocol's parser on its own: frames split anywhere across chunks, other ids as data,
// multi-byte text split across chunks, bounded frames, and bodies that are not frames.
import { describe, expect, test } from 'vitest';
import { FrameSplitter, ProtocolViolation, parseFrame } from '../../src/sandbox/code/protocol.js';

const ID = 'abc123';
const frame = (body: string): string => `\x1e\x1eAL:${ID}:${body}\n`;

function split(input: Buffer, sizes: (i: number) => number, max = 1024): { data: string; frames: string[] } {
  let data = '';
  const frames: string[] = [];
  const s = new FrameSplitter(
    ID,
    max,
    (t) => (data += t),
    (b) => frames.push(b.toString('utf8')),
  );
  for (let i = 0, n = 0; i < input.length; i += n, n = 0) {
    n = Math.max(1, sizes(i));
    s.push(input.subarray(i, i + n));
  }
  s.flush();
  return { data, frames };
}

describe('FrameSplitter', () => {
  const input = Buffer.from(
    `héllo ${frame('{"t":"result","isMainResult":true,"text":"1"}')}mid\x1e\x1eAL:other:{"t":"end"}\nété${frame('{"t":"end"}')}tail\x1e`,
  );
  const expected = {
    data: 'héllo mid\x1e\x1eAL:other:{"t":"end"}\nététail\x1e',
    frames: ['{"t":"result","isMainResult":true,"text":"1"}', '{"t":"end"}'],
  };

  test('gives the same split however the stream is chunked (byte by byte, odd sizes, whole)', () => {
    expect(split(input, () => input.length)).toEqual(expected);
    expect(split(input, () => 1)).toEqual(expected);
    expect(split(input, (i) => (i % 7) + 1)).toEqual(expected);
  });

  test('a frame longer than the bound is a ProtocolViolation, also when it ends in the same chunk', () => {
    const long = Buffer.from(frame('x'.repeat(2000)));
    expect(() => split(long, () => 100)).toThrow(ProtocolViolation);
    expect(() => split(long, () => long.length)).toThrow(ProtocolViolation);
  });

  test('parseFrame accepts the known frames only', () => {
    expect(parseFrame(Buffer.from('{"t":"end","exit":3}'))).toEqual({ t: 'end', exit: 3 });
    for (const bad of [
      'not json',
      '{"t":"eval","code":"x"}',
      '{"t":"result"}',
      '[]',
      '{"t":"error","name":1}',
    ]) {
      expect(() => parseFrame(Buffer.from(bad))).toThrow(ProtocolViolation);
    }
  });
});
