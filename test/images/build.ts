// Test images, built here from files on this host (busybox-static), and a push helper that speaks the
// registry's upload API (monolithic blob uploads, manifest PUT): what `docker push` does, in 40 lines.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { pack } from 'tar-stream';

export const BUSYBOX = '/bin/busybox';
export const OCI_MANIFEST = 'application/vnd.oci.image.manifest.v1+json';
export const OCI_INDEX = 'application/vnd.oci.image.index.v1+json';

export interface TarEntry {
  readonly name: string;
  readonly type?: 'file' | 'directory' | 'symlink' | 'link' | 'character-device' | 'block-device' | 'fifo';
  readonly mode?: number;
  readonly uid?: number;
  readonly gid?: number;
  readonly content?: Buffer | string;
  readonly linkname?: string;
  readonly size?: number;
}

export const sha256 = (b: Buffer | string): string =>
  `sha256:${createHash('sha256').update(b).digest('hex')}`;

/** A tar of `entries`, in order (tar-stream's pack: ustar + pax for long names). */
export async function tarOf(entries: readonly TarEntry[]): Promise<Buffer> {
  const p = pack();
  const chunks: Buffer[] = [];
  const done = new Promise<void>((res, rej) => {
    p.on('data', (c: unknown) => chunks.push(c as Buffer));
    p.on('end', () => res());
    p.on('error', rej);
  });
  for (const e of entries) {
    const type = e.type ?? 'file';
    const content = e.content === undefined ? undefined : Buffer.from(e.content);
    await new Promise<void>((res, rej) =>
      p.entry(
        {
          name: e.name,
          type,
          mode: e.mode ?? (type === 'directory' ? 0o755 : 0o644),
          uid: e.uid ?? 0,
          gid: e.gid ?? 0,
          mtime: new Date(1_700_000_000_000),
          ...(e.linkname !== undefined ? { linkname: e.linkname } : {}),
          ...(e.size !== undefined ? { size: e.size } : {}),
        },
        type === 'file' ? (content ?? Buffer.alloc(0)) : Buffer.alloc(0),
        (err) => (err ? rej(err) : res()),
      ),
    );
  }
  p.finalize();
  await done;
  return Buffer.concat(chunks);
}

export type Compression = 'gzip' | 'zstd' | 'none';

export interface TestLayer {
  readonly blob: Buffer;
  readonly mediaType: string;
  readonly diffId: string;
}

const HAVE_ZSTD = (() => {
  try {
    execFileSync('zstd', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

/**
 * A valid zstd frame made by hand: 128 KiB blocks, each RLE when it is one repeated byte, else raw.
 * Used when the zstd tool is not installed (it is not part of the project's setup).
 */
export function zstdFrame(data: Buffer): Buffer {
  const BLOCK = 128 * 1024;
  const parts: Buffer[] = [Buffer.from([0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x38])]; // magic, no FCS, window 128 KiB
  let off = 0;
  do {
    const chunk = data.subarray(off, off + BLOCK);
    const last = off + BLOCK >= data.length ? 1 : 0;
    const rle = chunk.length > 0 && chunk.every((b) => b === chunk[0]);
    const h = last | ((rle ? 1 : 0) << 1) | (chunk.length << 3);
    parts.push(
      Buffer.from([h & 0xff, (h >> 8) & 0xff, (h >> 16) & 0xff]),
      rle ? chunk.subarray(0, 1) : chunk,
    );
    off += BLOCK;
  } while (off < data.length);
  return Buffer.concat(parts);
}

/** zstd with the real tool when present (compressed blocks), else zstdFrame. */
export function zstd(data: Buffer): Buffer {
  return HAVE_ZSTD
    ? execFileSync('zstd', ['-q', '-c'], { input: data, maxBuffer: 1 << 30 })
    : zstdFrame(data);
}

export function layerOf(tar: Buffer, c: Compression = 'gzip'): TestLayer {
  const blob = c === 'gzip' ? gzipSync(tar) : c === 'zstd' ? zstd(tar) : tar;
  const suffix = c === 'none' ? '' : `+${c}`;
  return { blob, mediaType: `application/vnd.oci.image.layer.v1.tar${suffix}`, diffId: sha256(tar) };
}

export interface TestImage {
  readonly config: Buffer;
  readonly layers: readonly TestLayer[];
  readonly manifest: Buffer;
  readonly digest: string;
}

export function imageOf(
  layers: readonly TestLayer[],
  o: { os?: string; architecture?: string; config?: Record<string, unknown>; diffIds?: string[] } = {},
): TestImage {
  const config = Buffer.from(
    JSON.stringify({
      os: o.os ?? 'linux',
      architecture: o.architecture ?? 'amd64',
      config: o.config ?? { Env: ['PATH=/bin'], WorkingDir: '/', Cmd: ['/bin/sh'] },
      rootfs: { type: 'layers', diff_ids: o.diffIds ?? layers.map((l) => l.diffId) },
    }),
  );
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: OCI_MANIFEST,
      config: {
        mediaType: 'application/vnd.oci.image.config.v1+json',
        digest: sha256(config),
        size: config.length,
      },
      layers: layers.map((l) => ({ mediaType: l.mediaType, digest: sha256(l.blob), size: l.blob.length })),
    }),
  );
  return { config, layers, manifest, digest: sha256(manifest) };
}

export function indexOf(
  entries: ReadonlyArray<{ image: TestImage; os: string; architecture: string }>,
): Buffer {
  return Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: OCI_INDEX,
      manifests: entries.map((e) => ({
        mediaType: OCI_MANIFEST,
        digest: e.image.digest,
        size: e.image.manifest.length,
        platform: { os: e.os, architecture: e.architecture },
      })),
    }),
  );
}

export async function pushBlob(host: string, repo: string, bytes: Buffer): Promise<string> {
  const digest = sha256(bytes);
  const start = await fetch(`http://${host}/v2/${repo}/blobs/uploads/`, { method: 'POST' });
  const loc = start.headers.get('location');
  if (start.status !== 202 || !loc) throw new Error(`blob upload start: HTTP ${start.status}`);
  const url = new URL(loc, `http://${host}`);
  url.searchParams.set('digest', digest);
  const res = await fetch(url, {
    method: 'PUT',
    body: bytes,
    headers: { 'content-type': 'application/octet-stream' },
  });
  if (res.status !== 201) throw new Error(`blob upload: HTTP ${res.status} ${await res.text()}`);
  return digest;
}

export async function pushManifest(
  host: string,
  repo: string,
  ref: string,
  bytes: Buffer,
  mediaType: string,
): Promise<string> {
  const res = await fetch(`http://${host}/v2/${repo}/manifests/${ref}`, {
    method: 'PUT',
    body: bytes,
    headers: { 'content-type': mediaType },
  });
  if (res.status !== 201) throw new Error(`manifest upload: HTTP ${res.status} ${await res.text()}`);
  return sha256(bytes);
}

/** Pushes every blob of `img` and its manifest under `tag`. */
export async function pushImage(host: string, repo: string, tag: string, img: TestImage): Promise<string> {
  await pushBlob(host, repo, img.config);
  for (const l of img.layers) await pushBlob(host, repo, l.blob);
  return pushManifest(host, repo, tag, img.manifest, OCI_MANIFEST);
}

/** The registry's file for a blob (tests tamper with it). */
export function registryBlobFile(storage: string, digest: string): string {
  const hex = digest.slice(7);
  return join(storage, 'docker/registry/v2/blobs/sha256', hex.slice(0, 2), hex, 'data');
}

/** Layer 1: busybox and a few applet links, /etc/motd, /opt/data/{a,b}. */
export function busyboxEntries(): TarEntry[] {
  return [
    { name: 'bin/', type: 'directory' },
    { name: 'bin/busybox', content: readFileSync(BUSYBOX), mode: 0o755 },
    ...['sh', 'ls', 'cat', 'echo'].map((a): TarEntry => ({
      name: `bin/${a}`,
      type: 'symlink',
      linkname: 'busybox',
    })),
    { name: 'etc/', type: 'directory' },
    { name: 'etc/motd', content: 'hello from layer 1\n' },
    { name: 'etc/owned', content: 'x', uid: 1000, gid: 1001 },
    { name: 'opt/data/', type: 'directory' },
    { name: 'opt/data/a', content: 'a' },
    { name: 'opt/data/b', content: 'b' },
  ];
}

/** Layer 2: deletes /etc/motd (whiteout), replaces /opt/data (opaque), adds a file and a hard link to it. */
export function overlayEntries(): TarEntry[] {
  return [
    { name: 'etc/.wh.motd' },
    { name: 'opt/data/', type: 'directory' },
    { name: 'opt/data/.wh..wh..opq' },
    { name: 'opt/data/c', content: 'c from layer 2\n' },
    { name: 'opt/data/c2', type: 'link', linkname: 'opt/data/c' },
  ];
}

/** `img` as an OCI image layout directory at `dir`, its one manifest named `refName`. */
export function writeLayout(dir: string, img: TestImage, refName: string): void {
  const blobs = join(dir, 'blobs', 'sha256');
  mkdirSync(blobs, { recursive: true });
  for (const b of [img.config, img.manifest, ...img.layers.map((l) => l.blob)])
    writeFileSync(join(blobs, sha256(b).slice(7)), b);
  writeFileSync(join(dir, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  writeFileSync(
    join(dir, 'index.json'),
    JSON.stringify({
      schemaVersion: 2,
      manifests: [
        {
          mediaType: OCI_MANIFEST,
          digest: img.digest,
          size: img.manifest.length,
          annotations: { 'org.opencontainers.image.ref.name': refName },
        },
      ],
    }),
  );
}
