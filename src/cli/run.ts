// `airlock run`: one command in one fresh sandbox, output streamed live (or one JSON result), the
// command's exit status as airlock's, and the sandbox killed on every path out.
import { rmSync } from 'node:fs';
import type { Sandbox } from '../sandbox/index.js';
import type { AirlockOptions } from '../sandbox/airlock.js';
import type { ExecOptions, ExecResult } from '../sandbox/sandbox.js';
import { AirlockError } from '../core/errors.js';
import { ExecOptionsSchema, parseCommand, parseSandboxSpec } from '../core/spec.js';
import { parseOrThrow } from '../core/validate.js';
import { formatBytes } from '../core/units.js';
import { checkSecretSources, relabelSecretError } from './egress-flags.js';
import {
  checkWorkspaceDir,
  formatDuration,
  imageCommand,
  planRun,
  type RunFlags,
  type RunPlan,
} from './flags.js';
import { cliAirlock, statusOf, trapSignals } from './lifecycle.js';
import { phase } from './phases.js';

import { processIo, type Io } from './defaults.js';

export { processIo, type Io };

export async function runCommand(
  args: readonly string[],
  flags: RunFlags,
  io: Io = processIo,
): Promise<number> {
  phase('modules'); // this command's modules, initialised by main.ts's import()
  const plan = planRun(args, flags, process.cwd());
  const ws = plan.spec.workspace;
  if (ws?.hostDir !== undefined) checkWorkspaceDir(ws.hostDir);
  checkSecretSources(plan.egress);

  // Streamed output was already seen whole: keep no spill copy of it (the --json result points at one).
  return runPlan(plan, flags, io, {
    airlock: flags.json ? {} : { maxSpillBytes: 0 },
    output: flags.json ? {} : { onStdout: io.out, onStderr: io.err },
    after(sbx, result) {
      if (flags.json) io.out(`${JSON.stringify(result, null, 2)}\n`);
      else {
        for (const p of Object.values(result.spillPaths ?? {})) rmSync(p, { force: true });
        reportEnd(result, plan, sbx, io);
      }
    },
  });
}

/**
 * The build's code-cache step only (loadCommands): runs the pure steps of `airlock run -- true`
 * (flags, plan, spec and exec-option validation) so that the functions they call are compiled into
 * the CLI's code cache, not at each start. No sandbox, no host state: the build may run unprivileged.
 */
export function warmUpForCache(): void {
  const plan = planRun(['true'], { env: [] }, '/');
  parseSandboxSpec(plan.spec);
  parseCommand(plan.command!);
  parseOrThrow(ExecOptionsSchema, { timeoutMs: plan.timeoutMs }, 'exec options', 'INVALID_ARGUMENT');
}

/** How a planned command runs (see runPlan): the runtime's options, where output goes, what follows. */
export interface RunPlanSteps {
  readonly airlock: Pick<AirlockOptions, 'maxSpillBytes' | 'images'>;
  readonly output: Pick<ExecOptions, 'onStdout' | 'onStderr'>;
  /**
   * After the command, before the sandbox is killed (e.g. print the result, take a diff).
   * `interrupted()`: a signal arrived meanwhile (the run then exits 130/143, whatever this prints).
   */
  after(sbx: Sandbox, result: ExecResult, interrupted: () => boolean): void | Promise<void>;
}

/**
 * The flow every one-shot command shares (run, diff): create the plan's sandbox, run its command
 * under a signal trap, then `after`; every sandbox is killed and its host state released at the end.
 * The command's exit status, or 130/143 after SIGINT/SIGTERM.
 */
export async function runPlan(
  plan: RunPlan,
  flags: Pick<RunFlags, 'stdin'>,
  io: Io,
  steps: RunPlanSteps,
): Promise<number> {
  const airlock = cliAirlock({ ...steps.airlock, oneSandbox: true });
  phase('runtime');
  const trap = trapSignals(airlock, (line) => io.err(`${line}\n`));
  try {
    const sbx = await airlock.create(plan.spec).catch((e: unknown) => {
      throw relabelTemplateError(relabelSecretError(e, plan.egress));
    });
    phase('create');
    if (trap.exitCode !== undefined) return trap.exitCode;
    const result = await sbx.exec(plan.command ?? (await defaultCommand(airlock, sbx)), {
      timeoutMs: plan.timeoutMs,
      maxOutputBytes: plan.maxOutputBytes,
      signal: trap.signal,
      ...(flags.stdin ? { stdin: process.stdin } : {}),
      ...steps.output,
    });
    phase('exec');
    if (trap.exitCode !== undefined) return trap.exitCode;
    await steps.after(sbx, result, () => trap.exitCode !== undefined);
    if (trap.exitCode !== undefined) return trap.exitCode;
    return statusOf(result);
  } catch (e) {
    // Killing the sandbox under an exec in flight can fail that exec; the interrupt is the story.
    if (trap.exitCode !== undefined) return trap.exitCode;
    throw e;
  } finally {
    try {
      // Every sandbox of this runtime, and its host state released now (not batched for later:
      // this process is about to exit).
      await airlock.killAll();
      phase('kill');
    } finally {
      trap.dispose();
      if (flags.stdin) process.stdin.destroy();
    }
  }
}

/** The lines on stderr that say why a command ended early (a limit, the TTL, the OOM killer). */
export function reportEnd(result: ExecResult, plan: RunPlan, sbx: Sandbox, io: Io): void {
  const why = killedLine(result, plan, sbx.spec.limits);
  if (why) io.err(`airlock: ${why}\n`);
  const oom = oomLine(result, sbx.spec.limits);
  if (oom) io.err(`airlock: ${oom}\n`);
}

/**
 * `--template` naming no template or layer here is a bad flag (exit 2), not a missing object (the
 * library's TEMPLATE_NOT_FOUND, exit 3): the message says where to look.
 */
export function relabelTemplateError(e: unknown): unknown {
  if (!AirlockError.is(e, 'TEMPLATE_NOT_FOUND')) return e;
  return new AirlockError(
    'INVALID_ARGUMENT',
    `--template: ${e.message}; "airlock template ls" lists the templates in this state dir`,
    { field: '--template', cause: e },
  );
}

/**
 * One line when the OOM killer killed processes of the sandbox during the command but the command
 * itself was not ended by it (a child killed under a parent that carried on).
 */
export function oomLine(r: ExecResult, limits: { memoryBytes: number }): string | undefined {
  if (r.oomKills <= 0 || r.killedBy === 'oom') return undefined;
  const n = r.oomKills === 1 ? '1 process was' : `${r.oomKills} processes were`;
  return `${n} killed for exceeding the memory limit (${formatBytes(limits.memoryBytes)}); raise it with --memory`;
}

/** One line saying which limit ended the command, e.g. "out of memory (limit 256 MiB)". */
export function killedLine(
  r: ExecResult,
  plan: Pick<RunPlan, 'timeoutMs'> & { spec: { ttlMs?: number } },
  limits: { memoryBytes: number; pids: number },
): string | undefined {
  switch (r.killedBy) {
    case undefined:
      return undefined;
    case 'timeout':
      return `killed by timeout after ${formatDuration(plan.timeoutMs)}; raise it with --timeout`;
    case 'ttl':
      return `killed: the sandbox's TTL${plan.spec.ttlMs ? ` (${formatDuration(plan.spec.ttlMs)})` : ''} expired; raise it with --ttl`;
    case 'oom':
      return `out of memory (limit ${formatBytes(limits.memoryBytes)}); raise it with --memory`;
    case 'pids':
      return `pids limit (${limits.pids}) reached; raise it with --pids`;
    case 'killed':
      return 'killed';
  }
}

/** The command of `airlock run --image|--template` with none given: the root's or template's CMD. */
async function defaultCommand(airlock: ReturnType<typeof cliAirlock>, sbx: Sandbox): Promise<string[]> {
  if (sbx.spec.rootfs) return imageCommand(sbx.spec.rootfs.config);
  const t = sbx.spec.template;
  const name = typeof t === 'string' ? t : t?.name;
  const config = name !== undefined ? (await airlock.templates.inspect(name)).config : undefined;
  return imageCommand(config, `--template ${name ?? 'NAME'}`);
}
