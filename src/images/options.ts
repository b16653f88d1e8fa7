// Image store options from the environment (the CLI's, and the library's defaults):
//   AIRLOCK_IMAGE_REGISTRY        host[:port] put in front of references without a host (none by default)
//   AIRLOCK_INSECURE_REGISTRIES   comma-separated host[:port] reached over plain http (loopback always is)
//   AIRLOCK_REGISTRY_AUTH_FILE    a docker-style config.json: {"auths": {"host": {"auth": base64(user:pass)}}}
//                                 or {"username", "password"} per host
//   AIRLOCK_MAX_IMAGE_BYTES       cap on an image (bytes)
import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { AirlockError } from '../core/errors.js';
import type { RegistryCredentials } from './registry.js';

const AuthFile = z.object({
  auths: z.record(
    z.string(),
    z.object({
      auth: z.string().optional(),
      username: z.string().optional(),
      password: z.string().optional(),
    }),
  ),
});

/** Credentials per registry host from a docker-style auth file. */
export function credentialsFromFile(file: string): (registry: string) => RegistryCredentials | undefined {
  let parsed: z.infer<typeof AuthFile>;
  try {
    parsed = AuthFile.parse(JSON.parse(readFileSync(file, 'utf8')));
  } catch (e) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `registry auth file ${file} is not {"auths": {host: {auth | username, password}}}: ${(e as Error).message.slice(0, 200)}`,
      { field: 'AIRLOCK_REGISTRY_AUTH_FILE' },
    );
  }
  return (registry) => {
    const a = parsed.auths[registry] ?? parsed.auths[`https://${registry}`];
    if (!a) return undefined;
    if (a.username !== undefined && a.password !== undefined)
      return { username: a.username, password: a.password };
    if (a.auth === undefined) return undefined;
    const text = Buffer.from(a.auth, 'base64').toString('utf8');
    const colon = text.indexOf(':');
    return colon < 0 ? undefined : { username: text.slice(0, colon), password: text.slice(colon + 1) };
  };
}

export interface ImageEnvOptions {
  defaultRegistry?: string;
  insecure?: string[];
  credentials?: (registry: string) => RegistryCredentials | undefined;
  maxImageBytes?: number;
}

export function imageOptionsFromEnv(env: NodeJS.ProcessEnv = process.env): ImageEnvOptions {
  const o: ImageEnvOptions = {};
  if (env.AIRLOCK_IMAGE_REGISTRY) o.defaultRegistry = env.AIRLOCK_IMAGE_REGISTRY;
  if (env.AIRLOCK_INSECURE_REGISTRIES)
    o.insecure = env.AIRLOCK_INSECURE_REGISTRIES.split(',')
      .map((s) => s.trim())
      .filter(Boolean);
  if (env.AIRLOCK_REGISTRY_AUTH_FILE) o.credentials = credentialsFromFile(env.AIRLOCK_REGISTRY_AUTH_FILE);
  if (env.AIRLOCK_MAX_IMAGE_BYTES) {
    const n = Number(env.AIRLOCK_MAX_IMAGE_BYTES);
    if (!Number.isSafeInteger(n) || n <= 0)
      throw new AirlockError(
        'INVALID_ARGUMENT',
        `AIRLOCK_MAX_IMAGE_BYTES must be a positive number of bytes, not "${env.AIRLOCK_MAX_IMAGE_BYTES}"`,
        { field: 'AIRLOCK_MAX_IMAGE_BYTES' },
      );
    o.maxImageBytes = n;
  }
  return o;
}
