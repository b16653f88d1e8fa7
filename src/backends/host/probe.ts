// What the host must offer every tier built on backends/host/, as probe checks (a tier adds its own:
// bwrap, runsc, …).
import { existsSync, readFileSync } from 'node:fs';
import type { ProbeCheck } from '../../core/backend.js';
import { favorDynmods, type CgroupLayout } from './cgroups.privileged.js';

/**
 * Root, user namespaces, cgroups (and their migration mode, optional), overlayfs, seccomp, and
 * (optional) netfilter for transparent egress.
 */
export function hostChecks(layout: CgroupLayout, favorCgroupMigration: boolean): ProbeCheck[] {
  const checks: ProbeCheck[] = [];
  const isRoot = process.getuid?.() === 0;
  checks.push({
    name: 'root',
    ok: isRoot,
    detail: isRoot
      ? 'running as root'
      : 'the namespaces tier mounts overlayfs and writes cgroups: run Airlock as root',
  });
  const userns = readTrim('/proc/sys/user/max_user_namespaces');
  const usernsOk =
    userns !== undefined &&
    Number(userns) > 0 &&
    readTrim('/proc/sys/kernel/unprivileged_userns_clone') !== '0';
  checks.push({
    name: 'userns',
    ok: usernsOk,
    detail: usernsOk
      ? `unprivileged user namespaces enabled (max ${userns})`
      : 'unprivileged user namespaces are disabled (sysctl user.max_user_namespaces / kernel.unprivileged_userns_clone)',
  });
  checks.push({
    name: 'cgroups',
    ok: layout.version !== 0,
    detail:
      layout.version === 1
        ? `cgroup v1 (${Object.entries(layout.mounts)
            .map(([c, m]) => `${c}:${m}`)
            .join(' ')})`
        : layout.version === 2
          ? `cgroup v2 at ${layout.root}`
          : layout.reason,
  });
  if (isRoot && layout.version !== 0 && favorCgroupMigration) {
    const f = favorDynmods();
    checks.push({ name: 'cgroup-migration', ok: f.on, optional: true, detail: f.detail });
  }
  const overlayOk =
    /\toverlay$/m.test(readTrim('/proc/filesystems') ?? '') || existsSync('/sys/module/overlay');
  checks.push({
    name: 'overlayfs',
    ok: overlayOk,
    detail: overlayOk
      ? 'overlay filesystem available'
      : 'overlayfs not in /proc/filesystems (modprobe overlay)',
  });
  const seccompOk = existsSync('/proc/sys/kernel/seccomp/actions_avail');
  checks.push({
    name: 'seccomp',
    ok: seccompOk,
    detail: seccompOk
      ? `filter actions: ${readTrim('/proc/sys/kernel/seccomp/actions_avail')}`
      : 'kernel lacks seccomp filters',
  });
  // Transparent interception is configured over netlink (no ip/nft binaries): it needs the
  // kernel's netfilter (nf_tables with NAT); a kernel without it fails the create that asks for it.
  const netfilter = existsSync('/proc/sys/net/netfilter');
  checks.push({
    name: 'egress',
    ok: netfilter,
    optional: true,
    detail: netfilter
      ? 'netfilter in the kernel: transparent egress interception available (nf_tables over netlink)'
      : 'no netfilter in this kernel: network policies need `transparent: false`',
  });
  return checks;
}

function readTrim(p: string): string | undefined {
  try {
    return readFileSync(p, 'utf8').trim();
  } catch {
    return undefined;
  }
}
