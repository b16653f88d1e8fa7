// A sandbox's /workspace on the host: an overlay over snapshot layers and (idmapped, read-only) a host
// dir, with its writes on the sandbox's disk; mounted at create or ahead in a warm slot. Also the
// checks on the host paths a spec names (workspace dir, read-only mounts).
import {
  chmodSync,
  chownSync,
  mkdirSync,
  realpathSync,
  rmdirSync,
  rmSync,
  statSync,
  type Stats,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import type { Logger } from '../../core/backend.js';
import { AirlockError } from '../../core/errors.js';
import { forbiddenMountSourceReason, forbiddenWorkspaceReason, type SandboxSpec } from '../../core/spec.js';
import { bindReadOnly, mountIdmappedAll } from './idmap.privileged.js';
import type { CaptureSource } from './layer-capture.privileged.js';
import { closeLaunchNamespace, type Launcher } from './launcher.privileged.js';
import { mountOverlay, unmountAsync } from './mount.privileged.js';
import { discardUserns, takeWsUserns, type Slot, type WsOwner, type WsPlan } from './slots.js';

/** A host dir for the workspace, with the user namespace that idmaps its owner if made ahead. */
export interface HostWorkspace {
  readonly dir: string;
  readonly owner: WsOwner;
  readonly prepared: Promise<number | undefined> | undefined;
}

/**
 * The workspace at <dir>/ws: an overlay over `lowers` (snapshot layers) and, with `host`, the host
 * dir seen through an idmapped mount at <dir>/lower, so the sandbox uid owns what the dir's owner
 * owns (the plain dir where the filesystem cannot idmap). `rw`: writes go to an upper on the disk.
 */
export async function mountWorkspace(
  slot: Slot,
  host: HostWorkspace | undefined,
  mode: 'ro' | 'rw',
  lowers: string[],
  rootMode: number,
  logger: Logger,
): Promise<{ workspaceDir: string; wsSource: CaptureSource; hostLower?: string }> {
  const { dir, disk, uid } = slot;
  let hostLower: string | undefined;
  if (host) {
    const lower = join(dir, 'lower');
    mkdirSync(lower, { mode: 0o755 });
    const prepared = await host.prepared;
    // Always read-only: overlayfs never writes to its lower layers, and a writable host-side alias
    // of the caller's dir owned by the sandbox uid would be one mistake away from a write-through.
    const mapped =
      (await mountIdmappedAll([{ source: host.dir, target: lower }], host.owner, uid, true, prepared)) ===
      undefined;
    if (!mapped)
      logger.warn({ hostDir: host.dir }, 'idmapped mount unavailable; workspace keeps host owners');
    hostLower = mapped ? lower : host.dir;
    lowers.push(hostLower);
  }
  const workspaceDir = join(dir, 'ws');
  mkdirSync(workspaceDir, { mode: 0o755 });
  if (mode === 'ro') {
    // overlayfs needs two lowers when it has no upper: add an empty one if needed.
    if (lowers.length < 2) {
      const empty = join(dir, 'empty');
      mkdirSync(empty, { mode: 0o755 });
      lowers.push(empty);
    }
    mountOverlay(workspaceDir, lowers);
    return {
      workspaceDir,
      wsSource: { area: 'workspace', kind: 'none', dir: workspaceDir },
      ...(hostLower ? { hostLower } : {}),
    };
  }
  const upper = mkOwned(join(disk, 'upper'), uid, rootMode);
  const work = mkOwned(join(disk, 'work'), 0, 0o700);
  mountOverlay(workspaceDir, lowers, { dir: upper, work });
  return {
    workspaceDir,
    wsSource: { area: 'workspace', kind: 'diff', dir: upper },
    ...(hostLower ? { hostLower } : {}),
  };
}

/**
 * Mount a planned workspace in a warm slot ahead of time, into its launch namespace too (the create
 * that takes the slot then mounts nothing: see aheadFits). Best effort: on failure the slot is left
 * as it was and create mounts the workspace itself.
 */
export async function prepareWorkspace(
  slot: Slot,
  plan: WsPlan,
  launcher: Launcher | undefined,
  logger: Logger,
): Promise<void> {
  let st: Stats;
  try {
    st = statSync(plan.hostDir);
  } catch {
    return; // gone: the next create says so
  }
  const owner: WsOwner = { uid: st.uid, gid: st.gid };
  const w = takeWsUserns(slot);
  const same = w && w.owner.uid === owner.uid && w.owner.gid === owner.gid;
  if (!same) discardUserns(w?.fd);
  try {
    const { hostLower, ...m } = await mountWorkspace(
      slot,
      { dir: plan.hostDir, owner, prepared: same ? w!.fd : undefined },
      plan.mode === 'ro' ? 'ro' : 'rw',
      [],
      0o755,
      logger,
    );
    // What is mounted must be the dir that was stat'ed (not one renamed into its place meanwhile):
    // the idmapped clone, or where the filesystem cannot idmap, the host dir itself.
    const seen = statSync(hostLower!);
    if (seen.dev !== st.dev || seen.ino !== st.ino) throw new Error(`${plan.hostDir} changed while mounted`);
    if (slot.res.launchNs !== undefined) await launcher!.addMountAsync(slot.res.launchNs, m.workspaceDir);
    slot.ws = { plan, dev: st.dev, ino: st.ino, owner, ...m };
  } catch (e) {
    logger.debug({ err: (e as Error).message }, 'workspace not mounted ahead');
    await dropWorkspace(slot); // throws if it cannot be undone
  }
}

/**
 * Undo whatever of a workspace is mounted in a slot (prepareWorkspace's, or half of it), and drop
 * its launch namespace, which may hold a clone of it (the first exec makes a new one).
 */
export async function dropWorkspace(slot: Slot): Promise<void> {
  const ns = slot.res.launchNs;
  slot.res.launchNs = undefined;
  await closeLaunchNamespace(ns);
  await unmountAsync(join(slot.dir, 'ws'));
  await unmountAsync(join(slot.dir, 'lower'));
  // Never a recursive removal where a mount may have been: an empty dir or nothing, else it fails.
  for (const name of ['ws', 'lower', 'empty']) {
    try {
      rmdirSync(join(slot.dir, name));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    }
  }
  // On the slot's own disk (no mount there): what an overlay left in its upper and work dirs.
  for (const name of ['upper', 'work']) rmSync(join(slot.disk, name), { recursive: true, force: true });
}

export function mkOwned(path: string, uid: number, mode: number): string {
  mkdirSync(path);
  chownSync(path, uid, uid);
  chmodSync(path, mode); // after chown, and not subject to the umask
  return path;
}

/** `p` resolved, checked to be a directory a workspace may be over. */
export function checkHostDir(p: string, stateDir: string): string {
  let real: string;
  try {
    real = realpathSync(p);
  } catch {
    throw new AirlockError('INVALID_SPEC', `workspace.hostDir "${p}" does not exist`, {
      field: 'workspace.hostDir',
    });
  }
  if (!statSync(real).isDirectory()) {
    throw new AirlockError('INVALID_SPEC', `workspace.hostDir "${p}" is not a directory`, {
      field: 'workspace.hostDir',
    });
  }
  const why = forbiddenWorkspaceReason(real, stateDir);
  if (why) {
    throw new AirlockError('INVALID_SPEC', `${why} (resolved from "${p}")`, { field: 'workspace.hostDir' });
  }
  return real;
}

/**
 * Read-only host mounts (e.g. an MCP server's package): each a detached read-only clone under the
 * sandbox dir, which the tier then shows at its sandbox path. [clone, sandbox path] pairs.
 */
export function mountReadOnly(
  spec: Pick<SandboxSpec, 'mounts'>,
  dir: string,
  stateDir: string,
): Array<readonly [string, string]> {
  const roMounts: Array<readonly [string, string]> = [];
  for (const [i, m] of spec.mounts.entries()) {
    const src = checkMountSource(m.hostPath, stateDir, i);
    const target = join(dir, `ro-${i}`);
    if (statSync(src).isDirectory()) mkdirSync(target, { mode: 0o755 });
    else writeFileSync(target, '', { mode: 0o444 });
    bindReadOnly(src, target);
    roMounts.push([target, m.path]);
  }
  return roMounts;
}

/** Read-only mount `i`'s host path resolved, checked to be a file or dir a sandbox may see. */
export function checkMountSource(p: string, stateDir: string, i: number): string {
  const field = `mounts.${i}.hostPath`;
  let real: string;
  try {
    real = realpathSync(p);
  } catch {
    throw new AirlockError('INVALID_SPEC', `${field} "${p}" does not exist`, { field });
  }
  const st = statSync(real);
  if (!st.isDirectory() && !st.isFile()) {
    throw new AirlockError('INVALID_SPEC', `${field} "${p}" is neither a file nor a directory`, { field });
  }
  const why = forbiddenMountSourceReason(real, stateDir);
  if (why) throw new AirlockError('INVALID_SPEC', `${why} (resolved from "${p}")`, { field });
  return real;
}

export function realpathOr(p: string): string {
  try {
    return realpathSync(p);
  } catch {
    return p;
  }
}
