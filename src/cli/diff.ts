// `airlock diff [run flags] [--out DIR] -- CMD`: run CMD in a sandbox whose workspace is a cow copy
// of a host dir (default: the cwd), then print what it changed there as a git patch on stdout, or
// write the changed files into DIR. The command's own output goes to stderr, so stdout is the patch.
import { resolve } from 'node:path';
import { AirlockError } from '../core/errors.js';
import type { WorkspaceChange } from '../sandbox/workspace.js';
import { checkSecretSources } from './egress-flags.js';
import { checkWorkspaceDir, planRun, type RunFlags } from './flags.js';
import { processIo, reportEnd, runPlan, type Io } from './run.js';

export interface DiffFlags extends RunFlags {
  out?: string;
}

/** The `--out` listing: one line per change, like `git status --short`. */
export function changeLines(changes: readonly WorkspaceChange[]): string {
  const letter = { added: 'A', modified: 'M', deleted: 'D' } as const;
  return changes.map((c) => `${letter[c.kind]} ${c.path}\n`).join('');
}

export async function diffCommand(
  args: readonly string[],
  flags: DiffFlags,
  io: Io = processIo,
): Promise<number> {
  const cwd = process.cwd();
  const plan = planRun(args, { ...flags, workspace: flags.workspace ?? cwd }, cwd);
  const ws = plan.spec.workspace!;
  if (ws.mode !== 'cow') {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `--workspace: diff needs a cow workspace (a read-only one cannot change); drop ":${ws.mode}"`,
      { field: '--workspace' },
    );
  }
  checkWorkspaceDir(ws.hostDir!);
  checkSecretSources(plan.egress);
  const outDir = flags.out === undefined ? undefined : resolve(cwd, flags.out);

  return runPlan(plan, flags, io, {
    airlock: { maxSpillBytes: 0 },
    output: { onStdout: io.err, onStderr: io.err }, // stdout is the patch
    async after(sbx, result, interrupted) {
      reportEnd(result, plan, sbx, io);
      const diff = await sbx.workspace.diff(outDir === undefined ? {} : { dir: outDir });
      if (!interrupted()) io.out(outDir === undefined ? diff.patch : changeLines(diff.changes));
    },
  });
}
