// run_code's figures as MCP content (issue 34): a PNG result becomes an MCP image block
// (`image/png`, base64), so a client shows it and can hand it to a model as an image. The JSON text
// block keeps naming every image by size (tools.ts shapeExecution), so a client that drops images
// still knows there was one.
//
// SVG goes as TEXT (its markup, clipped), not as an image block: model APIs take PNG, JPEG, GIF and
// WebP images but not SVG, so an image/svg+xml block forwarded to a model is refused or dropped,
// while SVG is XML a model reads directly.
//
// Bounds: one image at most MAX_MCP_IMAGE_BYTES (decoded), at most MAX_MCP_IMAGES per call and
// MAX_MCP_IMAGE_TOTAL_BYTES together; past them a text block names what was left out and how to get
// it (save it to a file and read it with read_file).
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import type { Execution } from '../../core/code.js';
import { clip } from '../tools.js';

export const MAX_MCP_IMAGE_BYTES = 2 * 1024 * 1024;
export const MAX_MCP_IMAGES = 8;
export const MAX_MCP_IMAGE_TOTAL_BYTES = 8 * 1024 * 1024;

const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

/** `base` (the JSON text of the shaped Execution) plus its figures as content blocks, bounded. */
export function withFigures(
  base: CallToolResult,
  x: Execution | undefined,
  maxChars: number,
): CallToolResult {
  if (!x || base.isError) return base;
  const content: CallToolResult['content'] = [...base.content];
  const left: string[] = [];
  let images = 0;
  let total = 0;
  x.results.forEach((r, i) => {
    if (r.png !== undefined) {
      const bytes = Buffer.from(r.png, 'base64');
      // Only a real PNG is labelled image/png (the kernel's bytes are the sandbox's to choose).
      if (!bytes.subarray(0, 8).equals(PNG_MAGIC)) left.push(`result ${i}: not a PNG`);
      else if (bytes.length > MAX_MCP_IMAGE_BYTES)
        left.push(`result ${i}: image/png of ${bytes.length} bytes is over ${MAX_MCP_IMAGE_BYTES}`);
      else if (images >= MAX_MCP_IMAGES || total + bytes.length > MAX_MCP_IMAGE_TOTAL_BYTES)
        left.push(
          `result ${i}: image/png over this call's limit (${MAX_MCP_IMAGES} images, ${MAX_MCP_IMAGE_TOTAL_BYTES} bytes)`,
        );
      else {
        images++;
        total += bytes.length;
        // Re-encoded from the decoded bytes: the client gets canonical base64, nothing else.
        content.push({ type: 'image', mimeType: 'image/png', data: bytes.toString('base64') });
      }
    }
    if (r.svg !== undefined) content.push({ type: 'text', text: clip(r.svg, maxChars) });
  });
  if (left.length) {
    content.push({
      type: 'text',
      text: `Images left out: ${left.join('; ')}. Save a figure to a file (e.g. plt.savefig('/workspace/fig.png')) and fetch it another way.`,
    });
  }
  return { ...base, content };
}
