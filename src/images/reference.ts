// Image references, docker-style: `[host[:port]/]path[:tag][@sha256:<hex>]`.
//
// Rules (the same as the distribution project's reference grammar, less its Docker-Hub specifics):
// - The first path component is a registry host when it contains "." or ":" or is "localhost";
//   otherwise the reference has no host and `defaultRegistry` (if set) is put in front. There is
//   no built-in default registry and no implicit "library/" prefix: an unqualified name is either
//   qualified by the caller's configured default or stays a local name (images made by `load`).
// - Path components are lower-case alphanumerics joined by ".", "_", "__" or runs of "-".
// - No tag and no digest means the tag "latest". A digest pins the content; a tag beside it is kept
//   for display only (the digest wins).
import { AirlockError } from '../core/errors.js';

export interface ImageRef {
  /** `host[:port]`, or undefined for a local name (no host, no default registry). */
  readonly registry: string | undefined;
  /** e.g. `team/py` */
  readonly repository: string;
  readonly tag: string | undefined;
  /** `sha256:<64 hex>` */
  readonly digest: string | undefined;
}

const COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const HOST =
  /^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]{1,5})?$/;
const TAG = /^[\w][\w.-]{0,127}$/;
export const SHA256_DIGEST = /^sha256:[a-f0-9]{64}$/;
const MAX_NAME = 255;

function bad(ref: string, what: string): AirlockError {
  return new AirlockError(
    'IMAGE_REF_INVALID',
    `image reference "${ref}" ${what} (forms: name:tag, host[:port]/path:tag, name@sha256:<64 hex>)`,
    { field: 'image' },
  );
}

/** Parses `text`; throws IMAGE_REF_INVALID naming what to fix. */
export function parseImageRef(text: string, defaultRegistry?: string): ImageRef {
  if (text.length === 0) throw bad(text, 'is empty');
  if (text.length > 512 || /[\s\0]/.test(text)) throw bad(text, 'has whitespace or is too long');
  let rest = text;
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!SHA256_DIGEST.test(digest)) throw bad(text, 'has a digest that is not sha256:<64 lower-case hex>');
  }
  let tag: string | undefined;
  const colon = rest.lastIndexOf(':');
  if (colon > rest.lastIndexOf('/')) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!TAG.test(tag)) throw bad(text, `has an invalid tag "${tag}" (letters, digits, _ . -; at most 128)`);
  }
  const parts = rest.split('/');
  let registry: string | undefined;
  const first = parts[0]!;
  if (parts.length > 1 && (first.includes('.') || first.includes(':') || first === 'localhost')) {
    if (!HOST.test(first)) throw bad(text, `has an invalid registry host "${first}"`);
    const port = first.includes(':') ? Number(first.split(':')[1]) : 0;
    if (port > 65535) throw bad(text, `has an invalid port in "${first}"`);
    registry = first.toLowerCase();
    parts.shift();
  }
  for (const p of parts) {
    if (!COMPONENT.test(p)) {
      throw bad(
        text,
        `has an invalid path component "${p}" (lower-case letters and digits, joined by . _ __ or -)`,
      );
    }
  }
  const repository = parts.join('/');
  if (repository.length > MAX_NAME) throw bad(text, `has a name over ${MAX_NAME} characters`);
  if (registry === undefined && defaultRegistry !== undefined && defaultRegistry !== '') {
    if (!HOST.test(defaultRegistry))
      throw bad(defaultRegistry, 'is not a valid default registry host[:port]');
    registry = defaultRegistry.toLowerCase();
  }
  if (tag === undefined && digest === undefined) tag = 'latest';
  return { registry, repository, tag, digest };
}

/** `repository` with its host: `host/path` or `path`. */
export function nameOf(r: ImageRef): string {
  return r.registry === undefined ? r.repository : `${r.registry}/${r.repository}`;
}

/** The normalised text of a reference: `host/path:tag`, `host/path@sha256:…` or `host/path:tag@sha256:…`. */
export function formatImageRef(r: ImageRef): string {
  return `${nameOf(r)}${r.tag === undefined ? '' : `:${r.tag}`}${r.digest === undefined ? '' : `@${r.digest}`}`;
}

/** True for hosts that are this machine: plain http is allowed to them. */
export function isLoopbackHost(hostPort: string): boolean {
  const host = hostPort.startsWith('[') ? hostPort.slice(1, hostPort.indexOf(']')) : hostPort.split(':')[0]!;
  return host === 'localhost' || host === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}
