// sbx.files of a remote sandbox: the library's files API (read/write/list/exists/remove) plus stat,
// makeDir and watch, over the native API's streamed file routes.
import { AirlockError } from '../../core/errors.js';
import type { FileEntry } from '../../sandbox/files.js';
import { sandboxPath } from '../../sandbox/files.js';
import type { Caller, FsEvent, SandboxApi } from '../contract.js';

const DEFAULT_MAX_READ = 64 * 1024 * 1024;

export class RemoteFiles {
  constructor(
    private readonly id: string,
    private readonly api: SandboxApi,
    private readonly caller: Caller,
    private readonly check: () => void,
    private readonly mapError: (e: unknown) => unknown,
  ) {}

  private async call<T>(f: () => Promise<T>): Promise<T> {
    this.check();
    try {
      return await f();
    } catch (e) {
      throw this.mapError(e);
    }
  }

  async write(path: string, data: string | Uint8Array): Promise<void> {
    const p = sandboxPath(path);
    const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
    await this.call(() => this.api.writeFile(this.id, p, bytesStream(bytes), this.caller));
  }

  read(path: string, opts?: { format?: 'text'; maxBytes?: number }): Promise<string>;
  read(path: string, opts: { format: 'bytes'; maxBytes?: number }): Promise<Uint8Array>;
  async read(
    path: string,
    opts: { format?: 'text' | 'bytes'; maxBytes?: number } = {},
  ): Promise<string | Uint8Array> {
    const p = sandboxPath(path);
    const max = opts.maxBytes ?? DEFAULT_MAX_READ;
    const bytes = await this.call(async () => {
      const stream = await this.api.readFile(this.id, p, this.caller);
      const parts: Uint8Array[] = [];
      let n = 0;
      const reader = stream.getReader();
      try {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          n += value.length;
          if (n > max) {
            throw new AirlockError(
              'FILE_TOO_LARGE',
              `file is larger than maxBytes (${max}); raise maxBytes or read it with exec`,
            );
          }
          parts.push(value);
        }
      } finally {
        // Stop the download at once when the cap is hit (the server then stops reading the file).
        await reader.cancel().catch(() => {});
      }
      return Buffer.concat(parts);
    });
    return opts.format === 'bytes' ? new Uint8Array(bytes) : bytes.toString('utf8');
  }

  async list(dir = '/workspace'): Promise<FileEntry[]> {
    const p = sandboxPath(dir);
    const entries = await this.call(() => this.api.listDir(this.id, p, this.caller));
    return entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  async stat(path: string): Promise<FileEntry> {
    const p = sandboxPath(path);
    return this.call(() => this.api.stat(this.id, p, this.caller));
  }

  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (e) {
      if (AirlockError.is(e, 'FILE_NOT_FOUND')) return false;
      throw e;
    }
  }

  /** Remove a file or a whole tree; nothing there already is fine (as `rm -rf`, the library's remove). */
  async remove(path: string): Promise<void> {
    const p = sandboxPath(path);
    try {
      await this.call(() => this.api.remove(this.id, p, this.caller));
    } catch (e) {
      if (!AirlockError.is(e, 'FILE_NOT_FOUND')) throw e;
    }
  }

  /** Create a directory (and its parents). */
  async makeDir(path: string): Promise<FileEntry> {
    const p = sandboxPath(path);
    return this.call(() => this.api.makeDir(this.id, p, this.caller));
  }

  /** Changes under a directory, until `signal` aborts or the sandbox dies. */
  watch(path: string, opts: { signal?: AbortSignal } = {}): AsyncIterable<FsEvent> {
    const p = sandboxPath(path);
    this.check();
    return this.api.watch(this.id, p, this.caller, opts.signal);
  }
}

function bytesStream(bytes: Uint8Array): ReadableStream<Uint8Array> {
  const CHUNK = 256 * 1024;
  let i = 0;
  return new ReadableStream<Uint8Array>({
    pull(controller) {
      if (i >= bytes.length) {
        controller.close();
        return;
      }
      controller.enqueue(bytes.subarray(i, i + CHUNK));
      i += CHUNK;
    },
  });
}
