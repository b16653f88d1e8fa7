// `airlock mcp --secret` through the real CLI: the flag used to be refused whatever --allow said (its
// hosts were checked against a placeholder policy). Now a secret reaches the server as a sentinel (never
// the real value, which is redacted from results too), from env: or file: sources, alone or on top of a
// --policy file; bad uses fail before any sandbox exists, naming --secret and never echoing the source.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { canRunNamespaces, NO_RESIDUE, runCli, settledResidue, SKIP_REASON } from '../helpers.js';
import { FIXTURE, startCli } from './harness.js';

const HOSTILE = FIXTURE('hostile-server.ts');
const text = (r: unknown): string =>
  ((r as CallToolResult).content ?? []).map((c) => (c.type === 'text' ? c.text : '')).join('');
/** A token-shaped value built at run time (no credential-shaped literal in the source). */
const realValue = (): string => ['real', 'secret', randomBytes(16).toString('hex')].join('-');

if (!canRunNamespaces) {
  describe('airlock mcp --secret', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
} else {
  describe('airlock mcp --secret', () => {
    let dir: string;
    beforeAll(() => {
      dir = mkdtempSync('/var/tmp/airlock-mcp-secret-');
    });
    afterAll(() => rmSync(dir, { recursive: true, force: true }));

    it('env: source with --allow: the server sees a sentinel, the real value never reaches the client', async () => {
      const real = realValue();
      const cli = await startCli(
        ['--allow', 'api.example.test', '--secret', 'GH=env:GH_REAL@api.example.test', '--', ...HOSTILE],
        { env: { GH_REAL: real } },
      );
      try {
        const out = text(await cli.client.callTool({ name: 'leak_secret', arguments: { name: 'GH' } }));
        expect(out).not.toContain('GH=(unset)'); // the variable is there...
        expect(out).not.toContain(real); // ...but not the real value
        expect(out).toMatch(/GH=\[REDACTED:[^\]]+\]/); // and the sentinel itself is scrubbed
        // The source variable itself is not passed through to the server.
        const src = text(await cli.client.callTool({ name: 'leak_secret', arguments: { name: 'GH_REAL' } }));
        expect(src).toContain('GH_REAL=(unset)');
      } finally {
        await cli.close();
      }
    }, 120_000);

    it('file: source, several hosts, on top of a --policy file whose secret of the same name it replaces', async () => {
      const real = realValue();
      const file = join(dir, 'token');
      writeFileSync(file, `${real}\n`, { mode: 0o600 });
      const policy = join(dir, 'policy.yaml');
      writeFileSync(
        policy,
        [
          'network:',
          '  allow: [api.example.test, uploads.example.test]',
          'secrets:',
          '  - name: TOKEN',
          '    value: { fromEnv: NOT_SET_ANYWHERE }',
          '    hosts: [api.example.test]',
          '',
        ].join('\n'),
      );
      const cli = await startCli([
        '--policy',
        policy,
        '--secret',
        `TOKEN=file:${file}@api.example.test,uploads.example.test`,
        '--',
        ...HOSTILE,
      ]);
      try {
        const out = text(await cli.client.callTool({ name: 'leak_secret', arguments: { name: 'TOKEN' } }));
        expect(out).not.toContain('TOKEN=(unset)');
        expect(out).not.toContain(real);
        expect(out).toMatch(/TOKEN=\[REDACTED:[^\]]+\]/);
      } finally {
        await cli.close();
      }
    }, 120_000);

    it('refuses a --secret whose host is not allowed, naming the flag that fixes it (exit 2)', async () => {
      const r = await runCli([
        'mcp',
        '--allow',
        'other.example.test',
        '--secret',
        'GH=env:HOME@api.example.test',
        '--',
        ...HOSTILE,
      ]);
      expect(r.code).toBe(2);
      expect(r.stderr).toContain(
        '--secret: GH is bound to api.example.test, which the network policy does not allow; add --allow api.example.test',
      );
    }, 60_000);

    it('refuses an unset env: source, a duplicate name and a bad source, without echoing a source', async () => {
      const unset = await runCli([
        'mcp',
        '--allow',
        'api.example.test',
        '--secret',
        'GH=env:AIRLOCK_TEST_SURELY_UNSET_VAR@api.example.test',
        '--',
        ...HOSTILE,
      ]);
      expect(unset.code).toBe(2);
      expect(unset.stderr).toMatch(
        /--secret: GH: environment variable AIRLOCK_TEST_SURELY_UNSET_VAR is not set/,
      );

      const twice = await runCli([
        'mcp',
        '--allow',
        'api.example.test',
        '--secret',
        'GH=env:HOME@api.example.test',
        '--secret',
        'GH=env:PATH@api.example.test',
        '--',
        ...HOSTILE,
      ]);
      expect(twice.code).toBe(2);
      expect(twice.stderr).toContain('--secret: GH is given twice');

      const credential = randomBytes(12).toString('hex');
      const bad = await runCli([
        'mcp',
        '--allow',
        'api.example.test',
        '--secret',
        `GH=vault:${credential}@api.example.test`,
        '--',
        ...HOSTILE,
      ]);
      expect(bad.code).toBe(2);
      expect(bad.stderr).toMatch(/--secret: GH: the source must start with env:, file: or cmd:/);
      expect(bad.stderr).not.toContain(credential);
      expect(await settledResidue(10_000)).toEqual(NO_RESIDUE);
    }, 60_000);
  });
}
