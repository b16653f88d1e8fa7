// `tsx bench/images.ts [--runs N] [--mib M] [--creates N] [--gap-ms G]`: cold pull + unpack of an image from a real
// registry (docker-registry in its own netns, reached over loopback, as in test/images/), in MB/s,
// beside `tar -x` (GNU tar, gzip through zlib) of the very same layer blobs, in one run; then
// `Sandbox.create` from the cached image, p50, beside create on the host root (interleaved, the same
// runtime and warm pool; target ≤ 1.2×). Prints a table and one JSON line. Not part of the test run;
// no numbers are written into docs by hand. State: AIRLOCK_BENCH_STATE_DIR, AIRLOCK_BENCH_UID_FIRST.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ImageStore } from '../src/images/store.js';
import { Airlock } from '../src/sandbox/airlock.js';
import type { SandboxSpecInput } from '../src/core/spec.js';
import { BENCH_STATE_DIR, BENCH_UID_RANGE } from './common.js';
import { summarize } from './stats.js';
import { busyboxEntries, imageOf, layerOf, pushImage, tarOf, type TarEntry } from '../test/images/build.js';
import { startRegistry } from '../test/images/registry.js';

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(name);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
}

/** Files that compress like real ones (~3:1): random words from a small vocabulary. */
function textish(bytes: number): Buffer {
  const words = Array.from({ length: 512 }, () => randomBytes(3 + (randomBytes(1)[0]! % 6)).toString('hex'));
  const out: string[] = [];
  let n = 0;
  while (n < bytes) {
    const w = words[randomBytes(2).readUInt16LE() % words.length]!;
    out.push(w);
    n += w.length + 1;
  }
  return Buffer.from(out.join(' ').slice(0, bytes));
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function main(): Promise<void> {
  const runs = arg('--runs', 3);
  const mib = arg('--mib', 48);
  const gapMs = arg('--gap-ms', 50);
  const work = mkdtempSync(join(tmpdir(), 'airlock-bench-images-'));
  const reg = await startRegistry();
  try {
    const perLayer = Math.ceil((mib * 1024 * 1024) / 3 / (256 * 1024));
    const dataLayer = (k: number): TarEntry[] => [
      { name: `data${k}/`, type: 'directory' },
      ...Array.from({ length: perLayer }, (_, i): TarEntry => ({
        name: `data${k}/f${i}`,
        content: textish(256 * 1024),
      })),
    ];
    const tars = [
      await tarOf(busyboxEntries()),
      await tarOf(dataLayer(1)),
      await tarOf(dataLayer(2)),
      await tarOf(dataLayer(3)),
    ];
    const img = imageOf(tars.map((t) => layerOf(t, 'gzip')));
    await pushImage(reg.host, 'bench/img', 'v1', img);
    const packed = img.layers.reduce((n, l) => n + l.blob.length, 0);
    const unpacked = tars.reduce((n, t) => n + t.length, 0);
    const blobs = img.layers.map((l, i) => {
      const f = join(work, `layer${i}.tar.gz`);
      writeFileSync(f, l.blob);
      return f;
    });
    const pull: number[] = [];
    const tarx: number[] = [];
    for (let r = 0; r < runs; r++) {
      const state = join(work, `state${r}`);
      const t0 = process.hrtime.bigint();
      await new ImageStore({ stateDir: state }).pull(`${reg.host}/bench/img:v1`);
      pull.push(Number(process.hrtime.bigint() - t0) / 1e9);
      rmSync(state, { recursive: true, force: true });
      const dir = join(work, `tar${r}`);
      const t1 = process.hrtime.bigint();
      for (const [i, b] of blobs.entries()) {
        mkdirSync(join(dir, String(i)), { recursive: true });
        execFileSync('tar', ['-xzf', b, '-C', join(dir, String(i))]);
      }
      tarx.push(Number(process.hrtime.bigint() - t1) / 1e9);
      rmSync(dir, { recursive: true, force: true });
    }
    // Spaced by --gap-ms (default 50; both kinds alike) so that the warm pool has refilled: what a
    // create finds under load that leaves it time to. Back to back (--gap-ms 0) an image create finds
    // no slot of its image ready (preparing one costs a cold create, tens of ms on a loaded host) and
    // makes its own while the refill prepares the next: that measures the prepare, not the take.
    const creates = await createFromImage(`${reg.host}/bench/img:v1`, arg('--creates', 30), undefined, gapMs);
    // Without the warm pool: what each create itself sets up (slot, mounts), nothing made ahead.
    const cold = await createFromImage(`${reg.host}/bench/img:v1`, arg('--creates', 30), 0);
    const mb = (b: number, s: number): number => b / 1e6 / s;
    const p = median(pull);
    const t = median(tarx);
    const rows = [
      ['measure', 'median s', 'MB/s compressed', 'MB/s unpacked'],
      [
        'airlock cold pull + unpack (registry, verify, unpack)',
        p.toFixed(3),
        mb(packed, p).toFixed(1),
        mb(unpacked, p).toFixed(1),
      ],
      [
        'tar -xzf of the same layer blobs (local files)',
        t.toFixed(3),
        mb(packed, t).toFixed(1),
        mb(unpacked, t).toFixed(1),
      ],
    ];
    rows.push(
      ['create (ms)', 'p50', 'p99', 'p50 vs host'],
      ['Sandbox.create on the host root', creates.host.p50.toFixed(1), creates.host.p99.toFixed(1), '1.00×'],
      [
        'Sandbox.create from the cached image',
        creates.image.p50.toFixed(1),
        creates.image.p99.toFixed(1),
        `${(creates.image.p50 / creates.host.p50).toFixed(2)}×`,
      ],
      ['create, no warm pool: host root', cold.host.p50.toFixed(1), cold.host.p99.toFixed(1), '1.00×'],
      [
        'create, no warm pool: cached image',
        cold.image.p50.toFixed(1),
        cold.image.p99.toFixed(1),
        `${(cold.image.p50 / cold.host.p50).toFixed(2)}×`,
      ],
    );
    for (const r of rows)
      process.stdout.write(
        `${r[0]!.padEnd(56)} ${r
          .slice(1)
          .map((c) => c.padStart(16))
          .join('')}\n`,
      );
    process.stdout.write(
      JSON.stringify({
        bench: 'images',
        runs,
        layers: tars.length,
        packedBytes: packed,
        unpackedBytes: unpacked,
        pullS: pull,
        tarS: tarx,
        ratio: p / t,
        createHostMs: creates.host,
        createImageMs: creates.image,
        createRatio: creates.image.p50 / creates.host.p50,
        coldCreateHostMs: cold.host,
        coldCreateImageMs: cold.image,
        coldCreateRatio: cold.image.p50 / cold.host.p50,
        createGapMs: gapMs,
      }) + '\n',
    );
  } finally {
    await reg.close();
    rmSync(work, { recursive: true, force: true });
  }
}

/**
 * Create-only time (kill not counted) on the host root and from `ref` (pulled into the runtime's
 * store first, so every timed create finds it cached), interleaved so that drift moves both alike.
 */
async function createFromImage(
  ref: string,
  n: number,
  warmPool?: number,
  gapMs = 0,
): Promise<{ host: ReturnType<typeof summarize>; image: ReturnType<typeof summarize> }> {
  const airlock = new Airlock({
    stateDir: BENCH_STATE_DIR,
    uidRange: BENCH_UID_RANGE,
    ...(warmPool !== undefined ? { warmPool } : {}),
  });
  try {
    await airlock.reapOrphans();
    await new ImageStore({ stateDir: BENCH_STATE_DIR }).pull(ref);
    const once = async (spec: SandboxSpecInput): Promise<number> => {
      const t0 = process.hrtime.bigint();
      const sbx = await airlock.create(spec);
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      await sbx.kill();
      if (gapMs > 0) await new Promise((r) => setTimeout(r, gapMs));
      return ms;
    };
    const image: SandboxSpecInput = { image: ref, pull: 'never' };
    for (let i = 0; i < 3; i++) {
      await once({}); // warm-up: the pool, the page cache, the image helper
      await once(image);
    }
    const host: number[] = [];
    const img: number[] = [];
    for (let i = 0; i < n; i++) {
      host.push(await once({}));
      img.push(await once(image));
    }
    return { host: summarize(host), image: summarize(img) };
  } finally {
    await airlock.close();
  }
}

await main();
