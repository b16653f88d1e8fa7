// The one mapping from errors to HTTP responses of the server: an AirlockError keeps its code, message
// and field with the status httpStatusFor(code); anything else is a bare 500 INTERNAL (its details go
// to the logger, never to the client).
import { silentLogger, type Logger } from '../core/backend.js';
import { AirlockError, httpStatusFor } from '../core/errors.js';

/** The JSON error body of an error (an unexpected error becomes INTERNAL without its details). */
export function errorBody(e: unknown): { error: { code: string; message: string; field?: string } } {
  if (AirlockError.isInstance(e)) return { error: e.toJSON() };
  return { error: { code: 'INTERNAL', message: 'internal server error' } };
}

export function errorResponse(e: unknown, logger: Logger = silentLogger): Response {
  if (!AirlockError.isInstance(e)) {
    logger.error({ err: e instanceof Error ? (e.stack ?? e.message) : String(e) }, 'unexpected error');
  }
  // A refusal for quota (QuotaError) says when to retry.
  const retry = (e as { retryAfterSeconds?: unknown } | undefined)?.retryAfterSeconds;
  return Response.json(errorBody(e), {
    status: httpStatusFor(e),
    ...(typeof retry === 'number' ? { headers: { 'retry-after': String(retry) } } : {}),
  });
}

/** REQUEST_TOO_LARGE (413) for a body or upload over its cap. */
export function tooLarge(what: string, max: number): AirlockError {
  return new AirlockError(
    'REQUEST_TOO_LARGE',
    `the ${what} is larger than this server's cap of ${max} bytes; send less`,
    { field: 'body' },
  );
}
