// Templates on the front server: each tenant has its own template names. The supervisor's library
// keeps one flat namespace, so a tenant's template "py" is built there as `tn-<tenant hash>-py` and
// the store maps (tenant, name) → that internal name. The rules, in one place:
//   - a tenant sees, uses and deletes only the templates it built; another tenant's answers
//     TEMPLATE_NOT_FOUND exactly like one that never existed (no oracle), by name or internal name;
//   - by digest, a tenant may start from (create or base) only its own snapshots and templates;
//   - a name the tenant did not build falls through to the operator's templates (built on the host
//     with `airlock template build`), never to an internal name of any tenant;
//   - a build takes a quota reservation (one live sandbox and one create) for as long as it runs;
//   - a template definition reads nothing of the server's host (the request schema has no host
//     paths, mounts or secrets), and a step's network obeys the operator's allowPrivate setting.
import { createHash } from 'node:crypto';
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import { DIGEST_RE } from '../core/spec.js';
import { HOST_BASE, parseTemplate } from '../core/template.js';
import {
  TemplateBuildRequestSchema,
  type Caller,
  type SandboxApi,
  type TemplateBuildRequest,
  type TemplateEvent,
  type TemplateView,
} from './contract.js';
import { templateInputOf } from './local-templates.js';
import { QuotaError, usageOf, type Quotas } from './quotas.js';
import type { Store, TemplateRow } from './store.js';

/** Longest template name a tenant may give (its internal name adds TENANT_PREFIX_CHARS). */
export const MAX_TENANT_TEMPLATE_NAME = 40;
const INTERNAL_RE = /^tn-[0-9a-f]{16}-/;

/** The library's name of `tenant`'s template `name`. */
export function internalTemplateName(tenant: string, name: string): string {
  return `tn-${createHash('sha256').update(tenant).digest('hex').slice(0, 16)}-${name}`;
}

/**
 * Fields that would read the server's host, refused by name with what to do instead (the strict
 * schema would refuse them too, but only as "unknown field").
 */
const HOST_FIELDS: ReadonlyArray<{
  at: (v: Record<string, unknown>) => Array<[string, unknown]>;
  why: string;
}> = [
  {
    at: (v) => ['mounts', 'copy', 'workspace', 'secrets'].map((k) => [k, v[k]]),
    why: 'a template built on a server cannot read the server host (no mounts, host copies, workspace dirs or secrets): send file contents in files[]',
  },
  {
    at: (v) =>
      (Array.isArray(v.files) ? v.files : []).flatMap((f: unknown, i) =>
        ['from', 'src', 'source', 'hostPath', 'localPath'].map((k): [string, unknown] => [
          `files.${i}.${k}`,
          (f as Record<string, unknown> | null)?.[k],
        ]),
      ),
    why: "a template file is sent by its content (files[].content), never copied from the server's host",
  },
  {
    at: (v) =>
      (Array.isArray(v.steps) ? v.steps : []).flatMap((s: unknown, i) =>
        ['secrets', 'mounts'].map((k): [string, unknown] => [
          `steps.${i}.${k}`,
          (s as Record<string, unknown> | null)?.[k],
        ]),
      ),
    why: 'a template step takes no secrets or mounts: it runs with its own network policy only',
  },
];

/** The route's body schema: the contract's, after refusing host-reading fields by name. */
export const TemplateBuildBodySchema = z.preprocess((v, ctx) => {
  if (typeof v === 'object' && v !== null) {
    for (const rule of HOST_FIELDS) {
      for (const [path, value] of rule.at(v as Record<string, unknown>)) {
        if (value !== undefined) {
          ctx.addIssue({
            code: 'custom',
            message: rule.why,
            path: path.split('.').map((p) => (/^\d+$/.test(p) ? Number(p) : p)),
          });
          return v;
        }
      }
    }
  }
  return v;
}, TemplateBuildRequestSchema);

const notFound = (ref: string, field: string): AirlockError =>
  new AirlockError('TEMPLATE_NOT_FOUND', `no template ${ref}`, { field });

export interface TemplatePolicy {
  readonly allowPrivateNetwork: boolean;
  readonly defaultQueueTimeoutMs: number;
}

export class TenantTemplates {
  /** (tenant, name) pairs being built now: a second build of the same name waits for none. */
  private readonly building = new Set<string>();

  constructor(
    private readonly inner: SandboxApi,
    private readonly store: Store,
    private readonly quotas: Quotas,
    private readonly policy: TemplatePolicy,
    private readonly onQuota?: (retryAfterSeconds: number) => void,
  ) {}

  /**
   * A template reference from `tenant` (a create's template, a build's base) → what the library
   * should run; TEMPLATE_NOT_FOUND (naming `field`) for anything not visible to the tenant.
   */
  resolve(ref: string, caller: Caller, field: string): string {
    if (typeof ref !== 'string') throw notFound(String(ref), field);
    if (DIGEST_RE.test(ref)) {
      // Every snapshot and template is a layer: by digest, only the caller's own.
      if (
        this.store.snapshotTenant(ref) === caller.tenant ||
        this.store.ownsTemplateDigest(caller.tenant, ref)
      )
        return ref;
      throw new AirlockError(
        'TEMPLATE_NOT_FOUND',
        `no template ${ref}: give a template by name, or one of your snapshots or templates by digest`,
        { field },
      );
    }
    const own = this.store.getTemplate(caller.tenant, ref);
    if (own) return own.internal;
    if (INTERNAL_RE.test(ref) || this.store.isTenantTemplate(ref)) throw notFound(ref, field);
    return ref; // the operator's templates
  }

  async *build(
    req: TemplateBuildRequest,
    caller: Caller,
    signal?: AbortSignal,
  ): AsyncGenerator<TemplateEvent> {
    const buildOf = this.inner.buildTemplate?.bind(this.inner);
    if (!buildOf) throw new AirlockError('BACKEND_UNAVAILABLE', 'this server cannot build templates');
    if (req.name === HOST_BASE) {
      throw new AirlockError('INVALID_SPEC', `"${HOST_BASE}" is the built-in base, not a template name`, {
        field: 'name',
      });
    }
    if (req.name.length > MAX_TENANT_TEMPLATE_NAME) {
      throw new AirlockError(
        'INVALID_SPEC',
        `a template name is at most ${MAX_TENANT_TEMPLATE_NAME} characters`,
        {
          field: 'name',
        },
      );
    }
    (req.steps ?? []).forEach((s, i) => {
      const ap = (s.network as { allowPrivate?: unknown } | undefined)?.allowPrivate;
      if (!this.policy.allowPrivateNetwork && ap !== undefined && !(Array.isArray(ap) && ap.length === 0)) {
        throw new AirlockError(
          'PERMISSION_DENIED',
          'network.allowPrivate is disabled on this server (the operator can enable it in the server config)',
          { field: `steps.${i}.network.allowPrivate` },
        );
      }
    });
    const base =
      req.base === undefined || req.base === HOST_BASE ? req.base : this.resolve(req.base, caller, 'base');
    if (base !== undefined && base === req.base && base !== HOST_BASE && !DIGEST_RE.test(base)) {
      // The operator's template by name: it must exist (else the error would name `template`).
      try {
        await this.inner.getTemplate?.(base, caller);
      } catch (e) {
        if (AirlockError.is(e, 'TEMPLATE_NOT_FOUND')) throw notFound(base, 'base');
        throw e;
      }
    }
    const internal = internalTemplateName(caller.tenant, req.name);
    const wire: TemplateBuildRequest = { ...req, name: internal, ...(base !== undefined ? { base } : {}) };
    // The whole definition, checked as the library will (400 naming the field) before any quota.
    parseTemplate(templateInputOf(wire), 'template');
    const key = `${caller.tenant}\0${req.name}`;
    if (this.building.has(key)) {
      throw new AirlockError(
        'SNAPSHOT_IN_USE',
        `template ${req.name} is being built now; wait for that build`,
        {
          field: 'name',
        },
      );
    }
    this.building.add(key);
    try {
      const want = usageOf(req.limits);
      let release: () => void;
      try {
        release = await this.quotas.reserve(
          caller.tenant,
          want,
          req.queueTimeoutMs ?? this.policy.defaultQueueTimeoutMs,
          signal,
        );
      } catch (e) {
        if (e instanceof QuotaError) this.onQuota?.(e.retryAfterSeconds);
        throw e;
      }
      // The library's messages name its internal names: the caller reads its own names.
      const ownNames = (m: string): string => {
        const named = m.replaceAll(internal, req.name);
        return base !== undefined && req.base !== undefined && base !== req.base
          ? named.replaceAll(base, req.base)
          : named;
      };
      const own = (e: unknown): unknown =>
        AirlockError.isInstance(e)
          ? new AirlockError(e.code, ownNames(e.message), {
              ...(e.field !== undefined ? { field: e.field } : {}),
            })
          : e;
      try {
        const { queueTimeoutMs: _q, ...toSupervisor } = wire;
        for await (const e of buildOf(toSupervisor, caller, signal)) {
          if (e.type === 'start') yield { ...e, name: req.name };
          else if (e.type === 'done') {
            const row: TemplateRow = {
              tenant: caller.tenant,
              name: req.name,
              internal,
              digest: e.template.digest,
              createdAt: e.template.createdAt,
              sizeBytes: e.template.sizeBytes,
            };
            this.store.putTemplate(row);
            yield { type: 'done', template: viewOf(row) };
          } else yield e;
        }
      } catch (e) {
        throw own(e);
      } finally {
        release();
      }
    } finally {
      this.building.delete(key);
    }
  }

  list(caller: Caller): TemplateView[] {
    return this.store.templates(caller.tenant).map(viewOf);
  }

  get(name: string, caller: Caller): TemplateView {
    const row = typeof name === 'string' ? this.store.getTemplate(caller.tenant, name) : undefined;
    if (!row) throw notFound(String(name), 'name');
    return viewOf(row);
  }

  async remove(name: string, caller: Caller): Promise<void> {
    const row = typeof name === 'string' ? this.store.getTemplate(caller.tenant, name) : undefined;
    if (!row) throw notFound(String(name), 'name');
    try {
      // SNAPSHOT_IN_USE (and nothing removed) while one of the tenant's sandboxes runs on it.
      await this.inner.removeTemplate?.(row.internal, caller);
    } catch (e) {
      if (!AirlockError.is(e, 'TEMPLATE_NOT_FOUND')) throw e;
    }
    this.store.forgetTemplate(caller.tenant, name);
  }
}

function viewOf(r: TemplateRow): TemplateView {
  return { name: r.name, digest: r.digest, createdAt: r.createdAt, sizeBytes: r.sizeBytes };
}
