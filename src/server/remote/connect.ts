// The SandboxApi a RemoteAirlock talks to: RemoteSandboxApi (server/client.ts), the native REST API
// over HTTP (a URL) with the API key as a bearer token.
import { AirlockError } from '../../core/errors.js';
import { RemoteSandboxApi } from '../client.js';
import type { SandboxApi } from '../contract.js';

/** A SandboxApi over the native REST API at `apiUrl`, authenticated with `apiKey` when given. */
export function remoteSandboxApi(apiUrl: string, apiKey: string | undefined): SandboxApi {
  let url: URL;
  try {
    url = new URL(apiUrl);
  } catch {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `apiUrl "${apiUrl}" is not a URL; give e.g. http://127.0.0.1:8787`,
      {
        field: 'apiUrl',
      },
    );
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new AirlockError('INVALID_ARGUMENT', `apiUrl must be http:// or https:// (got ${url.protocol})`, {
      field: 'apiUrl',
    });
  }
  return new RemoteSandboxApi({ baseUrl: apiUrl, ...(apiKey !== undefined ? { apiKey } : {}) });
}
