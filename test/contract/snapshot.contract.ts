// The snapshot / fork / pause contract every backend must pass (STYLE.md habit 2), written against
// the public API (sbx.snapshot, snap.fork, airlock.snapshots, pause/resume, persistent), run by
// test/contract/snapshot-<backend>.test.ts. A backend that cannot honour a test declares a skip with
// a reason; it never gets a weaker copy.
import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  Airlock,
  AirlockError,
  Sandbox,
  type BackendName,
  type Snapshot,
  type SandboxSpecInput,
} from '../../src/index.js';
import { NO_RESIDUE, canRunGvisor, residue, testAirlock } from '../helpers.js';
import { contractRegistrar, expectError, picture, type ContractOptions } from './support.js';

const MiB = 1024 * 1024;

/**
 * `find` inside a sandbox: one sorted line per path with type, mode, owner name and (not for
 * directories, whose size is the filesystem's business) size.
 */
const TREE =
  'cd "$1" && find . -mindepth 1 | LC_ALL=C sort | while IFS= read -r p; do ' +
  'if [ -d "$p" ] && [ ! -L "$p" ]; then stat -c "%n %F %a %U" -- "$p"; ' +
  'else stat -c "%n %F %a %U %s" -- "$p"; fi; done';

async function tree(sbx: Sandbox, dir: string): Promise<string> {
  const r = await sbx.exec(['/bin/sh', '-c', TREE, 'sh', dir]);
  expect(r.stderr).toBe('');
  return r.stdout;
}

export function snapshotContract(backend: BackendName, opts: ContractOptions = {}): void {
  describe(`snapshot contract: ${backend}`, () => {
    let airlock: Airlock;
    const owned: Sandbox[] = [];
    const snaps: Snapshot[] = [];
    const hostPaths: string[] = [];

    beforeAll(() => {
      airlock = testAirlock();
    });
    afterEach(async () => {
      await Promise.allSettled(owned.splice(0).map((s) => s.kill()));
      // Newest first: a snapshot's children go before it.
      for (const s of snaps.splice(0).reverse()) {
        await s.remove().catch((e: unknown) => {
          if (!AirlockError.is(e, 'SNAPSHOT_NOT_FOUND')) throw e;
        });
      }
      for (const p of hostPaths.splice(0)) rmSync(p, { recursive: true, force: true });
    });
    afterAll(async () => {
      await airlock?.killAll();
    });

    const create = async (spec: Omit<SandboxSpecInput, 'backend'> = {}): Promise<Sandbox> => {
      const sbx = await Sandbox.create({ backend, ...spec }, { airlock });
      owned.push(sbx);
      return sbx;
    };
    const snapshot = async (sbx: Sandbox): Promise<Snapshot> => {
      const s = await sbx.snapshot();
      snaps.push(s);
      return s;
    };
    const fork = async (snap: Snapshot, o: Parameters<Snapshot['fork']>[0] = {}): Promise<Sandbox> => {
      const sbx = await snap.fork({ ...o, count: undefined });
      owned.push(sbx);
      return sbx;
    };
    const sh = async (sbx: Sandbox, cmd: string): Promise<string> => {
      const r = await sbx.exec(cmd);
      expect({ cmd, stderr: r.stderr, exitCode: r.exitCode }).toEqual({ cmd, stderr: '', exitCode: 0 });
      return r.stdout;
    };
    /** A host dir shaped like a small project checkout, removed after the test. */
    const projectDir = (): string => {
      const d = mkdtempSync(join(tmpdir(), 'airlock-snapshot-'));
      hostPaths.push(d);
      chmodSync(d, 0o755);
      writeFileSync(join(d, 'README.md'), '# project\n');
      mkdirSync(join(d, 'src'));
      writeFileSync(join(d, 'src', 'main.py'), 'print("hello")\n');
      writeFileSync(join(d, 'src', 'util.py'), 'X = 1\n');
      writeFileSync(join(d, 'data.bin'), Buffer.from([0, 1, 2, 254, 255]));
      symlinkSync('src/main.py', join(d, 'entry'));
      return d;
    };

    const { test, unknownSkips } = contractRegistrar(opts);

    // ---- snapshot and fork ----------------------------------------------------------------------

    describe('snapshot', () => {
      test('a snapshot captures the workspace and home, not /tmp', async () => {
        const sbx = await create();
        await sh(sbx, 'echo ws > /workspace/a.txt; mkdir -p /workspace/d/e; echo deep > /workspace/d/e/f');
        await sh(sbx, 'echo home > ~/.profile-x; mkdir ~/.cache; echo c > ~/.cache/c; echo t > /tmp/t');
        const before = Date.now();
        const snap = await snapshot(sbx);
        expect(snap.id).toMatch(/^sha256:[0-9a-f]{64}$/);
        expect(snap.digest).toBe(snap.id);
        expect(snap.backend).toBe(backend);
        expect(snap.source).toBe(sbx.id);
        expect(snap.parent).toEqual({ layers: [], workspace: { mode: 'empty' } });
        expect(snap.layers).toEqual([snap.id]);
        expect(snap.createdAt.getTime()).toBeGreaterThanOrEqual(before - 1000);
        expect(snap.createdAt.getTime()).toBeLessThanOrEqual(Date.now() + 1000);
        expect(snap.sizeBytes).toBe(3 + 5 + 5 + 2);
        expect(snap.entries).toBeGreaterThanOrEqual(8);
        expect(snap.diskBytes).toBeGreaterThan(0);

        const f = await fork(snap);
        expect(f.id).not.toBe(sbx.id);
        expect(f.info.layers).toEqual([snap.id]);
        expect(await f.files.read('a.txt')).toBe('ws\n');
        expect(await f.files.read('d/e/f')).toBe('deep\n');
        expect(await f.files.read('/home/user/.profile-x')).toBe('home\n');
        expect(await f.files.read('/home/user/.cache/c')).toBe('c\n');
        expect(await sh(f, 'ls -A /tmp')).toBe('');
        expect(await tree(f, '/workspace')).toBe(await tree(sbx, '/workspace'));
        expect(await tree(f, '/home/user')).toBe(await tree(sbx, '/home/user'));
      });

      test('the sandbox keeps running through a snapshot', async () => {
        const sbx = await create();
        const bg = await sbx.exec(
          'i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo $i >> /tmp/n; sleep 0.02; done',
          {
            background: true,
          },
        );
        await sleep(100);
        await snapshot(sbx);
        expect(sbx.paused).toBe(false);
        const r = await bg.wait();
        expect(r.exitCode).toBe(0);
        expect((await sbx.files.read('/tmp/n')).trim().split('\n')).toHaveLength(40);
        expect(await sh(sbx, 'echo still')).toBe('still\n');
      });

      test('types, modes, links and ownership survive a fork', async () => {
        const sbx = await create();
        await sh(
          sbx,
          [
            'cd /workspace',
            'mkdir -m 700 private && mkdir -m 750 shared && echo s > private/secret && chmod 600 private/secret',
            'printf "#!/bin/sh\\necho run\\n" > tool && chmod 755 tool',
            ': > empty && ln -s tool link && ln -s /etc/hostname abs && ln -s missing dangling',
            'mkfifo pipe && ln tool hardlink',
            'head -c 300000 /dev/urandom > blob && cp blob ~/blob',
            'printf x > "$(printf "caf\\351")"', // a name that is not UTF-8
            'echo u > suid && chmod 4755 suid',
          ].join(' && '),
        );
        const snap = await snapshot(sbx);
        const f = await fork(snap);
        const parentTree = await tree(sbx, '/workspace');
        const forkTree = await tree(f, '/workspace');
        // setuid/setgid bits are not captured (they grant nothing inside a sandbox); all else is equal.
        expect(parentTree).toContain('./suid regular file 4755');
        expect(forkTree).toBe(parentTree.replace('./suid regular file 4755', './suid regular file 755'));
        expect(await sh(f, 'readlink /workspace/link /workspace/abs /workspace/dangling')).toBe(
          'tool\n/etc/hostname\nmissing\n',
        );
        expect(await sh(f, '/workspace/tool')).toBe('run\n');
        expect(
          await sh(
            f,
            'stat -c %h /workspace/hardlink; [ /workspace/tool -ef /workspace/hardlink ] && echo same',
          ),
        ).toBe('2\nsame\n');
        expect(await sh(f, 'sha256sum < /workspace/blob; sha256sum < ~/blob')).toBe(
          await sh(sbx, 'sha256sum < /workspace/blob; sha256sum < ~/blob'),
        );
        // The fork owns what it was given: it can change and delete it.
        await sh(
          f,
          'echo more >> /workspace/private/secret && rm /workspace/tool && chmod 700 /workspace/shared',
        );
        expect(await f.files.read('private/secret')).toBe('s\nmore\n');
        expect(await sh(f, 'id -u; stat -c %u /workspace/private/secret ~/blob')).toMatch(
          /^(\d+)\n\1\n\1\n$/,
        );
      });

      test('a fork changes nothing in its parent, its siblings or the snapshot', async () => {
        const sbx = await create();
        await sh(
          sbx,
          'echo 1 > /workspace/v && mkdir /workspace/d && echo keep > /workspace/d/k && echo h > ~/h',
        );
        const snap = await snapshot(sbx);
        const [a, b] = await snap.fork({ count: 2 });
        owned.push(a!, b!);
        await sh(
          a!,
          'echo 2 > /workspace/v && rm -r /workspace/d && echo new > /workspace/new && rm ~/h && echo a > ~/a',
        );
        await sh(sbx, 'echo 3 > /workspace/v && echo p > /workspace/p');
        expect(await a!.files.read('v')).toBe('2\n');
        expect(await sh(a!, 'ls -A /workspace ~')).toBe('/home/user:\na\n\n/workspace:\nnew\nv\n');
        // The sibling still sees the snapshot.
        expect(await b!.files.read('v')).toBe('1\n');
        expect(await sh(b!, 'ls -A /workspace ~; cat /workspace/d/k')).toBe(
          '/home/user:\nh\n\n/workspace:\nd\nv\nkeep\n',
        );
        // The parent sees only its own changes.
        expect(await sbx.files.read('v')).toBe('3\n');
        expect(await sh(sbx, 'ls -A /workspace ~')).toBe('/home/user:\nh\n\n/workspace:\nd\np\nv\n');
        // A new fork still starts from the snapshot, even after its first forks are gone.
        await a!.kill();
        const c = await fork(snap);
        expect(await sh(c, 'ls -A /workspace ~; cat /workspace/v')).toBe(
          '/home/user:\nh\n\n/workspace:\nd\nv\n1\n',
        );
      });

      test('deletions over a host workspace are deletions in the fork', async () => {
        const dir = projectDir();
        const before = picture(dir);
        const sbx = await create({ workspace: { mode: 'cow', hostDir: dir } });
        // Delete a file and a symlink, replace a dir by a new one of the same name, edit a file.
        await sh(
          sbx,
          'rm README.md entry && rm -r src && mkdir src && echo "new" > src/new.py && echo e >> data.bin',
        );
        const snap = await snapshot(sbx);
        expect(snap.parent).toEqual({ layers: [], workspace: { mode: 'cow', hostDir: dir } });
        const f = await fork(snap);
        expect(f.spec.workspace).toEqual({ mode: 'cow', hostDir: dir });
        expect(await sh(f, 'ls -A /workspace /workspace/src')).toBe(
          '/workspace:\ndata.bin\nsrc\n\n/workspace/src:\nnew.py\n',
        );
        expect(await tree(f, '/workspace')).toBe(await tree(sbx, '/workspace'));
        // The fork can bring a deleted name back, and delete more; the host dir never changes.
        await sh(f, 'echo back > README.md && rm data.bin');
        expect(await sh(f, 'ls -A /workspace')).toBe('README.md\nsrc\n');
        expect(await sh(sbx, 'ls -A /workspace')).toBe('data.bin\nsrc\n');
        expect(picture(dir)).toEqual(before);
      });

      test('deletions in a fork are deletions in its own snapshot', async () => {
        const sbx = await create();
        await sh(
          sbx,
          'echo a > /workspace/a && echo b > /workspace/b && mkdir -p /workspace/d/sub && echo x > /workspace/d/sub/x && echo h > ~/h && echo g > ~/g',
        );
        const s1 = await snapshot(sbx);
        const f1 = await fork(s1);
        await sh(
          f1,
          'rm /workspace/a ~/h && rm -r /workspace/d && mkdir /workspace/d && echo y > /workspace/d/y',
        );
        const s2 = await snapshot(f1);
        expect(s2.parent).toEqual({ layers: [s1.id], workspace: { mode: 'empty' } });
        const f2 = await fork(s2);
        expect(await sh(f2, 'ls -A /workspace /workspace/d ~')).toBe(
          '/home/user:\ng\n\n/workspace:\nb\nd\n\n/workspace/d:\ny\n',
        );
        expect(await tree(f2, '/workspace')).toBe(await tree(f1, '/workspace'));
        // s1 is unchanged by all of it.
        const f3 = await fork(s1);
        expect(await sh(f3, 'ls -A /workspace /workspace/d/sub ~')).toBe(
          '/home/user:\ng\nh\n\n/workspace:\na\nb\nd\n\n/workspace/d/sub:\nx\n',
        );
      });

      test('forks of forks stack layers', async () => {
        const dir = projectDir();
        let sbx = await create({ workspace: { mode: 'cow', hostDir: dir } });
        const chain: Snapshot[] = [];
        for (let i = 1; i <= 4; i++) {
          await sh(
            sbx,
            `echo ${i} > /workspace/gen && echo ${i} >> ~/history && echo x > /workspace/only-${i}`,
          );
          if (i > 1) await sh(sbx, `rm /workspace/only-${i - 1}`);
          const s = await snapshot(sbx);
          expect(s.parent.layers).toEqual(chain.map((c) => c.id).reverse());
          expect(s.layers).toEqual([s.id, ...chain.map((c) => c.id).reverse()]);
          chain.push(s);
          sbx = await fork(s);
          expect(sbx.info.layers).toEqual(s.layers);
        }
        expect(await sbx.files.read('gen')).toBe('4\n');
        expect(await sbx.files.read('/home/user/history')).toBe('1\n2\n3\n4\n');
        expect(await sh(sbx, 'ls /workspace')).toBe('README.md\ndata.bin\nentry\ngen\nonly-4\nsrc\n');
        expect(await sbx.files.read('src/main.py')).toBe('print("hello")\n');
        // Every level still forks to its own state.
        const second = await fork(chain[1]!);
        expect(await second.files.read('/home/user/history')).toBe('1\n2\n');
        expect(await sh(second, 'ls /workspace | grep only-')).toBe('only-2\n');
      });

      test('fork({ count }) starts that many independent sandboxes', async () => {
        const sbx = await create();
        await sh(sbx, 'echo base > /workspace/base');
        const snap = await snapshot(sbx);
        const forks = await snap.fork({ count: 4 });
        owned.push(...forks);
        expect(forks).toHaveLength(4);
        expect(new Set(forks.map((f) => f.id)).size).toBe(4);
        expect(new Set(forks.map((f) => f.info.hostUid)).size).toBe(4);
        await Promise.all(forks.map((f, i) => sh(f, `echo ${i} > /workspace/me`)));
        const seen = await Promise.all(
          forks.map((f) => sh(f, 'cat /workspace/base /workspace/me; ls /workspace')),
        );
        seen.forEach((out, i) => expect(out).toBe(`base\n${i}\nbase\nme\n`));
        for (const bad of [0, -1, 1.5, 65, Number.NaN]) {
          await expectError(snap.fork({ count: bad }), 'INVALID_ARGUMENT', 'count');
        }
      });

      test('a fork takes the spec of its snapshot, with fork options on top', async () => {
        const sbx = await create({
          env: { FROM: 'parent' },
          metadata: { role: 'parent' },
          limits: { memoryBytes: 256 * MiB, pids: 64 },
          ttlMs: 120_000,
        });
        await sh(sbx, 'echo x > /workspace/x');
        const snap = await snapshot(sbx);
        const plain = await fork(snap);
        expect(plain.spec.env).toEqual({ FROM: 'parent' });
        expect(plain.spec.limits).toMatchObject({ memoryBytes: 256 * MiB, pids: 64 });
        expect(plain.info.metadata).toEqual({ role: 'parent' });
        expect(plain.spec.ttlMs).toBe(600_000); // a fork is a new session: its own TTL
        const f = await fork(snap, { ttlMs: 5000, env: { FROM: 'fork' }, metadata: { role: 'fork' } });
        expect(f.info.expiresAt!.getTime() - Date.now()).toBeLessThanOrEqual(5000);
        expect(await sh(f, 'echo $FROM; cat /workspace/x')).toBe('fork\nx\n');
        expect(f.info.metadata).toEqual({ role: 'fork' });
        expect(f.spec.limits).toMatchObject({ memoryBytes: 256 * MiB, pids: 64 });
        for (const key of ['workspace', 'layers', 'backend']) {
          const bad = { [key]: key === 'layers' ? [] : key === 'backend' ? backend : { mode: 'empty' } };
          await expectError(snap.fork(bad as Parameters<Snapshot['fork']>[0]), 'INVALID_ARGUMENT', key);
        }
      });

      test('a read-only workspace forks read-only, with the home it had', async () => {
        const dir = projectDir();
        const sbx = await create({ workspace: { mode: 'ro', hostDir: dir } });
        await sh(sbx, 'echo h > ~/notes');
        const snap = await snapshot(sbx);
        const f = await fork(snap);
        expect(await f.files.read('README.md')).toBe('# project\n');
        expect(await f.files.read('/home/user/notes')).toBe('h\n');
        expect((await f.exec('echo x > /workspace/new')).exitCode).not.toBe(0);
        await sh(f, 'echo more >> ~/notes');
        expect(await sbx.files.read('/home/user/notes')).toBe('h\n');
      });

      test('the same content gives the same digest', async () => {
        const write = async (extra: string): Promise<Snapshot> => {
          const sbx = await create();
          await sh(
            sbx,
            `mkdir -p /workspace/a/b && printf "one" > /workspace/a/b/f && ln -s a/b/f /workspace/l && mkfifo /workspace/p && echo h > ~/h && echo t > /tmp/ignored-$RANDOM ${extra}`,
          );
          return snapshot(sbx);
        };
        const one = await write('');
        await sleep(1100); // different timestamps: they are not part of the digest
        const two = await write('&& touch -d 2001-01-01 /workspace/a/b/f');
        expect(two.id).toBe(one.id);
        expect((await airlock.snapshots.list()).filter((s) => s.id === one.id)).toHaveLength(1);
        expect((await write('&& printf "!" >> /workspace/a/b/f')).id).not.toBe(one.id);
        expect((await write('&& chmod 600 /workspace/a/b/f')).id).not.toBe(one.id);
        expect((await write('&& mv ~/h ~/g')).id).not.toBe(one.id);
        // Also on top of a snapshot: the same changes over the same parent, the same digest.
        const f1 = await fork(one);
        const f2 = await fork(one);
        await Promise.all([f1, f2].map((f) => sh(f, 'rm /workspace/l && echo n > ~/n')));
        const [c1, c2] = [await snapshot(f1), await snapshot(f2)];
        expect(c1.id).toBe(c2.id);
        expect(c1.id).not.toBe(one.id);
      });
    });

    // ---- the tier a fork runs on (no silent downgrade) --------------------------------------------

    describe('tier', () => {
      // Both tiers are needed: the other one makes the same content first (it used to own the digest).
      if (!canRunGvisor) return;
      const other: BackendName = backend === 'gvisor' ? 'namespaces' : 'gvisor';
      const kernel = (sbx: Sandbox): Promise<string> => sh(sbx, 'cat /proc/version');
      const onOther = async (): Promise<Sandbox> => {
        const sbx = await Sandbox.create({ backend: other }, { airlock });
        owned.push(sbx);
        return sbx;
      };

      test("a fork runs on its snapshot's tier and kernel, also when the other tier has the same content", async () => {
        const content = 'echo same > /workspace/f && echo h > ~/h';
        const o = await onOther();
        await sh(o, content);
        const theirs = await snapshot(o);
        const sbx = await create();
        await sh(sbx, content);
        const mine = await snapshot(sbx);
        const [myKernel, otherKernel] = [await kernel(sbx), await kernel(o)];
        expect(myKernel).not.toBe(otherKernel); // gVisor's sentry reports its own kernel
        expect(sbx.info.backend).toBe(backend);
        expect({ mine: mine.backend, theirs: theirs.backend }).toEqual({ mine: backend, theirs: other });
        expect(mine.id).not.toBe(theirs.id);
        expect((await airlock.snapshots.inspect(mine.id)).backend).toBe(backend);
        // A fork, forks with count, a fork of a fork: each on this tier's kernel, with the content.
        const f = await fork(mine);
        expect(f.info.backend).toBe(backend);
        expect(await kernel(f)).toBe(myKernel);
        expect(await sh(f, 'cat /workspace/f ~/h')).toBe('same\nh\n');
        const many = await mine.fork({ count: 2 });
        owned.push(...many);
        for (const m of many) expect([m.info.backend, await kernel(m)]).toEqual([backend, myKernel]);
        await sh(f, 'echo more >> /workspace/f');
        const ff = await fork(await snapshot(f));
        expect([ff.info.backend, await kernel(ff)]).toEqual([backend, myKernel]);
        // The other tier's snapshot still forks onto the other tier.
        const of = await fork(theirs);
        expect([of.info.backend, await kernel(of)]).toEqual([other, otherKernel]);
        // Started from the snapshot as a template, or on its layers, with no tier named: its tier,
        // not the default one.
        const t = await airlock.create({ template: mine.id });
        owned.push(t);
        expect([t.info.backend, await kernel(t)]).toEqual([backend, myKernel]);
        const l = await airlock.create({ layers: [...mine.layers], workspace: mine.parent.workspace });
        owned.push(l);
        expect([l.info.backend, await kernel(l)]).toEqual([backend, myKernel]);
      }, 120_000);

      test('snapshots of unchanged sandboxes on the two tiers are two snapshots, each forking on its tier', async () => {
        // Nothing written: the same (empty) content over the same parent on both tiers, in both orders.
        const first = await snapshot(await create());
        const o = await onOther();
        const theirs = await snapshot(o);
        const second = await snapshot(await create());
        expect(second.id).toBe(first.id);
        expect(theirs.id).not.toBe(first.id);
        expect([first.backend, theirs.backend]).toEqual([backend, other]);
        const f = await fork(second);
        const of = await fork(theirs);
        expect([f.info.backend, of.info.backend]).toEqual([backend, other]);
        expect(await kernel(f)).not.toBe(await kernel(of));
        expect(await kernel(of)).toBe(await kernel(o));
      }, 120_000);
    });

    // ---- listing and removal --------------------------------------------------------------------

    describe('snapshots', () => {
      test('snapshots are listed, inspected and removed', async () => {
        const sbx = await create();
        await sh(sbx, 'echo listed > /workspace/l');
        const snap = await snapshot(sbx);
        const listed = (await airlock.snapshots.list()).find((s) => s.id === snap.id);
        expect(listed?.toJSON()).toEqual(snap.toJSON());
        const inspected = await airlock.snapshots.inspect(snap.id);
        expect(inspected.toJSON()).toEqual(snap.toJSON());
        expect(JSON.parse(JSON.stringify(inspected))).toMatchObject({
          id: snap.id,
          createdAt: snap.createdAt.toISOString(),
        });
        expect(await inspected.users()).toEqual([]);
        // An inspected snapshot forks like the one snapshot() returned.
        const f = await fork(inspected);
        expect(await f.files.read('l')).toBe('listed\n');
        await f.kill();
        await airlock.snapshots.remove(snap.id);
        expect((await airlock.snapshots.list()).map((s) => s.id)).not.toContain(snap.id);
        await expectError(airlock.snapshots.inspect(snap.id), 'SNAPSHOT_NOT_FOUND', 'id');
        await expectError(airlock.snapshots.remove(snap.id), 'SNAPSHOT_NOT_FOUND', 'id');
        await expectError(snap.fork(), 'SNAPSHOT_NOT_FOUND');
        await expectError(airlock.snapshots.inspect('nope'), 'INVALID_ARGUMENT', 'id');
        await expectError(airlock.snapshots.remove('sha256:1234'), 'INVALID_ARGUMENT', 'id');
        // The sandbox it was taken from is unaffected and can snapshot again.
        expect(await sbx.files.read('l')).toBe('listed\n');
        expect((await snapshot(sbx)).id).toBe(snap.id);
      });

      test('a snapshot used by a live fork cannot be removed until the forks are gone', async () => {
        const sbx = await create();
        await sh(sbx, 'head -c 4194304 /dev/urandom > /workspace/big');
        const snap = await snapshot(sbx);
        expect(snap.sizeBytes).toBe(4 * MiB);
        expect(snap.diskBytes).toBeGreaterThanOrEqual(4 * MiB);
        const [a, b] = await snap.fork({ count: 2 });
        owned.push(a!, b!);
        expect(await snap.users()).toEqual([a!.id, b!.id].sort());
        const e = await expectError(snap.remove(), 'SNAPSHOT_IN_USE');
        expect(e.message).toContain(a!.id);
        await a!.kill();
        await expectError(airlock.snapshots.remove(snap.id), 'SNAPSHOT_IN_USE');
        // Still intact for the remaining fork and for new ones.
        expect(await sh(b!, 'wc -c < /workspace/big')).toBe(`${4 * MiB}\n`);
        const c = await fork(snap);
        await c.kill();
        await b!.kill();
        expect(await snap.users()).toEqual([]);
        await snap.remove();
        await expectError(airlock.snapshots.inspect(snap.id), 'SNAPSHOT_NOT_FOUND');
        // The sandbox it came from never depended on it.
        expect(await sh(sbx, 'wc -c < /workspace/big')).toBe(`${4 * MiB}\n`);
      });

      test('a snapshot another snapshot builds on cannot be removed before it', async () => {
        const sbx = await create();
        await sh(sbx, 'echo 1 > /workspace/one');
        const s1 = await snapshot(sbx);
        const f = await fork(s1);
        await sh(f, 'echo 2 > /workspace/two');
        const s2 = await snapshot(f);
        await f.kill();
        const e = await expectError(s1.remove(), 'SNAPSHOT_IN_USE');
        expect(e.message).toContain(s2.id);
        const g = await fork(s2);
        expect(await sh(g, 'cat /workspace/one /workspace/two')).toBe('1\n2\n');
        await g.kill();
        await s2.remove();
        await s1.remove();
      });

      test('snapshot and fork errors are typed', async () => {
        const sbx = await create();
        const snap = await snapshot(sbx);
        await sbx.kill();
        await expectError(sbx.snapshot(), 'SANDBOX_GONE');
        const digest = `sha256:${'0'.repeat(64)}`;
        await expectError(create({ layers: ['latest'] }), 'INVALID_SPEC', 'layers.0');
        await expectError(create({ layers: [digest] }), 'INVALID_SPEC', 'layers.0');
        await expectError(create({ layers: [snap.id, snap.id] }), 'INVALID_SPEC', 'layers');
        await expectError(create({ layers: [snap.id, digest] }), 'INVALID_SPEC', 'layers');
        const dir = projectDir();
        await expectError(
          create({ layers: [snap.id], workspace: { mode: 'cow', hostDir: dir } }),
          'INVALID_SPEC',
          'workspace',
        );
        const aborted = new AbortController();
        aborted.abort();
        const live = await create();
        await expectError(live.snapshot({ signal: aborted.signal }), 'ABORTED');
      });
    });

    // ---- persistent, pause, resume --------------------------------------------------------------

    describe('persistent and pause', () => {
      test('a persistent sandbox is exempt from the TTL until killed', async () => {
        const sbx = await create({ persistent: true, ttlMs: 1000 });
        expect(sbx.info.persistent).toBe(true);
        expect(sbx.info.expiresAt).toBeNull();
        const ordinary = await create({ ttlMs: 1000 });
        await sleep(1800);
        expect(ordinary.alive).toBe(false);
        expect(sbx.alive).toBe(true);
        expect(await sh(sbx, 'echo alive')).toBe('alive\n');
        await expectError(() => sbx.setTimeout(5000), 'INVALID_ARGUMENT', 'ttlMs');
        // Its forks are ordinary sandboxes unless they ask to be persistent too.
        const snap = await snapshot(sbx);
        const f = await fork(snap, { ttlMs: 1000 });
        const p = await fork(snap, { ttlMs: 1000, persistent: true });
        expect(f.info.persistent).toBe(false);
        await sleep(1500);
        expect(f.alive).toBe(false);
        expect(p.alive).toBe(true);
        await sbx.kill();
        expect(sbx.alive).toBe(false);
        await expectError(sbx.exec('true'), 'SANDBOX_GONE');
      });

      test('pause stops a running counter and resume continues it', async () => {
        const sbx = await create({ persistent: true });
        const counter = await sbx.exec('while :; do echo "$(date +%s%3N)" >> /tmp/ticks; sleep 0.02; done', {
          background: true,
          timeoutMs: 60_000,
        });
        // Ticks come as fast as the tier starts processes (date and sleep each tick): wait for some.
        const ticksNow = async (): Promise<number> =>
          (await sbx.files.read('/tmp/ticks').catch(() => '')).trim().split('\n').filter(Boolean).length;
        for (let i = 0; i < 100 && (await ticksNow()) <= 6; i++) await sleep(100);
        const pauseCalled = Date.now();
        await sbx.pause();
        const paused = Date.now();
        expect(sbx.paused).toBe(true);
        expect(sbx.info.paused).toBe(true);
        await sbx.pause(); // idempotent
        await expectError(sbx.exec('true'), 'SANDBOX_PAUSED');
        await expectError(sbx.files.read('/tmp/ticks'), 'SANDBOX_PAUSED');
        await expectError(sbx.spawn('cat'), 'SANDBOX_PAUSED');
        await sleep(1000);
        const resumed = Date.now();
        await sbx.resume();
        await sbx.resume(); // idempotent
        expect(sbx.paused).toBe(false);
        const atResume = await ticksNow();
        for (let i = 0; i < 100 && (await ticksNow()) <= atResume + 6; i++) await sleep(100);
        const ticks = (await sbx.files.read('/tmp/ticks')).trim().split('\n').map(Number);
        const before = ticks.filter((t) => t <= paused);
        const during = ticks.filter((t) => t > paused + 20 && t < resumed);
        const after = ticks.filter((t) => t >= resumed);
        expect(before.filter((t) => t < pauseCalled).length).toBeGreaterThan(5);
        expect(during).toEqual([]);
        expect(after.length).toBeGreaterThan(5);
        await counter.kill();
      });

      test('a paused sandbox can be snapshotted and killed', async () => {
        const sbx = await create();
        await sh(sbx, 'echo p > /workspace/p');
        const running = sbx.exec('sleep 30', { timeoutMs: 40_000 });
        await sleep(100);
        await sbx.pause();
        const snap = await snapshot(sbx);
        expect(sbx.paused).toBe(true); // a snapshot does not thaw a paused sandbox
        const f = await fork(snap);
        expect(await f.files.read('p')).toBe('p\n');
        await sbx.kill();
        expect((await running).killedBy).toBe('killed');
        await expectError(sbx.resume(), 'SANDBOX_GONE');
      });
    });

    // ---- host -----------------------------------------------------------------------------------

    describe('host', () => {
      test('100 snapshot/fork/kill cycles leave nothing behind', async () => {
        const sbx = await create();
        await sh(sbx, 'echo base > /workspace/base && echo h > ~/h');
        const base = await snapshot(sbx);
        const ids = new Set<string>();
        for (let i = 0; i < 100; i++) {
          const f = await base.fork();
          await f.files.write(`/workspace/n`, String(i));
          const s = await f.snapshot();
          ids.add(s.id);
          await f.kill();
          await s.remove();
        }
        expect(ids.size).toBe(100);
        const forks = await base.fork({ count: 8 });
        await Promise.all(forks.map((f) => f.kill()));
        await sbx.kill();
        await base.remove();
        await Promise.allSettled(owned.splice(0).map((s) => s.kill()));
        await airlock.killAll(); // also the warm pool
        let r = residue();
        for (
          let waited = 0;
          waited < 2000 && JSON.stringify(r) !== JSON.stringify(NO_RESIDUE);
          waited += 50
        ) {
          await sleep(50);
          r = residue();
        }
        expect(r).toEqual(NO_RESIDUE);
        const left = (await airlock.snapshots.list()).map((s) => s.id);
        for (const id of [...ids, base.id]) expect(left).not.toContain(id);
      }, 120_000);
    });

    // Checked when run: nested describes are collected after this body returns, so only then have
    // all of them registered their tests (as in sandbox.contract.ts).
    it('every declared skip names a test of the suite', () => {
      expect(unknownSkips()).toEqual([]);
    });
  });
}
