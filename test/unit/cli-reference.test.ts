// docs/reference/cli.md is generated from the commander program (scripts/cli-reference.ts); a change to a
// command, argument, option or help text without `npm run docs:cli` fails here, so it cannot go stale.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { CLI_REFERENCE_PATH, renderCliReference } from '../../scripts/cli-reference.js';
import { buildProgram } from '../../src/cli/main.js';

describe('CLI reference', () => {
  it('the committed docs/reference/cli.md equals a fresh generation (run npm run docs:cli)', async () => {
    expect(readFileSync(CLI_REFERENCE_PATH, 'utf8')).toBe(await renderCliReference());
  });

  it('names every command and every option of every command', async () => {
    const text = await renderCliReference();
    const walk = (c: ReturnType<typeof buildProgram>, path: string[]): void => {
      const name = [...path, c.name()].join(' ');
      expect(text).toContain(`# ${name}\n`);
      for (const o of c.options) expect(text).toContain(`\`${o.flags.replace(/\|/g, '\\|')}\``);
      // Hidden commands (airlock supervisor, started by airlock serve) are not in --help either.
      for (const sub of c.createHelp().visibleCommands(c)) {
        if (sub.name() !== 'help') walk(sub, [...path, c.name()]);
      }
    };
    walk(buildProgram(), []);
  });
});
