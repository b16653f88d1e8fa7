// Saving one sandbox's VM for a snapshot (sandbox.ts prepareCapture, called by HostSandbox.snapshot
// before its layer copy, which finds no host files: everything the sandbox wrote is in guest RAM):
// QMP `stop`, migrate to a stream in the spill dir, copy it out as root (snapshot.ts), and keep the
// VM stopped until `release` (`cont`), so the layer's record and the stream are of the same instant.
import { randomBytes } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { AirlockError } from '../../core/errors.js';
import type { HostSandbox, PrepareCapture } from '../host/index.js';
import { selfOwner } from '../host/state.js';
import type { AgentConnection } from './agent.js';
import { Qmp } from './qmp.js';
import { saveStream, type VmRecord } from './snapshot.js';
import type { VmShape } from './start.js';

/** Why a paused microVM is not snapshotted (its frozen QEMU cannot answer its monitor). */
const PAUSED_REASON =
  'the sandbox is paused: its frozen QEMU cannot save the VM; resume it before the snapshot';

/** A live VM as the save needs it. */
export interface SavableVm {
  readonly id: string;
  readonly host: HostSandbox;
  readonly agent: AgentConnection;
  readonly vm: VmShape;
  readonly spillDir: string;
}

/** The stopped VM's stream and record into `dir` (snapshot.ts saveStream). */
export function saveVmStream(
  v: SavableVm,
  qmp: Qmp,
  dir: string,
  signal?: AbortSignal,
): Promise<{ bytes: number; hash: string; vm: VmRecord }> {
  return saveStream(qmp, {
    spillDir: v.spillDir,
    uid: v.host.p.hostUid,
    vm: { version: 4, ...v.vm, nextId: v.agent.nextRequestId, processes: v.agent.running },
    dir,
    gone: () => (v.host.destroyed ? `sandbox ${v.id} was killed` : undefined),
    ...(signal ? { signal } : {}),
  });
}

/**
 * Stop the VM and save it into a temp dir named like a layer capture in progress (the layer store's
 * reaper removes it if Airlock dies). `capture` is what HostSandbox.snapshot takes; `done` settles
 * once the VM runs again (released, or the save failed).
 */
export async function saveVm(
  v: SavableVm,
  signal?: AbortSignal,
): Promise<{ capture: Awaited<ReturnType<PrepareCapture>>; done: Promise<void> }> {
  if (v.host.paused) throw new AirlockError('INVALID_ARGUMENT', PAUSED_REASON);
  const vmDir = join(v.host.p.res.dir, 'vm');
  const stream = join(v.spillDir, 'snapshot');
  rmSync(stream, { force: true });
  const qmp = await Qmp.open(join(vmDir, 'qmp.sock'), 10_000, signal);
  const owner = selfOwner();
  const dir = join(
    v.host.p.store.root,
    `.tmp-${owner.pid}-${owner.startTicks}-${randomBytes(6).toString('hex')}`,
  );
  let finish!: () => void;
  const done = new Promise<void>((r) => (finish = r));
  const cont = async (): Promise<void> => {
    try {
      if (!v.host.destroyed) await qmp.execute('cont');
    } catch {
      // QEMU is gone (killed meanwhile): nothing to continue.
    } finally {
      qmp.close();
      rmSync(stream, { force: true });
      finish();
    }
  };
  try {
    await qmp.execute('stop');
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const { bytes, hash, vm } = await saveVmStream(v, qmp, dir, signal);
    return {
      capture: {
        memory: { dir, hash, record: { processes: vm.processes, bytes } },
        release: async () => {
          rmSync(dir, { recursive: true, force: true }); // moved into the layer unless it failed
          await cont();
        },
      },
      done,
    };
  } catch (e) {
    rmSync(dir, { recursive: true, force: true });
    await cont();
    throw e;
  }
}
