// backends/host/: the host state every isolation tier composes, and the seam a new tier plugs into.
//
// A tier is its own class implementing the BackendV1 contract (core/backend.ts); none extends
// another. It owns a `SandboxHost` for its state dir, built with a `HostTier` that names it, says
// whether bwrap starts its processes (only then are launch namespaces made) and what cgroup limits
// hold a sandbox of it (its runtime's footprint included). The SandboxHost gives it:
//   - checks(): the host probe checks every tier needs (root, userns, cgroups, overlayfs, seccomp);
//   - create(spec, make): a sandbox's host state from a warm slot — uid lease, tmpfs disk, workspace
//     and home overlays over snapshot layers, read-only mounts, netns, cgroup — as HostSandboxParts
//     (paths in a SandboxLayout), handed to `make`, which returns the tier's live sandbox; anything
//     that fails is released before the error is thrown;
//   - prepare(plan): what warm slots make ahead (PreparePlan; learned from creates otherwise);
//   - snapshots (the layer store, filtered to the tier's name), close(), reapOrphans().
// The tier's sandbox class composes a `HostSandbox` over those parts (freeze holds, pause/resume,
// snapshot with an optional PrepareCapture hook for process memory, egress plumbing into the netns,
// counters, destroy) and adds only spawn: how a process starts inside that state (bwrap, runsc, a
// microVM's agent, a WASM runtime), tracking it with enroll()/track().
// The lower-level pieces (state dirs, cgroups, launcher, layer store, mounts, netns, idmap, spawn)
// are files of their own here, imported directly where a tier needs one.
export { SandboxHost, type HostOptions, type HostTier } from './host.js';
export { HostSandbox, launchSharesKey, type HostSandboxParts, type PrepareCapture } from './sandbox.js';
export type { SandboxLayout } from './layout.js';
export { childExited, type ExitSource } from './child-exit.js';
export { imageLayerInUse, imageLayerUsers, preparedSlotMount } from './resources.js';
