// `airlock mcp scan` on a server whose tools/list fails the MCP SDK's schema check (a bare
// {"$schema": ...} inputSchema, as some published servers return): the real CLI as a child process,
// the fixture in a real sandbox. The listing is scanned anyway, the bad definitions get a clear
// `invalid-definition` finding, the valid-but-poisoned one is still found, the exit code is the
// scanner's (1 for a high finding), never 70, and nothing is left behind.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, runCli, settledResidue } from '../helpers.js';
import { FIXTURE, startCli } from './harness.js';

const Report = z.object({
  server: z.string(),
  tools: z.number(),
  findings: z.array(
    z.object({ ruleId: z.string(), severity: z.string(), location: z.string(), message: z.string() }),
  ),
});

describe.skipIf(!canRunNamespaces)(
  `airlock mcp scan on SDK-invalid definitions${canRunNamespaces ? '' : ` [skipped: ${SKIP_REASON}]`}`,
  () => {
    it('reports each invalid tool as a finding, still scans the rest, and exits 1 (not 70)', async () => {
      const r = await runCli(['mcp', 'scan', '--json', '--', ...FIXTURE('bare-schema-server.ts')]);
      expect(r.code, r.stderr).toBe(1);
      const report = Report.parse(JSON.parse(r.stdout));
      expect(report).toMatchObject({ server: 'bare-schema-server', tools: 4 });
      const invalid = report.findings.filter((f) => f.ruleId === 'invalid-definition');
      expect(invalid.map((f) => `${f.severity} ${f.location}`)).toEqual([
        'medium tools[bare]',
        'medium tools[untyped]',
      ]);
      // Readable, not a validator dump: the field, what is wrong, what to fix.
      expect(invalid[0]!.message).toMatch(/^Not a valid MCP tool definition \(inputSchema\.type: /);
      expect(invalid[0]!.message).toContain('"type": "object"');
      expect(invalid[0]!.message.length).toBeLessThan(400);
      const high = report.findings
        .filter((f) => f.severity === 'high')
        .map((f) => `${f.ruleId} ${f.location}`);
      expect(high).toEqual(
        expect.arrayContaining([
          'secrecy tools[poisoned].description',
          'exfiltration tools[poisoned].description',
        ]),
      );
      expect(await settledResidue(10_000)).toEqual(NO_RESIDUE);
    });

    it('the text report names the finding and the exit code stays the scanner’s', async () => {
      const r = await runCli(['mcp', 'scan', '--', ...FIXTURE('bare-schema-server.ts')]);
      expect(r.code, r.stderr).toBe(1);
      expect(r.stdout).toMatch(/^bare-schema-server: 4 tools/);
      expect(r.stdout).toMatch(/MEDIUM\s+invalid-definition\s+tools\[bare\]/);
      expect(r.stderr).not.toMatch(/internal error|ZodError|"code":\s*"invalid_/i);
    });

    it('the gateway serves the valid tools and quarantines the ones MCP clients would reject', async () => {
      const cli = await startCli(['--', ...FIXTURE('bare-schema-server.ts')]);
      try {
        // The SDK client checks the listing itself: it would reject the whole list if one were invalid.
        const { tools } = await cli.client.listTools();
        expect(tools.map((t) => t.name)).toEqual(['sum']); // poisoned: high finding; bare, untyped: invalid
        // Calling one anyway: refused with the reason, a readable line (no validator dump).
        await expect(cli.client.callTool({ name: 'bare', arguments: {} })).rejects.toThrow(
          /blocked by Airlock: tool bare .* quarantined: invalid-definition .*"type": "object"/,
        );
        expect(cli.stderr()).not.toMatch(/internal error|ZodError|"code":\s*"invalid_/i);
      } finally {
        await cli.close();
      }
      expect(await settledResidue(10_000)).toEqual(NO_RESIDUE);
    });

    it('pin and check read the listing as served: no internal error, no validator dump', async () => {
      const dir = mkdtempSync('/var/tmp/airlock-pin-');
      try {
        const lock = join(dir, 'airlock.lock.json');
        const p = await runCli(['mcp', 'pin', '--lockfile', lock, '--', ...FIXTURE('bare-schema-server.ts')]);
        expect(p.stderr).not.toMatch(/internal error|ZodError|"code":\s*"invalid_/i);
        expect(p.code, p.stderr).toBe(0);
        expect(readFileSync(lock, 'utf8')).toContain('untyped');
        const c = await runCli([
          'mcp',
          'diff',
          '--lockfile',
          lock,
          '--',
          ...FIXTURE('bare-schema-server.ts'),
        ]);
        expect(c.stderr).not.toMatch(/internal error|ZodError/i);
        expect(c.code, c.stderr).toBe(0);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
  },
);
