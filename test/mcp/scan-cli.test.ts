// `airlock mcp scan` on a server whose tools/list fails the MCP SDK's schema check (a bare
// {"$schema": ...} inputSchema, as some published servers return): the real CLI as a child process,
// the fixture in a real sandbox. The listing is scanned anyway, the bad definitions get a clear
// `invalid-definition` finding, the valid-but-poisoned one is still found, the exit code is the
// scanner's (1 for a high finding), never 70, and nothing is left behind.
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, runCli, settledResidue } from '../helpers.js';
import { FIXTURE } from './harness.js';

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
      expect(report).toMatchObject({ server: 'bare-schema-server', tools: 3 });
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
      expect(r.stdout).toMatch(/^bare-schema-server: 3 tools/);
      expect(r.stdout).toMatch(/MEDIUM\s+invalid-definition\s+tools\[bare\]/);
      expect(r.stderr).not.toMatch(/internal error|ZodError|"code":\s*"invalid_/i);
    });
  },
);
