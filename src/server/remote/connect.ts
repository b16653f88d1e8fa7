// The SandboxApi a RemoteAirlock talks to: RemoteSandboxApi (server/client.ts) over HTTP.
import { AirlockError } from '../../core/errors.js';
import type { SandboxApi } from '../contract.js';

/** A SandboxApi over the native REST API at `apiUrl`, authenticated with `apiKey` when given. */
export function remoteSandboxApi(apiUrl: string, apiKey: string | undefined): SandboxApi {
  void apiKey;
  throw new AirlockError('BACKEND_UNAVAILABLE', `no HTTP client for ${apiUrl} yet (RemoteSandboxApi)`);
}
