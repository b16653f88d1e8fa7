// The snapshot contract against the namespaces tier, and what only this tier can show: the layer on
// the host disk (owners, modes, whiteouts, read-only idmapped mounts), symlinks planted for the root
// copier, and forks owned by other (live or killed) processes.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { AirlockError, type Airlock, type Sandbox, type Snapshot } from '../../src/index.js';
import { libc } from '../../src/core/libc.privileged.js';
import {
  canRunNamespaces,
  NO_RESIDUE,
  residue,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  testAirlock,
} from '../helpers.js';
import { snapshotContract } from './snapshot.contract.js';

const LAYERS = join(TEST_STATE_DIR, 'layers');

if (canRunNamespaces) {
  snapshotContract('namespaces', { skip: {} });

  describe('snapshots on the namespaces tier', () => {
    let airlock: Airlock;
    const owned: Sandbox[] = [];
    const snaps: Snapshot[] = [];
    const hostPaths: string[] = [];
    beforeAll(() => {
      airlock = testAirlock();
    });
    afterEach(async () => {
      await Promise.allSettled(owned.splice(0).map((s) => s.kill()));
      for (const s of snaps.splice(0).reverse()) await s.remove().catch(() => {});
      for (const p of hostPaths.splice(0)) rmSync(p, { recursive: true, force: true });
    });
    afterAll(async () => {
      await airlock?.killAll();
    });
    const create = async (spec: Parameters<Airlock['create']>[0] = {}): Promise<Sandbox> => {
      const s = await airlock.create(spec);
      owned.push(s);
      return s;
    };
    const snapshot = async (sbx: Sandbox): Promise<Snapshot> => {
      const s = await sbx.snapshot();
      snaps.push(s);
      return s;
    };
    const sh = async (sbx: Sandbox, cmd: string): Promise<string> => {
      const r = await sbx.exec(cmd);
      expect({ stderr: r.stderr, exitCode: r.exitCode }).toEqual({ stderr: '', exitCode: 0 });
      return r.stdout;
    };
    const xattr = (p: string, name: string): string | undefined => {
      const buf = Buffer.alloc(64);
      const n = libc().lgetxattr(Buffer.from(`${p}\0`), name, buf, buf.length);
      return n < 0 ? undefined : buf.subarray(0, n).toString();
    };
    const layerFs = (s: Snapshot): string => join(LAYERS, s.id, 'fs');

    it('a layer is root-owned, in a root-only dir, with overlayfs whiteouts and opaque dirs', async () => {
      const dir = mkdtempSync(join(tmpdir(), 'airlock-layer-'));
      hostPaths.push(dir);
      writeFileSync(join(dir, 'gone.txt'), 'x');
      mkdirSync(join(dir, 'replaced'));
      writeFileSync(join(dir, 'replaced', 'old'), 'old');
      const sbx = await create({ workspace: { mode: 'cow', hostDir: dir } });
      await sh(
        sbx,
        'rm gone.txt && rm -r replaced && mkdir replaced && echo n > replaced/new && echo h > ~/h && chmod 640 ~/h',
      );
      const snap = await snapshot(sbx);
      expect(statSync(LAYERS).mode & 0o777).toBe(0o700);
      expect(statSync(LAYERS).uid).toBe(0);
      const fs = layerFs(snap);
      const gone = lstatSync(join(fs, 'workspace', 'gone.txt'));
      expect(gone.isCharacterDevice() && gone.rdev === 0).toBe(true);
      expect(xattr(join(fs, 'workspace', 'replaced'), 'trusted.overlay.opaque')).toBe('y');
      expect(readdirSync(join(fs, 'workspace', 'replaced'))).toEqual(['new']);
      const h = lstatSync(join(fs, 'home', 'h'));
      expect({ uid: h.uid, gid: h.gid, mode: h.mode & 0o7777, nlink: h.nlink }).toEqual({
        uid: 0,
        gid: 0,
        mode: 0o640,
        nlink: 1,
      });
      expect(readFileSync(join(fs, 'home', 'h'), 'utf8')).toBe('h\n');
      const record = JSON.parse(readFileSync(join(LAYERS, snap.id, 'snapshot.json'), 'utf8')) as {
        digest: string;
      };
      expect(record.digest).toBe(snap.id);
      expect(statSync(join(LAYERS, snap.id, 'snapshot.json')).mode & 0o777).toBe(0o600);
      // A fork sees the layer through read-only, idmapped mounts only.
      const f = await snap.fork();
      owned.push(f);
      const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
        .split('\n')
        .filter((l) => /\/layer-\d+$/.test(l.split(' ')[4] ?? '') && l.includes(`/sandboxes/${f.id}/`));
      expect(mounts).toHaveLength(1);
      expect(mounts[0]!.split(' ')[5]).toMatch(/^ro,/);
      expect(mounts[0]).toMatch(/idmapped/);
      expect(await sh(f, 'stat -c "%U %a" ~/h; ls /workspace')).toBe('user 640\nreplaced\n');
      // What the fork writes lands in its own upper, never in the layer.
      await sh(f, 'echo changed > ~/h && rm -r /workspace/replaced');
      expect(readFileSync(join(fs, 'home', 'h'), 'utf8')).toBe('h\n');
      expect(readdirSync(join(fs, 'workspace', 'replaced'))).toEqual(['new']);
    });

    it('symlinks planted for the root copier are copied as symlinks, never followed', async () => {
      const sbx = await create();
      await sh(
        sbx,
        'ln -s /etc/shadow ~/shadow && ln -s / ~/root && ln -s /proc/1/environ /workspace/env && mkdir /workspace/d && ln -s ../../../../../../etc /workspace/d/up',
      );
      const snap = await snapshot(sbx);
      const fs = layerFs(snap);
      for (const p of ['home/shadow', 'home/root', 'workspace/env', 'workspace/d/up'])
        expect(lstatSync(join(fs, p)).isSymbolicLink()).toBe(true);
      expect(snap.sizeBytes).toBe(0);
      const shadow = readFileSync('/etc/shadow');
      const walk = (d: string): void => {
        for (const n of readdirSync(d, { withFileTypes: true })) {
          const p = join(d, n.name);
          if (n.isDirectory()) walk(p);
          else if (n.isFile()) expect(readFileSync(p).includes(shadow)).toBe(false);
        }
      };
      walk(fs);
      const f = await snap.fork();
      owned.push(f);
      expect((await f.exec('cat ~/shadow')).exitCode).not.toBe(0);
      expect(await sh(f, 'readlink ~/root /workspace/d/up')).toBe('/\n../../../../../../etc\n');
    });

    it('a snapshot fails cleanly when the sandbox holds more apparent bytes than its disk', async () => {
      const sbx = await create({ limits: { diskBytes: 8 * 1024 * 1024 } });
      await sh(sbx, 'truncate -s 64M /workspace/sparse');
      const before = readdirSync(LAYERS);
      const e = await sbx.snapshot().catch((x: unknown) => x);
      expect(AirlockError.is(e, 'DISK_FULL')).toBe(true);
      expect(readdirSync(LAYERS)).toEqual(before); // the partial copy is gone
      expect(await sh(sbx, 'echo still running')).toBe('still running\n');
      await sh(sbx, 'rm /workspace/sparse && truncate -s 4M /workspace/sparse');
      const snap = await snapshot(sbx);
      expect(snap.sizeBytes).toBe(4 * 1024 * 1024);
      expect(snap.diskBytes).toBeLessThan(1024 * 1024); // holes stay holes
    });

    it('a fork owned by another process holds its snapshot until that process dies', async () => {
      const sbx = await create();
      await sh(sbx, 'echo held > /workspace/held');
      const snap = await snapshot(sbx);
      const child = spawn(process.execPath, ['--import', 'tsx', 'test/fixtures/fork-holder.ts', snap.id], {
        env: {
          ...process.env,
          AIRLOCK_STATE_DIR: TEST_STATE_DIR,
          AIRLOCK_UID_FIRST: String(TEST_UID_RANGE.first),
          AIRLOCK_UID_COUNT: String(TEST_UID_RANGE.count),
        },
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      onTestFinished(() => void child.kill('SIGKILL'));
      const line = await new Promise<string>((resolve, reject) => {
        createInterface({ input: child.stdout }).once('line', resolve);
        child.once('exit', (code) => reject(new Error(`fork-holder exited ${code}`)));
      });
      const [, forkId, content] = line.split(' ');
      expect(content).toBe('held');
      expect(await snap.users()).toEqual([forkId]);
      const e = await snap.remove().catch((x: unknown) => x);
      expect(AirlockError.is(e, 'SNAPSHOT_IN_USE')).toBe(true);
      expect((e as Error).message).toContain(forkId);
      // The owner dies without cleaning up: its fork is an orphan, reaped by the next removal.
      child.kill('SIGKILL');
      await new Promise((r) => child.once('exit', r));
      expect(existsSync(join(LAYERS, snap.id))).toBe(true);
      await snap.remove();
      expect(existsSync(join(LAYERS, snap.id))).toBe(false);
      expect(readdirSync(LAYERS).filter((n) => n.startsWith('.'))).toEqual([]);
      expect(readdirSync(join(TEST_STATE_DIR, 'sandboxes'))).not.toContain(forkId);
    });

    it('the reaper removes interrupted captures and removals, never a complete layer', async () => {
      const sbx = await create();
      await sh(sbx, 'echo keep > /workspace/k');
      const snap = await snapshot(sbx);
      await sbx.kill();
      // A capture by a process that died, a removal cut short, a dead owner's record of the layer.
      const deadTmp = join(LAYERS, '.tmp-999999-1-abcdef');
      mkdirSync(join(deadTmp, 'fs'), { recursive: true });
      const liveTmp = join(
        LAYERS,
        `.tmp-${process.pid}-${readFileSync(`/proc/${process.pid}/stat`, 'utf8').split(') ')[1]!.split(' ')[19]}-abcdef`,
      );
      mkdirSync(liveTmp);
      const trash = join(LAYERS, `.trash-${'1'.repeat(64)}-abcdef`);
      mkdirSync(trash);
      const fake = join(TEST_STATE_DIR, 'sandboxes', 'sbx-deadbeefdeadbeef');
      mkdirSync(fake, { recursive: true });
      writeFileSync(
        join(fake, 'owner.json'),
        JSON.stringify({
          id: 'sbx-deadbeefdeadbeef',
          owner: { pid: 999999, startTicks: '1' },
          layers: [snap.id],
        }),
      );
      symlinkSync('/nonexistent', join(fake, 'marker'));
      expect(await snap.users()).toEqual([]); // a dead owner uses nothing
      await testAirlock().reapOrphans();
      expect(existsSync(deadTmp)).toBe(false);
      expect(existsSync(liveTmp)).toBe(true); // ours: still alive
      rmSync(liveTmp, { recursive: true });
      expect(existsSync(trash)).toBe(false);
      expect(existsSync(fake)).toBe(false);
      expect(existsSync(join(LAYERS, snap.id, 'fs', 'workspace', 'k'))).toBe(true);
      const f = await snap.fork();
      owned.push(f);
      expect(await sh(f, 'cat /workspace/k')).toBe('keep\n');
    });

    it('a chain can be 32 layers deep, and no deeper', async () => {
      let sbx = await create();
      for (let i = 1; i <= 32; i++) {
        await sh(sbx, `echo ${i} > /workspace/l${i}`);
        const s = await snapshot(sbx);
        expect(s.layers).toHaveLength(i);
        sbx = await s.fork();
        owned.push(sbx);
      }
      expect(sbx.info.layers).toHaveLength(32);
      expect(await sh(sbx, 'cat /workspace/l1 /workspace/l32; ls /workspace | wc -l')).toBe('1\n32\n32\n');
      const e = await sbx.snapshot().catch((x: unknown) => x);
      expect(AirlockError.is(e, 'INVALID_ARGUMENT')).toBe(true);
      expect((e as Error).message).toMatch(/32 snapshot layers/);
    }, 120_000);

    it('leaves no residue on the host', async () => {
      await Promise.allSettled(owned.splice(0).map((s) => s.kill()));
      await airlock.killAll();
      let r = residue();
      for (let waited = 0; waited < 2000 && JSON.stringify(r) !== JSON.stringify(NO_RESIDUE); waited += 50) {
        await sleep(50);
        r = residue();
      }
      expect(r).toEqual(NO_RESIDUE);
      expect(readdirSync(LAYERS).filter((n) => n.startsWith('.'))).toEqual([]);
    });
  });
} else {
  describe('snapshot contract: namespaces', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
}
