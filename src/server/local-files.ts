// Files of the server API, streamed both ways. Like sbx.files, every operation runs INSIDE the
// sandbox (its uid, its mount namespace) through the library's spawn(): the root server process never
// opens a path under a sandbox's directories, so a symlink the sandbox planted resolves inside it.
import { randomBytes } from 'node:crypto';
import { posix } from 'node:path';
import type { Readable } from 'node:stream';
import { AirlockError } from '../core/errors.js';
import type { Sandbox } from '../sandbox/airlock.js';
import { fileError, sandboxPath } from '../sandbox/files.js';
import type { SandboxProcess } from '../sandbox/sandbox.js';
import type { FileEntryView } from './contract.js';

const STDERR_MAX = 64 * 1024;

/** Collect at most `max` bytes of a pipe (the rest is read and dropped so the writer never stalls). */
function collect(src: Readable, max: number): Promise<Buffer> {
  const parts: Buffer[] = [];
  let n = 0;
  src.on('data', (c: Buffer) => {
    if (n >= max) return;
    parts.push(c.subarray(0, max - n));
    n += c.length;
  });
  return new Promise((resolve) => {
    const done = (): void => resolve(Buffer.concat(parts));
    src.once('close', done);
    src.once('end', done);
    src.once('error', done);
  });
}

/** Run argv in the sandbox (cwd /) and collect its output. */
export async function runIn(
  sbx: Sandbox,
  argv: string[],
  maxBytes = 16 * 1024 * 1024,
): Promise<{ exitCode: number | null; stdout: Buffer; stderr: string }> {
  const p = await sbx.spawn(argv, { cwd: '/' });
  p.stdin.end();
  const [stdout, stderr, exit] = await Promise.all([
    collect(p.stdout, maxBytes),
    collect(p.stderr, STDERR_MAX),
    p.exited,
  ]);
  return { exitCode: exit.exitCode, stdout, stderr: stderr.toString('utf8') };
}

const TYPE: Record<string, FileEntryView['type']> = { f: 'file', d: 'dir', l: 'symlink' };
/** find -printf fields of one entry, NUL-separated (names may hold any byte but NUL and "/"). */
export const FIND_FORMAT = '%y\\0%s\\0%m\\0%T@\\0%p\\0';

/** Parse FIND_FORMAT output. */
export function parseFind(out: Buffer): FileEntryView[] {
  const f = out.toString('utf8').split('\0');
  const entries: FileEntryView[] = [];
  for (let i = 0; i + 4 < f.length; i += 5) {
    const path = f[i + 4]!;
    entries.push({
      name: posix.basename(path) || '/',
      path,
      type: TYPE[f[i]!] ?? 'other',
      size: Number(f[i + 1]),
      mode: parseInt(f[i + 2]!, 8),
      mtimeMs: Math.round(Number(f[i + 3]) * 1000),
    });
  }
  return entries;
}

export async function statPath(sbx: Sandbox, path: string): Promise<FileEntryView> {
  const p = sandboxPath(path);
  const r = await runIn(sbx, ['/usr/bin/find', p, '-maxdepth', '0', '-printf', FIND_FORMAT]);
  if (r.exitCode !== 0) throw fileError('stat', p, r.stderr);
  const [e] = parseFind(r.stdout);
  if (!e) throw new AirlockError('FILE_NOT_FOUND', `stat ${p}: no such file or directory`, { field: 'path' });
  return e;
}

export async function listPath(sbx: Sandbox, path: string): Promise<FileEntryView[]> {
  const p = sandboxPath(path);
  const r = await runIn(sbx, [
    '/usr/bin/find',
    p,
    '-mindepth',
    '1',
    '-maxdepth',
    '1',
    '-printf',
    FIND_FORMAT,
  ]);
  if (r.exitCode !== 0) throw fileError('list', p, r.stderr);
  return parseFind(r.stdout).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

export async function removePath(sbx: Sandbox, path: string): Promise<void> {
  const p = sandboxPath(path);
  // No -f: a path that is not there is FILE_NOT_FOUND, not a silent success. stdin is a pipe, so
  // rm never prompts.
  const r = await runIn(sbx, ['/bin/rm', '-r', '--', p]);
  if (r.exitCode !== 0) throw fileError('remove', p, r.stderr);
}

export async function makeDir(sbx: Sandbox, path: string): Promise<FileEntryView> {
  const p = sandboxPath(path);
  const r = await runIn(sbx, ['/bin/mkdir', '-p', '--', p]);
  if (r.exitCode !== 0) throw fileError('mkdir', p, r.stderr);
  return statPath(sbx, p);
}

/**
 * The file's bytes as a stream. Waits for the first bytes (or the end) before returning, so that a
 * missing file is an error here rather than a broken stream. Cancelling the stream kills the reader.
 */
export async function readStream(
  sbx: Sandbox,
  path: string,
  signal?: AbortSignal,
): Promise<ReadableStream<Uint8Array>> {
  const p = sandboxPath(path);
  // `signal` kills the reader, also while it waits for a first byte that never comes (a FIFO).
  const proc = await sbx.spawn(['/bin/cat', '--', p], { cwd: '/', ...(signal ? { signal } : {}) });
  proc.stdin.end();
  const stderr = collect(proc.stderr, STDERR_MAX);
  const out = proc.stdout;
  const failed = async (): Promise<AirlockError | undefined> => {
    const [exit, err] = await Promise.all([proc.exited, stderr]);
    return exit.exitCode === 0 ? undefined : fileError('read', p, err.toString('utf8'));
  };
  // Pull-based: the pipe is read only as fast as the client takes the bytes.
  const chunks = out[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  const first = await chunks.next();
  if (first.done) {
    const err = await failed();
    if (err) throw err;
  }
  let pending: Buffer | undefined = first.done ? undefined : first.value;
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (pending) {
        controller.enqueue(new Uint8Array(pending));
        pending = undefined;
        return;
      }
      const next = await chunks.next();
      if (!next.done) {
        controller.enqueue(new Uint8Array(next.value));
        return;
      }
      const err = await failed();
      if (err) controller.error(err);
      else controller.close();
    },
    async cancel() {
      await proc.kill();
      await chunks.return?.();
    },
  });
}

/**
 * Write a stream to a file: into a temporary name beside it, renamed over the path once complete, so
 * a failed or oversized upload leaves the old file (or none), never half a file. `body` erroring
 * (e.g. the upload cap) kills the writer and removes the temporary file. A symlink at the path is
 * written through, as sbx.files.write does: the path is resolved (readlink -f, inside the sandbox, as
 * its uid) and the file renamed over its target, not over the link.
 */
export async function writeStream(
  sbx: Sandbox,
  path: string,
  body: ReadableStream<Uint8Array>,
): Promise<FileEntryView> {
  const p = sandboxPath(path);
  const tmp = `.airlock-upload-${randomBytes(6).toString('hex')}`;
  // mv -T: a directory at the path is an error, not a place to move the file into.
  const proc: SandboxProcess = await sbx.spawn(
    [
      '/bin/sh',
      '-c',
      'mkdir -p -- "${1%/*}/" && t=$(readlink -f -- "$1") && cat > "${t%/*}/$2" && mv -fT -- "${t%/*}/$2" "$t"',
      'sh',
      p,
      tmp,
    ],
    { cwd: '/' },
  );
  const removeTmp = (): Promise<unknown> =>
    runIn(sbx, ['/bin/sh', '-c', 't=$(readlink -f -- "$1") && rm -f -- "${t%/*}/$2"', 'sh', p, tmp]).catch(
      () => {},
    );
  const stderr = collect(proc.stderr, STDERR_MAX);
  void collect(proc.stdout, 0);
  const reader = body.getReader();
  let closed = false;
  let wake: (() => void) | undefined;
  proc.stdin.once('close', () => {
    closed = true;
    wake?.();
  });
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (!closed && !proc.stdin.write(value)) {
        await new Promise<void>((resolve) => {
          wake = resolve;
          proc.stdin.once('drain', resolve);
        });
      }
      if (closed) {
        await reader.cancel().catch(() => {});
        break; // the writer died (e.g. mkdir failed): its stderr says why
      }
    }
    proc.stdin.end();
  } catch (e) {
    await proc.kill();
    await removeTmp();
    throw e;
  } finally {
    reader.releaseLock();
  }
  const [exit, err] = await Promise.all([proc.exited, stderr]);
  if (exit.exitCode !== 0) {
    await removeTmp();
    throw fileError('write', p, err.toString('utf8'));
  }
  return statPath(sbx, p);
}
