// Image references: the accepted forms, normalisation, and a typed error naming what to fix for each
// kind of bad input. Pure parsing: no registry.
import { describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { formatImageRef, isLoopbackHost, parseImageRef } from '../../src/images/reference.js';

const D = `sha256:${'a'.repeat(64)}`;

describe('parseImageRef', () => {
  it.each([
    ['busybox', 'busybox:latest'],
    ['team/py:3.12', 'team/py:3.12'],
    ['registry.example.com/team/py:3.12', 'registry.example.com/team/py:3.12'],
    ['localhost:5000/x', 'localhost:5000/x:latest'],
    ['127.0.0.1:5000/a/b/c:v1.2-rc_1', '127.0.0.1:5000/a/b/c:v1.2-rc_1'],
    [`registry.example.com/py@${D}`, `registry.example.com/py@${D}`],
    [`registry.example.com/py:3@${D}`, `registry.example.com/py:3@${D}`],
    ['Registry.Example.com/a__b.c-d', 'registry.example.com/a__b.c-d:latest'],
  ])('%s → %s', (input, want) => {
    expect(formatImageRef(parseImageRef(input))).toBe(want);
  });

  it('puts a configured default registry in front of host-less names only; there is no built-in one', () => {
    expect(formatImageRef(parseImageRef('team/py:3', 'mirror.example.com:443'))).toBe(
      'mirror.example.com:443/team/py:3',
    );
    expect(formatImageRef(parseImageRef('other.example.com/py:3', 'mirror.example.com'))).toBe(
      'other.example.com/py:3',
    );
    expect(parseImageRef('py').registry).toBeUndefined();
    expect(parseImageRef('py').repository).toBe('py'); // no implicit "library/"
  });

  it.each([
    ['', 'is empty'],
    ['Busybox', 'invalid path component "Busybox"'],
    ['a//b', 'invalid path component ""'],
    ['a/-b', 'invalid path component "-b"'],
    ['a:', 'invalid tag ""'],
    ['a:-x', 'invalid tag "-x"'],
    [`a:${'x'.repeat(129)}`, 'invalid tag'],
    ['a@sha256:abc', 'digest that is not sha256'],
    [`a@md5:${'a'.repeat(32)}`, 'digest that is not sha256'],
    ['a b', 'whitespace'],
    ['host.example.com:99999/a', 'invalid port'],
    ['-host.example.com/a', 'invalid registry host'],
    [`x/${'a'.repeat(300)}`, 'over 255'],
  ])('%j is IMAGE_REF_INVALID (%s)', (input, text) => {
    let err: unknown;
    try {
      parseImageRef(input);
    } catch (e) {
      err = e;
    }
    expect(AirlockError.is(err, 'IMAGE_REF_INVALID')).toBe(true);
    expect((err as Error).message).toContain(text);
  });

  it('plain http only for loopback hosts', () => {
    for (const h of ['localhost:5000', '127.0.0.1:80', '127.1.2.3', '[::1]:5000'])
      expect(isLoopbackHost(h)).toBe(true);
    for (const h of ['registry.example.com', '10.0.0.1:5000', '127.example.com', 'localhost.example.com'])
      expect(isLoopbackHost(h)).toBe(false);
  });
});
