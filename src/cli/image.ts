// `airlock image ls|pull|rm|prune|load`: the OCI image store in this state dir (AIRLOCK_STATE_DIR).
// Pull progress is one updating line on a TTY (bytes and layers), plain lines otherwise; --json prints
// one JSON document at the end. Registry settings come from the environment (src/images/options.ts).
import type { ResolvedImage } from '../core/image.js';
import { formatBytes } from '../core/units.js';
import { imageLayerInUse, preparedSlotMount } from '../backends/host/index.js';
import { mountedLayerPredicate } from '../images/in-use.js';
import { loadImages } from '../images/load.js';
import { imageOptionsFromEnv } from '../images/options.js';
import { ImageStore, type PullEvent } from '../images/store.js';
import { DEFAULT_STATE_DIR } from '../sandbox/airlock.js';
import { processIo, type Io } from './defaults.js';
import { table } from './table.js';

const short = (d: string): string => d.slice(0, 19); // sha256: + 12 hex

/**
 * The CLI's store: a layer is "in use" while a live sandbox's record names it (written before the
 * sandbox mounts it), a create holds the claim of a warm slot holding it, or any mount on the host
 * names it (backends/host imageLayerInUse).
 */
export function cliImageStore(env: NodeJS.ProcessEnv = process.env): ImageStore {
  const stateDir = env.AIRLOCK_STATE_DIR ?? DEFAULT_STATE_DIR;
  const store: ImageStore = new ImageStore({
    stateDir,
    ...imageOptionsFromEnv(env),
    inUse: (dir) => imageLayerInUse(stateDir, dir) || mounted(dir),
  });
  const mounted = mountedLayerPredicate(store.root, preparedSlotMount(stateDir));
  return store;
}

/** Renders pull events: an updating line on a TTY, one line per layer otherwise. */
export function progressPrinter(
  io: Io,
  tty: boolean,
): { onProgress: (e: PullEvent) => void; end: () => void } {
  let total = 0;
  let layers = 0;
  let done = 0;
  let got = 0;
  let open = false;
  const sizes = new Map<number, number>();
  const line = (text: string): void => {
    if (tty) {
      io.err(`\r\x1b[K${text}`);
      open = true;
    } else io.err(`${text}\n`);
  };
  const bar = (): string => {
    const width = 20;
    const f = total > 0 ? Math.min(1, got / total) : 1;
    return `[${'#'.repeat(Math.round(f * width)).padEnd(width, '-')}] ${formatBytes(got)}/${formatBytes(total)}`;
  };
  return {
    onProgress(e) {
      switch (e.kind) {
        case 'resolved':
          total = e.bytes;
          layers = e.layers;
          if (!tty)
            io.err(
              `${e.ref}: ${e.digest}, ${e.layers} layer${e.layers === 1 ? '' : 's'}, ${formatBytes(e.bytes)}\n`,
            );
          return;
        case 'layer':
          sizes.set(e.index, e.size);
          if (e.cached) {
            done++;
            got += e.size;
            if (!tty) io.err(`layer ${e.index + 1}/${layers} ${short(e.digest)}: cached\n`);
          }
          if (tty) line(`layers ${done}/${layers} ${bar()}`);
          return;
        case 'bytes':
          got += e.bytes;
          if (tty) line(`layers ${done}/${layers} ${bar()}`);
          return;
        case 'layer-done':
          done++;
          if (tty) line(`layers ${done}/${layers} ${bar()}`);
          else
            io.err(
              `layer ${e.index + 1}/${layers} ${short(e.digest)}: ${formatBytes(sizes.get(e.index) ?? 0)} pulled\n`,
            );
          return;
      }
    },
    end() {
      if (open) io.err('\n');
      open = false;
    },
  };
}

function summary(r: ResolvedImage): string {
  return `${r.ref} ${r.digest}\n`;
}

export async function imagePullCommand(
  ref: string,
  opts: { json?: boolean },
  io: Io = processIo,
  tty = process.stderr.isTTY === true,
): Promise<number> {
  const store = cliImageStore();
  const p = progressPrinter(io, tty && !opts.json);
  try {
    const r = await store.pull(ref, { pull: 'always', onProgress: p.onProgress });
    p.end();
    io.out(opts.json ? JSON.stringify(r, null, 2) + '\n' : summary(r));
    return 0;
  } finally {
    p.end();
  }
}

export async function imageLoadCommand(
  path: string,
  opts: { json?: boolean; name?: string },
  io: Io = processIo,
  tty = process.stderr.isTTY === true,
): Promise<number> {
  const store = cliImageStore();
  const p = progressPrinter(io, tty && !opts.json);
  try {
    const loaded = await loadImages(store, path, {
      onProgress: p.onProgress,
      ...(opts.name ? { name: opts.name } : {}),
    });
    p.end();
    io.out(opts.json ? JSON.stringify(loaded, null, 2) + '\n' : loaded.map(summary).join(''));
    return 0;
  } finally {
    p.end();
  }
}

export async function imageListCommand(opts: { json?: boolean }, io: Io = processIo): Promise<number> {
  const store = cliImageStore();
  const images = store.list();
  if (opts.json) {
    io.out(JSON.stringify(images, null, 2) + '\n');
    return 0;
  }
  if (images.length === 0) {
    io.out(`no images in ${store.root}\n`);
    return 0;
  }
  const rows = [['REF', 'DIGEST', 'LAYERS', 'SIZE', 'PULLED']];
  for (const i of images)
    rows.push([
      i.ref,
      short(i.digest),
      String(i.layers),
      formatBytes(i.sizeBytes),
      i.pulledAt.replace('T', ' ').replace(/\.\d+Z$/, 'Z'),
    ]);
  io.out(table(rows));
  return 0;
}

export async function imageRemoveCommand(
  ref: string,
  opts: { json?: boolean },
  io: Io = processIo,
): Promise<number> {
  const r = await cliImageStore().remove(ref);
  if (opts.json) io.out(JSON.stringify(r, null, 2) + '\n');
  else {
    io.out(
      `removed ${r.ref} (${r.removedLayers.length} layer${r.removedLayers.length === 1 ? '' : 's'} freed)\n`,
    );
    if (r.keptInUse.length)
      io.err(`kept ${r.keptInUse.length} layer(s) a live sandbox uses; prune frees them later\n`);
  }
  return 0;
}

export async function imagePruneCommand(opts: { json?: boolean }, io: Io = processIo): Promise<number> {
  const env = process.env;
  const stateDir = env.AIRLOCK_STATE_DIR ?? DEFAULT_STATE_DIR;
  const r = await cliImageStore(env).prune();
  // Allowlist roots (`executables`) no live sandbox and no snapshot uses go too.
  const { closuresDir, pruneClosures } = await import('../images/closure-cache.js');
  const mounted = mountedLayerPredicate(closuresDir(stateDir), preparedSlotMount(stateDir));
  const c = pruneClosures(stateDir, (dir) => imageLayerInUse(stateDir, dir) || mounted(dir));
  if (opts.json) io.out(JSON.stringify({ ...r, ...c }, null, 2) + '\n');
  else
    io.out(
      `freed ${r.removedLayers.length} layer(s)${r.keptInUse.length ? `; kept ${r.keptInUse.length} in use` : ''}` +
        `; freed ${c.removedClosures.length} executables root(s)\n`,
    );
  return 0;
}
