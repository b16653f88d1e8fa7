// The airlock CLI as a user runs it: a real child process (node + tsx) creating real sandboxes on the
// test state dir and uid range. Exit codes, stdout/stderr shape, and no residue afterwards.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  GVISOR_SKIP_REASON,
  NO_RESIDUE,
  SKIP_REASON,
  TEST_STATE_DIR,
  TEST_UID_RANGE,
  canRunGvisor,
  canRunNamespaces,
  residue,
  type Residue,
} from '../helpers.js';

const ROOT = join(import.meta.dirname, '..', '..');

interface CliResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

interface CliOptions {
  env?: Record<string, string>;
  /** Called with each stdout chunk; lets a test act once the command is running. */
  onStdout?: (text: string, child: ReturnType<typeof spawn>) => void;
  timeoutMs?: number;
}

function cli(args: string[], o: CliOptions = {}): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'src/cli/main.ts', ...args], {
      cwd: ROOT,
      env: {
        ...process.env,
        AIRLOCK_STATE_DIR: TEST_STATE_DIR,
        AIRLOCK_UID_RANGE: `${TEST_UID_RANGE.first}:${TEST_UID_RANGE.count}`,
        ...o.env,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (t: string) => {
      stdout += t;
      o.onStdout?.(stdout, child);
    });
    child.stderr.setEncoding('utf8').on('data', (t: string) => (stderr += t));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(
        new Error(
          `airlock ${args.join(' ')} did not exit within ${o.timeoutMs ?? 30_000} ms; stderr: ${stderr}`,
        ),
      );
    }, o.timeoutMs ?? 30_000);
    child.on('error', reject);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
}

const lines = (s: string): string[] => s.split('\n').filter((l) => l !== '');

/** Residue not present in `baseline`; with a clean host (the normal case) this is just residue(). */
function newResidue(baseline: Residue): Residue {
  const r = residue();
  const keep = <T>(now: T[], before: T[]): T[] => now.filter((x) => !before.includes(x));
  return {
    mounts: keep(r.mounts, baseline.mounts),
    cgroups: keep(r.cgroups, baseline.cgroups),
    sandboxDirs: keep(r.sandboxDirs, baseline.sandboxDirs),
    leases: keep(r.leases, baseline.leases),
    processes: keep(r.processes, baseline.processes),
  };
}

async function settledResidue(baseline: Residue): Promise<Residue> {
  let r = newResidue(baseline);
  for (let i = 0; i < 100 && JSON.stringify(r) !== JSON.stringify(NO_RESIDUE); i++) {
    await sleep(50);
    r = newResidue(baseline);
  }
  return r;
}

describe('airlock CLI: flags and usage errors (no sandbox needed)', () => {
  it('run --help documents the command shape and exits 0', async () => {
    const r = await cli(['run', '--help']);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/Usage: airlock run/);
    expect(r.stdout).toMatch(/\/bin\/sh -c/);
  });

  it('a bad size (--memory lots) exits 2 with one stderr line naming --memory', async () => {
    const r = await cli(['run', '--memory', 'lots', '--', 'true']);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe('');
    expect(lines(r.stderr)).toHaveLength(1);
    expect(r.stderr).toMatch(/^airlock: --memory: .*lots.*256m/);
  });

  it('an unknown option exits 2 with one line', async () => {
    const r = await cli(['run', '--no-such-flag', '--', 'true']);
    expect(r.code).toBe(2);
    expect(lines(r.stderr)).toHaveLength(1);
    expect(r.stderr).toMatch(/^airlock: unknown option '--no-such-flag'/);
  });

  it('an unknown command, a missing CMD and a malformed --env each exit 2', async () => {
    for (const args of [['frobnicate'], ['run'], ['run', '--env', 'NOEQUALS', '--', 'true']]) {
      const r = await cli(args);
      expect(r.code, args.join(' ')).toBe(2);
      expect(lines(r.stderr), args.join(' ')).toHaveLength(1);
      expect(r.stderr).toMatch(/^airlock: /);
    }
  });

  it('--workspace /nonexistent exits 2 before creating anything', async () => {
    const r = await cli(['run', '--workspace', '/nonexistent', '--', 'true']);
    expect(r.code).toBe(2);
    expect(lines(r.stderr)).toHaveLength(1);
    expect(r.stderr).toMatch(/^airlock: --workspace: .*\/nonexistent.* does not exist/);
  });

  it('a spec limit out of range names the flag (--memory 1m → exit 2)', async () => {
    const r = await cli(['run', '--memory', '1m', '--', 'true']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/^airlock: --memory: .*16 MiB/);
  });

  it('doctor --json prints one parseable report', async () => {
    const r = await cli(['doctor', '--json']);
    const report = JSON.parse(r.stdout) as {
      tiers: Record<string, { available: boolean; implemented: boolean }>;
      host: { cgroups: { versions: number[] }; landlock: { abi: number | null } };
    };
    expect(r.code).toBe(report.tiers.namespaces!.available ? 0 : 4);
    expect(report.tiers.gvisor!.implemented).toBe(true);
    const gv = report.tiers.gvisor as unknown as { available: boolean; platform?: string };
    // Where gVisor runs, doctor names the platform it detected (kvm only where /dev/kvm runs a guest).
    if (gv.available) expect(['kvm', 'systrap', 'ptrace']).toContain(gv.platform);
    // The microVM tier says which accelerator its guests use, and why (TCG where no KVM guest boots).
    const mv = report.tiers.microvm as unknown as {
      implemented: boolean;
      available: boolean;
      accelerator: string;
      detail: string;
    };
    expect(mv.implemented).toBe(true);
    if (mv.available) {
      expect(['kvm', 'tcg']).toContain(mv.accelerator);
      expect(mv.detail).toMatch(/^available \((KVM|TCG)/);
    } else expect(mv.accelerator).toBe('none');
    // The WASM tier loads Pyodide and QuickJS to say it is available.
    expect(report.tiers.wasm).toMatchObject({ implemented: true, available: true });
    expect(Array.isArray(report.host.cgroups.versions)).toBe(true);
  });
});

describe('airlock CLI: egress flags (no sandbox, no network needed)', () => {
  const dirs: string[] = [];
  afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));
  const policyFile = (yaml: string): string => {
    const dir = mkdtempSync(join(tmpdir(), 'airlock-cli-policy-'));
    dirs.push(dir);
    writeFileSync(join(dir, 'policy.yaml'), yaml);
    return join(dir, 'policy.yaml');
  };

  /** Exit 2, nothing on stdout, exactly one stderr line starting with `airlock: FLAG: `. */
  async function expectFlagError(args: string[], flag: string, text?: RegExp): Promise<string> {
    const r = await cli(['run', ...args, '--', 'true']);
    expect(r.code, `${args.join(' ')}: ${r.stderr}`).toBe(2);
    expect(r.stdout).toBe('');
    expect(lines(r.stderr), args.join(' ')).toHaveLength(1);
    expect(r.stderr.startsWith(`airlock: ${flag}: `), r.stderr).toBe(true);
    if (text) expect(r.stderr).toMatch(text);
    return r.stderr;
  }

  it('run --help documents the network flags', async () => {
    const r = await cli(['run', '--help']);
    expect(r.code).toBe(0);
    for (const f of ['--allow', '--deny', '--secret', '--policy']) expect(r.stdout).toContain(f);
    expect(r.stdout).toMatch(/env:VAR, file:\/abs\/path/);
  });

  it('over-broad or malformed --allow values exit 2 with the reason', async () => {
    await expectFlagError(['--allow', '*'], '--allow', /bare "\*" would allow every host/);
    await expectFlagError(['--allow', '*.com'], '--allow', /too broad/);
    await expectFlagError(['--allow', 'https://api.github.com/'], '--allow', /not a URL/);
    await expectFlagError(['--allow', 'example.com:99999'], '--allow', /not a TCP port/);
    await expectFlagError(['--allow', '169.254.169.254'], '--allow', /blocked range/);
    await expectFlagError(['--allow', 'ok.example.com', '--deny', '*'], '--deny', /bare "\*"/);
  });

  it('malformed --secret values exit 2 naming --secret', async () => {
    await expectFlagError(['--secret', 'NOEQUALS'], '--secret', /NAME=SOURCE@HOST/);
    await expectFlagError(['--secret', '9X=env:X@a.example'], '--secret', /not a variable name/);
    await expectFlagError(['--secret', 'T=vault:x@a.example'], '--secret', /env:, file: or cmd:/);
    await expectFlagError(['--secret', 'T=env:X'], '--secret', /no hosts/);
    await expectFlagError(['--secret', 'T=env:X@'], '--secret', /empty host/);
    await expectFlagError(['--secret', 'T=env:BAD-NAME@a.example'], '--secret', /env: needs a variable name/);
    await expectFlagError(['--secret', 'T=file:relative/path@a.example'], '--secret', /absolute path/);
    await expectFlagError(['--secret', 'T=cmd:@a.example'], '--secret', /needs a program/);
    await expectFlagError(['--secret', 'T=env:X@a.example:443'], '--secret', /without a port/);
    await expectFlagError(['--secret', 'T=env:X@*.example.com'], '--secret', /not wildcards/);
  });

  it('a --secret error never repeats its source (a command argument may be a credential)', async () => {
    const err = await expectFlagError(['--secret', 'T=cmd:vault login -token=hunter2'], '--secret');
    expect(err).not.toContain('hunter2');
  });

  it('a --secret whose host is not allowed, or whose source is missing, exits 2 before any sandbox', async () => {
    await expectFlagError(
      ['--secret', 'T=env:HOME@api.example.com'],
      '--secret',
      /add --allow api\.example\.com/,
    );
    await expectFlagError(
      ['--allow', 'api.example.com', '--secret', 'T=env:AIRLOCK_CLI_TEST_UNSET_VAR@api.example.com'],
      '--secret',
      /AIRLOCK_CLI_TEST_UNSET_VAR is not set/,
    );
    await expectFlagError(
      ['--allow', 'api.example.com', '--secret', 'T=file:/nonexistent/token@api.example.com'],
      '--secret',
      /does not exist/,
    );
  });

  it('--policy with a missing, unparsable or invalid file exits 2 naming --policy', async () => {
    await expectFlagError(['--policy', '/nonexistent/policy.yaml'], '--policy', /not found/);
    await expectFlagError(['--policy', policyFile('network:\n  allow: [ a.example\n')], '--policy');
    await expectFlagError(['--policy', policyFile('network:\n  alow: [a.example]\n')], '--policy', /alow/);
    await expectFlagError(['--policy', policyFile('network:\n  allow: ["*"]\n')], '--policy', /bare "\*"/);
    await expectFlagError(
      [
        '--policy',
        policyFile('secrets:\n  - name: T\n    value: { fromEnv: HOME }\n    hosts: [a.example]\n'),
      ],
      '--policy',
      /add --allow a\.example/,
    );
  });
});

describe('airlock CLI: running sandboxes', () => {
  // Anything already on the host (e.g. a leaked fixture of another run sharing the test state dir)
  // is not this suite's doing; on a clean host the baseline is NO_RESIDUE and this is residue() itself.
  let baseline: Residue = NO_RESIDUE;
  beforeAll(() => {
    if (canRunNamespaces) baseline = residue();
  });
  afterAll(async () => {
    if (canRunNamespaces) expect(await settledResidue(baseline)).toEqual(NO_RESIDUE);
  });

  it.skipIf(!canRunNamespaces)(`doctor reports the namespaces tier available (${SKIP_REASON})`, async () => {
    const r = await cli(['doctor', '--json']);
    expect(r.code).toBe(0);
    const report = JSON.parse(r.stdout) as {
      tiers: { namespaces: { available: boolean; checks: unknown[] } };
    };
    expect(report.tiers.namespaces.available).toBe(true);
    expect(report.tiers.namespaces.checks.length).toBeGreaterThan(0);
  });

  it.skipIf(!canRunNamespaces)(`the command's exit code becomes airlock's (${SKIP_REASON})`, async () => {
    const r = await cli(['run', '--', 'sh', '-c', 'exit 7']);
    expect(r.code).toBe(7);
    expect(r.stderr).toBe('');
  });

  it.skipIf(!canRunGvisor)(
    `--backend gvisor runs under gVisor's kernel and leaves nothing behind (${GVISOR_SKIP_REASON})`,
    async () => {
      const r = await cli([
        'run',
        '--backend',
        'gvisor',
        '--',
        'sh',
        '-c',
        'id -u; cat /proc/version; exit 3',
      ]);
      expect(r.code).toBe(3);
      const [uid, version] = r.stdout.split('\n');
      expect(uid).toBe('1000');
      expect(version).not.toBe(readFileSync('/proc/version', 'utf8').trim()); // not the host kernel
      // Also no prepared (warm) slot of either tier outlives the CLI.
      expect(await settledResidue(baseline)).toEqual(NO_RESIDUE);
    },
  );

  it.skipIf(!canRunNamespaces)(`output streams to stdout and stderr (${SKIP_REASON})`, async () => {
    const r = await cli(['run', '--', 'echo out; echo err >&2']);
    expect(r.code).toBe(0);
    expect(r.stdout).toBe('out\n');
    expect(r.stderr).toBe('err\n');
  });

  it.skipIf(!canRunNamespaces)(`--json prints only the ExecResult on stdout (${SKIP_REASON})`, async () => {
    const r = await cli(['run', '--json', '--', 'echo', 'hi']);
    expect(r.code).toBe(0);
    const result = JSON.parse(r.stdout) as {
      exitCode: number;
      stdout: string;
      stderr: string;
      durationMs: number;
    };
    expect(result.exitCode).toBe(0);
    expect(result.stdout).toBe('hi\n');
    expect(result.stderr).toBe('');
    expect(typeof result.durationMs).toBe('number');
  });

  it.skipIf(!canRunNamespaces)(`--env is visible inside, the host env is not (${SKIP_REASON})`, async () => {
    const r = await cli(
      ['run', '--env', 'A=B', '-e', 'EMPTY=', '--', 'echo "A=$A EMPTY=[$EMPTY] S=${CLI_TEST_SECRET:-unset}"'],
      {
        env: { CLI_TEST_SECRET: 'hunter2' },
      },
    );
    expect(r.code).toBe(0);
    expect(r.stdout).toBe('A=B EMPTY=[] S=unset\n');
  });

  it.skipIf(!canRunNamespaces)(
    `--timeout kills the command: exit 137 and a timeout line (${SKIP_REASON})`,
    async () => {
      const r = await cli(['run', '--timeout', '1s', '--', 'sleep', '30']);
      expect(r.code).toBe(137);
      expect(lines(r.stderr)).toHaveLength(1);
      expect(r.stderr).toMatch(/^airlock: killed by timeout after 1s/);
    },
  );

  it.skipIf(!canRunNamespaces)(`--memory holds a memory bomb: killedBy oom (${SKIP_REASON})`, async () => {
    const r = await cli([
      'run',
      '--memory',
      '64m',
      '--json',
      '--',
      'perl',
      '-e',
      '$x = "a" x (512*1024*1024)',
    ]);
    const result = JSON.parse(r.stdout) as { killedBy?: string; exitCode: number | null };
    expect(result.killedBy).toBe('oom');
    expect(r.code).not.toBe(0);
    expect(r.stderr).toBe(''); // --json: the limit is in the result, not on stderr
  });

  it.skipIf(!canRunNamespaces)(
    `a child OOM-killed under a parent that lives on: one line on stderr, oomKills in --json (${SKIP_REASON})`,
    async () => {
      const bomb = 'perl -e \'$x = "a" x (512*1024*1024)\'; echo "child $?"';
      const r = await cli(['run', '--memory', '64m', '--', 'sh', '-c', bomb]);
      expect([r.code, r.stdout]).toEqual([0, 'child 137\n']);
      const own = lines(r.stderr).filter((l) => l.startsWith('airlock:'));
      expect(own).toEqual([
        'airlock: 1 process was killed for exceeding the memory limit (64 MiB); raise it with --memory',
      ]);
      const j = await cli(['run', '--memory', '64m', '--json', '--', 'sh', '-c', `${bomb}; ${bomb}`]);
      const result = JSON.parse(j.stdout) as { oomKills: number; exitCode: number; killedBy?: string };
      expect(result).toMatchObject({ oomKills: 2, exitCode: 0 });
      expect(result.killedBy).toBeUndefined();
      // Nothing killed: no line, and 0 in the result.
      const none = await cli(['run', '--json', '--', 'true']);
      expect((JSON.parse(none.stdout) as { oomKills: number }).oomKills).toBe(0);
      // A command that does not exist: 127, one line.
      const missing = await cli(['run', '--', 'no-such-command-xyz']);
      expect([missing.code, lines(missing.stderr)]).toEqual([
        127,
        ['airlock: no-such-command-xyz: command not found'],
      ]);
    },
    60_000,
  );

  it.skipIf(!canRunNamespaces)(
    `--workspace DIR is a copy-on-write view of DIR (${SKIP_REASON})`,
    async () => {
      const dir = mkdtempSync(join(tmpdir(), 'airlock-cli-ws-'));
      try {
        writeFileSync(join(dir, 'input.txt'), 'from the host\n');
        const r = await cli([
          'run',
          '--workspace',
          dir,
          '--',
          'cat /workspace/input.txt && echo new > /workspace/out.txt',
        ]);
        expect(r.stderr).toBe('');
        expect(r.code).toBe(0);
        expect(r.stdout).toBe('from the host\n');
        expect(readdirSync(dir)).toEqual(['input.txt']);
        const ro = await cli(['run', '--workspace', `${dir}:ro`, '--', 'touch /workspace/x']);
        expect(ro.code).not.toBe(0);
        expect(existsSync(join(dir, 'x'))).toBe(false);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );

  it.skipIf(!canRunNamespaces)(`SIGINT kills the sandbox and exits 130 (${SKIP_REASON})`, async () => {
    let sent = false;
    const r = await cli(['run', '--', 'echo ready; sleep 30'], {
      onStdout: (out, child) => {
        if (!sent && out.includes('ready')) {
          sent = true;
          child.kill('SIGINT');
        }
      },
    });
    expect(sent).toBe(true);
    expect(r.code).toBe(130);
    expect(r.stderr).toMatch(/SIGINT/);
  });

  it.skipIf(!canRunNamespaces)(
    `a reader closing stdout (EPIPE) ends the run like SIGPIPE: 141 (${SKIP_REASON})`,
    async () => {
      const r = await cli(['run', '--', 'seq 1 100000000'], {
        onStdout: (_out, child) => child.stdout?.destroy(),
      });
      expect(r.code).toBe(141);
    },
  );

  it.skipIf(!canRunNamespaces)(
    `demo blocks every hostile attempt and exits 0 (${SKIP_REASON})`,
    async () => {
      const r = await cli(['demo'], { timeoutMs: 60_000 });
      expect(r.stderr).toBe('');
      expect(r.code).toBe(0);
      expect(r.stdout).toMatch(/fork bomb\s+blocked/);
      expect(r.stdout).toMatch(/memory bomb.*\s+blocked/);
      expect(r.stdout).toMatch(/write \/workspace\/hello\.txt\s+allowed/);
      expect(r.stdout).not.toMatch(/ALLOWED|FAILED/);
    },
    90_000,
  );
});
