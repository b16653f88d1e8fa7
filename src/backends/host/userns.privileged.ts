// SECURITY-CRITICAL (privileged): a cheap source of fresh, empty user namespaces for idmapped
// mounts (idmap.privileged.ts writes their one-line maps and keeps only an fd).
//
// A user namespace exists only while a process (or an fd) holds it, and only a single-threaded
// process can unshare one: never Node, and never the launcher's worker thread. Exec'ing
// `unshare --user cat` for each one costs about 2 ms of CPU (two dynamically linked execs), paid by
// every warm slot of a sandbox with a host workspace or on a snapshot. Instead, one long-lived Perl
// process (perl-base is Essential in Debian: always installed) forks a child per namespace, with no
// exec: about 0.3 ms. The child unshares CLONE_NEWUSER, says so, and blocks until its parent kills
// it; Airlock writes the maps and opens /proc/<pid>/ns/user meanwhile. The pid cannot be recycled
// in between: the helper reaps a child only when Airlock says it is done with it (`k <pid>`).
//
// What the helper can do: fork, unshare a user namespace (which gives its child no capability
// outside that namespace), kill and reap its own children. It reads one-line commands from Airlock
// on stdin and answers on stdout; it gets no environment. It dies with Airlock (PR_SET_PDEATHSIG,
// and it exits at EOF on stdin), and its children die with it. Where Perl or the helper is missing
// or fails, the caller falls back to exec'ing unshare (idmap.privileged.ts).
import type { Socket } from 'node:net';
import { spawnDirect, type DirectChild } from './spawn.privileged.js';

/** System call numbers the helper needs (Perl's `syscall` takes raw numbers). */
const SYSCALLS: Readonly<Record<string, { unshare: number; prctl: number }>> = {
  x64: { unshare: 272, prctl: 157 },
  arm64: { unshare: 97, prctl: 167 },
};
const PERL = '/usr/bin/perl';
/** How long one answer may take before the helper is given up on. */
const ANSWER_WAIT_MS = 5000;

// Commands: "u" → "ok <pid>" (a child now in a new, unmapped user namespace) or "err <why>";
// "k <pid>" → (no answer) SIGKILL and reap that child, if it is one of ours.
// PR_SET_PDEATHSIG (1) with SIGKILL (9): the helper dies with Airlock, each child with the helper.
// CLONE_NEWUSER = 0x10000000.
const SCRIPT = String.raw`
use strict;
my ($unshare, $prctl) = @ARGV;
syscall($prctl, 1, 9) == 0 or die "prctl: $!";
$| = 1;
my %kids;
while (my $line = <STDIN>) {
  if ($line eq "u\n") {
    my ($r, $w);
    unless (pipe($r, $w)) { print "err pipe: $!\n"; next }
    my $helper = $$;
    my $pid = fork();
    unless (defined $pid) { print "err fork: $!\n"; close $r; close $w; next }
    if ($pid == 0) {
      close $r; close STDIN; close STDOUT;
      # Die with the helper; if it is already gone (the parent is not it any more), go now.
      syscall($prctl, 1, 9) == 0 or syscall(60, 1);
      getppid() == $helper or syscall(60, 1);
      syscall($unshare, 0x10000000) == 0 or syscall(60, 1);
      syswrite($w, "1");
      select(undef, undef, undef, undef) while 1;
    }
    close $w;
    my $got = sysread($r, my $byte, 1);
    close $r;
    if ($got) { $kids{$pid} = 1; print "ok $pid\n" }
    else { waitpid($pid, 0); print "err unshare failed in the child\n" }
  } elsif ($line =~ /\Ak ([0-9]+)\n\z/ && delete $kids{$1}) {
    kill 'KILL', $1;
    waitpid($1, 0);
  }
}
kill 'KILL', keys %kids;
waitpid($_, 0) for keys %kids;
`;

interface Pending {
  resolve(pid: number): void;
  reject(e: Error): void;
}

/** The running helper: one command in flight per `fork()` call, answered in order. */
class UsernsHelper {
  private readonly pending: Pending[] = [];
  private buffered = '';
  private readonly output: Socket;
  dead = false;

  constructor(
    readonly child: DirectChild,
    private readonly input: Socket,
    output: Socket,
  ) {
    // An idle helper never keeps Node alive (its output is ref'd only while an answer is awaited);
    // at Node's exit its stdin closes and it ends.
    input.unref();
    output.unref();
    this.output = output;
    input.on('error', () => this.fail(new Error('user namespace helper: stdin closed')));
    output.setEncoding('utf8');
    output.on('data', (t: string) => this.onData(t));
    output.on('close', () => this.fail(new Error('user namespace helper exited')));
  }

  /** A child of the helper that is in a new user namespace; call `release` once done with it. */
  fork(): Promise<number> {
    if (this.dead) return Promise.reject(new Error('user namespace helper is not running'));
    return new Promise<number>((resolve, reject) => {
      const timer = setTimeout(
        () => this.fail(new Error('user namespace helper did not answer')),
        ANSWER_WAIT_MS,
      );
      timer.unref();
      if (this.pending.length === 0) this.output.ref();
      this.pending.push({
        resolve: (pid) => (clearTimeout(timer), resolve(pid)),
        reject: (e) => (clearTimeout(timer), reject(e)),
      });
      this.input.write('u\n');
    });
  }

  /** Kill and reap the child (answers nothing). */
  release(pid: number): void {
    if (!this.dead) this.input.write(`k ${pid}\n`);
  }

  private onData(t: string): void {
    this.buffered += t;
    let nl: number;
    while ((nl = this.buffered.indexOf('\n')) >= 0) {
      const line = this.buffered.slice(0, nl);
      this.buffered = this.buffered.slice(nl + 1);
      const p = this.pending.shift();
      if (!p) return this.fail(new Error(`user namespace helper said "${line}" unasked`));
      if (this.pending.length === 0) this.output.unref();
      const m = /^ok ([1-9][0-9]*)$/.exec(line);
      if (m) p.resolve(Number(m[1]));
      else p.reject(new Error(`user namespace helper: ${line.slice(0, 200)}`));
    }
  }

  private fail(e: Error): void {
    if (!this.dead) {
      this.dead = true;
      this.input.destroy();
      this.child.kill();
      const reap = setInterval(() => this.child.reap() && clearInterval(reap), 50);
      reap.unref();
    }
    for (const p of this.pending.splice(0)) p.reject(e);
  }
}

let helper: UsernsHelper | undefined;
/** Helpers started so far: after MAX_STARTS that died, no more (each call falls back). */
let starts = 0;
const MAX_STARTS = 3;

/** The process-wide helper, started on first use; undefined where it cannot run (then: fall back). */
export function usernsHelper(): UsernsHelper | undefined {
  if (helper && !helper.dead) return helper;
  const nr = SYSCALLS[process.arch];
  if (starts >= MAX_STARTS || !nr) return undefined;
  starts++;
  try {
    const child = spawnDirect(
      PERL,
      [PERL, '-e', SCRIPT, String(nr.unshare), String(nr.prctl)],
      [],
      ['read', 'write', 'null'],
    );
    const [input, output] = child.pipes as [Socket, Socket];
    helper = new UsernsHelper(child, input, output);
    return helper;
  } catch {
    starts = MAX_STARTS; // no Perl: every namespace comes from an exec'd unshare instead
    return undefined;
  }
}

/** The helper's pid, if it runs (tests). */
export function usernsHelperPid(): number | undefined {
  return helper && !helper.dead ? helper.child.pid : undefined;
}
