// Typed errors: stable codes, a cross-module isInstance check, and the one mapping to CLI exit codes
// and HTTP statuses. Expected values are spelled out here, independently of the module under test.
import { describe, expect, it } from 'vitest';
import {
  AirlockError,
  ERROR_CODES,
  exitCodeFor,
  httpStatusFor,
  type AirlockErrorCode,
} from '../../src/core/errors.js';

const EXPECTED: Record<AirlockErrorCode, { exit: number; http: number }> = {
  INVALID_SPEC: { exit: 2, http: 400 },
  INVALID_ARGUMENT: { exit: 2, http: 400 },
  SANDBOX_NOT_FOUND: { exit: 3, http: 404 },
  SANDBOX_GONE: { exit: 3, http: 410 },
  BACKEND_UNAVAILABLE: { exit: 4, http: 503 },
  PERMISSION_DENIED: { exit: 4, http: 403 },
  FILE_NOT_FOUND: { exit: 1, http: 404 },
  FILE_TOO_LARGE: { exit: 1, http: 413 },
  PROCESS_NOT_FOUND: { exit: 3, http: 404 },
  REQUEST_TOO_LARGE: { exit: 1, http: 413 },
  CAPACITY_EXHAUSTED: { exit: 5, http: 503 },
  DISK_FULL: { exit: 1, http: 507 },
  ABORTED: { exit: 130, http: 499 },
  SANDBOX_PAUSED: { exit: 1, http: 409 },
  SNAPSHOT_NOT_FOUND: { exit: 3, http: 404 },
  SNAPSHOT_IN_USE: { exit: 1, http: 409 },
  TEMPLATE_NOT_FOUND: { exit: 3, http: 404 },
  TEMPLATE_BUILD_FAILED: { exit: 1, http: 422 },
  EXECUTABLE_NOT_FOUND: { exit: 3, http: 404 },
  EXECUTABLE_INVALID: { exit: 1, http: 422 },
  LIBRARY_NOT_FOUND: { exit: 1, http: 422 },
  ROOT_LINK_UNSAFE: { exit: 1, http: 422 },
  MCP_INVALID_MESSAGE: { exit: 1, http: 400 },
  MCP_INVALID_CONFIG: { exit: 2, http: 400 },
  MCP_CALL_DENIED: { exit: 1, http: 403 },
  MCP_BUDGET_EXHAUSTED: { exit: 1, http: 429 },
  MCP_SERVER_FAILED: { exit: 1, http: 502 },
  UNAUTHORIZED: { exit: 4, http: 401 },
  QUOTA_EXCEEDED: { exit: 5, http: 429 },
  WORKSPACE_DIFF_UNSUPPORTED: { exit: 1, http: 422 },
  PORT_UNREACHABLE: { exit: 1, http: 502 },
  IMAGE_REF_INVALID: { exit: 2, http: 400 },
  IMAGE_NOT_FOUND: { exit: 3, http: 404 },
  IMAGE_DIGEST_MISMATCH: { exit: 1, http: 502 },
  IMAGE_PLATFORM_UNSUPPORTED: { exit: 1, http: 422 },
  IMAGE_TOO_LARGE: { exit: 1, http: 413 },
  IMAGE_LAYER_UNSAFE: { exit: 1, http: 422 },
  IMAGE_AUTH_FAILED: { exit: 4, http: 401 },
  IMAGE_REGISTRY_ERROR: { exit: 1, http: 502 },
  IMAGE_IN_USE: { exit: 1, http: 409 },
  CODE_DENIED: { exit: 1, http: 422 },
  CODE_CONTEXT_NOT_FOUND: { exit: 3, http: 404 },
  INTERNAL: { exit: 70, http: 500 },
};
const CODES = Object.keys(EXPECTED) as AirlockErrorCode[];

describe('AirlockError', () => {
  it('has exactly the documented codes', () => {
    expect(Object.keys(ERROR_CODES).sort()).toEqual([...CODES].sort());
  });

  it('carries code, message, field and cause', () => {
    const cause = new Error('root cause');
    const e = new AirlockError('INVALID_SPEC', 'bad memory', { field: 'limits.memoryBytes', cause });
    expect(e).toBeInstanceOf(Error);
    expect(e).toBeInstanceOf(AirlockError);
    expect(e.name).toBe('AirlockError');
    expect(e.code).toBe('INVALID_SPEC');
    expect(e.message).toBe('bad memory');
    expect(e.field).toBe('limits.memoryBytes');
    expect(e.cause).toBe(cause);
    expect(e.stack).toContain('bad memory');
  });

  it('has no field or cause unless given', () => {
    const e = new AirlockError('INTERNAL', 'oops');
    expect(e.field).toBeUndefined();
    expect('cause' in e).toBe(false);
  });

  it('isInstance recognises AirlockErrors only', () => {
    expect(AirlockError.isInstance(new AirlockError('ABORTED', 'x'))).toBe(true);
    for (const other of [
      new Error('x'),
      Object.assign(new Error('x'), { code: 'INVALID_SPEC' }),
      { code: 'INVALID_SPEC', message: 'x', name: 'AirlockError' },
      null,
      undefined,
      'AirlockError',
      42,
    ]) {
      expect(AirlockError.isInstance(other)).toBe(false);
    }
  });

  it('isInstance works across module copies (the marker is a registered symbol)', () => {
    // What another copy of the module would construct: same registry symbol, different class.
    const foreign = Object.assign(new Error('from another copy'), {
      [Symbol.for('airlock.error')]: true,
      code: 'SANDBOX_GONE',
    });
    expect(AirlockError.isInstance(foreign)).toBe(true);
    expect(AirlockError.is(foreign, 'SANDBOX_GONE')).toBe(true);
    expect(exitCodeFor(foreign)).toBe(3);
  });

  it('is() checks the code', () => {
    const e = new AirlockError('FILE_NOT_FOUND', 'x');
    expect(AirlockError.is(e, 'FILE_NOT_FOUND')).toBe(true);
    expect(AirlockError.is(e, 'FILE_TOO_LARGE')).toBe(false);
    expect(AirlockError.is(new Error('x'), 'FILE_NOT_FOUND')).toBe(false);
  });

  it('toJSON gives code, message and field only when set', () => {
    const withField = new AirlockError('INVALID_ARGUMENT', 'bad path', {
      field: 'path',
      cause: new Error('c'),
    });
    expect(withField.toJSON()).toEqual({ code: 'INVALID_ARGUMENT', message: 'bad path', field: 'path' });
    const without = new AirlockError('SANDBOX_GONE', 'gone');
    expect(without.toJSON()).toEqual({ code: 'SANDBOX_GONE', message: 'gone' });
    expect(Object.keys(without.toJSON())).toEqual(['code', 'message']);
    expect(JSON.parse(JSON.stringify(withField))).toEqual(withField.toJSON());
    expect(JSON.stringify({ error: without })).toBe('{"error":{"code":"SANDBOX_GONE","message":"gone"}}');
  });
});

describe('exitCodeFor / httpStatusFor', () => {
  it.each(CODES)('%s maps to its exit code and HTTP status', (code) => {
    const e = new AirlockError(code, 'x');
    expect(exitCodeFor(e)).toBe(EXPECTED[code].exit);
    expect(httpStatusFor(e)).toBe(EXPECTED[code].http);
  });

  it('maps anything else to INTERNAL', () => {
    for (const other of [
      new Error('x'),
      new TypeError('x'),
      'string',
      null,
      undefined,
      { code: 'ABORTED' },
    ]) {
      expect(exitCodeFor(other)).toBe(70);
      expect(httpStatusFor(other)).toBe(500);
    }
  });

  it('uses exit codes a shell can tell apart from success', () => {
    for (const code of CODES) {
      expect(EXPECTED[code].exit).toBeGreaterThan(0);
      expect(EXPECTED[code].exit).toBeLessThan(256);
      expect(EXPECTED[code].http).toBeGreaterThanOrEqual(400);
    }
  });
});
