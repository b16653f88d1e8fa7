// `remoteAirlock.templates`: the library's `airlock.templates` (build, list, inspect, remove) over a
// server. A build streams the server's events: onProgress gets the library's TemplateProgress phases
// (so a progress printer written for the library works unchanged), onEvent every wire event,
// including each step's output and duration. A template file path is read here, on the client's
// machine, and sent as its contents: the server never reads a path.
import { AirlockError } from '../core/errors.js';
import { readConfigData } from '../core/config-file.js';
import { MAX_TEMPLATE_FILE_BYTES } from '../core/template.js';
import { parseOrThrow } from '../core/validate.js';
import type { TemplateProgress } from '../sandbox/templates.js';
import {
  TemplateBuildRequestSchema,
  type Caller,
  type SandboxApi,
  type TemplateBuildRequest,
  type TemplateEvent,
  type TemplateView,
} from './contract.js';

/** A template on a server (the tenant's own). */
export interface RemoteTemplateInfo {
  readonly name: string;
  readonly digest: string;
  readonly createdAt: Date;
  readonly sizeBytes: number;
}

/** Options of `remoteAirlock.templates.build()`. */
export interface RemoteTemplateBuildOptions {
  /** The library's progress phases (start, files, step, layer, done). */
  readonly onProgress?: (p: TemplateProgress) => void;
  /** Every event of the server's stream (step output as base64, step durations...). */
  readonly onEvent?: (e: TemplateEvent) => void;
  /** Aborting cancels the build on the server (it leaves nothing behind). */
  readonly signal?: AbortSignal;
  readonly backend?: 'namespaces' | 'gvisor';
  /** How long the build may wait for the tenant's quota (as a create's queueTimeoutMs). */
  readonly queueTimeoutMs?: number;
}

const infoOf = (v: TemplateView): RemoteTemplateInfo => ({
  name: v.name,
  digest: v.digest,
  createdAt: new Date(v.createdAt),
  sizeBytes: v.sizeBytes,
});

/** The library phase an event stands for, if any. */
function phaseOf(e: TemplateEvent): TemplateProgress | undefined {
  switch (e.type) {
    case 'start':
      return { phase: 'start', name: e.name, steps: e.steps };
    case 'files':
      return { phase: 'files', count: e.count };
    case 'step-started':
      return { phase: 'step', index: e.index, steps: e.steps, command: e.command };
    case 'layer':
      return { phase: 'layer', digest: e.digest, bytes: e.bytes };
    case 'done':
      return { phase: 'done', digest: e.template.digest, bytes: e.template.sizeBytes };
    default:
      return undefined;
  }
}

export class RemoteTemplates {
  constructor(
    private readonly api: SandboxApi,
    private readonly caller: Caller,
  ) {}

  private need<K extends 'buildTemplate' | 'listTemplates' | 'getTemplate' | 'removeTemplate'>(
    k: K,
  ): NonNullable<SandboxApi[K]> {
    const f = this.api[k];
    if (!f) throw new AirlockError('BACKEND_UNAVAILABLE', 'this server API has no templates');
    return f.bind(this.api) as NonNullable<SandboxApi[K]>;
  }

  /**
   * Build a template on the server from a YAML file (read here) or a template object; resolves with
   * the template once built, or throws the build's AirlockError (TEMPLATE_BUILD_FAILED naming the
   * step, INVALID_SPEC naming the field, QUOTA_EXCEEDED...).
   */
  async build(
    fileOrObject: string | TemplateBuildRequest,
    opts: RemoteTemplateBuildOptions = {},
  ): Promise<RemoteTemplateInfo> {
    const raw =
      typeof fileOrObject === 'string'
        ? readConfigData(fileOrObject, {
            what: 'template file',
            code: 'INVALID_SPEC',
            maxBytes: MAX_TEMPLATE_FILE_BYTES,
            format: 'yaml',
          })
        : fileOrObject;
    const req: TemplateBuildRequest = parseOrThrow(
      TemplateBuildRequestSchema,
      {
        ...(raw as object),
        ...(opts.backend !== undefined ? { backend: opts.backend } : {}),
        ...(opts.queueTimeoutMs !== undefined ? { queueTimeoutMs: opts.queueTimeoutMs } : {}),
      },
      'template',
    );
    let done: TemplateView | undefined;
    for await (const e of this.need('buildTemplate')(req, this.caller, opts.signal)) {
      const p = phaseOf(e);
      try {
        opts.onEvent?.(e);
        if (p) opts.onProgress?.(p);
      } catch {
        /* a callback's bug never breaks a build (as in the library) */
      }
      if (e.type === 'done') done = e.template;
    }
    if (!done) throw new AirlockError('INTERNAL', 'the server ended the template build without a result');
    return infoOf(done);
  }

  /** The caller's templates. */
  async list(): Promise<RemoteTemplateInfo[]> {
    return (await this.need('listTemplates')(this.caller)).map(infoOf);
  }

  /** One of the caller's templates; TEMPLATE_NOT_FOUND otherwise. */
  async inspect(name: string): Promise<RemoteTemplateInfo> {
    return infoOf(await this.need('getTemplate')(name, this.caller));
  }

  /** Delete one (SNAPSHOT_IN_USE while a sandbox runs on it). */
  remove(name: string): Promise<void> {
    return this.need('removeTemplate')(name, this.caller);
  }
}
