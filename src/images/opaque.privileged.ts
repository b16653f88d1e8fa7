// SECURITY-CRITICAL (privileged): reads the overlayfs opaque-directory marker of an unpacked layer
// (xattr trusted.overlay.opaque=y). trusted.* xattrs are visible only with CAP_SYS_ADMIN, and Node
// has no xattr binding, so this goes through libc's lgetxattr (never follows a final symlink).
import { libc } from '../core/libc.privileged.js';

export const OPAQUE_XATTR = 'trusted.overlay.opaque';

/** True when `hostPath` (a directory in a layer) hides the same directory in every lower layer. */
export function isOpaqueDir(hostPath: string): boolean {
  const value = Buffer.alloc(8);
  const path = Buffer.concat([Buffer.from(hostPath), Buffer.from([0])]);
  const n = libc().lgetxattr(path, OPAQUE_XATTR, value, value.length);
  return n === 1 && value[0] === 0x79; // 'y'
}
