// "Is this layer in use?" from the kernel's own records, for callers with no sandbox records at hand
// (the CLI's rm/prune): a layer is in use while any mount namespace on the host has a mount whose
// source or options name its directory (an overlay lower, a bind). One read of mountinfo per mount
// namespace. Sandbox runtimes that record their layers pass a predicate of their own as well.
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';

/**
 * Every mountinfo line on the host (one namespace once) that mentions `root`, but those whose mount
 * point `skip` says to leave out.
 */
export function mountLinesUnder(root: string, skip?: (mountPoint: string) => boolean): string[] {
  const seen = new Set<string>();
  const out: string[] = [];
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      const ns = readlinkSync(`/proc/${pid}/ns/mnt`);
      if (seen.has(ns)) continue;
      seen.add(ns);
      for (const line of readFileSync(`/proc/${pid}/mountinfo`, 'utf8').split('\n')) {
        if (line.includes(root) && !skip?.(line.split(' ')[4] ?? '')) out.push(line);
      }
    } catch {
      /* exited, or not ours to read */
    }
  }
  return out;
}

/**
 * A predicate for ImageStoreOptions.inUse: true when a mount anywhere names `layerDir`, but one at a
 * mount point `skip` leaves out (a warm slot's image root mounted ahead: not a use, see
 * backends/host preparedSlotMount).
 */
export function mountedLayerPredicate(
  root: string,
  skip?: (mountPoint: string) => boolean,
): (layerDir: string) => boolean {
  let lines: string[] | undefined;
  return (layerDir) => {
    lines ??= mountLinesUnder(root, skip);
    // mountinfo escapes spaces etc. as octal; layer dirs are sha256 names under a plain root.
    return lines.some(
      (l) =>
        l.includes(`${layerDir} `) ||
        l.includes(`${layerDir}:`) ||
        l.includes(`${layerDir},`) ||
        l.endsWith(layerDir),
    );
  };
}
