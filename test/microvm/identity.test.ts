// The guest agent fails closed on a refused IDENTITY frame (guest/agent.c refuse_identity): the host
// sends a sandbox's first EXEC right behind its IDENTITY without waiting for the answer
// (src/backends/microvm/start.ts identify), so a VM whose IDENTITY fails must power off before it
// reads the next frame, and that EXEC never runs. A real guest: QEMU booted directly (as root, no
// jail: this checks the agent, not the VMM's confinement), spoken to frame by frame.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { afterAll, describe, expect, it, vi } from 'vitest';
import {
  DEFAULT_CACHE_DIR,
  ensureAgent,
  ensureInitramfs,
  ensurePackageLayer,
  ensureRootfs,
  findKernel,
} from '../../src/backends/microvm/assets.js';
import { ensureEtc } from '../../src/backends/host/rootfs.js';
import {
  Frame,
  FrameDecoder,
  encodeExec,
  encodeFrame,
  type GuestFrame,
} from '../../src/backends/microvm/protocol.js';
import { findQemu, qemuArgs } from '../../src/backends/microvm/qemu.js';
import { TEST_STATE_DIR } from '../helpers.js';
import { MICROVM_SKIP_REASON, canRunMicrovm } from './qemus.js';

const MiB = 1024 * 1024;

describe.skipIf(!canRunMicrovm)(`microvm guest agent: a refused IDENTITY (${MICROVM_SKIP_REASON})`, () => {
  vi.setConfig({ testTimeout: 600_000 });
  const dir = mkdtempSync('/var/tmp/airlock-test-identity-');
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('powers the VM off before the EXEC sent right behind it runs', async () => {
    const kernel = findKernel(DEFAULT_CACHE_DIR);
    if (typeof kernel === 'string') throw new Error(kernel);
    const initramfs = await ensureInitramfs(DEFAULT_CACHE_DIR, kernel, await ensureAgent(DEFAULT_CACHE_DIR));
    const packages = await ensurePackageLayer(DEFAULT_CACHE_DIR);
    const rootfs = await ensureRootfs(DEFAULT_CACHE_DIR, [
      { dir: packages },
      { dir: ensureEtc(TEST_STATE_DIR), at: '/etc' },
    ]);
    const sock = join(dir, 'agent.sock');
    const args = qemuArgs({
      accel: 'tcg',
      kernel: kernel.vmlinuz,
      initramfs,
      rootfs,
      memoryBytes: 256 * MiB,
      pids: 64,
      vcpus: 1,
      diskBytes: 64 * MiB,
      agentSocket: sock,
    });
    const q = spawn(findQemu()!, args, { stdio: 'ignore' });
    const exited = new Promise<number | null>((r) => q.on('exit', (code) => r(code)));
    try {
      while (!existsSync(sock)) await new Promise((r) => setTimeout(r, 10));
      const s = connect(sock);
      const frames: GuestFrame[] = [];
      const decoder = new FrameDecoder();
      let hello!: () => void;
      const helloSeen = new Promise<void>((r) => (hello = r));
      let ran!: () => void;
      const started = new Promise<void>((r) => (ran = r));
      const closed = new Promise<void>((r) => s.on('close', () => r()));
      s.on('error', () => {});
      s.on('data', (c: Buffer) => {
        for (const f of decoder.push(c)) {
          frames.push(f);
          if (f.type === 'hello') hello();
          if (f.type === 'started') ran(); // the EXEC ran: the assertion below says so
        }
      });
      await helloSeen;
      // A malformed IDENTITY (too short) and, in the same write, an EXEC that would print.
      s.write(
        Buffer.concat([
          encodeFrame(Frame.IDENTITY, 1, Buffer.alloc(8)),
          encodeExec(2, { uid: 1000, argv: ['echo', 'ran'], env: {}, cwd: '/', stdin: false }),
        ]),
      );
      // The guest powered off: QEMU is gone (-no-reboot). Or the EXEC started (the test fails).
      await Promise.race([Promise.all([exited, closed]), started]);
      expect(frames.map((f) => f.type)).toEqual(['hello', 'error']);
      expect(frames[1]).toMatchObject({ id: 1, message: 'malformed identity' });
    } finally {
      q.kill('SIGKILL');
      await exited;
    }
  });
});
