// HMAC-SHA256 over a list of fields, each length-prefixed (4-byte big-endian byte count, then its
// UTF-8 bytes): two different field lists never feed the MAC the same bytes, whatever the fields
// contain (NUL, dots, separators), so no separator choice matters. The first field is a domain tag
// naming what the MAC is for, so a MAC made for one purpose never verifies for another.
import { createHmac } from 'node:crypto';

export function macFields(key: Uint8Array | string, fields: readonly string[]): Buffer {
  const h = createHmac('sha256', key);
  for (const f of fields) {
    const b = Buffer.from(f, 'utf8');
    const len = Buffer.alloc(4);
    len.writeUInt32BE(b.length);
    h.update(len).update(b);
  }
  return h.digest();
}
