// Turning command-line text into a sandbox spec and exec options. Pure (no I/O) except
// `checkWorkspaceDir` and the --policy file (egress-flags.ts), so every flag error is an
// INVALID_ARGUMENT naming the flag (exit code 2).
import { statSync } from 'node:fs';
import { resolve } from 'node:path';
import { AirlockError } from '../core/errors.js';
import type { BackendName, SandboxSpecInput } from '../core/spec.js';
import { parseBytes, parseDurationMs } from '../core/units.js';
import type { UidRange } from '../backends/host/state.js';
import { planEgress, type EgressFlags, type EgressPlan } from './egress-flags.js';
import { CLI_BACKENDS, DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT } from './defaults.js';

export interface RunFlags extends EgressFlags {
  backend?: string;
  memory?: string;
  cpus?: string;
  pids?: string;
  disk?: string;
  timeout?: string;
  ttl?: string;
  workspace?: string;
  template?: string;
  /** Run on this image (an image reference); without CMD, its entrypoint + cmd run. */
  image?: string;
  /** When to pull --image: missing (default), always, never. */
  pull?: string;
  /** Only these programs (comma-separated) and their closure exist in the root. */
  executables?: string;
  env: string[];
  maxOutput?: string;
  json?: boolean;
  stdin?: boolean;
}

export interface RunPlan {
  readonly spec: SandboxSpecInput;
  /**
   * A shell string (run with /bin/sh -c) or an argv array; undefined with --image and no CMD: the
   * image's entrypoint + cmd (known once it is resolved; see imageCommand).
   */
  readonly command: string | string[] | undefined;
  readonly timeoutMs: number;
  readonly maxOutputBytes: number;
  /** The network part of the spec and where each secret came from (for error messages). */
  readonly egress: EgressPlan;
}

const DEFAULT_TTL_MS = 600_000;
const MAX_TTL_MS = 24 * 3_600_000;

/** Characters that only mean something to a shell: one CMD argument holding any of them is a script. */
const SHELL_SYNTAX = /[\s|&;<>()$`\\"'*?[\]#~{}!]/;

/**
 * One argument with shell syntax or spaces → a shell string (`/bin/sh -c`); one plain word → argv of
 * one; several arguments → argv as given (no shell, no re-splitting).
 */
export function commandFromArgs(args: readonly string[]): string | string[] {
  if (args.length === 0) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      'no command given; use: airlock run [flags] -- CMD [ARGS...]',
      {
        field: 'CMD',
      },
    );
  }
  if (args.length === 1 && SHELL_SYNTAX.test(args[0]!)) return args[0]!;
  return [...args];
}

function parseIntFlag(text: string, flag: string): number {
  if (!/^\s*\d+\s*$/.test(text)) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `${flag}: "${text}" is not a whole number; use e.g. ${flag} 64`,
      {
        field: flag,
      },
    );
  }
  return Number(text);
}

function parseCpus(text: string): number {
  if (!/^\s*(\d+(\.\d+)?|\.\d+)\s*$/.test(text) || Number(text) <= 0) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `--cpus: "${text}" is not a positive number of CPUs; use e.g. --cpus 0.5`,
      {
        field: '--cpus',
      },
    );
  }
  return Number(text);
}

export function parseEnvPairs(pairs: readonly string[]): Record<string, string> {
  const env: Record<string, string> = {};
  for (const p of pairs) {
    const m = /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/s.exec(p);
    if (!m) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `--env: "${p}" is not NAME=VALUE (NAME: letters, digits and _, not starting with a digit); use e.g. --env MODE=test`,
        { field: '--env' },
      );
    }
    env[m[1]!] = m[2]!;
  }
  return env;
}

export function parseBackend(text: string): BackendName {
  if ((CLI_BACKENDS as readonly string[]).includes(text)) return text as BackendName;
  throw new AirlockError(
    'INVALID_ARGUMENT',
    `--backend: "${text}" is not a backend; use one of ${CLI_BACKENDS.join(', ')}`,
    {
      field: '--backend',
    },
  );
}

/** `DIR`, `DIR:cow` or `DIR:ro`; DIR is made absolute against `cwd`. */
export function parseWorkspace(text: string, cwd: string): { hostDir: string; mode: 'cow' | 'ro' } {
  const m = /^(.*?)(?::(cow|ro))?$/s.exec(text)!;
  const dir = m[1]!;
  if (dir === '') {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `--workspace: "${text}" names no directory; use e.g. --workspace ./project:ro`,
      {
        field: '--workspace',
      },
    );
  }
  return { hostDir: resolve(cwd, dir), mode: (m[2] as 'cow' | 'ro' | undefined) ?? 'cow' };
}

/** Fail before any host state is created when the workspace directory is missing. */
export function checkWorkspaceDir(dir: string): void {
  let isDir: boolean;
  try {
    isDir = statSync(dir).isDirectory();
  } catch {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `--workspace: "${dir}" does not exist; pass an existing directory`,
      {
        field: '--workspace',
      },
    );
  }
  if (!isDir) {
    throw new AirlockError('INVALID_ARGUMENT', `--workspace: "${dir}" is not a directory; pass a directory`, {
      field: '--workspace',
    });
  }
}

export function planRun(args: readonly string[], f: RunFlags, cwd: string): RunPlan {
  const limits: Record<string, number> = {};
  if (f.memory !== undefined) limits.memoryBytes = parseBytes(f.memory, '--memory');
  if (f.cpus !== undefined) limits.cpus = parseCpus(f.cpus);
  if (f.pids !== undefined) limits.pids = parseIntFlag(f.pids, '--pids');
  if (f.disk !== undefined) limits.diskBytes = parseBytes(f.disk, '--disk');
  const timeoutMs = parseDurationMs(f.timeout ?? DEFAULT_TIMEOUT, '--timeout');
  const maxOutputBytes = parseBytes(f.maxOutput ?? DEFAULT_MAX_OUTPUT, '--max-output');
  // Without --ttl the sandbox outlives the command's timeout, so a long --timeout is not cut by the TTL.
  const ttlMs =
    f.ttl !== undefined
      ? parseDurationMs(f.ttl, '--ttl')
      : Math.min(MAX_TTL_MS, Math.max(DEFAULT_TTL_MS, timeoutMs + 30_000));
  const egress = planEgress(f, cwd);
  const spec: SandboxSpecInput = {
    ...(f.backend !== undefined ? { backend: parseBackend(f.backend) } : {}),
    ttlMs,
    limits,
    ...(f.workspace !== undefined ? { workspace: parseWorkspace(f.workspace, cwd) } : {}),
    ...(f.template !== undefined ? { template: f.template } : {}),
    ...(f.image !== undefined ? { image: f.image } : {}),
    ...(f.pull !== undefined ? { pull: parsePull(f.pull, f.image) } : {}),
    ...(f.executables !== undefined
      ? {
          executables: f.executables
            .split(',')
            .map((e) => e.trim())
            .filter((e) => e !== ''),
        }
      : {}),
    env: parseEnvPairs(f.env),
    ...(egress.network ? { network: egress.network, secrets: egress.secrets } : {}),
  };
  // With --image or --template and no CMD: the image's or template's entrypoint + cmd (run.ts).
  const command =
    (f.image !== undefined || f.template !== undefined) && args.length === 0
      ? undefined
      : commandFromArgs(args);
  return { spec, command, timeoutMs, maxOutputBytes, egress };
}

function parsePull(text: string, image: string | undefined): 'never' | 'missing' | 'always' {
  if (image === undefined)
    throw new AirlockError('INVALID_ARGUMENT', '--pull needs --image (it says when to pull it)', {
      field: '--pull',
    });
  if (text !== 'never' && text !== 'missing' && text !== 'always') {
    throw new AirlockError('INVALID_ARGUMENT', `--pull: "${text}" is not never, missing or always`, {
      field: '--pull',
    });
  }
  return text;
}

/**
 * What `airlock run --image REF` (or `--template NAME`) with no CMD runs: the image's (template's)
 * entrypoint followed by its cmd.
 */
export function imageCommand(
  config: { entrypoint?: readonly string[]; cmd?: readonly string[] } | undefined,
  what = '--image REF',
): string[] {
  const argv = [...(config?.entrypoint ?? []), ...(config?.cmd ?? [])];
  if (argv.length === 0) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `${what === '--image REF' ? 'the image' : 'the template'} sets no entrypoint or cmd; give the command: airlock run ${what} -- CMD [ARGS...]`,
      { field: 'CMD' },
    );
  }
  return argv;
}

/** `AIRLOCK_UID_RANGE=FIRST:COUNT` picks the host uids handed to sandboxes (default 3000000:65536). */
export function uidRangeFromEnv(value: string | undefined): UidRange | undefined {
  if (value === undefined || value === '') return undefined;
  const m = /^(\d+):(\d+)$/.exec(value.trim());
  const first = m ? Number(m[1]) : NaN;
  const count = m ? Number(m[2]) : NaN;
  if (!m || first < 1000 || count < 1 || first + count > 2 ** 32 - 2) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `AIRLOCK_UID_RANGE: "${value}" is not FIRST:COUNT of unused host uids (FIRST >= 1000); use e.g. 3000000:65536`,
      { field: 'AIRLOCK_UID_RANGE' },
    );
  }
  return { first, count };
}

/** Which flag sets a spec / exec-option field, so an error names what the user typed. */
const FLAG_FOR_FIELD: Array<[RegExp, string]> = [
  [/^limits\.memoryBytes$/, '--memory'],
  [/^limits\.cpus$/, '--cpus'],
  [/^limits\.pids$/, '--pids'],
  [/^limits\.diskBytes$/, '--disk'],
  [/^ttlMs$/, '--ttl'],
  [/^timeoutMs$/, '--timeout'],
  [/^maxOutputBytes$/, '--max-output'],
  [/^workspace(\.|$)/, '--workspace'],
  [/^env(\.|$)/, '--env'],
  [/^backend$/, '--backend'],
  [/^template$/, '--template'],
  [/^image$/, '--image'],
  [/^pull$/, '--pull'],
  [/^command$/, 'CMD'],
  [/^network\.allow(\.|$)/, '--allow'],
  [/^network\.deny(\.|$)/, '--deny'],
  [/^secrets(\.|$)/, '--secret'],
  [/^(network|canaries)(\.|$)/, '--policy'],
];

export function flagForField(field: string): string | undefined {
  return FLAG_FOR_FIELD.find(([re]) => re.test(field))?.[1];
}

/** 1500 → "1.5s", 120000 → "2m", 250 → "250ms". */
export function formatDuration(ms: number): string {
  if (ms < 1000) return `${ms}ms`;
  if (ms % 3_600_000 === 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0) return `${ms / 60_000}m`;
  return `${Number((ms / 1000).toFixed(3))}s`;
}
