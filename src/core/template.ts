// Templates: a YAML file naming a base and setup steps, built once into an immutable layer addressed
// by its content digest (see src/sandbox/templates.ts). This file is the trust boundary for template
// files (zod, INVALID_SPEC naming the field) and for the name → digest records kept in the state dir.
import { createHash } from 'node:crypto';
import { posix } from 'node:path';
import { z } from 'zod';
import { NetworkPolicySchema } from './network-spec.js';
import { canonicalJson } from './canonical-json.js';
import { parseConfigText, readConfigData } from './config-file.js';
import { DigestSchema, EnvSchema, LimitsSchema, DIGEST_RE, TEMPLATE_NAME_RE } from './spec.js';
import { parseOrThrow } from './validate.js';

export { TEMPLATE_NAME_RE };
/** The one canonical JSON (core/canonical-json.ts), re-exported for template callers. */
export { canonicalJson };

export const TEMPLATE_RECORD_VERSION = 1;
/** The default base: read-only host system dirs, an empty workspace and home (today's default sandbox). */
export const HOST_BASE = 'host';
export const MAX_TEMPLATE_FILE_BYTES = 4 * 1024 * 1024;
const MAX_FILE_CONTENT_BYTES = 1024 * 1024;
const DAY_MS = 24 * 3_600_000;
/** Step timeout unless the step sets timeoutMs. */
export const DEFAULT_STEP_TIMEOUT_MS = 600_000;

export const TemplateNameSchema = z
  .string()
  .regex(
    TEMPLATE_NAME_RE,
    'a template name is 1 to 63 lowercase letters, digits, ".", "_" or "-", starting with a letter or digit',
  )
  .refine((n) => n !== HOST_BASE, `"${HOST_BASE}" is the built-in base, not a template name`);

/** What `Sandbox.create({ template })` and a template's `base` accept: a name or a layer digest. */
export const TemplateRefSchema = z.union([DigestSchema, TemplateNameSchema], {
  error: 'a template is a name (lowercase letters, digits, ".", "_", "-") or a digest "sha256:<64 hex>"',
});

const noNul = (s: string): boolean => !s.includes('\0');

/** Only /workspace and /home/user are captured into a layer: files go there. */
const CAPTURED_ROOTS = ['/workspace', '/home/user'];

const templatePath = z
  .string()
  .min(1, 'a file path cannot be empty')
  .refine(noNul, 'a file path cannot contain NUL')
  .refine((p) => !p.split('/').includes('..'), 'a file path cannot contain ".." segments')
  .transform((p) => posix.normalize(p.startsWith('/') ? p : `/workspace/${p}`).replace(/\/+$/, ''))
  .refine(
    (p) => CAPTURED_ROOTS.some((r) => p.startsWith(`${r}/`)),
    'a file path is relative to /workspace, or absolute under /workspace/ or /home/user/ (only those are captured)',
  );

const sandboxDir = z
  .string()
  .refine((p) => p.startsWith('/'), 'workdir must be an absolute path inside the sandbox')
  .refine(noNul, 'workdir cannot contain NUL');

export const TemplateStepSchema = z
  .object({
    /** A shell string (run with /bin/sh -c) or an argv array. */
    run: z.union([
      z.string().trim().min(1, 'run cannot be empty').refine(noNul, 'run cannot contain NUL'),
      z
        .array(z.string().refine(noNul, 'run arguments cannot contain NUL'))
        .min(1, 'run needs at least the program'),
    ]),
    /** Egress for this step only (same schema as a sandbox's network). Absent: no network at all. */
    network: NetworkPolicySchema.optional(),
    env: EnvSchema.optional(),
    timeoutMs: z
      .number()
      .int()
      .min(1000, 'timeoutMs must be at least 1000')
      .max(DAY_MS)
      .default(DEFAULT_STEP_TIMEOUT_MS),
    /** Working directory (default /workspace). */
    workdir: sandboxDir.optional(),
  })
  .strict();

/** A base that is an OCI image: `image:<reference>` (steps run on its root; their changes are captured). */
export const IMAGE_BASE_PREFIX = 'image:';
const ImageBaseSchema = z
  .string()
  .regex(
    /^image:[^\s\0]{1,512}$/,
    'an image base is "image:<reference>", e.g. image:registry.example.com/team/py:3.12',
  );

/**
 * What a sandbox made from the template runs with (the image config of a template; a Dockerfile's
 * ENV, WORKDIR, CMD, ENTRYPOINT): `env` is `KEY=value` entries over the base image's (or the host's
 * defaults), `cmd`/`entrypoint` are what `airlock run --template NAME` runs with no command.
 */
export const TemplateConfigSchema = z
  .object({
    env: z
      .array(z.string().regex(/^[^=\0]+=[^\0]*$/, 'config.env entries are KEY=value'))
      .max(256)
      .optional(),
    workingDir: sandboxDir.optional(),
    entrypoint: z.array(z.string().refine(noNul, 'entrypoint cannot contain NUL')).max(256).optional(),
    cmd: z.array(z.string().refine(noNul, 'cmd cannot contain NUL')).max(256).optional(),
  })
  .strict();
export type TemplateConfig = z.output<typeof TemplateConfigSchema>;

/** The zod schema of a template file (name, base, files, steps, limits). */
export const TemplateFileSchema = z
  .object({
    name: TemplateNameSchema,
    /** "host" (default), another template's name, a layer digest, or `image:<reference>`. */
    base: z.union([z.literal(HOST_BASE), TemplateRefSchema, ImageBaseSchema]).default(HOST_BASE),
    /** What sandboxes made from the template run with (kept in its record; see TemplateConfigSchema). */
    config: TemplateConfigSchema.optional(),
    /** Written (as the sandbox user) before the first step. */
    files: z
      .array(
        z
          .object({
            path: templatePath,
            content: z
              .string()
              .refine(
                (c) => Buffer.byteLength(c) <= MAX_FILE_CONTENT_BYTES,
                'a file content is at most 1 MiB (write larger files in a step)',
              ),
          })
          .strict(),
      )
      .max(256, 'at most 256 files')
      .refine((f) => new Set(f.map((x) => x.path)).size === f.length, 'files must not repeat a path')
      .default([]),
    steps: z.array(TemplateStepSchema).max(64, 'at most 64 steps').default([]),
    /** Limits of the build sandbox. */
    limits: LimitsSchema.default(() => LimitsSchema.parse({})),
  })
  .strict();

/** A template as written: defaults not yet filled in. */
export type TemplateInput = z.input<typeof TemplateFileSchema>;
/** A validated template file. */
export type Template = z.output<typeof TemplateFileSchema>;
/** One validated build step of a template. */
export type TemplateStep = z.output<typeof TemplateStepSchema>;

/** Validate a template object; throws `AirlockError` naming the field. */
export function parseTemplate(input: unknown, source = 'template'): Template {
  return parseOrThrow(TemplateFileSchema, input, source);
}

/** Parse and validate a template from YAML text. */
export function parseTemplateYaml(text: string, source = 'template file'): Template {
  return parseTemplate(
    parseConfigText(text, '', { what: source, code: 'INVALID_SPEC', format: 'yaml' }),
    source,
  );
}

/** Read and validate a template YAML file. */
export function loadTemplateFile(path: string): Template {
  const opts = {
    what: 'template file',
    code: 'INVALID_SPEC',
    maxBytes: MAX_TEMPLATE_FILE_BYTES,
    format: 'yaml',
  } as const;
  return parseTemplate(readConfigData(path, opts), `template file ${path}`);
}

/** sha256 of the validated template's canonical JSON (defaults filled in, key order irrelevant). */
export function templateSourceDigest(t: Template): string {
  return `sha256:${createHash('sha256').update(canonicalJson(t)).digest('hex')}`;
}

/** `<stateDir>/templates/<name>.json`: what a name points at, and how it was built. */
export const TemplateRecordSchema = z
  .object({
    version: z.literal(TEMPLATE_RECORD_VERSION),
    name: TemplateNameSchema,
    /** The template's layer digest: what `Sandbox.create({ template: name })` runs. */
    digest: DigestSchema,
    /** Layers the build stacked over its base, top first (the first is `digest`). */
    layers: z.array(DigestSchema).min(1),
    base: z.object({ ref: z.string().min(1), digest: DigestSchema.nullable() }).strict(),
    /** Canonical hash of the template file that was built (templateSourceDigest). */
    sourceDigest: DigestSchema,
    createdAt: z.iso.datetime(),
    /** Bytes of file content in the layers the build made. */
    sizeBytes: z.number().int().nonnegative(),
    files: z.array(z.string()),
    steps: z.array(z.record(z.string(), z.unknown())),
    /** The image the template lies on (its base, or its base template's), pinned by digest. */
    image: z
      .object({ ref: z.string().min(1), digest: DigestSchema })
      .strict()
      .optional(),
    config: TemplateConfigSchema.optional(),
  })
  .strict()
  .refine((r) => r.layers[0] === r.digest, { message: 'layers[0] must be digest', path: ['layers'] });

export type TemplateRecord = z.output<typeof TemplateRecordSchema>;

export const isDigest = (s: string): boolean => DIGEST_RE.test(s);
