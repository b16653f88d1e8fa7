// Which accelerator runs this host's microVMs: KVM only when a probe actually boots a guest with it
// (a /dev/kvm can exist and still fail stock guests, e.g. a PVM device), otherwise TCG emulation.
// The answer is cached in the state dir per QEMU and kernel, as gVisor's platform probe is.
import { execFile } from 'node:child_process';
import { existsSync, writeFileSync } from 'node:fs';
import { z } from 'zod';
import { readRecordFile } from '../../core/validate.js';
import { qemuArgs, type Accel } from './qemu.js';

const PROBE_TIMEOUT_MS = 30_000;

const AccelFileSchema = z
  .object({ key: z.string(), accel: z.enum(['kvm', 'tcg']), detail: z.string().max(2000) })
  .strict();

export interface AccelReport {
  readonly accel: Accel;
  /** Why: what the KVM probe saw. */
  readonly detail: string;
}

/** Boot the guest kernel to its init under KVM; true when init said so. */
function kvmBoots(qemu: string, kernel: string, initramfs: string): Promise<{ ok: boolean; detail: string }> {
  const args = qemuArgs({
    accel: 'kvm',
    kernel,
    initramfs,
    rootfs: '',
    memoryBytes: 64 * 1024 * 1024,
    pids: 64,
    vcpus: 1,
    diskBytes: 1 << 20,
    agentSocket: '',
    probe: true,
  });
  // The probe's console goes to stdout, where init's line is looked for.
  const i = args.indexOf('-serial');
  args[i + 1] = 'stdio';
  return new Promise((resolve) => {
    execFile(
      qemu,
      args,
      { timeout: PROBE_TIMEOUT_MS, env: {}, maxBuffer: 4 << 20 },
      (err, stdout, stderr) => {
        if (stdout.includes('AIRLOCK-PROBE-OK'))
          return resolve({ ok: true, detail: 'a KVM guest booted to init' });
        const why = (stderr || err?.message || 'no output').trim().split('\n').pop() ?? '';
        resolve({ ok: false, detail: `a KVM guest did not reach init (${why.slice(0, 300)})` });
      },
    );
  });
}

export async function detectAccel(
  qemu: string,
  kernel: string,
  initramfs: string,
  cacheFile: string,
  key: string,
): Promise<AccelReport> {
  if (!existsSync('/dev/kvm')) return { accel: 'tcg', detail: 'TCG: no /dev/kvm on this host' };
  const cached = readRecordFile(AccelFileSchema, cacheFile, 'microvm accelerator cache');
  if (cached && cached.key === key) return { accel: cached.accel, detail: cached.detail };
  const r = await kvmBoots(qemu, kernel, initramfs);
  const rep: AccelReport = r.ok
    ? { accel: 'kvm', detail: `KVM: ${r.detail}` }
    : { accel: 'tcg', detail: `TCG: /dev/kvm exists but ${r.detail}` };
  writeFileSync(cacheFile, JSON.stringify({ key, ...rep }), { mode: 0o600 });
  return rep;
}
