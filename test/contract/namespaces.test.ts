// The sandbox contract against the namespaces tier (bubblewrap + cgroups + overlayfs + seccomp).
import {
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  renameSync,
  rmdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { createHash } from 'node:crypto';
import { tmpdir } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Airlock, Sandbox } from '../../src/index.js';
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

  // After a create with a workspace over a host dir, warm slots mount that workspace ahead of time;
  // the next create uses it only for the very same dir (inode and owner) and mode.
  describe('a workspace mounted ahead in a warm slot', () => {
    const sandboxesDir = join(TEST_STATE_DIR, 'sandboxes');
    /** Sandbox ids with an overlay at <sandboxes>/<id>/ws. */
    const wsMounts = (): string[] =>
      readFileSync('/proc/self/mountinfo', 'utf8')
        .split('\n')
        .filter((l) => l.includes(' - overlay '))
        .map((l) => l.split(' ')[4]!)
        .filter((m) => m.startsWith(`${sandboxesDir}/`) && m.endsWith('/ws'))
        .map((m) => m.slice(sandboxesDir.length + 1, -3));
    /** Wait until a slot that is not `used` (killed or live) holds a workspace mounted ahead. */
    const ahead = async (used: string[]): Promise<string> => {
      for (let i = 0; i < 500; i++) {
        const id = wsMounts().find((m) => !used.includes(m));
        if (id) return id;
        await sleep(10);
      }
      throw new Error('no workspace was mounted ahead');
    };
    const run = async (sbx: Sandbox, cmd: string): Promise<string> => {
      const r = await sbx.exec(cmd);
      expect(r.stderr).toBe('');
      return r.stdout;
    };
    /** Sandboxes that are not warm slots: ours, and earlier ones whose release is still to come. */
    const used: string[] = [];
    const first = async (hostDir: string, mode: 'cow' | 'ro' = 'cow'): Promise<string> => {
      used.push(...wsMounts().filter((m) => !used.includes(m)));
      const sbx = await Sandbox.create({ workspace: { mode, hostDir } }, { airlock });
      used.push(sbx.id);
      await sbx.kill();
      return ahead(used);
    };
    const next = async (spec: Parameters<typeof Sandbox.create>[0]): Promise<Sandbox> => {
      const sbx = await Sandbox.create(spec, { airlock });
      used.push(sbx.id);
      return sbx;
    };

    it('serves the same dir, with what changed in it meanwhile', async () => {
      const a = ownedDir(0);
      const slot = await first(a);
      writeFileSync(join(a, 'later'), 'after the mount\n');
      const sbx = await next({ workspace: { mode: 'cow', hostDir: a } });
      try {
        expect(sbx.id).toBe(slot);
        expect(
          await run(sbx, 'cat /workspace/f /workspace/later; stat -c %u /workspace/f; echo z > /workspace/f'),
        ).toBe('x\nafter the mount\n1000\n');
        expect(readFileSync(join(a, 'f'), 'utf8')).toBe('x\n'); // copy-on-write: the host dir is unchanged
      } finally {
        await sbx.kill();
      }
    });

    it('not for a dir renamed into its place since, nor after a chown', async () => {
      const a = ownedDir(0);
      await first(a);
      renameSync(a, `${a}.old`);
      dirs.push(`${a}.old`);
      mkdirSync(a);
      writeFileSync(join(a, 'new'), 'new dir\n');
      let sbx = await next({ workspace: { mode: 'cow', hostDir: a } });
      try {
        expect(await run(sbx, 'ls /workspace; cat /workspace/new')).toBe('new\nnew dir\n');
      } finally {
        await sbx.kill();
      }
      await ahead(used);
      chownSync(a, 4243, 4243);
      chownSync(join(a, 'new'), 4243, 4243);
      sbx = await next({ workspace: { mode: 'cow', hostDir: a } });
      try {
        // The new owner is the one mapped to the sandbox user.
        expect(await run(sbx, 'stat -c %u /workspace/new /workspace; echo y >> /workspace/new')).toBe(
          '1000\n1000\n',
        );
      } finally {
        await sbx.kill();
      }
    });

    it('not for another mode, another dir, or no workspace: each gets its own, and nothing is left', async () => {
      const a = ownedDir(0);
      const b = ownedDir(0);
      writeFileSync(join(b, 'f'), 'b\n');
      await first(a);
      let sbx = await next({ workspace: { mode: 'ro', hostDir: a } });
      try {
        const r = await sbx.exec('cat /workspace/f; echo no > /workspace/f');
        expect(r.stdout).toBe('x\n');
        expect(r.exitCode).not.toBe(0); // read-only
      } finally {
        await sbx.kill();
      }
      await ahead(used);
      sbx = await next({ workspace: { mode: 'cow', hostDir: b } });
      try {
        expect(await run(sbx, 'cat /workspace/f')).toBe('b\n');
      } finally {
        await sbx.kill();
      }
      await ahead(used);
      sbx = await next({});
      try {
        expect(await run(sbx, 'ls -A /workspace; touch /workspace/mine && echo ok')).toBe('ok\n');
        expect(wsMounts()).not.toContain(sbx.id);
      } finally {
        await sbx.kill();
      }
      // Killed sandboxes' workspaces go with their teardown; a warm slot's stays until close.
      for (let i = 0; i < 200 && wsMounts().some((m) => used.includes(m)); i++) await sleep(10);
      expect(wsMounts().filter((m) => used.includes(m))).toEqual([]);
    });
  });

  // A killed sandbox's host state is released a little later, in a batch with others' (see
  // deferTeardown): never left behind, whether or not close() comes.
  it("a killed sandbox's host state goes soon without close(), and before close() resolves", async () => {
    const sandboxes = join(TEST_STATE_DIR, 'sandboxes');
    const mountsOf = (id: string): string[] =>
      readFileSync('/proc/self/mountinfo', 'utf8')
        .split('\n')
        .map((l) => l.split(' ')[4] ?? '')
        .filter((m) => m.startsWith(`${sandboxes}/${id}/`));
    const gone = (id: string): void => {
      expect(existsSync(join(sandboxes, id))).toBe(false);
      expect(mountsOf(id)).toEqual([]);
    };
    // Alone (no batch fills up, no close): its release starts on its own.
    const a = await Sandbox.create({ workspace: { mode: 'cow', hostDir: ownedDir(0) } }, { airlock });
    expect((await a.exec('echo x > /workspace/y && cat /workspace/y')).stdout).toBe('x\n');
    await a.kill();
    for (let i = 0; i < 500 && existsSync(join(sandboxes, a.id)); i++) await sleep(10);
    gone(a.id);
    // Several killed just before close(): all released by the time it resolves.
    const own = testAirlock();
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const s = await Sandbox.create({}, { airlock: own });
      ids.push(s.id);
      await s.exec('true');
      await s.kill();
    }
    await own.close();
    for (const id of ids) gone(id);
  });

  // Killed sandboxes hold their uids until their batched release: a create that finds every uid
  // leased runs those releases first instead of failing.
  it('a uid range held only by killed sandboxes is reclaimed for the next create', async () => {
    // Two uids of our own, outside every other range the tests and benches use.
    const small = new Airlock({
      stateDir: TEST_STATE_DIR,
      uidRange: { first: 3_990_000, count: 2 },
      warmPool: 0,
    });
    try {
      for (let i = 0; i < 5; i++) {
        const s = await Sandbox.create({}, { airlock: small });
        expect((await s.exec('echo ok')).stdout).toBe('ok\n');
        await s.kill();
      }
    } finally {
      await small.close();
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
