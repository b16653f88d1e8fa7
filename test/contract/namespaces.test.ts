// The sandbox contract against the namespaces tier (bubblewrap + cgroups + overlayfs + seccomp).
import { chownSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { canRunNamespaces, SKIP_REASON, testAirlock } from '../helpers.js';
import { sandboxContract } from './sandbox.contract.js';

if (canRunNamespaces) {
  sandboxContract('namespaces', { skip: {} });
} else {
  describe('sandbox contract: namespaces', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
}

describe.skipIf(!canRunNamespaces)(`namespaces: warm slots (${SKIP_REASON})`, () => {
  const airlock = testAirlock();
  const dirs: string[] = [];
  afterAll(async () => {
    await airlock.killAll();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  const ownedDir = (uid: number): string => {
    const d = mkdtempSync(join(tmpdir(), 'airlock-ws-'));
    dirs.push(d);
    writeFileSync(join(d, 'f'), 'x\n');
    chownSync(d, uid, uid);
    chownSync(join(d, 'f'), uid, uid);
    return d;
  };

  // The warm slot prepares the idmapping for the owner of the last workspace dir: the sandbox
  // after it uses that one, a dir of another owner must still get its own mapping.
  it('each cow workspace shows its own dir owner as the sandbox user, whoever owned the previous one', async () => {
    const a = ownedDir(0);
    const b = ownedDir(4242);
    for (const hostDir of [a, a, b, b, undefined, a]) {
      const sbx = await Sandbox.create(hostDir ? { workspace: { mode: 'cow', hostDir } } : {}, { airlock });
      try {
        if (!hostDir) continue;
        const r = await sbx.exec(
          'stat -c %u /workspace/f /workspace; id -u; echo y >> /workspace/f && cat /workspace/f',
        );
        expect(r.stderr).toBe('');
        expect(r.stdout).toBe('1000\n1000\n1000\nx\ny\n');
      } finally {
        await sbx.kill();
      }
    }
  });
});
