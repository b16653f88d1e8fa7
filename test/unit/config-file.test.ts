// core/config-file.ts: the one loader for config files (gateway configs, templates, policy files).
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { configFormat, loadConfigFile, readConfigData } from '../../src/core/config-file.js';

const dir = mkdtempSync(join(tmpdir(), 'airlock-config-file-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const write = (name: string, text: string): string => {
  const p = join(dir, name);
  writeFileSync(p, text);
  return p;
};
const OPTS = { what: 'test config', code: 'MCP_INVALID_CONFIG', maxBytes: 1024 } as const;
const Schema = z.object({ servers: z.record(z.string(), z.object({ port: z.number() }).strict()) }).strict();

describe('config files', () => {
  it('chooses YAML or JSON by extension, then by content', () => {
    expect(configFormat('a.yaml', '{}')).toBe('yaml');
    expect(configFormat('a.YML', '{}')).toBe('yaml');
    expect(configFormat('a.json', 'x: 1')).toBe('json');
    expect(configFormat('a.conf', '  {"x": 1}')).toBe('json');
    expect(configFormat('a.conf', 'x: 1')).toBe('yaml');
    expect(configFormat('a.json', 'x: 1', 'yaml')).toBe('yaml');
    expect(readConfigData(write('c.conf', 'servers:\n  a: { port: 1 }\n'), OPTS)).toEqual({
      servers: { a: { port: 1 } },
    });
    expect(readConfigData(write('c.json', '\ufeff{"servers": {}}'), OPTS)).toEqual({ servers: {} });
  });

  it('names the file and the full path of the bad key, with the caller’s error code', () => {
    const p = write('bad.yaml', 'servers:\n  a: { port: "80" }\n');
    expect(() => loadConfigFile(p, Schema, OPTS)).toThrow(
      expect.objectContaining({
        code: 'MCP_INVALID_CONFIG',
        field: 'servers.a.port',
        message: expect.stringContaining(`invalid test config ${p} at servers.a.port:`),
      }),
    );
    const q = write('typo.json', '{"servers": {"a": {"port": 1, "prot": 2}}}');
    expect(() => loadConfigFile(q, Schema, OPTS)).toThrow(
      expect.objectContaining({
        field: 'servers.a.prot',
        message: expect.stringContaining(`${q} at servers.a.prot: unknown field(s) "prot"`),
      }),
    );
  });

  it('refuses broken syntax, duplicate YAML keys, oversized files, directories and missing files', () => {
    const broken = write('broken.json', '{"servers": ');
    expect(() => readConfigData(broken, OPTS)).toThrow(
      expect.objectContaining({
        code: 'MCP_INVALID_CONFIG',
        message: expect.stringContaining(`${broken}: not valid JSON`),
      }),
    );
    expect(() => readConfigData(write('dup.yaml', 'a: 1\na: 2\n'), OPTS)).toThrow(
      expect.objectContaining({ code: 'MCP_INVALID_CONFIG' }),
    );
    expect(() => readConfigData(write('big.yaml', `a: "${'x'.repeat(2000)}"\n`), OPTS)).toThrow(
      /is larger than 1024 bytes/,
    );
    expect(() => readConfigData(dir, OPTS)).toThrow(/is not a regular file/);
    expect(() => readConfigData(join(dir, 'nope.yaml'), OPTS)).toThrow(
      expect.objectContaining({ code: 'FILE_NOT_FOUND' }),
    );
  });

  // Root reads any file, so the check only means something for another user.
  it.skipIf(process.getuid?.() === 0)('an unreadable file is PERMISSION_DENIED (not a parse error)', () => {
    const p = write('secret.yaml', 'a: 1\n');
    chmodSync(p, 0o000);
    expect(() => readConfigData(p, OPTS)).toThrow(expect.objectContaining({ code: 'PERMISSION_DENIED' }));
  });
});
