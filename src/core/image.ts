// Images: the seam between the image store (src/images/: pull, verify, unpack OCI images) and the
// tiers that run a sandbox on an image's root filesystem. Types only; no I/O here.
//
// An unpacked image layer is a directory in overlayfs format, the same format as snapshot layers:
// a deletion is a whiteout (char device 0/0), an opaque directory carries the xattr
// trusted.overlay.opaque=y. Layers are immutable once unpacked and are only ever mounted read-only
// (nosuid, nodev) as overlay lowers.

/** When to contact the registry for a reference: `missing` (default) pulls only what is not cached. */
export type PullPolicy = 'never' | 'missing' | 'always';
export const PULL_POLICIES: readonly PullPolicy[] = ['never', 'missing', 'always'];

/** What an image's config says about how its programs run (OCI image config, `config` object). */
export interface ImageConfig {
  /** `KEY=value` entries, in order. */
  readonly env: readonly string[];
  /** Absolute; '' when the image sets none. */
  readonly workingDir: string;
  /** `name`, `uid`, `uid:gid` or `name:group`; '' when the image sets none. */
  readonly user: string;
  readonly entrypoint: readonly string[];
  readonly cmd: readonly string[];
  readonly labels: Readonly<Record<string, string>>;
}

/** An image ready to be a sandbox's root. */
export interface ResolvedImage {
  /** The reference as the caller wrote it, normalised (e.g. `registry.example.com/team/py:3.12`). */
  readonly ref: string;
  /** The manifest digest the reference resolved to (`sha256:<hex>`): what actually runs. */
  readonly digest: string;
  /** Absolute host dirs of the unpacked layers, BOTTOM first (the manifest's order). */
  readonly layers: readonly string[];
  readonly config: ImageConfig;
}

/** Resolves an image reference to unpacked layers (pulling per `pull`). Implemented by src/images/. */
export interface ImageResolver {
  resolve(ref: string, options?: { pull?: PullPolicy; signal?: AbortSignal }): Promise<ResolvedImage>;
  /**
   * Optional: what `resolve` would return, when that is known now without a pull or a read (an image
   * resolved before and checked unchanged); undefined: call `resolve`. A create from a cached image
   * then resolves it without an asynchronous step. Must give exactly what `resolve` would.
   */
  cached?(ref: string, options?: { pull?: PullPolicy }): ResolvedImage | undefined;
  /** Optional: release what the resolver holds (watches); it may resolve again afterwards. */
  close?(): Promise<void>;
}
