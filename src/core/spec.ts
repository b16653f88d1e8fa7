// The sandbox spec and exec options: validated with zod at the trust boundary (STYLE.md habit 3).
// Every failure becomes INVALID_SPEC naming the offending field, e.g. `limits.memoryBytes`.
import { isAbsolute, normalize } from 'node:path';
import { z } from 'zod';
import { AirlockError } from './errors.js';
import { parseOrThrow } from './validate.js';
import { NetworkPolicySchema, SecretsSchema, secretHostReachable } from './network-spec.js';
import { BACKEND_NAMES, type BackendName } from './backend-names.js';
import { PULL_POLICIES, type PullPolicy } from './image.js';
import { CodePolicySchema } from './code.js';

export { parseOrThrow };

export { BACKEND_NAMES, type BackendName };

const MiB = 1024 * 1024;

/** A snapshot (layer) id: its content digest. */
export const DIGEST_RE = /^sha256:[0-9a-f]{64}$/;
export const DigestSchema = z
  .string()
  .regex(DIGEST_RE, 'a snapshot id is "sha256:" followed by 64 lowercase hex digits');
/** A template name (`airlock template build`); "host" is reserved for the built-in base. */
export const TEMPLATE_NAME_RE = /^[a-z0-9][a-z0-9._-]{0,62}$/;
/** Deepest snapshot chain a sandbox can run on (each layer is one read-only overlay lower). */
export const MAX_LAYERS = 32;
const GiB = 1024 * MiB;
const DAY_MS = 24 * 3_600_000;

const envKey = z
  .string()
  .regex(
    /^[A-Za-z_][A-Za-z0-9_]*$/,
    'environment variable names are letters, digits and _, not starting with a digit',
  );
const envValue = z.string().refine((v) => !v.includes('\0'), 'environment values cannot contain NUL bytes');
export const EnvSchema = z.record(envKey, envValue);

/** Host paths that must never become a workspace: the whole host, or kernel interfaces. */
const FORBIDDEN_WORKSPACE_ROOTS = ['/proc', '/sys', '/dev', '/run', '/boot'];

const under = (p: string, root: string): boolean =>
  p === root || p.startsWith(root === '/' ? '/' : root + '/');

/**
 * Why `p` (absolute, normalised) cannot be a workspace, or undefined. Applied to the path as written
 * (spec validation) AND to its resolved real path (the backend), so a symlink cannot route around it.
 * `stateDir` is Airlock's own state: neither it, anything in it, nor any of its ancestors may be shared.
 */
export function forbiddenWorkspaceReason(p: string, stateDir?: string): string | undefined {
  if (p === '/') return 'workspace.hostDir cannot be "/": share a project directory, not the host';
  const root = FORBIDDEN_WORKSPACE_ROOTS.find((r) => under(p, r));
  if (root)
    return `workspace.hostDir cannot be under ${root} (kernel and runtime interfaces are never shared)`;
  if (stateDir && (under(p, stateDir) || under(stateDir, p))) {
    return `workspace.hostDir cannot contain or be inside Airlock's state dir ${stateDir}`;
  }
  return undefined;
}

const hostDir = z
  .string()
  .refine((p) => isAbsolute(p), 'workspace.hostDir must be an absolute path')
  .transform((p) => normalize(p).replace(/\/+$/, '') || '/')
  .superRefine((p, ctx) => {
    const why = forbiddenWorkspaceReason(p);
    if (why) ctx.addIssue({ code: 'custom', message: why });
  });

export const WorkspaceSchema = z
  .object({
    hostDir: hostDir.optional(),
    mode: z.enum(['cow', 'ro', 'empty']).default('empty'),
  })
  .strict()
  .superRefine((w, ctx) => {
    if (w.mode !== 'empty' && w.hostDir === undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['hostDir'],
        message: `mode "${w.mode}" needs workspace.hostDir`,
      });
    }
    if (w.mode === 'empty' && w.hostDir !== undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['mode'],
        message: 'workspace.hostDir is set but mode is "empty"; use mode "cow" or "ro"',
      });
    }
  });

/** Sandbox paths a read-only mount may not cover: they are the sandbox's own layout. */
const RESERVED_SANDBOX_ROOTS = [
  '/usr',
  '/bin',
  '/sbin',
  '/lib',
  '/lib64',
  '/lib32',
  '/libx32',
  '/etc',
  '/proc',
  '/dev',
  '/sys',
  '/tmp',
  '/home',
  '/workspace',
  '/run',
];

/**
 * A host file or directory bound read-only into the sandbox (e.g. an MCP server's own package).
 * Never writable: the sandbox changes nothing on the host through it.
 */
export const MountSchema = z
  .object({
    hostPath: z
      .string()
      .refine((p) => isAbsolute(p), 'mounts[].hostPath must be an absolute path')
      .transform((p) => normalize(p).replace(/\/+$/, '') || '/')
      .superRefine((p, ctx) => {
        const why = forbiddenMountSourceReason(p);
        if (why) ctx.addIssue({ code: 'custom', message: why });
      }),
    /** Where it appears inside the sandbox (absolute; default: the same path as on the host). */
    path: z
      .string()
      .refine((p) => isAbsolute(p), 'mounts[].path must be an absolute path inside the sandbox')
      .transform((p) => normalize(p).replace(/\/+$/, '') || '/')
      .optional(),
  })
  .strict()
  .transform((m) => ({ hostPath: m.hostPath, path: m.path ?? m.hostPath }))
  .superRefine((m, ctx) => {
    if (forbiddenMountSourceReason(m.hostPath)) return; // reported on hostPath already
    const root =
      m.path === '/' ? '/' : RESERVED_SANDBOX_ROOTS.find((r) => under(m.path, r) || under(r, m.path));
    if (root) {
      ctx.addIssue({
        code: 'custom',
        path: ['path'],
        message: `mounts[].path "${m.path}" would cover the sandbox's own ${root}; mount it elsewhere (e.g. under /opt)`,
      });
    }
  });
export type Mount = z.output<typeof MountSchema>;

/** Why a host path cannot be mounted into a sandbox, or undefined (applied again to its realpath). */
export function forbiddenMountSourceReason(p: string, stateDir?: string): string | undefined {
  if (p === '/') return 'mounts[].hostPath cannot be "/": mount the server\'s own directory';
  const root = [...FORBIDDEN_WORKSPACE_ROOTS, '/etc'].find((r) => under(p, r));
  if (root)
    return `mounts[].hostPath cannot be under ${root} (host configuration and kernel interfaces are never shared)`;
  if (stateDir && (under(p, stateDir) || under(stateDir, p)))
    return `mounts[].hostPath cannot contain or be inside Airlock's state dir ${stateDir}`;
  return undefined;
}

export const LimitsSchema = z
  .object({
    memoryBytes: z
      .number()
      .int()
      .min(16 * MiB, 'memoryBytes must be at least 16 MiB')
      .max(64 * GiB)
      .default(512 * MiB),
    cpus: z.number().positive().max(256).default(1),
    pids: z.number().int().min(8, 'pids must be at least 8').max(65_536).default(256),
    diskBytes: z
      .number()
      .int()
      .min(1 * MiB, 'diskBytes must be at least 1 MiB')
      .max(256 * GiB)
      .default(512 * MiB),
  })
  .strict();

/** Image layers a sandbox's root is an overlay of (at most this many lowers). */
export const MAX_IMAGE_LAYERS = 128;

/** An image config as the tiers use it (core/image.ts ImageConfig). */
const ImageConfigSchema = z
  .object({
    env: z.array(z.string().regex(/^[^=\0]+=[^\0]*$/, 'image env entries are KEY=value')),
    workingDir: z.string().refine((p) => p === '' || p.startsWith('/'), 'workingDir is absolute or empty'),
    user: z.string().refine((u) => !u.includes('\0') && !u.includes('\n'), 'user has no NUL or newline'),
    entrypoint: z.array(z.string()),
    cmd: z.array(z.string()),
    labels: z.record(z.string(), z.string()),
  })
  .strict();

/**
 * Internal (set by `Airlock.create` from `image`, never accepted from a remote client): the root
 * filesystem is an overlay of these unpacked image layers plus the sandbox's own upper dir.
 */
export const RootfsSchema = z
  .object({
    /**
     * Absolute host dirs of the unpacked layers, BOTTOM first (ResolvedImage.layers). They reach the
     * kernel only through open_tree (idmapped views), never inside an overlay option string, so ':'
     * (as in the stores' `sha256:<hex>` dirs) is fine; ',' and '\' are refused all the same.
     */
    layers: z
      .array(
        z
          .string()
          .refine((p) => isAbsolute(p) && normalize(p) === p, 'rootfs.layers are absolute, normalised paths')
          .refine((p) => !/[,\\\0]/.test(p), "rootfs.layers paths cannot hold ',' or '\\'"),
      )
      .min(1, 'rootfs.layers lists at least one layer')
      .max(MAX_IMAGE_LAYERS, `an image has at most ${MAX_IMAGE_LAYERS} layers`),
    config: ImageConfigSchema,
    image: z
      .object({ ref: z.string().min(1), digest: z.string().regex(DIGEST_RE) })
      .strict()
      .optional(),
  })
  .strict();
export type Rootfs = z.output<typeof RootfsSchema>;

/** `executables` of a sandbox spec: program names or absolute paths (see SandboxSpecSchema). */
export const ExecutablesSchema = z
  .array(
    z
      .string()
      .min(1)
      .max(4096)
      .refine(
        (e) => /^[A-Za-z0-9._+-]+$/.test(e) || (e.startsWith('/') && !e.includes('\0')),
        'executables are program names (letters, digits, ".", "_", "+", "-") or absolute paths',
      )
      .refine((e) => e !== '.' && e !== '..', 'executables are program names or absolute paths'),
  )
  .min(1, 'executables lists at least one program (omit it for the whole root)')
  .max(64, 'executables lists at most 64 programs');

/** The zod schema of a sandbox spec (`Sandbox.create`). */
export const SandboxSpecSchema = z
  .object({
    backend: z.enum(BACKEND_NAMES).default('namespaces'),
    ttlMs: z.number().int().min(1000, 'ttlMs must be at least 1000').max(DAY_MS).default(600_000),
    limits: LimitsSchema.default(() => LimitsSchema.parse({})),
    workspace: WorkspaceSchema.default(() => WorkspaceSchema.parse({})),
    /** Host files or dirs bound read-only (at most 16), e.g. an MCP server's package. */
    mounts: z.array(MountSchema).max(16, 'at most 16 mounts').default([]),
    env: EnvSchema.default({}),
    metadata: z.record(z.string(), z.string()).default({}),
    /**
     * Exempt from the TTL: the sandbox lives until `kill()` (or its Airlock process ends). `ttlMs` is
     * then ignored. Absent means false.
     */
    persistent: z.boolean().optional(),
    /**
     * Internal (set by `snapshot.fork()`): the snapshot layers the workspace and home start from, top
     * first: a snapshot's digest followed by its parent chain. Each must exist in the state dir.
     */
    layers: z
      .array(DigestSchema)
      .min(1, 'layers lists at least one snapshot (omit it for a fresh sandbox)')
      .max(MAX_LAYERS, `a snapshot chain is at most ${MAX_LAYERS} layers deep`)
      .refine((l) => new Set(l).size === l.length, 'layers must not repeat a snapshot')
      .optional(),
    /**
     * Start from a built template: its name (resolved to its digest when the sandbox is created) or a
     * layer digest ("sha256:…"). After create, `spec.template` is `{ name?, digest }`: the digest that
     * ran. Not together with `layers`.
     */
    template: z
      .union(
        [
          z.string().refine((t) => DIGEST_RE.test(t) || (TEMPLATE_NAME_RE.test(t) && t !== 'host'), {
            message:
              'template is a template name (lowercase letters, digits, ".", "_", "-") or a digest "sha256:<64 hex>"',
          }),
          z.object({ name: z.string().regex(TEMPLATE_NAME_RE).optional(), digest: DigestSchema }).strict(),
        ],
        { error: 'template is a name, a digest "sha256:<64 hex>", or { name?, digest }' },
      )
      .optional(),
    /**
     * Run on an image's root filesystem instead of the host's /usr: a reference (`name:tag`,
     * `registry.example.com/team/py@sha256:…`) resolved by the runtime's image resolver at create.
     * After create, `sbx.info.image` is `{ ref, digest }`: the digest that ran.
     */
    image: z
      .string()
      .min(1, 'image is an image reference, e.g. "registry.example.com/team/py:3.12"')
      .max(1024)
      .refine((r) => !/[\s\0]/.test(r), 'image references hold no whitespace or NUL')
      .optional(),
    /** When to contact the registry for `image`: `missing` (default), `always`, or `never`. */
    pull: z.enum(PULL_POLICIES as [PullPolicy, ...PullPolicy[]]).optional(),
    /**
     * An executable allowlist: the sandbox's root holds only these programs (names looked up on the
     * source's PATH, or absolute paths) and what they need to run (shared libraries, script
     * interpreters, runtime data such as Python's stdlib), taken from the host root or from `image`.
     * Anything else is absent: exec of it fails (ENOENT; exit 127 through exec). See docs/allowlists.md.
     */
    executables: ExecutablesSchema.optional(),
    /** Internal (set from `image` at create): see RootfsSchema. */
    rootfs: RootfsSchema.optional(),
    /** Egress policy. Absent: no network at all (the sandbox's netns has only lo, no route). */
    network: NetworkPolicySchema.optional(),
    /** Credentials the sandbox may use without seeing them (needs `network`). */
    secrets: SecretsSchema.default([]),
    /**
     * Fake credentials planted in the sandbox (env variables or files); any appearance of one in
     * egress is blocked and raised as an alert event. Needs `network`.
     */
    canaries: z
      .array(
        z
          .object({
            name: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'canary names are environment-variable-like'),
            kind: z.enum(['env', 'file']),
            path: z.string().startsWith('/', 'canary paths are absolute paths inside the sandbox').optional(),
            format: z
              .enum(['github', 'aws-access-key', 'aws-secret-key', 'openai', 'anthropic', 'generic'])
              .optional(),
          })
          .strict()
          .refine((c) => c.kind === 'env' || c.path !== undefined, {
            message: 'a file canary needs a path',
            path: ['path'],
          }),
      )
      .default([]),
    /** The static analysis policy of `sbx.runCode` (a run's own `policy` option wins over it). */
    codePolicy: CodePolicySchema.optional(),
  })
  .strict()
  .superRefine((spec, ctx) => {
    if (spec.pull !== undefined && spec.image === undefined) {
      ctx.addIssue({ code: 'custom', path: ['pull'], message: 'pull needs image (it says when to pull it)' });
    }
    for (const f of ['template', 'layers'] as const) {
      if (spec.executables !== undefined && spec[f] !== undefined) {
        ctx.addIssue({
          code: 'custom',
          path: ['executables'],
          message: `executables cannot be combined with ${f} (an allowlist root starts fresh)`,
        });
      }
      // (rootfs is internal: with layers it is a template or snapshot made on that image.)
      if (spec.image !== undefined && spec[f] !== undefined) {
        ctx.addIssue({
          code: 'custom',
          path: ['image'],
          message: `image cannot be combined with ${f} (a template or snapshot made on an image names it already)`,
        });
      }
    }
    if (spec.template !== undefined && spec.layers !== undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['template'],
        message: 'template and layers cannot both be given (a template already names its layers)',
      });
    }
    if (spec.canaries.length && spec.network === undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['canaries'],
        message: 'canaries need a network policy (they are watched for at egress)',
      });
    }
    if (spec.secrets.length && spec.network === undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['secrets'],
        message: 'secrets need a network policy whose network.allow names their hosts',
      });
      return;
    }
    for (const [i, secret] of spec.secrets.entries()) {
      for (const [j, host] of secret.hosts.entries()) {
        if (!secretHostReachable(spec.network!, host)) {
          ctx.addIssue({
            code: 'custom',
            path: ['secrets', i, 'hosts', j],
            message: `${host} is not reachable under network.allow (ports 443/80); add it there or the secret can never be used`,
          });
        }
      }
    }
  });

/** What `Sandbox.create` accepts: every field optional. */
export type SandboxSpecInput = z.input<typeof SandboxSpecSchema>;
/** A validated sandbox spec, defaults filled in. */
export type SandboxSpec = z.output<typeof SandboxSpecSchema>;
/** A sandbox's resource limits: `memoryBytes`, `cpus`, `pids`, `diskBytes`. */
export type Limits = z.output<typeof LimitsSchema>;

/** Validate a sandbox spec; throws `AirlockError` `INVALID_SPEC` naming the field. */
export function parseSandboxSpec(input: unknown): SandboxSpec {
  return parseOrThrow(SandboxSpecSchema, input ?? {}, 'sandbox spec');
}

// ---- exec options -------------------------------------------------------------------------------

const sandboxPath = z
  .string()
  .refine((p) => p.startsWith('/'), 'must be an absolute path inside the sandbox')
  .refine((p) => !p.includes('\0'), 'must not contain NUL');

export const ExecOptionsSchema = z
  .object({
    timeoutMs: z.number().int().positive().max(DAY_MS).default(60_000),
    maxOutputBytes: z
      .number()
      .int()
      .min(64, 'maxOutputBytes must be at least 64')
      .max(256 * MiB)
      .default(64_000),
    cwd: sandboxPath.default('/workspace'),
    env: EnvSchema.default({}),
    background: z.boolean().default(false),
    // Not validated here (functions and streams), but listed so that a misspelt option is an error.
    stdin: z.unknown().optional(),
    signal: z.unknown().optional(),
    onStdout: z.unknown().optional(),
    onStderr: z.unknown().optional(),
  })
  .strict();

export type ExecCommand = string | readonly string[];

export function parseCommand(cmd: unknown): string[] {
  if (typeof cmd === 'string') {
    if (cmd.trim() === '')
      throw new AirlockError('INVALID_ARGUMENT', 'command is empty', { field: 'command' });
    if (cmd.includes('\0'))
      throw new AirlockError('INVALID_ARGUMENT', 'command contains NUL', { field: 'command' });
    return ['/bin/sh', '-c', cmd];
  }
  if (Array.isArray(cmd) && cmd.length > 0 && cmd.every((a) => typeof a === 'string' && !a.includes('\0'))) {
    return [...(cmd as string[])];
  }
  throw new AirlockError(
    'INVALID_ARGUMENT',
    'command must be a non-empty shell string or a non-empty array of strings without NUL bytes',
    { field: 'command' },
  );
}
