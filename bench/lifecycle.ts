// P1: one-shot create → exec `true` → kill on the namespaces tier, beside the floor measured in the
// same run: plain spawn of `true`, and raw bwrap with the same isolation flags (same uid switch,
// namespaces, read-only /usr, /proc, /dev, tmpfs /tmp, the same seccomp program on an fd).
import { spawn } from 'node:child_process';
import { Airlock, Sandbox } from '../src/index.js';
import { buildSeccompFilter } from '../src/backends/namespaces/seccomp.privileged.js';
import { fmt, sample, summarize, type Summary } from './stats.js';

function run(cmd: string, args: string[], opts: { uid?: number; seccomp?: Buffer } = {}): Promise<void> {
  return new Promise((resolve, reject) => {
    const c = spawn(cmd, args, {
      env: {},
      stdio: opts.seccomp ? ['ignore', 'ignore', 'inherit', 'pipe'] : ['ignore', 'ignore', 'inherit'],
      ...(opts.uid !== undefined ? { uid: opts.uid, gid: opts.uid } : {}),
    });
    if (opts.seccomp) (c.stdio[3] as NodeJS.WritableStream).end(opts.seccomp);
    c.on('error', reject);
    c.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`${cmd} exited ${code}`))));
  });
}

const RAW_BWRAP = [
  '--unshare-all',
  '--unshare-user',
  '--disable-userns',
  '--die-with-parent',
  '--new-session',
  '--uid',
  '1000',
  '--gid',
  '1000',
  '--cap-drop',
  'ALL',
  '--ro-bind',
  '/usr',
  '/usr',
  '--symlink',
  'usr/bin',
  '/bin',
  '--symlink',
  'usr/lib',
  '/lib',
  '--symlink',
  'usr/lib64',
  '/lib64',
  '--proc',
  '/proc',
  '--dev',
  '/dev',
  '--tmpfs',
  '/tmp',
  '--seccomp',
  '3',
  '--',
  '/usr/bin/true',
];

export interface LifecycleReport {
  readonly spawnTrue: Summary;
  readonly rawBwrap: Summary;
  readonly airlock: Summary;
  readonly ratioToRawBwrap: number;
}

export async function lifecycle(opts: { runs: number; log: (s: string) => void }): Promise<LifecycleReport> {
  const { runs, log } = opts;
  const seccomp = buildSeccompFilter();
  const airlock = new Airlock({
    stateDir: '/var/tmp/airlock-bench',
    uidRange: { first: 3_800_000, count: 4096 },
  });
  await airlock.reapOrphans();

  log(`spawn true ×${runs}`);
  const spawnTrue = summarize(await sample(runs, () => run('/usr/bin/true', [])));
  log(`raw bwrap ×${runs}`);
  const rawBwrap = summarize(
    await sample(runs, () => run('/usr/bin/bwrap', RAW_BWRAP, { uid: 3_799_999, seccomp })),
  );
  log(`airlock create→exec true→kill ×${runs}`);
  const airlockS = summarize(
    await sample(runs, async () => {
      const sbx = await Sandbox.create({}, { airlock });
      const r = await sbx.exec(['/usr/bin/true']);
      await sbx.kill();
      if (r.exitCode !== 0) throw new Error(`exec failed: ${r.stderr}`);
    }),
  );
  return { spawnTrue, rawBwrap, airlock: airlockS, ratioToRawBwrap: airlockS.p50 / rawBwrap.p50 };
}

export function formatLifecycle(r: LifecycleReport): string {
  const row = (name: string, s: Summary): string =>
    `| ${name} | ${fmt(s.p50)} | ${fmt(s.p99)} | ${fmt(s.mean)} | ${(s.p50 / r.rawBwrap.p50).toFixed(2)}× |`;
  return [
    '| one-shot `true` | p50 | p99 | mean | p50 vs raw bwrap |',
    '|---|---|---|---|---|',
    row('plain spawn', r.spawnTrue),
    row('raw bwrap (same flags + seccomp)', r.rawBwrap),
    row('Airlock create→exec→kill', r.airlock),
    '',
    `target: Airlock p50 ≤ 1.5× raw bwrap → ${r.ratioToRawBwrap <= 1.5 ? 'MET' : 'MISSED'} (${r.ratioToRawBwrap.toFixed(2)}×), n=${r.airlock.n}`,
  ].join('\n');
}
