// `tsx bench/images.ts [--runs N] [--mib M]`: cold pull + unpack of an image from a real registry
// (docker-registry in its own netns, reached over loopback, as in test/images/), in MB/s, beside
// `tar -x` (GNU tar, gzip through zlib) of the very same layer blobs, in one run. Prints a table and
// one JSON line. Not part of the test run; no numbers are written into docs by hand.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ImageStore } from '../src/images/store.js';
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
      }) + '\n',
    );
  } finally {
    await reg.close();
    rmSync(work, { recursive: true, force: true });
  }
}

await main();
