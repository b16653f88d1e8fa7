// The sandbox contract against the namespaces tier (bubblewrap + cgroups + overlayfs + seccomp).
import { chownSync, existsSync, mkdtempSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { tmpdir } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { canRunNamespaces, SKIP_REASON, TEST_STATE_DIR, testAirlock } from '../helpers.js';
import { sandboxContract } from './sandbox.contract.js';

if (canRunNamespaces) {
  sandboxContract('namespaces', { skip: {} });
} else {
  describe('sandbox contract: namespaces', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
}

describe.skipIf(!canRunNamespaces)(`namespaces tier (${SKIP_REASON})`, () => {
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

  // Each exec's process is moved into the sandbox's cgroups (memory, pids, cpu, freezer) before
  // bwrap starts; if that fails, the command must not run at all.
  it('a command whose process cannot be put in its cgroup never runs', async () => {
    const sbx = await Sandbox.create({}, { airlock });
    try {
      expect((await sbx.exec('echo first')).stdout).toBe('first\n'); // the cgroup files are in use
      const name = `${createHash('sha256').update(TEST_STATE_DIR).digest('hex').slice(0, 8)}-${sbx.id}`;
      // No process between execs, so it can be removed (v1's pids hierarchy, or the v2 cgroup) once
      // the last exec's exited tasks are released.
      const dir = [`/sys/fs/cgroup/pids/airlock/${name}`, `/sys/fs/cgroup/airlock/${name}`].find((d) =>
        existsSync(d),
      )!;
      for (let i = 0; ; i++) {
        try {
          rmdirSync(dir);
          break;
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code !== 'EBUSY' || i >= 200) throw e;
          await sleep(10);
        }
      }
      const marker = join(TEST_STATE_DIR, 'sandboxes', sbx.id, 'disk', 'tmp', 'ran');
      const r = await sbx.exec('touch /tmp/ran');
      expect(r.exitCode).not.toBe(0);
      expect(existsSync(marker)).toBe(false);
    } finally {
      await sbx.kill();
    }
  });
});
