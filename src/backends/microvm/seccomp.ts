// Airlock's own seccomp filter on QEMU (beside QEMU's `-sandbox on`, which filters what QEMU's
// authors know it never needs): the namespaces tier's reviewed profile (host/seccomp.privileged.ts:
// x86_64 only, no ptrace or process_vm_*, no mount/umount2/pivot_root/setns or new mounts, no
// kexec, bpf, perf_event_open, userfaultfd, keyrings or module loading, no new user namespaces),
// plus unshare of any namespace at all. QEMU needs none of them: the jail is built before the
// filter is installed (by guest/vmm-jail.c, after its uid drop), and migration here is a plain stream
// (no postcopy, so no userfaultfd). Stacked filters each apply, so the strictest answer wins.
import { buildSeccompFilter } from '../host/seccomp.privileged.js';

let cached: Buffer | undefined;

/** The raw filter program (struct sock_filter[]) for QEMU. */
export function vmmSeccompFilter(): Buffer {
  cached ??= buildSeccompFilter({ extraDeniedSyscalls: ['unshare'] });
  return cached;
}
