// `airlock run-code [--language L] [--file F | -] [--backend B] [CODE]`: run code once in a fresh
// sandbox (sbx.runCode: the static analysis first), print its stdout, stderr and results as text,
// then destroy the sandbox. Exit 0 when the code ran without an error, 1 when it raised one (or
// timed out), and exitCodeFor(error) when Airlock refused or failed (2 bad input, …).
import { readFileSync } from 'node:fs';
import { CODE_LANGUAGES, type CodeLanguage, type CodeResult } from '../core/code.js';
import { AirlockError } from '../core/errors.js';
import type { Io } from './defaults.js';
import { parseBackend } from './flags.js';
import { cliAirlock, trapSignals } from './lifecycle.js';

export interface RunCodeFlags {
  language?: string;
  file?: string;
  backend?: string;
  timeout?: string;
}

/** One result as text: its text, or what kind of data it carries (images are not printed). */
export function resultLine(r: CodeResult): string {
  if (r.text !== undefined) return r.text;
  const kinds = (['png', 'svg', 'html', 'json'] as const).filter((k) => r[k] !== undefined);
  return `[${kinds.join(', ')} result]`;
}

function source(code: string | undefined, flags: RunCodeFlags, readStdin: () => string): string {
  if (flags.file !== undefined && code !== undefined) {
    throw new AirlockError('INVALID_ARGUMENT', 'give the code either inline or with --file, not both', {
      field: '--file',
    });
  }
  if (flags.file === '-') return readStdin();
  if (flags.file !== undefined) {
    try {
      return readFileSync(flags.file, 'utf8');
    } catch (e) {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `--file: cannot read ${flags.file} (${(e as Error).message})`,
        {
          field: '--file',
        },
      );
    }
  }
  if (code === undefined) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      'no code: give it as an argument, with --file F, or --file - for stdin',
      {
        field: '--file',
      },
    );
  }
  return code;
}

export async function runCodeCommand(
  code: string | undefined,
  flags: RunCodeFlags,
  io: Io,
  readStdin: () => string = () => readFileSync(0, 'utf8'),
): Promise<number> {
  const text = source(code, flags, readStdin);
  const language = (flags.language ?? 'python') as CodeLanguage;
  if (!(CODE_LANGUAGES as readonly string[]).includes(language)) {
    throw new AirlockError('INVALID_ARGUMENT', `--language: use one of ${CODE_LANGUAGES.join(', ')}`, {
      field: '--language',
    });
  }
  const timeoutMs = flags.timeout === undefined ? undefined : Number(flags.timeout) * 1000;
  if (timeoutMs !== undefined && !(Number.isFinite(timeoutMs) && timeoutMs >= 1)) {
    throw new AirlockError('INVALID_ARGUMENT', '--timeout: a number of seconds, e.g. 30', {
      field: '--timeout',
    });
  }
  const airlock = cliAirlock({ oneSandbox: true });
  const trap = trapSignals(airlock, (line) => io.err(`${line}\n`));
  try {
    const sbx = await airlock.create(
      flags.backend !== undefined ? { backend: parseBackend(flags.backend) } : {},
    );
    try {
      const ex = await sbx.runCode(text, {
        language,
        signal: trap.signal,
        ...(timeoutMs !== undefined ? { timeoutMs: Math.round(timeoutMs) } : {}),
        onStdout: (t) => io.out(t),
        onStderr: (t) => io.err(t),
      });
      for (const f of ex.findings) io.err(`airlock: ${f.action} ${f.rule} (line ${f.line}): ${f.reason}\n`);
      for (const r of ex.results) io.out(`${resultLine(r)}\n`);
      if (ex.error) io.err(ex.error.traceback || `${ex.error.name}: ${ex.error.value}\n`);
      if (trap.exitCode !== undefined) return trap.exitCode;
      return ex.error ? 1 : 0;
    } finally {
      await sbx.kill();
    }
  } finally {
    trap.dispose();
    await airlock.close();
  }
}
