// sbx.files: file operations run INSIDE the sandbox (as its uid, in its mount namespace), never by
// the root host process on the sandbox's directories. A symlink the sandbox planted therefore
// resolves inside the sandbox, never to a host path.
import { posix } from 'node:path';
import { AirlockError } from '../core/errors.js';

/** One entry of `sbx.files.list()`. */
export interface FileEntry {
  readonly name: string;
  readonly path: string;
  readonly type: 'file' | 'dir' | 'symlink' | 'other';
  readonly size: number;
  readonly mode: number;
  readonly mtimeMs: number;
}

/** Runs argv inside the sandbox (its uid, its mounts) and collects stdout as bytes. */
export type RunRaw = (
  argv: string[],
  o: { stdin?: Uint8Array | string; maxBytes: number },
) => Promise<{ exitCode: number | null; stdout: Buffer; stderr: string }>;

const DEFAULT_MAX_READ = 64 * 1024 * 1024;

/** Relative paths are relative to /workspace; the result is normalised and absolute. */
export function sandboxPath(p: string): string {
  if (typeof p !== 'string' || p === '' || p.includes('\0')) {
    throw new AirlockError('INVALID_ARGUMENT', 'path must be a non-empty string without NUL bytes', {
      field: 'path',
    });
  }
  return posix.resolve('/workspace', p);
}

export class SandboxFiles {
  constructor(private readonly run: RunRaw) {}

  async write(path: string, data: string | Uint8Array): Promise<void> {
    const p = sandboxPath(path);
    const r = await this.run(['/bin/sh', '-c', 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', 'sh', p], {
      stdin: data,
      maxBytes: 64 * 1024,
    });
    if (r.exitCode !== 0) throw fileError('write', p, r.stderr);
  }

  read(path: string, opts?: { format?: 'text'; maxBytes?: number }): Promise<string>;
  read(path: string, opts: { format: 'bytes'; maxBytes?: number }): Promise<Uint8Array>;
  async read(
    path: string,
    opts: { format?: 'text' | 'bytes'; maxBytes?: number } = {},
  ): Promise<string | Uint8Array> {
    const p = sandboxPath(path);
    const r = await this.run(['/bin/cat', '--', p], { maxBytes: opts.maxBytes ?? DEFAULT_MAX_READ });
    if (r.exitCode !== 0) throw fileError('read', p, r.stderr);
    return opts.format === 'bytes' ? new Uint8Array(r.stdout) : r.stdout.toString('utf8');
  }

  async list(dir = '/workspace'): Promise<FileEntry[]> {
    const p = sandboxPath(dir);
    const r = await this.run(
      ['/usr/bin/find', p, '-mindepth', '1', '-maxdepth', '1', '-printf', '%y\\0%s\\0%m\\0%T@\\0%f\\0'],
      { maxBytes: 16 * 1024 * 1024 },
    );
    if (r.exitCode !== 0) throw fileError('list', p, r.stderr);
    const f = r.stdout.toString('utf8').split('\0');
    const out: FileEntry[] = [];
    for (let i = 0; i + 4 < f.length; i += 5) {
      const name = f[i + 4]!;
      out.push({
        name,
        path: posix.join(p, name),
        type: f[i] === 'f' ? 'file' : f[i] === 'd' ? 'dir' : f[i] === 'l' ? 'symlink' : 'other',
        size: Number(f[i + 1]),
        mode: parseInt(f[i + 2]!, 8),
        mtimeMs: Math.round(Number(f[i + 3]) * 1000),
      });
    }
    return out.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  async exists(path: string): Promise<boolean> {
    const r = await this.run(['/usr/bin/test', '-e', sandboxPath(path)], { maxBytes: 64 * 1024 });
    return r.exitCode === 0;
  }

  async remove(path: string): Promise<void> {
    const p = sandboxPath(path);
    const r = await this.run(['/bin/rm', '-rf', '--', p], { maxBytes: 64 * 1024 });
    if (r.exitCode !== 0) throw fileError('remove', p, r.stderr);
  }
}

/** The typed error for a failed in-sandbox file command, from its stderr. */
export function fileError(op: string, path: string, stderr: string): AirlockError {
  const msg = stderr.trim().split('\n').pop() ?? '';
  if (/No such file or directory|Not a directory/.test(msg)) {
    return new AirlockError('FILE_NOT_FOUND', `${op} ${path}: no such file or directory`, { field: 'path' });
  }
  if (/Permission denied|Read-only file system|Operation not permitted/.test(msg)) {
    return new AirlockError('PERMISSION_DENIED', `${op} ${path}: ${msg.replace(/^[^:]*: /, '')}`, {
      field: 'path',
    });
  }
  if (/No space left on device|Disk quota exceeded/.test(msg)) {
    return new AirlockError('DISK_FULL', `${op} ${path}: the sandbox disk is full; raise limits.diskBytes`, {
      field: 'path',
    });
  }
  return new AirlockError('INTERNAL', `${op} ${path} failed: ${msg || 'unknown error'}`);
}
