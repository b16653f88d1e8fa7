// What one sandbox is made of on the host, as paths: the dirs and mounts a tier shows its processes
// (bwrap binds them, runsc's OCI bundle mounts them). Host state (host/) fills it in at create.
/** Where the static helper (busybox) is bound in a sandbox on an image root. */
export const IMAGE_HELPER_PATH = '/.airlock/bin/busybox';

export interface SandboxLayout {
  /** Generated /etc, bound read-only. */
  readonly etcDir: string;
  /** The sandbox's /workspace: overlay mount, a plain dir on the sandbox disk, or a host dir (ro). */
  readonly workspaceDir: string;
  readonly workspaceReadOnly: boolean;
  /** Host files/dirs bound read-only: [prepared read-only clone on the host, path in the sandbox]. */
  readonly roMounts?: ReadonlyArray<readonly [host: string, sandbox: string]>;
  /** Extra read-only files bound over the generated /etc (e.g. the CA bundle for egress interception). */
  readonly extraRoFiles?: ReadonlyArray<readonly [host: string, sandbox: string]>;
  /** Sandbox-private dirs on its size-capped disk. */
  readonly tmpDir: string;
  readonly homeDir: string;
  /** Backs /dev/shm, so shared memory counts against the sandbox disk like any other file. */
  readonly shmDir: string;
  /**
   * A read-only tree of device nodes bound as /dev (ensureDevTree: the nodes bwrap's --dev would
   * make, made once per state dir); absent: bwrap's --dev, remounted read-only.
   */
  readonly devDir?: string;
  /** A devpts instance of the sandbox's own (capped number of ptys); absent: bwrap's uncapped one. */
  readonly ptsDir?: string;
  /**
   * The sandbox runs on an image root (host/image-root.privileged.ts): `dir` (an overlay of the
   * image's layers and the sandbox's upper dir, writable) is its "/" instead of a read-only root
   * with the host's /usr and the generated /etc; `helper` (a read-only bind of a static busybox) is
   * bound at IMAGE_HELPER_PATH.
   */
  readonly imageRoot?: { readonly dir: string; readonly helper: string };
  /** True when processes start inside the sandbox's persistent netns. */
  readonly inSandboxNetns: boolean;
}
