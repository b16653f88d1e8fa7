// `airlock.templates`: build a template (base + files + steps, each step in a sandbox with its own
// network policy) into an immutable snapshot layer, and keep name → digest records under
// `<stateDir>/templates/<name>.json` (0600, in a 0700 root-only dir, written atomically).
//
// A build runs consecutive steps with the same network policy in one sandbox; where the policy
// changes it snapshots that sandbox and continues in a new one (on that snapshot) with the next
// policy, so no step ever runs with another step's network. The template's digest is the digest of
// the last layer; layers are content-addressed, so the same inputs give the same digest.
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdirSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AirlockError } from '../core/errors.js';
import { monotonicMs } from '../core/units.js';
import { z } from 'zod';
import { readRecordFile } from '../core/validate.js';
import type { SnapshotParent, SnapshotRecord } from '../core/snapshot.js';
import { DIGEST_RE, TEMPLATE_NAME_RE, type BackendName, type SandboxSpecInput } from '../core/spec.js';
import {
  HOST_BASE,
  IMAGE_BASE_PREFIX,
  TEMPLATE_RECORD_VERSION,
  TemplateRecordSchema,
  canonicalJson,
  loadTemplateFile,
  parseTemplate,
  templateSourceDigest,
  type Template,
  type TemplateConfig,
  type TemplateInput,
  type TemplateRecord,
  type TemplateStep,
} from '../core/template.js';
import type { SandboxBase } from './sandbox.js';

/** The image a layer's source sandbox ran on (its recorded spec's rootfs.image). */
const RootfsImageSchema = z.object({ ref: z.string().min(1), digest: z.string().regex(DIGEST_RE) }).strict();

/** Bytes of a failed step's stderr kept in the error. */
const STDERR_TAIL_CHARS = 2000;

/** Build progress events: step i/N, layer bytes, done. */
export type TemplateProgress =
  | { readonly phase: 'start'; readonly name: string; readonly steps: number }
  | { readonly phase: 'files'; readonly count: number }
  /** Step `index` (0-based) of `steps` starts. */
  | { readonly phase: 'step'; readonly index: number; readonly steps: number; readonly command: string }
  /** A layer was captured: `bytes` of file content in it. */
  | { readonly phase: 'layer'; readonly digest: string; readonly bytes: number }
  | { readonly phase: 'done'; readonly digest: string; readonly bytes: number };

/**
 * What a step does while it runs (TemplateBuildOptions.onStep): its output as it comes (text chunks),
 * and its end with how long it took. Apart from TemplateProgress so that a progress printer that only
 * knows the phases above keeps working.
 */
export type TemplateStepEvent =
  | {
      readonly kind: 'output';
      readonly index: number;
      readonly stream: 'stdout' | 'stderr';
      readonly text: string;
    }
  | {
      readonly kind: 'done';
      readonly index: number;
      readonly durationMs: number;
      readonly exitCode: number | null;
    };

/** Options of `airlock.templates.build()`. */
export interface TemplateBuildOptions {
  readonly onProgress?: (p: TemplateProgress) => void;
  /** Each step's output as it runs, and its end (the server streams these to its clients). */
  readonly onStep?: (e: TemplateStepEvent) => void;
  readonly signal?: AbortSignal;
  /**
   * The tier the build's steps run on. Default: the tier its base was taken on (a template's or
   * snapshot's), namespaces for the host base; never silently a weaker one.
   */
  readonly backend?: BackendName;
}

/** A built template: name, digest, layers, base. */
export interface TemplateInfo {
  readonly name: string;
  /** The layer digest a sandbox created from this name runs now. */
  readonly digest: string;
  /** Layers the build stacked over its base, top first. */
  readonly layers: readonly string[];
  readonly base: { readonly ref: string; readonly digest: string | null };
  /** Canonical hash of the template file that was built. */
  readonly sourceDigest: string;
  readonly createdAt: Date;
  readonly sizeBytes: number;
  readonly files: readonly string[];
  readonly steps: ReadonlyArray<Readonly<Record<string, unknown>>>;
  /** The image it lies on (`image:<ref>` base, or a base template's), pinned by digest. */
  readonly image?: { readonly ref: string; readonly digest: string };
  /** What its sandboxes run with: env, working dir, and the command of `airlock run --template`. */
  readonly config?: TemplateConfig;
}

/** A template step that failed: which one (0-based), its exit status and the end of its stderr. */
export class TemplateBuildError extends AirlockError {
  constructor(
    message: string,
    readonly step: number,
    readonly exitCode: number | null,
    readonly stderrTail: string,
    readonly killedBy?: string,
  ) {
    super('TEMPLATE_BUILD_FAILED', message, { field: `steps.${step}` });
  }
}

/** A resolved template reference: the layer chain a sandbox on it runs on. */
export interface ResolvedTemplate {
  readonly name?: string;
  readonly digest: string;
  /** The whole chain, top first (the digest, then what it lies on). */
  readonly layers: readonly string[];
  readonly workspace: SnapshotParent['workspace'];
  /** The tier its top layer was taken on: sandboxes on it run there unless their spec names one. */
  readonly backend: BackendName;
  /** The image its layers lie on (they hold that root's changes), pinned by digest. */
  readonly image?: { readonly ref: string; readonly digest: string };
  /** The template's config (resolved by name only). */
  readonly config?: TemplateConfig;
}

/** What Templates needs from its runtime (narrow, so that it does not depend on Airlock). */
export interface TemplateRuntime {
  create(spec: SandboxSpecInput): Promise<SandboxBase>;
  /** The layer record for a digest (of any tier: layers share one store), or undefined. */
  layer(digest: string): Promise<SnapshotRecord | undefined>;
  /** Remove a layer with the snapshot store's rules (SNAPSHOT_IN_USE while used). */
  removeLayer(digest: string): Promise<void>;
}

/** `airlock.templates`: build, list, inspect and remove templates. */
export class Templates {
  private readonly dir: string;

  constructor(
    stateDir: string,
    private readonly runtime: TemplateRuntime,
  ) {
    this.dir = join(stateDir, 'templates');
  }

  /**
   * Build a template from a YAML file path or a template object: a sandbox on its base, its files
   * written, its steps run in order (each with its own network policy), then a snapshot. Stores
   * name → digest and returns the record. A failing step throws TemplateBuildError
   * (TEMPLATE_BUILD_FAILED, `step`, `stderrTail`); the build sandboxes are always killed.
   */
  async build(fileOrObject: string | TemplateInput, opts: TemplateBuildOptions = {}): Promise<TemplateInfo> {
    const t = typeof fileOrObject === 'string' ? loadTemplateFile(fileOrObject) : parseTemplate(fileOrObject);
    const progress = (p: TemplateProgress): void => {
      try {
        opts.onProgress?.(p);
      } catch {
        /* a progress callback's bug never breaks a build */
      }
    };
    const onStep = (e: TemplateStepEvent): void => {
      try {
        opts.onStep?.(e);
      } catch {
        /* nor does a step callback's */
      }
    };
    const aborted = (): void => {
      if (opts.signal?.aborted) throw new AirlockError('ABORTED', `template ${t.name}: build aborted`);
    };
    // `image:<ref>`: the first build sandbox starts on the image; the rest on the layers above it.
    const imageBase = t.base.startsWith(IMAGE_BASE_PREFIX)
      ? t.base.slice(IMAGE_BASE_PREFIX.length)
      : undefined;
    const base = t.base === HOST_BASE || imageBase !== undefined ? undefined : await this.resolve(t.base);
    let image = base?.image;
    const backend = opts.backend ?? base?.backend ?? 'namespaces';
    progress({ phase: 'start', name: t.name, steps: t.steps.length });
    const segments = segment(t.steps);
    const stacked: SnapshotRecord[] = [];
    const madeHere = new Set<string>();
    let sbx: SandboxBase | undefined;
    try {
      let from = base?.digest;
      for (const [s, seg] of segments.entries()) {
        aborted();
        if (s > 0) {
          const rec = await this.capture(sbx!, madeHere);
          stacked.unshift(rec);
          progress({ phase: 'layer', digest: rec.digest, bytes: rec.sizeBytes });
          await sbx!.kill();
          sbx = undefined;
          from = rec.digest;
        }
        sbx = await this.runtime.create({
          backend,
          ...(from ? { template: from } : imageBase !== undefined ? { image: imageBase } : {}),
          limits: t.limits,
          persistent: true, // killed below, whatever happens; no TTL cuts a long step short
          ...(seg.network ? { network: seg.network } : {}),
          metadata: { 'airlock.template': t.name },
        });
        if (s === 0 && imageBase !== undefined) image = sbx.info.image;
        if (s === 0 && t.files.length) {
          for (const f of t.files) await sbx.files.write(f.path, f.content);
          progress({ phase: 'files', count: t.files.length });
        }
        for (const i of seg.indexes) {
          aborted();
          const step = t.steps[i]!;
          progress({ phase: 'step', index: i, steps: t.steps.length, command: commandText(step) });
          await runStep(sbx, step, i, opts.signal, opts.onStep ? onStep : undefined);
        }
      }
      const top = await this.capture(sbx!, madeHere);
      stacked.unshift(top);
      progress({ phase: 'layer', digest: top.digest, bytes: top.sizeBytes });
      await sbx!.kill();
      sbx = undefined;
      const record: TemplateRecord = {
        version: TEMPLATE_RECORD_VERSION,
        name: t.name,
        digest: top.digest,
        layers: stacked.map((r) => r.digest),
        base: { ref: t.base, digest: base?.digest ?? (imageBase !== undefined ? image!.digest : null) },
        ...(image ? { image: { ref: image.ref, digest: image.digest } } : {}),
        ...(t.config ? { config: t.config } : {}),
        sourceDigest: templateSourceDigest(t),
        createdAt: new Date().toISOString(),
        sizeBytes: stacked.reduce((n, r) => n + r.sizeBytes, 0),
        files: t.files.map((f) => f.path),
        steps: t.steps.map((s) => JSON.parse(canonicalJson(s)) as Record<string, unknown>),
      };
      this.write(record);
      progress({ phase: 'done', digest: top.digest, bytes: record.sizeBytes });
      return infoOf(record);
    } catch (e) {
      await sbx?.kill().catch(() => {});
      // Layers this failed build made (never ones that existed before it, which others may use).
      for (const d of stacked.map((r) => r.digest).filter((d) => madeHere.has(d)))
        await this.runtime.removeLayer(d).catch(() => {});
      throw e;
    }
  }

  private async capture(sbx: SandboxBase, madeHere: Set<string>): Promise<SnapshotRecord> {
    const snap = await sbx.snapshot();
    const rec = await this.runtime.layer(snap.digest);
    if (!rec) throw new AirlockError('INTERNAL', `layer ${snap.digest} vanished right after its capture`);
    if (rec.source === sbx.id) madeHere.add(rec.digest);
    return rec;
  }

  /** Every template, by name. */
  async list(): Promise<TemplateInfo[]> {
    return this.records().map(infoOf);
  }

  /** A template by name, or the template(s) whose digest this is (the newest); TEMPLATE_NOT_FOUND otherwise. */
  async inspect(nameOrDigest: string): Promise<TemplateInfo> {
    if (typeof nameOrDigest === 'string' && DIGEST_RE.test(nameOrDigest)) {
      const hits = this.records().filter((r) => r.digest === nameOrDigest);
      hits.sort((a, b) => b.createdAt.localeCompare(a.createdAt));
      if (hits[0]) return infoOf(hits[0]);
      throw notFound(nameOrDigest);
    }
    return infoOf(this.read(checkName(nameOrDigest)));
  }

  /**
   * Delete a template's name and the layers its build made. SNAPSHOT_IN_USE (nothing removed) while
   * a live sandbox runs on its layer or another snapshot/template is built on it. Layers another
   * template also uses stay.
   */
  async remove(name: string): Promise<void> {
    const record = this.read(checkName(name));
    const others = this.records().filter((r) => r.name !== record.name);
    // Layers another template's build also made (the same content gives the same digest): they stay.
    const sharedBuilt = new Set(others.flatMap((r) => r.layers));
    // ...and layers other templates run on (their bases' chains): removing those is never tried.
    const usedElsewhere = new Set(sharedBuilt);
    for (const r of others) {
      for (const d of (await this.runtime.layer(r.digest))?.parent.layers ?? []) usedElsewhere.add(d);
    }
    const [top, ...below] = record.layers;
    if (!sharedBuilt.has(top!)) {
      try {
        // SNAPSHOT_IN_USE (and nothing removed) while a live sandbox or a later layer uses it.
        await this.runtime.removeLayer(top!);
      } catch (e) {
        if (!AirlockError.is(e, 'SNAPSHOT_NOT_FOUND')) throw e;
      }
    }
    rmSync(this.file(record.name), { force: true });
    for (const d of below) {
      if (usedElsewhere.has(d)) continue;
      await this.runtime.removeLayer(d).catch(() => {}); // in use by someone else: it stays
    }
  }

  /**
   * A name (its current digest) or a digest (any layer of the namespaces tier: template or
   * snapshot) → the chain a sandbox runs on. TEMPLATE_NOT_FOUND when there is none.
   */
  async resolve(ref: string): Promise<ResolvedTemplate> {
    let name: string | undefined;
    let digest = ref;
    if (!DIGEST_RE.test(ref)) {
      name = checkName(ref);
      digest = this.read(name).digest;
    }
    const layer = await this.runtime.layer(digest);
    if (!layer) {
      throw new AirlockError(
        'TEMPLATE_NOT_FOUND',
        name
          ? `template ${name}'s layer ${digest} no longer exists; rebuild it`
          : `no template or snapshot ${digest}`,
        { field: 'template' },
      );
    }
    // By name: the record's image (the reference this build used); by digest: the layer source's.
    const record = name ? this.read(name) : undefined;
    const image = RootfsImageSchema.safeParse(
      record?.image ?? (layer.spec as { rootfs?: { image?: unknown } }).rootfs?.image,
    );
    const config = record?.config;
    return {
      ...(name ? { name } : {}),
      digest,
      layers: [digest, ...layer.parent.layers],
      workspace: layer.parent.workspace,
      backend: layer.backend,
      ...(image.success ? { image: image.data } : {}),
      ...(config ? { config } : {}),
    };
  }

  private file(name: string): string {
    return join(this.dir, `${name}.json`);
  }

  private read(name: string): TemplateRecord {
    const r = readRecordFile(TemplateRecordSchema, this.file(name), 'template record');
    if (!r) throw notFound(name);
    if (r.name !== name) {
      throw new AirlockError('INTERNAL', `template record ${this.file(name)} is corrupt: name mismatch`);
    }
    return r;
  }

  private records(): TemplateRecord[] {
    let names: string[];
    try {
      names = readdirSync(this.dir);
    } catch {
      return [];
    }
    return names
      .filter((n) => n.endsWith('.json') && TEMPLATE_NAME_RE.test(n.slice(0, -5)))
      .map((n) => this.read(n.slice(0, -5)))
      .sort((a, b) => a.name.localeCompare(b.name));
  }

  private write(record: TemplateRecord): void {
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    chmodSync(this.dir, 0o700);
    const path = this.file(record.name);
    const tmp = `${path}.${process.pid}-${randomBytes(4).toString('hex')}.tmp`;
    try {
      writeFileSync(tmp, JSON.stringify(record, null, 2) + '\n', { mode: 0o600 });
      renameSync(tmp, path);
    } catch (e) {
      rmSync(tmp, { force: true });
      throw e;
    }
  }
}

/** Consecutive steps with the same network policy: one build sandbox each. */
function segment(
  steps: readonly TemplateStep[],
): Array<{ network: TemplateStep['network']; indexes: number[] }> {
  const out: Array<{ network: TemplateStep['network']; key: string; indexes: number[] }> = [];
  steps.forEach((s, i) => {
    const key = canonicalJson(s.network ?? null);
    const last = out[out.length - 1];
    if (last && last.key === key) last.indexes.push(i);
    else out.push({ network: s.network, key, indexes: [i] });
  });
  if (!out.length) out.push({ network: undefined, key: 'null', indexes: [] });
  return out;
}

async function runStep(
  sbx: SandboxBase,
  step: TemplateStep,
  i: number,
  signal?: AbortSignal,
  onStep?: (e: TemplateStepEvent) => void,
): Promise<void> {
  const started = monotonicMs();
  const r = await sbx.exec(typeof step.run === 'string' ? step.run : [...step.run], {
    timeoutMs: step.timeoutMs,
    ...(step.env ? { env: step.env } : {}),
    ...(step.workdir ? { cwd: step.workdir } : {}),
    ...(signal ? { signal } : {}),
    ...(onStep
      ? {
          onStdout: (text: string) => onStep({ kind: 'output', index: i, stream: 'stdout', text }),
          onStderr: (text: string) => onStep({ kind: 'output', index: i, stream: 'stderr', text }),
        }
      : {}),
  });
  onStep?.({ kind: 'done', index: i, durationMs: monotonicMs() - started, exitCode: r.exitCode });
  if (r.exitCode === 0 && !r.killedBy) return;
  const tail = r.stderr.slice(-STDERR_TAIL_CHARS);
  const how = r.killedBy
    ? `was killed (${r.killedBy})`
    : r.signal
      ? `died by ${r.signal}`
      : `exited ${r.exitCode}`;
  throw new TemplateBuildError(
    `template step ${i + 1} (${commandText(step)}) ${how}${tail.trim() ? `; stderr ends: ${tail.trimEnd()}` : ''}`,
    i,
    r.exitCode,
    tail,
    r.killedBy,
  );
}

function commandText(step: TemplateStep): string {
  const t = typeof step.run === 'string' ? step.run : step.run.join(' ');
  return t.length > 80 ? `${t.slice(0, 79)}…` : t;
}

function checkName(name: string): string {
  if (typeof name !== 'string' || !TEMPLATE_NAME_RE.test(name) || name === HOST_BASE) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `"${String(name)}" is not a template name or digest (lowercase letters, digits, ".", "_", "-"; or sha256:<64 hex>)`,
      { field: 'template' },
    );
  }
  return name;
}

function notFound(ref: string): AirlockError {
  return new AirlockError('TEMPLATE_NOT_FOUND', `no template ${ref}`, { field: 'template' });
}

function infoOf(r: TemplateRecord): TemplateInfo {
  return {
    name: r.name,
    digest: r.digest,
    layers: r.layers,
    base: r.base,
    sourceDigest: r.sourceDigest,
    createdAt: new Date(r.createdAt),
    sizeBytes: r.sizeBytes,
    files: r.files,
    steps: r.steps,
    ...(r.image ? { image: r.image } : {}),
    ...(r.config ? { config: r.config } : {}),
  };
}

export type { Template, TemplateInput, TemplateRecord };
