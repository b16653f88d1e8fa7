// watch(): changes in one directory of a sandbox, found by polling a listing taken INSIDE the sandbox.
// Why polling and not inotify: host-side inotify would have the root server open paths under the
// sandbox's own (writable, attacker-shaped) directories, where a planted symlink points anywhere on
// the host; an inotify tool inside the sandbox is not in every image (and gVisor's inotify differs).
// A listing by `find` in the sandbox, as its uid, is what files.list already trusts, on every tier.
// The cost: changes are seen at the poll interval, a rename is a remove plus a create, and a change
// undone within one interval is not seen.
import { AirlockError } from '../core/errors.js';
import type { Sandbox } from '../sandbox/airlock.js';
import { fileError, sandboxPath } from '../sandbox/files.js';
import type { FsEvent } from './contract.js';
import { FIND_FORMAT, parseFind, runIn } from './local-files.js';
import { PushQueue } from './queue.js';

type Sig = { type: string; size: number; mtimeMs: number; mode: number };

async function scan(sbx: Sandbox, dir: string): Promise<Map<string, Sig>> {
  const r = await runIn(sbx, ['/usr/bin/find', dir, '-maxdepth', '1', '-printf', FIND_FORMAT]);
  if (r.exitCode !== 0) throw fileError('watch', dir, r.stderr);
  const all = parseFind(r.stdout);
  const self = all.find((e) => e.path === dir);
  if (self && self.type !== 'dir') {
    throw new AirlockError('INVALID_ARGUMENT', `watch ${dir}: not a directory; watch its parent`, {
      field: 'path',
    });
  }
  return new Map(all.filter((e) => e.path !== dir).map((e) => [e.path, e]));
}

function diff(before: Map<string, Sig>, after: Map<string, Sig>): FsEvent[] {
  const out: FsEvent[] = [];
  for (const [path, a] of after) {
    const b = before.get(path);
    if (!b || b.type !== a.type) out.push({ type: 'create', path });
    else if (b.size !== a.size || b.mtimeMs !== a.mtimeMs) out.push({ type: 'write', path });
    else if (b.mode !== a.mode) out.push({ type: 'chmod', path });
  }
  for (const path of before.keys()) if (!after.has(path)) out.push({ type: 'remove', path });
  return out;
}

/** A watch stream with `ready`: resolved once the first listing is taken (changes after it are seen). */
export type WatchStream = AsyncIterable<FsEvent> & { readonly ready: Promise<void> };

/**
 * Poll `path` every `intervalMs` until `signal` aborts or the sandbox dies. Polling starts at once
 * (not at the first next()), so `ready` means what it says.
 */
export function pollWatch(
  sbx: Sandbox,
  path: string,
  o: { intervalMs: number; signal?: AbortSignal | undefined; onEnd?: () => void },
): WatchStream {
  const dir = sandboxPath(path);
  const stop = new AbortController();
  const signal = o.signal ? AbortSignal.any([o.signal, stop.signal]) : stop.signal;
  const q = new PushQueue<FsEvent>({ signal });
  const ready = scan(sbx, dir);
  ready.catch(() => {}); // the consumer sees it through `ready` or the stream
  const loop = async (): Promise<void> => {
    let last = await ready;
    while (!signal.aborted) {
      await new Promise<void>((resolve) => {
        const done = (): void => {
          clearTimeout(t);
          signal.removeEventListener('abort', done);
          resolve();
        };
        const t = setTimeout(done, o.intervalMs);
        signal.addEventListener('abort', done, { once: true });
      });
      if (signal.aborted || !sbx.alive) break;
      if (sbx.paused) continue; // frozen: nothing changes, and its files are refused
      let now: Map<string, Sig>;
      try {
        now = await scan(sbx, dir);
      } catch (e) {
        if (AirlockError.is(e, 'SANDBOX_PAUSED') || AirlockError.is(e, 'SANDBOX_GONE')) continue;
        // The directory itself went away: say so, then end.
        if (AirlockError.is(e, 'FILE_NOT_FOUND')) {
          q.push({ type: 'remove', path: dir });
          break;
        }
        throw e;
      }
      for (const e of diff(last, now)) q.push(e);
      last = now;
    }
  };
  loop()
    .then(
      () => q.end(),
      (e: unknown) => q.end(e),
    )
    .finally(() => o.onEnd?.());
  return {
    ready: ready.then(() => {}),
    async *[Symbol.asyncIterator]() {
      try {
        yield* q;
      } finally {
        stop.abort();
      }
    },
  };
}
