// The host's side of the kernel protocol (kernels/python.py describes it): one stream of a kernel
// process carries the cell's raw output with control frames in-band, each `\x1e\x1eAL:<id>:<body>\n`
// where <id> is the current run's random id. Everything else is data. The kernel runs untrusted code,
// so this parser assumes any byte sequence: a frame body is bounded (a longer one is a protocol
// error, not a growing buffer), a body is parsed with zod (never evaluated), and output that names
// another id is data.
import { StringDecoder } from 'node:string_decoder';
import { z } from 'zod';

/** A result frame: CodeResult's fields, each optional, as the kernel sends them. */
const ResultFrameSchema = z.object({
  t: z.literal('result'),
  isMainResult: z.boolean(),
  text: z.string().optional(),
  html: z.string().optional(),
  svg: z.string().optional(),
  png: z.string().optional(),
  json: z.unknown().optional(),
});

/** Every frame a kernel may send on stdout. */
export const KernelFrameSchema = z.discriminatedUnion('t', [
  ResultFrameSchema,
  z.object({ t: z.literal('error'), name: z.string(), value: z.string(), traceback: z.string() }),
  z.object({ t: z.literal('end'), exit: z.number().int().optional() }),
]);
export type KernelFrame = z.infer<typeof KernelFrameSchema>;

/** Why a stream broke the protocol (the kernel is then killed: its state cannot be trusted). */
export class ProtocolViolation extends Error {}

/**
 * Splits one stream of a run into data and frame bodies. `onData` gets text (UTF-8 decoded across
 * chunk boundaries), `onFrame` the raw body of each frame (without the newline).
 */
export class FrameSplitter {
  private readonly marker: Buffer;
  private pending: Buffer = Buffer.alloc(0);
  private inFrame = false;
  private frameParts: Buffer[] = [];
  private frameBytes = 0;
  private readonly decoder = new StringDecoder('utf8');

  constructor(
    id: string,
    private readonly maxFrameBytes: number,
    private readonly onData: (text: string) => void,
    private readonly onFrame: (body: Buffer) => void,
  ) {
    this.marker = Buffer.from(`\x1e\x1eAL:${id}:`, 'latin1');
  }

  /** Feed a chunk; throws ProtocolViolation on a frame over maxFrameBytes. */
  push(chunk: Buffer): void {
    let buf = chunk;
    for (;;) {
      if (this.inFrame) {
        // A frame's parts are kept as they came (no copying per chunk) until its newline.
        const nl = buf.indexOf(0x0a);
        const take = nl < 0 ? buf.length : nl;
        this.frameBytes += take;
        if (this.frameBytes > this.maxFrameBytes) {
          throw new ProtocolViolation(`a kernel frame is longer than ${this.maxFrameBytes} bytes`);
        }
        if (nl < 0) {
          this.frameParts.push(buf);
          return;
        }
        const body = Buffer.concat([...this.frameParts, buf.subarray(0, nl)]);
        this.frameParts = [];
        this.frameBytes = 0;
        this.inFrame = false;
        buf = buf.subarray(nl + 1);
        this.onFrame(body);
        continue;
      }
      if (this.pending.length) {
        buf = Buffer.concat([this.pending, buf]); // at most a marker's length held back
        this.pending = Buffer.alloc(0);
      }
      const at = buf.indexOf(this.marker);
      if (at >= 0) {
        this.data(buf.subarray(0, at));
        buf = buf.subarray(at + this.marker.length);
        this.inFrame = true;
        continue;
      }
      // Keep back a tail that may be the start of a marker split across chunks.
      const keep = partialMarkerTail(buf, this.marker);
      this.data(buf.subarray(0, buf.length - keep));
      this.pending = Buffer.from(buf.subarray(buf.length - keep));
      return;
    }
  }

  /** Whatever was held back, as data (the stream ended). */
  flush(): void {
    if (!this.inFrame) this.data(this.pending);
    this.pending = Buffer.alloc(0);
    const rest = this.decoder.end();
    if (rest) this.onData(rest);
  }

  private data(b: Buffer): void {
    if (b.length === 0) return;
    const t = this.decoder.write(b);
    if (t) this.onData(t);
  }
}

/** How many bytes at the end of `buf` are a proper prefix of `marker`. */
function partialMarkerTail(buf: Buffer, marker: Buffer): number {
  const max = Math.min(marker.length - 1, buf.length);
  for (let k = max; k > 0; k--) {
    if (buf.subarray(buf.length - k).equals(marker.subarray(0, k))) return k;
  }
  return 0;
}

/** A frame body → a frame, or a ProtocolViolation naming what was wrong. */
export function parseFrame(body: Buffer): KernelFrame {
  let raw: unknown;
  try {
    raw = JSON.parse(body.toString('utf8'));
  } catch {
    throw new ProtocolViolation('a kernel frame is not JSON');
  }
  const r = KernelFrameSchema.safeParse(raw);
  if (!r.success)
    throw new ProtocolViolation(`a kernel frame is not a known frame: ${r.error.issues[0]?.message}`);
  return r.data;
}
