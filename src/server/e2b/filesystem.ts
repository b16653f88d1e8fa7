// The envd `filesystem.Filesystem` service (Connect RPC, JSON) over a SandboxApi.
import { posix } from 'node:path';
import type { Hono } from 'hono';
import { AirlockError } from '../../core/errors.js';
import type { FileEntryView } from '../contract.js';
import { EnvdError, serverStream, unary } from './connect.js';
import {
  checkUser,
  e2bPath,
  envdError,
  rpcUser,
  target,
  whileKeyActive,
  type EnvdDeps,
  type Target,
} from './envd.js';
import {
  EmptySchema,
  ListDirRequestSchema,
  MoveRequestSchema,
  PathRequestSchema,
  WatchDirRequestSchema,
} from './schemas.js';

const FILE_TYPE: Record<FileEntryView['type'], string> = {
  file: 'FILE_TYPE_FILE',
  dir: 'FILE_TYPE_DIRECTORY',
  symlink: 'FILE_TYPE_SYMLINK',
  other: 'FILE_TYPE_UNSPECIFIED',
};

const EVENT_TYPE = {
  create: 'EVENT_TYPE_CREATE',
  write: 'EVENT_TYPE_WRITE',
  remove: 'EVENT_TYPE_REMOVE',
  rename: 'EVENT_TYPE_RENAME',
  chmod: 'EVENT_TYPE_CHMOD',
} as const;

/** `ls -l` style permissions, as envd reports them. */
function permissions(type: FileEntryView['type'], mode: number): string {
  const t = type === 'dir' ? 'd' : type === 'symlink' ? 'l' : '-';
  let s = '';
  for (let shift = 6; shift >= 0; shift -= 3) {
    const b = (mode >> shift) & 7;
    s += (b & 4 ? 'r' : '-') + (b & 2 ? 'w' : '-') + (b & 1 ? 'x' : '-');
  }
  return t + s;
}

/** A FileEntryView as envd's EntryInfo message (proto3 JSON). */
export function entryInfo(e: FileEntryView): Record<string, unknown> {
  return {
    name: e.name,
    type: FILE_TYPE[e.type],
    path: e.path,
    size: String(e.size),
    mode: e.mode & 0o7777,
    permissions: permissions(e.type, e.mode),
    owner: '',
    group: '',
    modifiedTime: new Date(e.mtimeMs).toISOString(),
  };
}

const UPLOAD_TMP_PREFIX = '.airlock-upload-';

/** At most this many entries in one ListDir answer (depth > 1 walks the tree). */
const MAX_LIST_ENTRIES = 10_000;

async function listDeep(deps: EnvdDeps, t: Target, root: string, depth: number): Promise<FileEntryView[]> {
  const out: FileEntryView[] = [];
  let level = [root];
  for (let d = 0; d < depth && level.length > 0; d++) {
    const next: string[] = [];
    for (const dir of level) {
      for (const e of await deps.api.listDir(t.id, dir, t.caller)) {
        out.push(e);
        if (out.length > MAX_LIST_ENTRIES) {
          throw new EnvdError(
            'resource_exhausted',
            `over ${MAX_LIST_ENTRIES} entries: list with a smaller depth`,
          );
        }
        if (e.type === 'dir') next.push(e.path);
      }
    }
    level = next;
  }
  return out;
}

async function exists(deps: EnvdDeps, t: Target, p: string): Promise<boolean> {
  try {
    await deps.api.stat(t.id, p, t.caller);
    return true;
  } catch (e) {
    if (AirlockError.is(e, 'FILE_NOT_FOUND')) return false;
    throw e;
  }
}

/** Move: `mv -T` inside the sandbox (argv, no shell), like envd's rename(2). */
async function move(deps: EnvdDeps, t: Target, src: string, dst: string): Promise<FileEntryView> {
  await deps.api.stat(t.id, src, t.caller); // FILE_NOT_FOUND for a missing source
  let stderr = '';
  let exitCode: number | null = null;
  for await (const ev of deps.api.exec(
    t.id,
    { cmd: ['mv', '-T', '--', src, dst], timeoutMs: 60_000 },
    t.caller,
  )) {
    if (ev.type === 'stderr') stderr += Buffer.from(ev.data, 'base64').toString('utf8');
    if (ev.type === 'exit') exitCode = ev.exitCode;
    if (ev.type === 'error') throw new EnvdError('internal', ev.message);
  }
  if (exitCode !== 0)
    throw new EnvdError(
      'failed_precondition',
      `cannot move ${src} to ${dst}: ${stderr.trim().slice(0, 500)}`,
    );
  return deps.api.stat(t.id, dst, t.caller);
}

function unsupported(what: string): () => Promise<never> {
  return () =>
    Promise.reject(new EnvdError('unimplemented', `${what} is not supported by Airlock (see docs/e2b.md)`));
}

export function mountFilesystem(app: Hono, deps: EnvdDeps): void {
  const P = '/filesystem.Filesystem/';
  const who = (c: Parameters<typeof target>[0]): Target => {
    checkUser(rpcUser(c));
    return target(c, deps);
  };

  app.post(
    `${P}Stat`,
    unary(
      PathRequestSchema,
      async (req, c) => {
        const t = who(c);
        return { entry: entryInfo(await deps.api.stat(t.id, e2bPath(req.path), t.caller)) };
      },
      envdError,
    ),
  );

  app.post(
    `${P}MakeDir`,
    unary(
      PathRequestSchema,
      async (req, c) => {
        const t = who(c);
        const p = e2bPath(req.path);
        if (await exists(deps, t, p)) throw new EnvdError('already_exists', `${p} already exists`);
        return { entry: entryInfo(await deps.api.makeDir(t.id, p, t.caller)) };
      },
      envdError,
    ),
  );

  app.post(
    `${P}Move`,
    unary(
      MoveRequestSchema,
      async (req, c) => {
        const t = who(c);
        return { entry: entryInfo(await move(deps, t, e2bPath(req.source), e2bPath(req.destination))) };
      },
      envdError,
    ),
  );

  app.post(
    `${P}ListDir`,
    unary(
      ListDirRequestSchema,
      async (req, c) => {
        const t = who(c);
        const depth = req.depth === undefined || req.depth === 0 ? 1 : req.depth;
        const entries = await listDeep(deps, t, e2bPath(req.path), depth);
        return { entries: entries.map(entryInfo) };
      },
      envdError,
    ),
  );

  app.post(
    `${P}Remove`,
    unary(
      PathRequestSchema,
      async (req, c) => {
        const t = who(c);
        await deps.api.remove(t.id, e2bPath(req.path), t.caller);
        return {};
      },
      envdError,
    ),
  );

  app.post(
    `${P}WatchDir`,
    serverStream(
      WatchDirRequestSchema,
      async function* ({ req, signal, c }) {
        const t = who(c);
        if (req.recursive) {
          throw new EnvdError(
            'unimplemented',
            'recursive watchDir is not supported by Airlock: watch each directory',
          );
        }
        const root = e2bPath(req.path);
        const st = await deps.api.stat(t.id, root, t.caller);
        if (st.type !== 'dir') throw new EnvdError('invalid_argument', `path: ${root} is not a directory`);
        const events = deps.api.watch(t.id, root, t.caller, signal);
        // The SDK acts on the start message (writes, expects events): it must mean the watch is
        // established, so that a change right after it is reported.
        if (events.ready) await events.ready;
        yield { start: {} };
        for await (const ev of whileKeyActive(deps, t, events)) {
          const rel = posix.relative(root, ev.path);
          if (rel === '' || rel.startsWith('..')) continue;
          if (rel.includes('/')) continue; // only the directory's own children
          // The temporary file an upload is written to before its rename (server/local-files.ts) is
          // an artefact of how Airlock writes, not a change the client made: E2B would not show it.
          if (rel.startsWith(UPLOAD_TMP_PREFIX)) continue;
          let entry: Record<string, unknown> | undefined;
          if (req.includeEntry && ev.type !== 'remove' && ev.type !== 'rename') {
            entry = await deps.api.stat(t.id, ev.path, t.caller).then(entryInfo, () => undefined);
          }
          yield { filesystem: { name: rel, type: EVENT_TYPE[ev.type], ...(entry ? { entry } : {}) } };
        }
      },
      envdError,
      { keepalive: {} },
    ),
  );

  for (const m of ['CreateWatcher', 'GetWatcherEvents', 'RemoveWatcher']) {
    app.post(`${P}${m}`, unary(EmptySchema, unsupported(`the polling watcher (${m})`), envdError));
  }
}
