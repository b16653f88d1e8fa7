// `airlock template build FILE | ls [--json] | inspect NAME|DIGEST | rm NAME`: templates in this state
// dir (AIRLOCK_STATE_DIR). Build progress is one updating line on a TTY, plain lines otherwise.
import { readFileSync } from 'node:fs';
import { basename, dirname, resolve } from 'node:path';
import { AirlockError } from '../core/errors.js';
import type { TemplateInput } from '../core/template.js';
import { formatBytes } from '../core/units.js';
import { dockerfileTemplate } from '../sandbox/dockerfile-template.js';
import type { TemplateInfo, TemplateProgress } from '../sandbox/templates.js';
import { cliAirlock, trapSignals } from './lifecycle.js';
import { parseBackend } from './flags.js';
import { processIo, type Io } from './run.js';
import { table } from './table.js';

const short = (d: string): string => d.slice(0, 19); // sha256: + 12 hex

function progressText(p: TemplateProgress, total: { steps: number }): string {
  switch (p.phase) {
    case 'start':
      total.steps = p.steps;
      return `building ${p.name}: ${p.steps} step${p.steps === 1 ? '' : 's'}`;
    case 'files':
      return `wrote ${p.count} file${p.count === 1 ? '' : 's'}`;
    case 'step':
      return `step ${p.index + 1}/${p.steps}: ${p.command}`;
    case 'layer':
      return `layer ${short(p.digest)}: ${formatBytes(p.bytes)}`;
    case 'done':
      return `built ${p.digest} (${formatBytes(p.bytes)})`;
  }
}

export async function templateBuildCommand(
  file: string | undefined,
  opts: { json?: boolean; backend?: string; file?: string; name?: string },
  io: Io = processIo,
  tty = process.stderr.isTTY === true,
): Promise<number> {
  const airlock = cliAirlock();
  const trap = trapSignals(airlock, (line) => io.err(`${open ? '\n' : ''}${line}\n`));
  const total = { steps: 0 };
  let open = false; // a TTY line waiting for its newline
  const onProgress = (p: TemplateProgress): void => {
    const text = progressText(p, total);
    if (tty && p.phase !== 'done') {
      io.err(`\r\x1b[K${text}`);
      open = true;
    } else {
      if (open) io.err('\r\x1b[K');
      open = false;
      io.err(`${text}\n`);
    }
  };
  try {
    const backend = opts.backend === undefined ? {} : { backend: parseBackend(opts.backend) };
    const source = templateSource(file, opts);
    const t = await airlock.templates
      .build(source, { onProgress, signal: trap.signal, ...backend })
      .catch((e: unknown) => {
        if (trap.exitCode !== undefined) return trap.exitCode;
        throw e;
      });
    if (typeof t === 'number') return t;
    io.out(opts.json ? JSON.stringify(t, null, 2) + '\n' : `${t.name} ${t.digest}\n`);
    return 0;
  } finally {
    if (open) io.err('\n');
    trap.dispose();
    await airlock.close();
  }
}

const when = (t: TemplateInfo): string =>
  t.createdAt
    .toISOString()
    .replace('T', ' ')
    .replace(/\.\d+Z$/, 'Z');

export async function templateListCommand(opts: { json?: boolean }, io: Io = processIo): Promise<number> {
  const airlock = cliAirlock();
  const all = await airlock.templates.list();
  if (opts.json) {
    io.out(JSON.stringify(all, null, 2) + '\n');
    return 0;
  }
  if (all.length === 0) {
    io.out(`no templates in ${airlock.stateDir}\n`);
    return 0;
  }
  const rows = [['NAME', 'DIGEST', 'CREATED', 'SIZE', 'STEPS', 'BASE']];
  for (const t of all) {
    rows.push([
      t.name,
      short(t.digest),
      when(t),
      formatBytes(t.sizeBytes),
      String(t.steps.length),
      t.base.digest ? `${t.base.ref === t.base.digest ? short(t.base.ref) : t.base.ref}` : t.base.ref,
    ]);
  }
  io.out(table(rows));
  return 0;
}

export async function templateInspectCommand(ref: string, io: Io = processIo): Promise<number> {
  const t = await cliAirlock().templates.inspect(ref);
  io.out(JSON.stringify(t, null, 2) + '\n');
  return 0;
}

export async function templateRemoveCommand(name: string, io: Io = processIo): Promise<number> {
  await cliAirlock().templates.remove(name);
  io.out(`removed ${name}\n`);
  return 0;
}

/** The YAML file as given, or the template a Dockerfile (-f) describes (sandbox/dockerfile-template.ts). */
function templateSource(
  file: string | undefined,
  opts: { file?: string; name?: string },
): string | TemplateInput {
  if (opts.file === undefined) {
    if (file === undefined)
      throw new AirlockError('INVALID_ARGUMENT', 'give a template YAML file, or a Dockerfile with -f', {
        field: 'FILE',
      });
    return file;
  }
  if (file !== undefined)
    throw new AirlockError('INVALID_ARGUMENT', 'give a template YAML file or -f Dockerfile, not both', {
      field: 'FILE',
    });
  let text: string;
  try {
    text = readFileSync(opts.file, 'utf8');
  } catch (e) {
    throw new AirlockError('FILE_NOT_FOUND', `cannot read the Dockerfile ${opts.file}`, {
      field: '--file',
      cause: e,
    });
  }
  const context = dirname(resolve(opts.file));
  const name =
    opts.name ??
    (basename(context)
      .toLowerCase()
      .replace(/[^a-z0-9._-]/g, '-')
      .replace(/^[^a-z0-9]+/, '')
      .slice(0, 63) ||
      'dockerfile');
  return dockerfileTemplate(text, { name, context });
}
