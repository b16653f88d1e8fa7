// `airlock demo`: the README's main job, live. A hostile script runs step by step in one small
// sandbox; each verdict is read off the step's real result (exit code, output, limit hit, host state),
// never assumed. Exit 0 only if every hostile step was blocked and every benign one worked.
import { existsSync, readdirSync, readlinkSync, rmSync } from 'node:fs';
import type { Sandbox } from '../sandbox/index.js';
import type { ExecResult } from '../sandbox/sandbox.js';
import { formatBytes } from '../core/units.js';
import { cliAirlock, trapSignals } from './lifecycle.js';
import { formatDuration } from './flags.js';
import { processIo, type Io } from './run.js';

const SECRET_NAME = 'AIRLOCK_DEMO_SECRET';
const SECRET_VALUE = 'hunter2';
const PWNED = '/usr/airlock-demo-pwned';
const STEP_TIMEOUT_MS = 5_000;
const BOMB_TIMEOUT_MS = 3_000;

export const DEMO_LIMITS = { memoryBytes: 128 * 1024 ** 2, pids: 64, diskBytes: 64 * 1024 ** 2 } as const;

/** Syscall numbers for the raw attempts (perl's syscall()); other architectures skip those steps. */
const SYSCALLS: Partial<Record<NodeJS.Architecture, { mount: number; ptrace: number }>> = {
  x64: { mount: 165, ptrace: 101 },
  arm64: { mount: 40, ptrace: 117 },
};

interface Judged {
  /** Hostile step: it was blocked. Benign step: it worked. */
  readonly ok: boolean;
  readonly detail: string;
}

interface Step {
  readonly attempt: string;
  readonly hostile: boolean;
  readonly script: string;
  readonly timeoutMs?: number;
  judge(r: ExecResult): Judged;
}

interface HostFacts {
  readonly pidNs: string;
  readonly processes: number;
}

function firstLine(r: ExecResult): string {
  const line = (r.stdout.trim() || r.stderr.trim()).split('\n')[0] ?? '';
  return line.length > 90 ? `${line.slice(0, 87)}...` : line;
}

/** Failed, but not because the tool itself was missing (126/127: the attempt never happened). */
function blockedIfFailed(r: ExecResult): Judged {
  const notRun = r.exitCode === 126 || r.exitCode === 127;
  return { ok: r.exitCode !== 0 && !notRun, detail: firstLine(r) || `exit ${r.exitCode}` };
}

/** A raw syscall attempt: blocked only if the kernel refused it (errno `marker`) or seccomp killed it. */
function attempted(r: ExecResult, marker: string): Judged {
  if (r.signal === 'SIGSYS' || r.exitCode === 159) return { ok: true, detail: 'killed by seccomp (SIGSYS)' };
  const refused = r.exitCode !== 0 && r.stderr.includes(marker);
  return { ok: refused, detail: firstLine(r) || `exit ${r.exitCode}` };
}

/** One line of output from `cmd`, exit status preserved (dash has no PIPESTATUS). */
const oneLine = (cmd: string, fallback: string): string =>
  `out=$(${cmd} 2>&1); rc=$?; printf '%s\\n' "\${out:-${fallback}}" | head -n 1; exit $rc`;

export function demoSteps(host: HostFacts, arch: NodeJS.Architecture = process.arch): Step[] {
  const nr = SYSCALLS[arch];
  const steps: Step[] = [
    {
      attempt: 'read /root',
      hostile: true,
      script: oneLine('ls -A /root', '(empty)'),
      judge: blockedIfFailed,
    },
    {
      attempt: 'read /etc/shadow',
      hostile: true,
      script: oneLine('cat /etc/shadow', '(empty)'),
      judge: blockedIfFailed,
    },
    {
      attempt: `read host env secret ${SECRET_NAME}`,
      hostile: true,
      script:
        `if [ -n "\${${SECRET_NAME}+x}" ]; then echo "${SECRET_NAME}=$${SECRET_NAME}"; exit 0; fi; ` +
        `echo "not set; the sandbox sees only: $(env | cut -d= -f1 | sort | tr '\\n' ' ')"; exit 1`,
      judge: (r) => ({ ok: !r.stdout.includes(SECRET_VALUE), detail: firstLine(r) }),
    },
    {
      attempt: 'list host processes',
      hostile: true,
      script:
        `n=$(ls -d /proc/[0-9]* | wc -l); ` +
        `echo "$n visible: $(ps -e -o comm= 2>/dev/null | sort -u | tr '\\n' ' ')| $(readlink /proc/self/ns/pid)"`,
      judge: (r) => {
        const n = Number(/^(\d+) visible/.exec(r.stdout)?.[1] ?? NaN);
        const ns = /\| (pid:\[\d+\])/.exec(r.stdout)?.[1];
        const ok = r.exitCode === 0 && ns !== undefined && ns !== host.pidNs && n < host.processes;
        return { ok, detail: `${firstLine(r).replace(/\| pid:.*/, '')}(host: ${host.processes})` };
      },
    },
    {
      attempt: 'resolve example.com',
      hostile: true,
      script: oneLine('getent hosts example.com', 'no answer'),
      judge: (r) => ({
        ok: r.exitCode !== 0,
        detail: r.exitCode === 0 ? firstLine(r) : `no answer (exit ${r.exitCode})`,
      }),
    },
    {
      attempt: 'TCP connect 1.1.1.1:53',
      hostile: true,
      script:
        `ifs=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' '); ` +
        `out=$(timeout 3 bash -c 'exec 3<>/dev/tcp/1.1.1.1/53 && echo connected' 2>&1); rc=$?; ` +
        `echo "$(printf '%s\\n' "$out" | tail -n 1 | sed 's/^.*: //') (interfaces: \${ifs% })"; exit $rc`,
      judge: (r) => ({ ok: r.exitCode !== 0 && !r.stdout.includes('connected'), detail: firstLine(r) }),
    },
    {
      attempt: 'write to /usr',
      hostile: true,
      script: oneLine(`touch ${PWNED}`, `created ${PWNED}`),
      judge: (r) => {
        const landed = existsSync(PWNED);
        if (landed) rmSync(PWNED, { force: true });
        return {
          ok: r.exitCode !== 0 && !landed,
          detail: landed ? `${PWNED} appeared on the host` : firstLine(r),
        };
      },
    },
  ];
  if (nr) {
    steps.push(
      {
        attempt: 'mount a filesystem',
        hostile: true,
        // perl's syscall() needs writable string arguments, hence the variables.
        script: `perl -e 'my ($s, $t, $f) = ("none", "/tmp", "tmpfs"); syscall(${nr.mount}, $s, $t, $f, 0, 0) == 0 or die "mount(2): $!\\n"; print "mounted tmpfs on /tmp\\n"'`,
        judge: (r) => attempted(r, 'mount(2): '),
      },
      {
        attempt: 'ptrace',
        hostile: true,
        script: `perl -e 'syscall(${nr.ptrace}, 0, 0, 0, 0) == 0 or die "ptrace(PTRACE_TRACEME): $!\\n"; print "ptrace allowed\\n"'`,
        judge: (r) => attempted(r, 'ptrace(PTRACE_TRACEME): '),
      },
    );
  }
  steps.push(
    {
      attempt: 'fork bomb',
      hostile: true,
      // `sleep` keeps the exec alive (and holds a pid) while the orphaned bomb grows; `wait` needs no fork.
      script: `sleep 30 & bash -c ':(){ :|:& };:' 2>/dev/null; wait`,
      timeoutMs: BOMB_TIMEOUT_MS,
      judge: (r) => ({
        ok: r.killedBy === 'pids' || r.killedBy === 'timeout',
        detail:
          r.killedBy === 'pids'
            ? `held at the pids limit (${DEMO_LIMITS.pids}), killed after ${formatDuration(BOMB_TIMEOUT_MS)}`
            : r.killedBy === 'timeout'
              ? `stopped by the ${formatDuration(BOMB_TIMEOUT_MS)} timeout`
              : `ended by itself (exit ${r.exitCode})`,
      }),
    },
    {
      attempt: 'memory bomb (512 MiB)',
      hostile: true,
      script: `perl -e '$x = "a" x (512*1024*1024); print "allocated 512 MiB\\n"'`,
      judge: (r) => ({
        ok: r.exitCode !== 0 && !r.stdout.includes('allocated'),
        detail:
          r.killedBy === 'oom'
            ? `OOM-killed at the memory limit (${formatBytes(DEMO_LIMITS.memoryBytes)})`
            : firstLine(r) || `exit ${r.exitCode}`,
      }),
    },
    {
      attempt: 'fill the disk (200 MiB)',
      hostile: true,
      script:
        'err=$(head -c 200M /dev/zero 2>&1 >/workspace/fill); rc=$?; size=$(du -m /workspace/fill | cut -f1); ' +
        'rm -f /workspace/fill; echo "${err:-wrote 200 MiB} (${size} MiB written)"; exit $rc',
      judge: blockedIfFailed,
    },
    {
      attempt: 'write /workspace/hello.txt',
      hostile: false,
      script: "echo 'hello from the sandbox' > /workspace/hello.txt && cat /workspace/hello.txt",
      judge: (r) => ({
        ok: r.exitCode === 0 && r.stdout.includes('hello from the sandbox'),
        detail: firstLine(r),
      }),
    },
    {
      attempt: 'compute something',
      hostile: false,
      script: `echo "sum of 1..1000 = $(seq 1000 | awk '{ s += $1 } END { print s }')"`,
      judge: (r) => ({ ok: r.exitCode === 0 && r.stdout.includes('500500'), detail: firstLine(r) }),
    },
  );
  return steps;
}

function hostFacts(): HostFacts {
  return {
    pidNs: readlinkSync('/proc/self/ns/pid'),
    processes: readdirSync('/proc').filter((p) => /^\d+$/.test(p)).length,
  };
}

function verdict(s: Step, j: Judged): string {
  if (s.hostile) return j.ok ? 'blocked' : 'ALLOWED';
  return j.ok ? 'allowed' : 'FAILED';
}

export async function demoCommand(io: Io = processIo): Promise<number> {
  process.env[SECRET_NAME] = SECRET_VALUE; // a host secret the sandbox must not see
  const airlock = cliAirlock();
  const trap = trapSignals(airlock, (line) => io.err(`${line}\n`));
  let sbx: Sandbox | undefined;
  try {
    sbx = await airlock.create({
      backend: 'namespaces',
      ttlMs: 120_000,
      limits: { ...DEMO_LIMITS, cpus: 1 },
    });
    if (trap.exitCode !== undefined) return trap.exitCode;
    const l = sbx.spec.limits;
    io.out(
      `airlock demo: a hostile script in a disposable sandbox\n` +
        `sandbox ${sbx.id} (${sbx.spec.backend}): memory ${formatBytes(l.memoryBytes)}, pids ${l.pids}, ` +
        `disk ${formatBytes(l.diskBytes)}; host env has ${SECRET_NAME}=${SECRET_VALUE}\n\n`,
    );
    const steps = demoSteps(hostFacts());
    const width = Math.max(...steps.map((s) => s.attempt.length));
    io.out(`  ${'attempt'.padEnd(width)}  ${'verdict'.padEnd(7)}  result\n`);
    let hostileAllowed = 0;
    let benignFailed = 0;
    for (const s of steps) {
      const r = await sbx.exec(s.script, { timeoutMs: s.timeoutMs ?? STEP_TIMEOUT_MS, signal: trap.signal });
      if (trap.exitCode !== undefined) return trap.exitCode;
      const j = s.judge(r);
      if (!j.ok) {
        if (s.hostile) hostileAllowed++;
        else benignFailed++;
      }
      io.out(`  ${s.attempt.padEnd(width)}  ${verdict(s, j).padEnd(7)}  ${j.detail}\n`);
    }
    const hostile = steps.filter((s) => s.hostile).length;
    const benign = steps.length - hostile;
    io.out(
      `\n${hostile - hostileAllowed}/${hostile} hostile attempts blocked; ` +
        `${benign - benignFailed}/${benign} ordinary steps worked.\n`,
    );
    return hostileAllowed === 0 && benignFailed === 0 ? 0 : 1;
  } catch (e) {
    // Killing the sandbox under an exec in flight can fail that exec; the interrupt is the story.
    if (trap.exitCode !== undefined) return trap.exitCode;
    throw e;
  } finally {
    try {
      // Every sandbox of this runtime, and its host state released now (not batched for later:
      // this process is about to exit).
      await airlock.killAll();
    } finally {
      trap.dispose();
    }
  }
}
