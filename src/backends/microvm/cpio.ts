// A cpio archive in the "newc" format the Linux kernel unpacks as its initramfs (only what the guest's
// initramfs needs: directories and regular files, all owned by root).

export interface CpioEntry {
  /** Path inside the archive, without a leading slash. */
  readonly name: string;
  /** Full st_mode: 0o40755 for a directory, 0o100755 for an executable file. */
  readonly mode: number;
  readonly data?: Buffer;
}

function pad4(n: number): Buffer {
  return Buffer.alloc((4 - (n % 4)) % 4);
}

function header(ino: number, mode: number, nlink: number, size: number, nameSize: number): string {
  // magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor, rdevmajor, rdevminor, namesize, check
  const fields = [ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, nameSize, 0];
  return '070701' + fields.map((v) => v.toString(16).toUpperCase().padStart(8, '0')).join('');
}

export function newcArchive(entries: readonly CpioEntry[]): Buffer {
  const parts: Buffer[] = [];
  const add = (ino: number, e: CpioEntry): void => {
    const data = e.data ?? Buffer.alloc(0);
    const name = Buffer.from(`${e.name}\0`);
    const head = Buffer.concat([
      Buffer.from(header(ino, e.mode, e.mode & 0o40000 ? 2 : 1, data.length, name.length)),
      name,
    ]);
    parts.push(head, pad4(head.length), data, pad4(data.length));
  };
  entries.forEach((e, i) => add(i + 1, e));
  add(0, { name: 'TRAILER!!!', mode: 0 });
  return Buffer.concat(parts);
}
