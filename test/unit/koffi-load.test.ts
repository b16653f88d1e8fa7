// loadKoffi (src/core/libc.privileged.ts) loads koffi's native module directly instead of through
// koffi's probing entry module (CLI start-up). It must be the very module koffi's entry loads, not a
// look-alike: each case runs in a fresh Node process, since a module loaded once is cached.
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const LIBC = new URL('../../src/core/libc.privileged.ts', import.meta.url).href;

function fresh(body: string): unknown {
  const script = `
    import { createRequire } from 'node:module';
    import { readFileSync } from 'node:fs';
    const require = createRequire(import.meta.url);
    const { loadKoffi, libc } = await import(${JSON.stringify(LIBC)});
    ${body}`;
  const out = execFileSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
    cwd: ROOT,
    encoding: 'utf8',
  });
  return JSON.parse(out) as unknown;
}

describe('loadKoffi', () => {
  it("is the native module koffi's own entry loads, without loading that entry", () => {
    const r = fresh(`
      const native = loadKoffi();
      const entryLoaded = Object.keys(require.cache).some((k) => /\\/koffi\\/(index|src\\/koffi\\/index)\\.cjs$/.test(k));
      const koffi = require('koffi');
      process.stdout.write(JSON.stringify({
        entryLoaded,
        same: koffi.default === native,
        version: native.version === JSON.parse(readFileSync(require.resolve('koffi').replace(/index[.]cjs$/, 'package.json'), 'utf8')).version,
      }));`);
    expect(r).toEqual({ entryLoaded: false, same: true, version: true });
  }, 30_000);

  it('binds libc through it: a call returns what the kernel says', () => {
    const r = fresh(`
      const c = libc();
      const fds = Buffer.alloc(8);
      const rc = c.pipe2(fds, 0);
      const [a, b] = [fds.readInt32LE(0), fds.readInt32LE(4)];
      process.stdout.write(JSON.stringify({ rc, distinct: a !== b && a > 2 && b > 2, closed: c.close(a) + c.close(b) }));`);
    expect(r).toEqual({ rc: 0, distinct: true, closed: 0 });
  }, 30_000);
});
