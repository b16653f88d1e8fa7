// `airlock diff [run flags] [--out DIR] -- CMD`: run CMD in a sandbox whose workspace is a cow copy
// of a host dir (default: the cwd), then print what it changed there as a git patch on stdout, or
// write the changed files into DIR. The command's own output goes to stderr, so stdout is the patch.
import { resolve } from 'node:path';
import { AirlockError } from '../core/errors.js';
import type { Sandbox } from '../sandbox/index.js';
import type { WorkspaceChange } from '../sandbox/workspace.js';
import { checkSecretSources, relabelSecretError } from './egress-flags.js';
import { checkWorkspaceDir, planRun, type RunFlags } from './flags.js';
import { cliAirlock, statusOf, trapSignals } from './lifecycle.js';
import { killedLine, oomLine, processIo, relabelTemplateError, type Io } from './run.js';

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

  const airlock = cliAirlock({ maxSpillBytes: 0 });
  const trap = trapSignals(airlock, (line) => io.err(`${line}\n`));
  let sbx: Sandbox | undefined;
  try {
    sbx = await airlock.create(plan.spec).catch((e: unknown) => {
      throw relabelTemplateError(relabelSecretError(e, plan.egress));
    });
    if (trap.exitCode !== undefined) return trap.exitCode;
    const result = await sbx.exec(plan.command, {
      timeoutMs: plan.timeoutMs,
      maxOutputBytes: plan.maxOutputBytes,
      signal: trap.signal,
      ...(flags.stdin ? { stdin: process.stdin } : {}),
      onStdout: io.err, // stdout is the patch
      onStderr: io.err,
    });
    if (trap.exitCode !== undefined) return trap.exitCode;
    const why = killedLine(result, plan, sbx.spec.limits);
    if (why) io.err(`airlock: ${why}\n`);
    const oom = oomLine(result, sbx.spec.limits);
    if (oom) io.err(`airlock: ${oom}\n`);
    const diff = await sbx.workspace.diff(outDir === undefined ? {} : { dir: outDir });
    if (trap.exitCode !== undefined) return trap.exitCode;
    io.out(outDir === undefined ? diff.patch : changeLines(diff.changes));
    return statusOf(result);
  } catch (e) {
    if (trap.exitCode !== undefined) return trap.exitCode;
    throw e;
  } finally {
    try {
      await airlock.killAll();
    } finally {
      trap.dispose();
      if (flags.stdin) process.stdin.destroy();
    }
  }
}
