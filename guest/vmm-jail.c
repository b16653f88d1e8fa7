// SECURITY-CRITICAL. The VMM jail in one host-side program (not part of the guest; built static by
// src/backends/microvm/assets.ts ensureVmmJail). Airlock spawns it as root (empty env, cwd /,
// inside the sandbox's netns, its own fds close-on-exec) and it does, in this order, what a chain of
// sh, setpriv, unshare, mount, pivot_root, umount and setpriv did before it:
//  1. block reading the gate (fd 3): EOF means Airlock died before enrolling it in the sandbox's
//     cgroup, so nothing runs (exit 125);
//  2. SIGKILL when its parent (Airlock) dies, checked against the parent it started with;
//  3. new mount and PID namespaces and a fork: this (outer) process waits and relays the exit
//     status; the inner one is PID 1 of its namespace and gets SIGKILL when the outer dies, so
//     killing the outer (Airlock's kill()) takes the whole VM along;
//  4. the inner makes every mount private, binds ROOT (a root-owned skeleton of mount points) onto
//     itself, binds each SRC at ROOT/DEST with its flags, makes ROOT read-only, pivot_roots into it
//     and detaches the old root;
//  5. drops to UID (gid the same; never 0): no groups, no capabilities (bounding set emptied while
//     it still may), no_new_privs, SIGKILL on the outer's death again; then verifies all of it;
//  6. installs the seccomp filter read from fd 6 and execs PROGRAM (absolute, under /usr) with fds
//     0-2, 4 (tap) and 5 (migration stream) only.
// Any failure exits non-zero (125 before the gate opened or if a parent died, 126 otherwise) with a
// message on stderr, before any exec: PROGRAM never runs unjailed.
//
// Usage: vmm-jail UID ROOT N (SRC DEST FLAGS){N} -- PROGRAM [ARGS...]
//   SRC absolute; DEST absolute in the jail (a mount point of ROOT's skeleton); no ".." anywhere;
//   FLAGS a comma list of ro, nosuid, nodev, noexec (or "-" for none); N at most MAX_MOUNTS.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define GATE_FD 3
#define TAP_FD 4
#define INCOMING_FD 5
#define FILTER_FD 6
#define MAX_INSNS 4096
#define MAX_MOUNTS 16
#define MAX_PATH 4096

struct bind {
  const char *src, *dest;
  unsigned long flags;
};

static void fail(int code, const char *what) {
  fprintf(stderr, "vmm-jail: %s\n", what);
  _exit(code);
}

static void fail_errno(const char *what, const char *arg) {
  fprintf(stderr, "vmm-jail: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
  _exit(126);
}

// An absolute path without "." or ".." components (refuses what could leave the jail's root).
static int clean_abs(const char *p) {
  if (p[0] != '/' || strlen(p) >= MAX_PATH) return 0;
  for (const char *c = p; *c; c++)
    if (c[0] == '/' && c[1] == '.' && (c[2] == '/' || c[2] == 0 || (c[2] == '.' && (c[3] == '/' || c[3] == 0))))
      return 0;
  return 1;
}

static unsigned long parse_flags(const char *s) {
  if (strcmp(s, "-") == 0) return 0;
  unsigned long f = 0;
  char buf[64];
  if (strlen(s) >= sizeof buf) fail(126, "mount flags too long");
  strcpy(buf, s);
  for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (strcmp(t, "ro") == 0) f |= MS_RDONLY;
    else if (strcmp(t, "nosuid") == 0) f |= MS_NOSUID;
    else if (strcmp(t, "nodev") == 0) f |= MS_NODEV;
    else if (strcmp(t, "noexec") == 0) f |= MS_NOEXEC;
    else fail(126, "unknown mount flag");
  }
  return f;
}

static unsigned long parse_uid(const char *s) {
  char *end;
  errno = 0;
  unsigned long u = strtoul(s, &end, 10);
  if (errno || *s < '1' || *s > '9' || *end || u == 0 || u >= 0x7fffffffUL) fail(126, "bad uid (never 0)");
  return u;
}

// Whether the process at the other end of `fd` (a pipe's read end whose write end it holds) is
// gone: its death closes the write end. Used where getppid() cannot tell (PID 1 of a namespace).
static int parent_gone(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 0) != 0;
}

static void read_filter(struct sock_fprog *prog) {
  static struct sock_filter insns[MAX_INSNS];
  size_t got = 0;
  for (;;) {
    if (got == sizeof insns) fail(126, "seccomp filter longer than MAX_INSNS");
    ssize_t n = read(FILTER_FD, (char *)insns + got, sizeof insns - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno("reading the seccomp filter", NULL);
    if (n == 0) break;
    got += (size_t)n;
  }
  close(FILTER_FD);
  if (got == 0 || got % sizeof insns[0]) fail(126, "the seccomp filter is empty or not whole instructions");
  prog->len = (unsigned short)(got / sizeof insns[0]);
  prog->filter = insns;
}

static void jail(const char *root, const struct bind *b, int n) {
  char at[2 * MAX_PATH];
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) fail_errno("making mounts private", NULL);
  if (mount(root, root, NULL, MS_BIND, NULL)) fail_errno("binding the root", root);
  for (int i = 0; i < n; i++) {
    snprintf(at, sizeof at, "%s%s", root, b[i].dest);
    if (mount(b[i].src, at, NULL, MS_BIND, NULL)) fail_errno("binding", b[i].src);
    // A bind mount takes its flags only from a remount.
    if (mount(NULL, at, NULL, MS_REMOUNT | MS_BIND | b[i].flags, NULL)) fail_errno("remounting", at);
  }
  if (mount(NULL, root, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL))
    fail_errno("making the root read-only", root);
  if (chdir(root)) fail_errno("chdir", root);
  if (syscall(SYS_pivot_root, ".", ".old")) fail_errno("pivot_root", root);
  if (chdir("/")) fail_errno("chdir", "/");
  // The empty mount point stays (the root is read-only).
  if (umount2("/.old", MNT_DETACH)) fail_errno("detaching the old root", NULL);
}

static void drop(unsigned long uid, int outer) {
  if (setgroups(0, NULL)) fail_errno("setgroups", NULL);
  // The bounding set, while CAP_SETPCAP is still held; EINVAL past the kernel's last capability.
  for (int c = 0; c < 64; c++)
    if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) && errno != EINVAL) fail_errno("dropping the bounding set", NULL);
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)) fail_errno("clearing ambient caps", NULL);
  if (setresgid(uid, uid, uid)) fail_errno("setresgid", NULL);
  if (setresuid(uid, uid, uid)) fail_errno("setresuid", NULL);
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2] = {{0, 0, 0}, {0, 0, 0}};
  if (syscall(SYS_capset, &h, d)) fail_errno("capset", NULL);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) fail_errno("no_new_privs", NULL);
  // The credential change cleared the parent-death signal.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)) fail_errno("pdeathsig", NULL);
  if (parent_gone(outer)) fail(125, "the outer process died");
  // Verify rather than trust.
  uid_t r, e, s;
  gid_t gr, ge, gs;
  if (getresuid(&r, &e, &s) || r != uid || e != uid || s != uid) fail(126, "uid not dropped");
  if (getresgid(&gr, &ge, &gs) || gr != uid || ge != uid || gs != uid) fail(126, "gid not dropped");
  if (getgroups(0, NULL) != 0) fail(126, "supplementary groups left");
  memset(d, 0xff, sizeof d);
  if (syscall(SYS_capget, &h, d)) fail_errno("capget", NULL);
  for (int i = 0; i < 2; i++)
    if (d[i].effective || d[i].permitted || d[i].inheritable) fail(126, "capabilities left");
  for (int c = 0; c < 64; c++) {
    int bset = prctl(PR_CAPBSET_READ, c, 0, 0, 0);
    if (bset < 0 && errno == EINVAL) break;
    if (bset != 0) fail(126, "bounding set not empty");
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, c, 0, 0) != 0) fail(126, "ambient caps left");
  }
  if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) fail(126, "no_new_privs not set");
}

// Closes every fd but 0-2, the tap and the migration stream (the filter and gate are closed already).
static void close_others(int keep_from) {
  for (int fd = GATE_FD; fd < keep_from; fd++)
    if (fd != TAP_FD && fd != INCOMING_FD) close(fd);
  if (syscall(SYS_close_range, keep_from, ~0U, 0)) fail_errno("close_range", NULL);
}

int main(int argc, char **argv) {
  // Parse everything before the gate: a bad spec fails before anything happens.
  if (argc < 5) fail(126, "usage: vmm-jail UID ROOT N (SRC DEST FLAGS){N} -- PROGRAM [ARGS...]");
  unsigned long uid = parse_uid(argv[1]);
  const char *root = argv[2];
  if (!clean_abs(root) || strcmp(root, "/") == 0) fail(126, "ROOT must be an absolute path");
  char *end;
  long n = strtol(argv[3], &end, 10);
  if (*end || n < 0 || n > MAX_MOUNTS || argc < 4 + 3 * n + 2) fail(126, "bad mount count");
  struct bind b[MAX_MOUNTS];
  for (int i = 0; i < n; i++) {
    b[i].src = argv[4 + 3 * i];
    b[i].dest = argv[5 + 3 * i];
    if (!clean_abs(b[i].src) || !clean_abs(b[i].dest) || strcmp(b[i].dest, "/") == 0)
      fail(126, "mount paths must be absolute, without . or ..");
    b[i].flags = parse_flags(argv[6 + 3 * i]);
  }
  char **prog = argv + 4 + 3 * n;
  if (strcmp(prog[0], "--") != 0 || !prog[1]) fail(126, "expected -- PROGRAM after the mounts");
  prog++;
  if (strncmp(prog[0], "/usr/", 5) != 0 || !clean_abs(prog[0])) fail(126, "PROGRAM must be absolute, under /usr");

  // 1. The gate.
  pid_t airlock = getppid();
  char go;
  ssize_t r;
  while ((r = read(GATE_FD, &go, 1)) < 0 && errno == EINTR) {
  }
  if (r != 1) fail(125, "the gate closed: Airlock is gone");
  close(GATE_FD);
  // 2. Die with Airlock (and check it did not die before).
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)) fail_errno("pdeathsig", NULL);
  if (getppid() != airlock) fail(125, "Airlock died");

  // 3. Namespaces and the fork. The pipe tells the inner if the outer died before its pdeathsig.
  int alive[2];
  if (pipe2(alive, O_CLOEXEC)) fail_errno("pipe", NULL);
  // Above the fds it passes on (a missing tap or stream leaves 4 or 5 free for the pipe).
  for (int i = 0; i < 2; i++) {
    int fd = fcntl(alive[i], F_DUPFD_CLOEXEC, FILTER_FD + 1);
    if (fd < 0) fail_errno("dup", NULL);
    close(alive[i]);
    alive[i] = fd;
  }
  if (unshare(CLONE_NEWNS | CLONE_NEWPID)) fail_errno("unshare", NULL);
  pid_t child = fork();
  if (child < 0) fail_errno("fork", NULL);
  if (child > 0) {
    close(alive[0]);
    // The outer holds nothing else the VM needs; it waits and relays.
    close(TAP_FD);
    close(INCOMING_FD);
    close(FILTER_FD);
    int st;
    while (waitpid(child, &st, 0) < 0)
      if (errno != EINTR) fail_errno("waitpid", NULL);
    if (WIFEXITED(st)) _exit(WEXITSTATUS(st));
    // Die of the same signal (as unshare --fork does), so Airlock sees how QEMU ended.
    int sig = WTERMSIG(st);
    signal(sig, SIG_DFL);
    kill(getpid(), sig);
    _exit(128 + sig);
  }
  close(alive[1]);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)) fail_errno("pdeathsig", NULL);
  if (parent_gone(alive[0])) fail(125, "the outer process died");

  // 4, 5, 6.
  jail(root, b, (int)n);
  drop(uid, alive[0]);
  struct sock_fprog filter;
  read_filter(&filter);
  close(alive[0]);
  close_others(INCOMING_FD + 2);
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter)) fail_errno("installing the seccomp filter", NULL);
  execv(prog[0], prog);
  fail_errno("exec", prog[0]);
  return 126;
}
