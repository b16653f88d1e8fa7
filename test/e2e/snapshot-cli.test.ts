// `airlock snapshot ls|rm` as a user runs it: a real child process on the test state dir, next to
// snapshots and forks made by the library in this process.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Airlock } from '../../src/index.js';
import { SKIP_REASON, canRunNamespaces, runCli, testAirlock } from '../helpers.js';

const cli = runCli;

describe.skipIf(!canRunNamespaces)(
  `airlock snapshot${canRunNamespaces ? '' : ` [skipped: ${SKIP_REASON}]`}`,
  () => {
    let airlock: Airlock;
    beforeAll(() => {
      airlock = testAirlock();
    });
    afterAll(async () => {
      await airlock?.killAll();
    });

    it('ls lists snapshots; rm refuses while a fork lives, then removes by prefix', async () => {
      const sbx = await airlock.create({});
      // Unique content: a layer left by an interrupted earlier run must not be this one (same digest).
      await sbx.exec(`echo cli-${process.pid}-${Date.now()} > /workspace/f`);
      const snap = await sbx.snapshot();
      const fork = await snap.fork();

      const ls = await cli(['snapshot', 'ls', '--json']);
      expect(ls.code).toBe(0);
      const listed = (JSON.parse(ls.stdout) as Array<{ id: string; users: string[]; source: string }>).find(
        (s) => s.id === snap.id,
      );
      expect(listed).toMatchObject({ id: snap.id, source: sbx.id, users: [fork.id] });
      const table = await cli(['snapshot', 'ls']);
      expect(table.code).toBe(0);
      expect(table.stdout.split('\n')[0]).toMatch(/^ID\s+CREATED\s+SIZE\s+DISK\s+ENTRIES\s+PARENT\s+FORKS$/);
      expect(table.stdout).toContain(snap.id.slice(0, 19));

      const prefix = snap.id.slice(7, 19);
      const refused = await cli(['snapshot', 'rm', prefix]);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toContain(fork.id);
      expect(refused.stderr.trim().split('\n')).toHaveLength(1);

      await fork.kill();
      const rm = await cli(['snapshot', 'rm', prefix]);
      expect({ code: rm.code, stdout: rm.stdout, stderr: rm.stderr }).toEqual({
        code: 0,
        stdout: `removed ${snap.id}\n`,
        stderr: '',
      });
      expect((await cli(['snapshot', 'ls', '--json'])).stdout).not.toContain(snap.id);
      const again = await cli(['snapshot', 'rm', snap.id]);
      expect(again.code).toBe(3);
      expect((await cli(['snapshot', 'rm', 'xyz'])).code).toBe(2);
      await sbx.kill();
    }, 60_000);
  },
);
