// Templates on the supervisor's side: the library's `airlock.templates` served as the SandboxApi's
// template methods. A build's callbacks (progress, step output) become one ordered stream of
// TemplateEvents; each step's output is sent up to TEMPLATE_OUTPUT_BYTES (base64), the rest only
// counted. Whoever stops reading (the client went away) cancels the build, and the stream ends only
// once the library has killed its build sandbox and removed the layers it made: nothing is left.
import { AirlockError } from '../core/errors.js';
import type { TemplateInput } from '../core/template.js';
import type { Airlock } from '../sandbox/airlock.js';
import type { TemplateInfo } from '../sandbox/templates.js';
import {
  TEMPLATE_OUTPUT_BYTES,
  type TemplateBuildRequest,
  type TemplateEvent,
  type TemplateView,
} from './contract.js';

export function templateView(t: TemplateInfo): TemplateView {
  return {
    name: t.name,
    digest: t.digest,
    createdAt: t.createdAt.toISOString(),
    sizeBytes: t.sizeBytes,
  };
}

/** The wire request → the library's template input (validated there: INVALID_SPEC naming the field). */
export function templateInputOf(req: TemplateBuildRequest): TemplateInput {
  return {
    name: req.name,
    ...(req.base !== undefined ? { base: req.base } : {}),
    ...(req.files !== undefined ? { files: req.files } : {}),
    ...(req.steps !== undefined ? { steps: req.steps as NonNullable<TemplateInput['steps']> } : {}),
    ...(req.limits !== undefined ? { limits: req.limits } : {}),
  };
}

/**
 * Build `req` with the library and yield its events in order, ending with `done`; a failed build
 * throws its AirlockError (TEMPLATE_BUILD_FAILED naming the step, INVALID_SPEC naming the field...).
 * Returning early or aborting `signal` cancels the build and waits for its clean-up.
 */
export async function* buildTemplateEvents(
  airlock: Airlock,
  req: TemplateBuildRequest,
  signal?: AbortSignal,
): AsyncGenerator<TemplateEvent> {
  const ctl = new AbortController();
  const onAbort = (): void => ctl.abort();
  if (signal?.aborted) ctl.abort();
  else signal?.addEventListener('abort', onAbort, { once: true });

  const queue: TemplateEvent[] = [];
  let wake: (() => void) | undefined;
  const push = (e: TemplateEvent): void => {
    queue.push(e);
    wake?.();
  };
  const sent = new Map<number, number>(); // output bytes sent per step
  const cut = new Set<number>(); // steps whose output went past the bound

  let settled = false;
  const build = airlock.templates
    .build(templateInputOf(req), {
      signal: ctl.signal,
      ...(req.backend !== undefined ? { backend: req.backend } : {}),
      onProgress: (p) => {
        if (p.phase === 'start') push({ type: 'start', name: p.name, steps: p.steps });
        else if (p.phase === 'files') push({ type: 'files', count: p.count });
        else if (p.phase === 'step')
          push({ type: 'step-started', index: p.index, steps: p.steps, command: p.command });
        else if (p.phase === 'layer') push({ type: 'layer', digest: p.digest, bytes: p.bytes });
      },
      onStep: (e) => {
        if (e.kind === 'done') {
          push({
            type: 'step-finished',
            index: e.index,
            durationMs: Math.round(e.durationMs),
            exitCode: e.exitCode,
            truncated: cut.has(e.index),
          });
          return;
        }
        const bytes = Buffer.from(e.text, 'utf8');
        const room = TEMPLATE_OUTPUT_BYTES - (sent.get(e.index) ?? 0);
        if (bytes.length > room) cut.add(e.index);
        if (room <= 0) return;
        const part = bytes.subarray(0, room);
        sent.set(e.index, (sent.get(e.index) ?? 0) + part.length);
        push({ type: 'step-output', index: e.index, stream: e.stream, data: part.toString('base64') });
      },
    })
    .finally(() => {
      settled = true;
      wake?.();
    });
  build.catch(() => {}); // observed below

  try {
    for (;;) {
      while (queue.length) yield queue.shift()!;
      if (settled) break;
      await new Promise<void>((resolve) => (wake = resolve));
      wake = undefined;
    }
    const info = await build; // throws the build's error
    while (queue.length) yield queue.shift()!;
    yield { type: 'done', template: templateView(info) };
  } finally {
    signal?.removeEventListener('abort', onAbort);
    if (!settled) {
      ctl.abort();
      // The library kills its build sandbox and removes the layers this build made before it settles.
      await build.catch(() => {});
    }
  }
}

export async function listTemplateViews(airlock: Airlock): Promise<TemplateView[]> {
  return (await airlock.templates.list()).map(templateView);
}

export async function getTemplateView(airlock: Airlock, name: string): Promise<TemplateView> {
  const t = await airlock.templates.inspect(name);
  // inspect() also takes a digest; this route names templates only.
  if (t.name !== name) throw new AirlockError('TEMPLATE_NOT_FOUND', `no template ${name}`, { field: 'name' });
  return templateView(t);
}
