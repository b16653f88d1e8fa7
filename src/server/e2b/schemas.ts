// Our definitions of the E2B wire messages, written from the e2b SDK's published behaviour: the
// control API's JSON bodies and the envd services' messages in proto3 JSON form (lowerCamelCase
// names; uint32 as a number or a decimal string; bytes as base64; enums by name or number). Unknown
// fields are dropped (proto3 JSON readers ignore them too); known ones are checked.
import { z } from 'zod';

const uint32 = z.union([
  z.number().int().min(0).max(0xffffffff),
  z
    .string()
    .regex(/^[0-9]{1,10}$/)
    .transform(Number)
    .refine((n) => n <= 0xffffffff, 'out of range'),
]);
const int32 = z.union([
  z.number().int(),
  z
    .string()
    .regex(/^-?[0-9]{1,10}$/)
    .transform(Number),
]);
/** proto3 bytes: standard or URL-safe base64, padding optional. */
const bytes = z
  .string()
  .regex(/^[A-Za-z0-9+/_-]*={0,2}$/, 'must be base64')
  .transform((s) => new Uint8Array(Buffer.from(s, 'base64')));

// ---- control API ----------------------------------------------------------------------------------

const seconds = z.number().int().min(0).max(86_400);

export const NewSandboxSchema = z.object({
  templateID: z.string().min(1).max(200),
  timeout: seconds.optional(),
  metadata: z.record(z.string(), z.string()).nullish(),
  envVars: z.record(z.string(), z.string()).nullish(),
  allow_internet_access: z.boolean().nullish(),
  secure: z.boolean().nullish(),
  autoPause: z.boolean().nullish(),
  autoPauseMemory: z.boolean().nullish(),
  autoResume: z.object({ enabled: z.boolean() }).nullish(),
  network: z.unknown().optional(),
  mcp: z.unknown().optional(),
  iam: z.unknown().optional(),
  volumeMounts: z.array(z.unknown()).nullish(),
});
export type NewSandbox = z.infer<typeof NewSandboxSchema>;

export const TimeoutBodySchema = z.object({ timeout: seconds });
export const ConnectBodySchema = z.object({ timeout: seconds.optional(), memory: z.boolean().optional() });
export const RefreshBodySchema = z.object({ duration: seconds.optional() });
export const PauseBodySchema = z.object({ memory: z.boolean().nullish() });
export const SnapshotBodySchema = z.object({ name: z.string().max(200).optional() });

// ---- process.Process ------------------------------------------------------------------------------

export const ProcessSelectorSchema = z
  .object({ pid: uint32.optional(), tag: z.string().optional() })
  .refine((s) => s.pid !== undefined || s.tag !== undefined, 'give a pid');

export const StartRequestSchema = z.object({
  process: z.object({
    cmd: z.string().min(1),
    args: z.array(z.string()).optional(),
    envs: z.record(z.string(), z.string()).optional(),
    cwd: z.string().optional(),
  }),
  pty: z.unknown().optional(),
  tag: z.string().optional(),
  stdin: z.boolean().optional(),
});

export const SelectorRequestSchema = z.object({ process: ProcessSelectorSchema });

export const SendInputRequestSchema = z.object({
  process: ProcessSelectorSchema,
  input: z.object({ stdin: bytes.optional(), pty: bytes.optional() }),
});

export const SendSignalRequestSchema = z.object({
  process: ProcessSelectorSchema,
  signal: z.union([z.enum(['SIGNAL_UNSPECIFIED', 'SIGNAL_SIGTERM', 'SIGNAL_SIGKILL']), int32]),
});

export const EmptySchema = z.object({});

// ---- filesystem.Filesystem ------------------------------------------------------------------------

export const PathRequestSchema = z.object({ path: z.string() });
export const ListDirRequestSchema = z.object({ path: z.string(), depth: uint32.optional() });
export const MoveRequestSchema = z.object({ source: z.string(), destination: z.string() });
export const WatchDirRequestSchema = z.object({
  path: z.string(),
  recursive: z.boolean().optional(),
  includeEntry: z.boolean().optional(),
  allowNetworkMounts: z.boolean().optional(),
});
