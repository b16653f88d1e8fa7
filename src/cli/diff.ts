// `airlock diff [run flags] [--out DIR] -- CMD`: run CMD in a sandbox whose workspace is a cow copy
// of a host dir (default: the cwd), then print what it changed there as a git patch on stdout, or
// write the changed files into DIR. The command's own output goes to stderr, so stdout is the patch.
import { resolve } from 'node:path';
import { Option, type Command } from 'commander';
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

const DIFF_HELP = `
The workspace is a copy-on-write view of DIR (default: the current directory): the command can change
it freely, the host dir is never written. Afterwards airlock prints the changes as a git patch
(binary files as GIT binary patch), which "git apply" run in DIR applies:
  airlock diff -- 'npm version patch --no-git-tag-version' > bump.patch && git apply bump.patch
With --out DIR2 the added and modified files are written into DIR2 (new or empty) instead, and
stdout lists every change as "A path", "M path" or "D path" (deleted paths are only listed).
.git directories are left out. A special file (fifo, socket, device) or a non-UTF-8 name among
the changes is refused (exit 1), as is a changed file over 16 MiB.

Exit status: the command's (the patch is printed either way), or airlock's own error codes as for run.
`;

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

/**
 * `airlock diff`, registered by main.ts after `run`: the same flags as run (copied from it, so they
 * cannot drift) except --json, plus --out; --workspace defaults to the cwd.
 */
export function registerDiffCommand(program: Command, io: Io, setStatus: (code: number) => void): void {
  const run = program.commands.find((c) => c.name() === 'run');
  const diff = program
    .command('diff')
    .description('run one command on a cow copy of a dir and print what it changed there as a git patch')
    .usage('[flags] [--out DIR] [--] CMD [ARGS...]')
    .argument('<CMD...>', 'command and arguments (as for airlock run)');
  for (const o of run?.options ?? []) {
    if (o.long === '--json') continue;
    if (o.long === '--workspace') {
      diff.addOption(
        new Option(
          '--workspace <dir>',
          'host dir the command works on, as a cow copy (default: the current directory); never written',
        ),
      );
    } else diff.addOption(o);
  }
  diff
    .option('--out <dir>', 'write the added and modified files into this new or empty dir instead of a patch')
    .passThroughOptions()
    .addHelpText('after', DIFF_HELP)
    .action(async (cmd: string[], flags: DiffFlags) => setStatus(await diffCommand(cmd, flags, io)));
}
