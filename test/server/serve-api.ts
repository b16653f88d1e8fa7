// Small typed calls of the native REST API for the server tests (raw fetch: what any client sends).
import { expect } from 'vitest';
import { call, REQUEST_TIMEOUT_MS } from './serve-helpers.js';

export interface View {
  id: string;
  state: string;
  expiresAt: string | null;
  reason?: string;
  metadata: Record<string, string>;
}

export async function create(url: string, key: string, body: Record<string, unknown> = {}): Promise<View> {
  const r = await call(url, key, 'POST', '/v1/sandboxes', body);
  const text = await r.text();
  if (r.status !== 201) throw new Error(`create: HTTP ${r.status} ${text}`);
  return JSON.parse(text) as View;
}

export async function get(url: string, key: string, id: string): Promise<View> {
  const r = await call(url, key, 'GET', `/v1/sandboxes/${encodeURIComponent(id)}`);
  const text = await r.text();
  if (r.status !== 200) throw new Error(`get: HTTP ${r.status} ${text}`);
  return JSON.parse(text) as View;
}

/** Run a command; its stdout (decoded) and exit code. */
export async function exec(
  url: string,
  key: string,
  id: string,
  cmd: string | string[],
  signal?: AbortSignal,
): Promise<{ stdout: string; exitCode: number | null }> {
  const r = await fetch(`${url}/v1/sandboxes/${encodeURIComponent(id)}/exec`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ cmd }),
    signal: signal ?? AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`exec: HTTP ${r.status} ${text}`);
  let stdout = '';
  let exitCode: number | null | undefined;
  for (const line of text.split('\n').filter(Boolean)) {
    const e = JSON.parse(line) as { type: string; data?: string; exitCode?: number | null; message?: string };
    if (e.type === 'stdout') stdout += Buffer.from(e.data!, 'base64').toString('utf8');
    if (e.type === 'exit') exitCode = e.exitCode;
    if (e.type === 'error') throw new Error(`exec: ${e.message}`);
  }
  if (exitCode === undefined) throw new Error(`exec: no exit event in ${text}`);
  return { stdout, exitCode };
}

export async function writeFile(
  url: string,
  key: string,
  id: string,
  path: string,
  data: Uint8Array | string,
): Promise<Response> {
  return fetch(`${url}/v1/sandboxes/${encodeURIComponent(id)}/files?path=${encodeURIComponent(path)}`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/octet-stream' },
    body: typeof data === 'string' ? data : Buffer.from(data),
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
}

export async function readFile(url: string, key: string, id: string, path: string): Promise<string> {
  const r = await call(
    url,
    key,
    'GET',
    `/v1/sandboxes/${encodeURIComponent(id)}/files?path=${encodeURIComponent(path)}`,
  );
  const text = await r.text();
  if (r.status !== 200) throw new Error(`read: HTTP ${r.status} ${text}`);
  return text;
}

export async function kill(url: string, key: string, id: string): Promise<void> {
  const r = await call(url, key, 'DELETE', `/v1/sandboxes/${encodeURIComponent(id)}`);
  expect(r.status, await r.clone().text()).toBe(204);
}

/** The error body of a response, checked to be the one shape every route uses. */
export async function errorOf(r: Response): Promise<{ status: number; code: string; message: string }> {
  const body = (await r.json()) as { error: { code: string; message: string } };
  expect(typeof body.error.code).toBe('string');
  return { status: r.status, code: body.error.code, message: body.error.message };
}
