// `airlock doctor`: which isolation tiers and controls work on this host, and why not when they don't.
import type { ProbeCheck } from '../core/backend.js';
import { ERROR_CODES } from '../core/errors.js';
import { cliAirlock } from './lifecycle.js';
import {
  probeCgroups,
  probeKvm,
  probeLandlock,
  probeTool,
  type CgroupReport,
  type KvmReport,
  type LandlockReport,
  type ToolReport,
} from './host-probes.js';
import { processIo, type Io } from './run.js';

export interface DoctorReport {
  readonly tiers: {
    readonly namespaces: {
      readonly implemented: true;
      readonly available: boolean;
      readonly reason?: string;
      readonly checks: readonly ProbeCheck[];
    };
    readonly gvisor: {
      readonly implemented: true;
      readonly available: boolean;
      readonly reason?: string;
      /** The runsc platform sandboxes run on here (kvm only where /dev/kvm really runs a guest). */
      readonly platform?: string;
      readonly checks: readonly ProbeCheck[];
      readonly runsc: ToolReport;
    };
    readonly microvm: {
      readonly implemented: true;
      readonly available: boolean;
      readonly reason?: string;
      readonly checks: readonly ProbeCheck[];
      /** One line: the accelerator and why (KVM only where a probe booted a guest with it), or why not. */
      readonly detail: string;
      readonly qemu: ToolReport;
      /** What the tier's guests run with here ('none': the tier is unavailable). */
      readonly accelerator: 'kvm' | 'tcg' | 'none';
    };
    readonly wasm: {
      readonly implemented: true;
      readonly available: boolean;
      readonly reason?: string;
      readonly checks: readonly ProbeCheck[];
    };
  };
  readonly host: {
    readonly cgroups: CgroupReport;
    readonly landlock: LandlockReport;
    readonly kvm: KvmReport;
  };
}

export async function doctorReport(): Promise<DoctorReport> {
  const airlock = cliAirlock({ oneSandbox: true }); // probes only: no warm pool, no launcher thread
  const ns = await airlock.probe('namespaces');
  const gv = await airlock.probe('gvisor');
  const platform = /^(kvm|systrap|ptrace)\b/.exec(
    gv.checks.find((c) => c.name === 'platform')?.detail ?? '',
  )?.[1];
  const runsc = probeTool('runsc');
  const qemu = probeTool('qemu-system-x86_64');
  const kvm = probeKvm();
  // The microVM probe boots a guest under KVM once (cached per QEMU and kernel) to tell KVM from TCG.
  const mv = await airlock.probe('microvm');
  const accelCheck = mv.checks.find((c) => c.name === 'accelerator');
  const accelerator = !mv.available ? 'none' : /^KVM\b/.test(accelCheck?.detail ?? '') ? 'kvm' : 'tcg';
  const microvmDetail = mv.available
    ? `available (${accelerator === 'kvm' ? 'KVM' : 'TCG software emulation: slow'}): ${accelCheck?.detail ?? ''}`
    : `UNAVAILABLE: ${mv.reason ?? 'see the failed checks'}`;
  // The WASM probe loads Pyodide and QuickJS once in a worker thread (a few seconds).
  const wasm = await airlock.probe('wasm');
  return {
    tiers: {
      namespaces: {
        implemented: true,
        available: ns.available,
        ...(ns.reason ? { reason: ns.reason } : {}),
        checks: ns.checks,
      },
      gvisor: {
        implemented: true,
        available: gv.available,
        ...(gv.reason ? { reason: gv.reason } : {}),
        ...(platform ? { platform } : {}),
        checks: gv.checks,
        runsc,
      },
      microvm: {
        implemented: true,
        available: mv.available,
        ...(mv.reason ? { reason: mv.reason } : {}),
        checks: mv.checks,
        detail: microvmDetail,
        qemu,
        accelerator,
      },
      wasm: {
        implemented: true,
        available: wasm.available,
        ...(wasm.reason ? { reason: wasm.reason } : {}),
        checks: wasm.checks,
      },
    },
    host: { cgroups: probeCgroups(), landlock: probeLandlock(), kvm },
  };
}

export function formatDoctor(r: DoctorReport): string {
  const ns = r.tiers.namespaces;
  const width = Math.max(...ns.checks.map((c) => c.name.length), 8);
  const lines = [
    `namespaces  ${ns.available ? 'available' : `UNAVAILABLE: ${ns.reason ?? 'see the failed checks'}`}`,
  ];
  for (const c of ns.checks) lines.push(`  ${c.ok ? 'ok  ' : 'FAIL'}  ${c.name.padEnd(width)}  ${c.detail}`);
  const gv = r.tiers.gvisor;
  lines.push(
    `gvisor      ${gv.available ? `available (platform ${gv.platform ?? '?'})` : `UNAVAILABLE: ${gv.reason ?? 'see the failed checks'}`}`,
  );
  for (const c of gv.checks.filter((c) => ['runsc', 'platform'].includes(c.name) || !c.ok)) {
    lines.push(`  ${c.ok ? 'ok  ' : 'FAIL'}  ${c.name.padEnd(width)}  ${c.detail}`);
  }
  lines.push(`microvm     ${r.tiers.microvm.detail}`);
  const wasm = r.tiers.wasm;
  const interp = wasm.checks.find((c) => c.name === 'interpreters')?.detail ?? '';
  lines.push(
    `wasm        ${wasm.available ? `available: ${interp}` : `UNAVAILABLE: ${wasm.reason ?? 'see the failed checks'}`}`,
  );
  lines.push('host');
  lines.push(`  cgroups   ${r.host.cgroups.detail}`);
  lines.push(`  landlock  ${r.host.landlock.detail}`);
  lines.push(`  kvm       ${r.host.kvm.detail}`);
  return `${lines.join('\n')}\n`;
}

/** Exit 0 when the namespaces tier can run sandboxes here, 4 (BACKEND_UNAVAILABLE) otherwise. */
export async function doctorCommand(opts: { json?: boolean }, io: Io = processIo): Promise<number> {
  const report = await doctorReport();
  io.out(opts.json ? `${JSON.stringify(report, null, 2)}\n` : formatDoctor(report));
  return report.tiers.namespaces.available ? 0 : ERROR_CODES.BACKEND_UNAVAILABLE.exit;
}
