// Which images a remote client may run (`image` in a create request): only from registries the
// operator lists in the server config (`images: { registries: [...] }`); none by default. A pull is
// the server reaching out to a registry and unpacking what it serves as root, so a client never
// picks the registry; and the reference must name its registry (a bare `name:tag` would go to the
// server's default registry or to an image loaded locally by the operator).
import { AirlockError } from '../core/errors.js';
import { parseImageRef } from '../images/reference.js';

/** The config key operators set (named in every refusal). */
export const IMAGE_REGISTRIES_KEY = 'images.registries';

/** Throws PERMISSION_DENIED unless `ref` names a registry in `registries` (host[:port], any case). */
export function checkImageAllowed(ref: string, registries: readonly string[]): void {
  if (registries.length === 0) {
    throw new AirlockError(
      'PERMISSION_DENIED',
      `images are disabled on this server: the operator lists the registries clients may use in the server config (${IMAGE_REGISTRIES_KEY})`,
      { field: 'image' },
    );
  }
  const parsed = parseImageRef(ref);
  const host = parsed.registry?.toLowerCase();
  if (host === undefined || !registries.some((r) => r.toLowerCase() === host)) {
    throw new AirlockError(
      'PERMISSION_DENIED',
      `image ${JSON.stringify(ref.slice(0, 200))} is not from a registry this server allows; name one of: ${registries.join(', ')} (${IMAGE_REGISTRIES_KEY} in the server config)`,
      { field: 'image' },
    );
  }
}
