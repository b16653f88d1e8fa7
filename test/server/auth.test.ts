// The front server's listen rule and --listen parsing (pure functions; the CLI refusal itself is
// tested with the real `airlock serve` in serve-tenants.test.ts).
import { describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { checkListen, isLoopback, parseListen } from '../../src/server/auth.js';

describe('parseListen', () => {
  it('reads HOST:PORT, [V6]:PORT and a bare port (loopback)', () => {
    expect(parseListen('127.0.0.1:7070')).toEqual({ host: '127.0.0.1', port: 7070 });
    expect(parseListen('[::1]:0')).toEqual({ host: '::1', port: 0 });
    expect(parseListen('7070')).toEqual({ host: '127.0.0.1', port: 7070 });
    expect(parseListen(':7070')).toEqual({ host: '127.0.0.1', port: 7070 });
  });

  it('refuses anything else with INVALID_ARGUMENT naming --listen', () => {
    for (const bad of [
      '',
      'host',
      '127.0.0.1:',
      '127.0.0.1:65536',
      '1.2.3.4:80:80',
      '::1:80',
      'a b:1',
      '127.0.0.1:-1',
    ]) {
      try {
        parseListen(bad);
        expect.unreachable(bad);
      } catch (e) {
        expect(AirlockError.is(e, 'INVALID_ARGUMENT') && e.field, bad).toBe('listen');
      }
    }
  });
});

describe('checkListen', () => {
  it('loopback needs nothing; anything else needs TLS or --insecure-listen', () => {
    for (const host of ['127.0.0.1', '127.8.9.10', '::1', 'localhost', '::ffff:127.0.0.1']) {
      expect(isLoopback(host), host).toBe(true);
      expect(() => checkListen({ host, port: 1 }, { tls: false, insecureListen: false })).not.toThrow();
    }
    // Not loopback, however it is spelled: all interfaces, private, public, names, mapped v4.
    for (const host of [
      '0.0.0.0',
      '::',
      '10.0.0.1',
      '192.168.1.2',
      'example.com',
      '::ffff:10.0.0.1',
      '128.0.0.1',
      'localhost.',
    ]) {
      expect(isLoopback(host), host).toBe(false);
      expect(() => checkListen({ host, port: 1 }, { tls: false, insecureListen: false }), host).toThrow(
        /without TLS/,
      );
      expect(() => checkListen({ host, port: 1 }, { tls: true, insecureListen: false })).not.toThrow();
      expect(() => checkListen({ host, port: 1 }, { tls: false, insecureListen: true })).not.toThrow();
    }
  });
});
