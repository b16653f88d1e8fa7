// The remote TypeScript SDK: `new RemoteAirlock({ apiUrl, apiKey })` (or AIRLOCK_API_URL and
// AIRLOCK_API_KEY) has the library Airlock's surface (create, get, list, killAll, close, snapshots)
// and makes RemoteSandboxes that live on a server. `Sandbox.create(spec, { airlock })` takes either
// runtime, and `airlockFromEnv()` picks one, so code written against the library runs unchanged.
//
// What a server never does for a client (it would act on the server's own host) fails here with a
// typed error before any request: host paths (mounts, a workspace over a host dir), secrets read from
// an environment, a file or a program (a client sends `{ literal: value }`), canaries, persistent
// sandboxes, internal snapshot layers.
import { AirlockError } from '../../core/errors.js';
import { parseSandboxSpec, type SandboxSpec, type SandboxSpecInput } from '../../core/spec.js';
import { Airlock } from '../../sandbox/airlock.js';
import { registerRemoteRuntime, type RemoteRuntime } from '../../sandbox/portable.js';
import type { Caller, CreateRequest, SandboxApi, SandboxView, SnapshotView } from '../contract.js';
import { defaultSpillDir } from './exec.js';
import { RemoteSandbox, RemoteSnapshot, type RemoteContext } from './sandbox.js';
import { remoteSandboxApi } from './connect.js';
import { RemoteTemplates } from '../templates-client.js';

/** Options of `new RemoteAirlock()`. */
export interface RemoteAirlockOptions {
  /** The server, e.g. http://127.0.0.1:8787 (default: AIRLOCK_API_URL). */
  readonly apiUrl?: string;
  /** The API key sent as a bearer token (default: AIRLOCK_API_KEY). */
  readonly apiKey?: string;
  /** Where truncated exec output is spilled on this machine (default: a 0700 dir under the tmp dir). */
  readonly spillDir?: string;
  /** All spill files of one sandbox together are cut at this size (default 2 GiB). */
  readonly maxSpillBytes?: number;
  /** Talk to this SandboxApi instead of apiUrl (tests, or an in-process server). */
  readonly api?: SandboxApi;
}

/** The remote counterpart of `airlock.snapshots`. */
export interface RemoteSnapshots {
  list(): Promise<RemoteSnapshot[]>;
  inspect(id: string): Promise<RemoteSnapshot>;
  remove(id: string): Promise<void>;
}

/** The server decides who the caller is from its API key; this is only the seam's argument. */
const CALLER: Caller = { tenant: 'remote-client' };

const REMOTE = 'cannot be used with a remote Airlock (apiUrl): the server never';

export class RemoteAirlock implements RemoteRuntime {
  readonly apiUrl: string | undefined;
  readonly api: SandboxApi;
  /** The seam's caller argument for direct `api` calls (the server knows the tenant from the key). */
  readonly caller: Caller = CALLER;
  readonly snapshots: RemoteSnapshots;
  /** The remote counterpart of `airlock.templates` (server/templates-client.ts). */
  readonly templates: RemoteTemplates;
  private readonly live = new Map<string, RemoteSandbox>();
  private readonly ctx: RemoteContext;

  constructor(opts: RemoteAirlockOptions = {}) {
    const apiUrl = opts.apiUrl ?? nonEmpty(process.env.AIRLOCK_API_URL);
    const apiKey = opts.apiKey ?? nonEmpty(process.env.AIRLOCK_API_KEY);
    if (opts.api) this.api = opts.api;
    else if (apiUrl !== undefined) this.api = remoteSandboxApi(apiUrl, apiKey);
    else {
      throw new AirlockError(
        'INVALID_ARGUMENT',
        'a remote Airlock needs a server: pass apiUrl (e.g. http://127.0.0.1:8787) or set AIRLOCK_API_URL',
        { field: 'apiUrl' },
      );
    }
    this.apiUrl = apiUrl;
    this.ctx = {
      api: this.api,
      caller: CALLER,
      spillDir: opts.spillDir ?? defaultSpillDir(),
      maxSpillBytes: opts.maxSpillBytes ?? 2 * 1024 ** 3,
      onGone: (id) => this.live.delete(id),
      fork: (snapshot) => this.start({ snapshot }, undefined),
    };
    this.templates = new RemoteTemplates(this.api, CALLER);
    const wrap = (v: SnapshotView): RemoteSnapshot => new RemoteSnapshot(v, this.ctx.fork);
    this.snapshots = {
      list: async () => (await this.api.listSnapshots(CALLER)).map(wrap),
      inspect: async (id) => {
        const v = (await this.api.listSnapshots(CALLER)).find((s) => s.id === id);
        if (!v)
          throw new AirlockError('SNAPSHOT_NOT_FOUND', `no snapshot ${id} on the server`, { field: 'id' });
        return wrap(v);
      },
      remove: (id) => this.api.removeSnapshot(id, CALLER),
    };
  }

  /** Create a sandbox on the server from a library spec (only what a server may do for a client). */
  async create(input: SandboxSpecInput = {}): Promise<RemoteSandbox> {
    const spec = parseSandboxSpec(remoteOnly(input));
    return this.start(toCreateRequest(spec, input), spec);
  }

  private async start(req: CreateRequest, spec: SandboxSpec | undefined): Promise<RemoteSandbox> {
    const view = await this.api.create(req, CALLER).catch((e: unknown) => {
      throw this.unreachable(e);
    });
    const sbx = new RemoteSandbox(view, spec, this.ctx);
    this.live.set(sbx.id, sbx);
    return sbx;
  }

  /** "Cannot reach the server", with what to check: the URL this client was given. */
  private unreachable(e: unknown): unknown {
    if (!AirlockError.is(e, 'BACKEND_UNAVAILABLE') || !e.message.startsWith('cannot reach')) return e;
    return new AirlockError(
      'BACKEND_UNAVAILABLE',
      `${e.message}; is \`airlock serve\` running there? Check apiUrl (or AIRLOCK_API_URL)`,
      { field: 'apiUrl', cause: e },
    );
  }

  /** A live sandbox this client created or connected to (as the library's get: no request). */
  get(id: string): RemoteSandbox {
    const s = this.live.get(id);
    if (!s || !s.alive) {
      throw new AirlockError(
        'SANDBOX_NOT_FOUND',
        `no live sandbox with id "${id}" in this client; connect() to one on the server`,
        {
          field: 'id',
        },
      );
    }
    return s;
  }

  /** A handle to a sandbox on the server (made by any client of the same tenant). */
  async connect(id: string): Promise<RemoteSandbox> {
    const known = this.live.get(id);
    if (known?.alive) return known;
    const view = await this.api.get(id, CALLER);
    if (view.state !== 'running' && view.state !== 'paused') {
      throw new AirlockError(
        'SANDBOX_GONE',
        `sandbox ${id} is ${view.state}${view.reason ? ` (${view.reason})` : ''}`,
      );
    }
    const sbx = new RemoteSandbox(view, undefined, this.ctx);
    this.live.set(id, sbx);
    return sbx;
  }

  /** The live sandboxes of this client (as the library's list). */
  list(): RemoteSandbox[] {
    return [...this.live.values()].filter((s) => s.alive);
  }

  /** Every sandbox of this tenant on the server, optionally those whose metadata matches. */
  query(filter: { metadata?: Record<string, string> } = {}): Promise<SandboxView[]> {
    return this.api.list(filter, CALLER);
  }

  /** Kill every sandbox this client created or connected to. */
  async killAll(): Promise<void> {
    await Promise.allSettled([...this.live.values()].map((s) => s.kill()));
  }

  /** Same as killAll. */
  close(): Promise<void> {
    return this.killAll();
  }
}

// `new Airlock({ apiUrl })` and `Sandbox.create` with AIRLOCK_API_URL set make their runtime here
// (src/sandbox may not import this layer; the package entry imports this module, which lends it).
registerRemoteRuntime((opts) => new RemoteAirlock(opts));

/**
 * The runtime the environment asks for: a RemoteAirlock when AIRLOCK_API_URL is set, else a local
 * Airlock (which needs root on this machine).
 */
export function airlockFromEnv(env: NodeJS.ProcessEnv = process.env): RemoteAirlock | Airlock {
  const apiUrl = nonEmpty(env.AIRLOCK_API_URL);
  if (apiUrl === undefined) return new Airlock();
  const apiKey = nonEmpty(env.AIRLOCK_API_KEY);
  return new RemoteAirlock({ apiUrl, ...(apiKey !== undefined ? { apiKey } : {}) });
}

function nonEmpty(v: string | undefined): string | undefined {
  return v === undefined || v === '' ? undefined : v;
}

/** Refuse, before any request, what only the server's own host could provide. */
function remoteOnly(input: SandboxSpecInput): SandboxSpecInput {
  if (input === null || typeof input !== 'object') return input;
  const i = input as Record<string, unknown>;
  const refuse = (field: string, what: string): never => {
    throw new AirlockError('INVALID_SPEC', `${field} ${REMOTE} ${what}`, { field });
  };
  if (Array.isArray(i.mounts) && i.mounts.length > 0)
    refuse('mounts', 'binds its own host paths; upload files with sbx.files.write instead');
  const ws = i.workspace as Record<string, unknown> | undefined;
  if (
    ws &&
    typeof ws === 'object' &&
    (ws.hostDir !== undefined || (ws.mode !== undefined && ws.mode !== 'empty'))
  ) {
    refuse('workspace.hostDir', 'shares its own host directories; upload files with sbx.files.write instead');
  }
  if (Array.isArray(i.secrets)) {
    for (const [n, sec] of (i.secrets as Array<Record<string, unknown> | null>).entries()) {
      const v = sec?.value as Record<string, unknown> | undefined;
      if (v && typeof v === 'object' && v.literal === undefined) {
        refuse(
          `secrets.${n}.value`,
          'reads secrets from its own environment, files or programs (fromEnv/fromFile/command); ' +
            'read the value here and send it as { literal: value }',
        );
      }
      if (sec?.body === true)
        refuse(`secrets.${n}.body`, 'swaps secrets into plain-HTTP bodies for a client');
    }
  }
  if (Array.isArray(i.canaries) && i.canaries.length > 0) refuse('canaries', 'plants canaries for a client');
  if (i.persistent === true)
    refuse('persistent', 'keeps a sandbox without a TTL for a client; set ttlMs (at most 24 h)');
  if (i.layers !== undefined) refuse('layers', 'takes internal layers; fork a snapshot or name a template');
  if (i.rootfs !== undefined) refuse('rootfs', 'takes internal host paths; name an image instead');
  if (Array.isArray(i.executables) && i.executables.some((e) => typeof e === 'string' && e.startsWith('/')))
    refuse('executables', 'names host paths; over a server, give program names (looked up on PATH)');
  if (i.pull !== undefined) refuse('pull', 'decides when to pull (a server pulls what it lacks)');
  return input;
}

/** The CreateRequest for a parsed (and remote-checked) spec; fields the caller did not set are left to the server's defaults. */
function toCreateRequest(spec: SandboxSpec, input: SandboxSpecInput): CreateRequest {
  const template =
    spec.template === undefined
      ? undefined
      : typeof spec.template === 'string'
        ? spec.template
        : spec.template.digest;
  if (spec.backend === 'microvm' || spec.backend === 'wasm') {
    throw new AirlockError('BACKEND_UNAVAILABLE', 'a server runs the namespaces and gvisor tiers only', {
      field: 'backend',
    });
  }
  return {
    backend: spec.backend,
    ttlMs: spec.ttlMs,
    limits: spec.limits,
    ...(Object.keys(spec.env).length ? { env: spec.env } : {}),
    ...(Object.keys(spec.metadata).length ? { metadata: spec.metadata } : {}),
    ...(template !== undefined ? { template } : {}),
    ...(spec.image !== undefined ? { image: spec.image } : {}),
    ...(spec.executables !== undefined ? { executables: [...spec.executables] } : {}),
    ...(spec.secrets.length
      ? {
          secrets: spec.secrets.map((x) => ({
            name: x.name,
            value: 'literal' in x.value ? x.value.literal : '',
            hosts: [...x.hosts],
          })),
        }
      : {}),
    // The input as given (the server parses it with the same schema): not the parsed form.
    ...(input.network !== undefined ? { network: input.network as Record<string, unknown> } : {}),
    ...(spec.codePolicy !== undefined ? { codePolicy: spec.codePolicy } : {}),
  };
}
