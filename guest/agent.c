// Airlock's guest init and agent for the microVM tier: PID 1 of the guest kernel, static, no libraries.
//
// Boot (as PID 1, boot.c): mount /dev, /proc, /sys; load the kernel modules the initramfs carries (listed in
// /modules.order, in dependency order); mount the read-only rootfs block device, a tmpfs sized by the
// sandbox's disk limit, and an overlay of both; move /dev, /proc, /sys into it and chroot there. Then
// serve the host over the virtio-serial port named "airlock.agent" (docs/microvm.md: frame format).
//
// The host is trusted by the guest (it is the guest's hypervisor); the guest is NOT trusted by the host,
// which validates every frame it gets (src/backends/microvm/protocol.ts). This file still checks every
// frame it reads: a malformed frame ends the connection (and with it the VM), never a crash midway.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/random.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "guest.h"
#include "protocol.h"

extern char **environ;

#define MAX_EXECS 64
#define CHUNK 65536

struct exec {
  uint32_t id;
  pid_t pid;       // 0: slot free
  int out, err;    // pipes from the process, -1 once at EOF
  int in;          // pipe to its stdin, -1 when closed
  char *inbuf;     // stdin bytes not yet taken by the process
  size_t inlen;
  int in_eof;      // close stdin once inbuf drains
  int status;      // wait status, valid once exited
  int exited;
  char cg[64];     // its cgroup (every descendant stays in it): kill and "all gone" use it
};

static struct exec execs[MAX_EXECS];
static int port = -1;
static int have_cgroups = 0;
/** /dev/urandom, opened once at start (a snapshot keeps it open): IDENTITY seeds the CRNG through it. */
static int urandom = -1;


// ---- frames -------------------------------------------------------------------------------------

static void put32(unsigned char *p, uint32_t v) {
  p[0] = v;
  p[1] = v >> 8;
  p[2] = v >> 16;
  p[3] = v >> 24;
}
static uint32_t get32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {
      struct pollfd pf = {fd, POLLOUT, 0};
      poll(&pf, 1, -1);
      continue;
    }
    if (w <= 0) die("write to host");
    p += w;
    n -= w;
  }
}

static void send_frame(uint8_t type, uint32_t id, const void *payload, uint32_t len) {
  unsigned char h[AGENT_HEADER_BYTES] = {0};
  put32(h, len);
  h[4] = type;
  put32(h + 8, id);
  write_all(port, h, sizeof h);
  if (len) write_all(port, payload, len);
}

static void send_error(uint32_t id, const char *msg) { send_frame(FR_ERROR, id, msg, strlen(msg)); }

// ---- limit counters -----------------------------------------------------------------------------

// The sandbox cgroup's memory.events and pids.events, opened once at start (a snapshot keeps them
// open): STARTED and EXIT carry their counts as the exec starts and once it is gone, so the host
// needs no reads of its own around an exec (src/backends/microvm/agent.ts).
static int events_mem = -1, events_pids = -1;

static void put64(unsigned char *p, uint64_t v) {
  put32(p, (uint32_t)v);
  put32(p + 4, (uint32_t)(v >> 32));
}

// The value of the line "<key> <n>" of an events file (0 if unreadable: the counts only classify).
static uint64_t event_count(int fd, const char *key) {
  char buf[512];
  ssize_t n = fd >= 0 ? pread(fd, buf, sizeof buf - 1, 0) : -1;  // offset 0: the kernel reads anew
  if (n <= 0) return 0;
  buf[n] = 0;
  size_t kl = strlen(key);
  for (char *l = buf;;) {
    if (strncmp(l, key, kl) == 0 && l[kl] == ' ') return strtoull(l + kl + 1, NULL, 10);
    l = strchr(l, '\n');
    if (!l) return 0;
    l++;
  }
}

// 16 bytes: u64 oom kills (memory.events oom_kill), u64 fork refusals (pids.events max).
static void put_counters(unsigned char *p) {
  put64(p, event_count(events_mem, "oom_kill"));
  put64(p + 8, event_count(events_pids, "max"));
}

// ---- exec ---------------------------------------------------------------------------------------

static struct exec *find_exec(uint32_t id) {
  for (int i = 0; i < MAX_EXECS; i++)
    if (execs[i].pid && execs[i].id == id) return &execs[i];
  return NULL;
}

// The facade's command check (src/sandbox/exec-check.ts runs it in /bin/sh on the other tiers),
// done here so that an exec is one execve in the guest, not a shell first (on a restored guest
// every new binary runs on a cold translation cache): a command that cannot run fails with one
// line naming it and 127 (not found) or 126 (found, cannot run). Run as the exec's user, in its cwd
// and environment.
static void check_command(const char *cmd) {
  struct stat st;
  const char *why = NULL;
  int code = 126;
  if (strchr(cmd, '/')) {
    if (stat(cmd, &st) != 0) why = "no such file or directory", code = 127;
    else if (S_ISDIR(st.st_mode)) why = "is a directory";
    else if (access(cmd, X_OK) != 0) why = "permission denied (not executable)";
  } else {
    // Looked up in the exec's PATH as `command -v` does (dash's default path without one).
    const char *path = getenv("PATH");
    if (!path) path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    why = "command not found", code = 127;
    for (const char *p = path; why;) {
      size_t n = strcspn(p, ":");
      char full[4096];
      if (snprintf(full, sizeof full, "%.*s/%s", (int)n, n ? p : ".", cmd) < (int)sizeof full &&
          stat(full, &st) == 0 && S_ISREG(st.st_mode))
        why = NULL;
      if (!p[n]) break;
      p += n + 1;
    }
  }
  if (!why) return;
  dprintf(2, "airlock: %s: %s\n", cmd, why);
  _exit(code);
}

// EXEC payload: u32 uid, u32 argc, u32 envc, u8 stdin, 3 pad; then NUL-terminated strings:
// cwd, argv[argc], env[envc] ("K=V"). Nothing may follow the last string.
static void do_exec(uint32_t id, unsigned char *p, uint32_t len) {
  if (find_exec(id)) return send_error(id, "exec id in use");
  struct exec *x = NULL;
  for (int i = 0; i < MAX_EXECS && !x; i++)
    if (!execs[i].pid) x = &execs[i];
  if (!x) return send_error(id, "too many concurrent execs");
  if (len < 16 || p[len - 1] != 0) return send_error(id, "malformed exec frame");
  uint32_t uid = get32(p), argc = get32(p + 4), envc = get32(p + 8);
  int want_stdin = p[12];
  if (argc < 1 || argc > AGENT_MAX_STRINGS || envc > AGENT_MAX_STRINGS || uid == 0)
    return send_error(id, "bad exec counts or uid");
  char **strs = calloc(1 + argc + 1 + envc + 1, sizeof(char *));
  if (!strs) return send_error(id, "out of memory");
  uint32_t n = 0, want = 1 + argc + envc;
  for (uint32_t off = 16; off < len && n < want; n++) {
    strs[n] = (char *)p + off;
    off += strlen((char *)p + off) + 1;
    if (n + 1 == want && off != len) n = want + 1;  // trailing bytes
  }
  if (n != want) {
    free(strs);
    return send_error(id, "malformed exec strings");
  }
  char *cwd = strs[0];
  char **argv = strs + 1;
  char **envp = calloc(envc + 1, sizeof(char *));
  if (!envp) {
    free(strs);
    return send_error(id, "out of memory");
  }
  for (uint32_t i = 0; i < envc; i++) envp[i] = strs[1 + argc + i];
  char **argvz = calloc(argc + 1, sizeof(char *));
  memcpy(argvz, argv, argc * sizeof(char *));

  int o[2], e[2], in[2] = {-1, -1};
  if (pipe2(o, O_CLOEXEC) || pipe2(e, O_CLOEXEC) || (want_stdin && pipe2(in, O_CLOEXEC)))
    die("pipe");
  memset(x, 0, sizeof *x);
  x->id = id;
  unsigned char pl[20];  // STARTED: u32 pid, the counters before the process could count in them
  put_counters(pl + 4);
  if (have_cgroups) {
    snprintf(x->cg, sizeof x->cg, SANDBOX_CG "/x%u", id);
    if (mkdir(x->cg, 0755) != 0) x->cg[0] = 0;
  }
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    if (x->cg[0]) {
      char f[96];
      snprintf(f, sizeof f, "%s/cgroup.procs", x->cg);
      int fd = open(f, O_WRONLY);
      if (fd < 0 || write(fd, "0", 1) != 1) _exit(125);
      close(fd);
    }
    setsid();
    int null = open("/dev/null", O_RDWR);
    dup2(want_stdin ? in[0] : null, 0);
    dup2(o[1], 1);
    dup2(e[1], 2);
    if (setgroups(0, NULL) || setgid(uid) || setuid(uid)) {
      dprintf(2, "airlock-agent: cannot drop to uid %u: %s\n", uid, strerror(errno));
      _exit(126);
    }
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    if (chdir(cwd) != 0) {
      dprintf(2, "airlock: cwd %s: %s\n", cwd, strerror(errno));
      _exit(126);
    }
    environ = envp;  // execvp searches the PATH of the new environment
    check_command(argvz[0]);
    execvp(argvz[0], argvz);
    int err = errno;
    dprintf(2, "airlock: %s: %s\n", argvz[0], strerror(err));
    _exit(err == ENOENT || err == ENOTDIR ? 127 : 126);
  }
  free(strs);
  free(envp);
  free(argvz);
  close(o[1]);
  close(e[1]);
  x->pid = pid;
  x->out = o[0];
  x->err = e[0];
  x->in = -1;
  if (want_stdin) {
    close(in[0]);
    x->in = in[1];
    fcntl(x->in, F_SETFL, O_NONBLOCK);
  }
  put32(pl, (uint32_t)pid);
  send_frame(FR_STARTED, id, pl, sizeof pl);
}

static void kill_exec(struct exec *x, int sig) {
  if (x->cg[0] && sig == SIGKILL) {
    char f[96];
    snprintf(f, sizeof f, "%s/cgroup.kill", x->cg);
    int fd = open(f, O_WRONLY);
    if (fd >= 0 && write(fd, "1", 1) == 1) {
      close(fd);
      return;
    }
    if (fd >= 0) close(fd);
  }
  if (!x->exited) kill(-x->pid, sig);
}

static void close_stdin(struct exec *x) {
  if (x->in >= 0) close(x->in);
  x->in = -1;
  free(x->inbuf);
  x->inbuf = NULL;
  x->inlen = 0;
}

static void flush_stdin(struct exec *x) {
  while (x->in >= 0 && x->inlen) {
    ssize_t w = write(x->in, x->inbuf, x->inlen);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) return;
    if (w < 0) return close_stdin(x);  // EPIPE: the process ignores its stdin
    memmove(x->inbuf, x->inbuf + w, x->inlen - w);
    x->inlen -= w;
  }
  if (x->in >= 0 && !x->inlen && x->in_eof) close_stdin(x);
}

static void do_stdin(struct exec *x, unsigned char *p, uint32_t len) {
  if (x->in < 0) return;  // closed or ignored: drop
  if (x->inlen + len > AGENT_MAX_STDIN_BUFFER) return close_stdin(x);
  char *nb = realloc(x->inbuf, x->inlen + len);
  if (!nb) return close_stdin(x);
  x->inbuf = nb;
  memcpy(x->inbuf + x->inlen, p, len);
  x->inlen += len;
  flush_stdin(x);
}

// The exec is over once its process was reaped, its output pipes are at EOF and its cgroup is empty.
static void maybe_finish(struct exec *x) {
  if (!x->pid || !x->exited || x->out >= 0 || x->err >= 0) return;
  if (x->cg[0]) {
    if (rmdir(x->cg) != 0 && errno == EBUSY) return;  // descendants left: retried on each SIGCHLD
  }
  unsigned char pl[24];  // EXIT: code, signal, the counters with every process of it gone
  int code = WIFEXITED(x->status) ? WEXITSTATUS(x->status) : -1;
  int sig = WIFSIGNALED(x->status) ? WTERMSIG(x->status) : 0;
  put32(pl, (uint32_t)code);
  put32(pl + 4, (uint32_t)sig);
  put_counters(pl + 8);
  close_stdin(x);
  uint32_t id = x->id;
  memset(x, 0, sizeof *x);
  send_frame(FR_EXIT, id, pl, sizeof pl);
}

// ---- files (bounded, as root: the host decides what a path may be) -------------------------------

static void do_read(uint32_t id, unsigned char *p, uint32_t len) {
  if (!len || p[len - 1]) return send_error(id, "malformed path");
  int fd = open((char *)p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return send_error(id, strerror(errno));
  static char buf[AGENT_MAX_FILE_BYTES + 1];
  size_t n = 0;
  ssize_t r;
  while (n <= AGENT_MAX_FILE_BYTES && (r = read(fd, buf + n, AGENT_MAX_FILE_BYTES + 1 - n)) > 0) n += r;
  close(fd);
  if (n > AGENT_MAX_FILE_BYTES) return send_error(id, "file too large");
  send_frame(FR_FILE_DATA, id, buf, n);
}

// FILE_WRITE payload: u32 mode, path NUL, data.
static void do_write(uint32_t id, unsigned char *p, uint32_t len) {
  if (len < 6) return send_error(id, "malformed write");
  uint32_t mode = get32(p) & 07777;
  char *path = (char *)p + 4;
  size_t pl = strnlen(path, len - 4);
  if (pl == len - 4 || pl == 0) return send_error(id, "malformed path");
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return send_error(id, strerror(errno));
  unsigned char *data = p + 4 + pl + 1;
  size_t dl = len - 4 - pl - 1;
  while (dl) {
    ssize_t w = write(fd, data, dl);
    if (w <= 0) {
      close(fd);
      return send_error(id, strerror(errno));
    }
    data += w;
    dl -= w;
  }
  fchmod(fd, mode);
  close(fd);
  send_frame(FR_OK, id, NULL, 0);
}

// ---- identity ----------------------------------------------------------------------------------

// Makes this VM a given sandbox: a create may restore a VM saved once for many sandboxes (the baked
// boot snapshot, src/backends/microvm/bake.ts), or a fork restores its parent. Each then needs its own
// wall clock (a restored guest's clock stopped when it was saved), its own RNG state (restored guests
// would otherwise share the saved CRNG and draw the same "random" bytes), its hostname and its limits.
// Fail closed: a VM that did not become its sandbox (a restored one still holds the baked VM's clock
// and RNG state) runs nothing. The host may send its first EXEC right behind the IDENTITY frame
// (src/backends/microvm/start.ts), so a refusal powers the VM off before any later frame is read.
static void shutdown_vm(void);
static void refuse_identity(uint32_t id, const char *msg) {
  send_error(id, msg);
  shutdown_vm();
}

static void do_identity(uint32_t id, unsigned char *p, uint32_t len) {
  if (len < AGENT_IDENTITY_FIXED + 2 || len > AGENT_IDENTITY_FIXED + AGENT_MAX_HOSTNAME + 1 || p[len - 1])
    return refuse_identity(id, "malformed identity");
  const char *host = (const char *)p + AGENT_IDENTITY_FIXED;
  if (strlen(host) != len - AGENT_IDENTITY_FIXED - 1) return refuse_identity(id, "malformed identity");
  struct timespec ts = {(time_t)((uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32), get32(p + 8)};
  if (ts.tv_nsec >= 1000000000 || clock_settime(CLOCK_REALTIME, &ts) != 0)
    return refuse_identity(id, "cannot set the clock");
  // Credit the host's bytes as entropy and reseed the CRNG now: every read after this answer draws
  // from a state the saved VM never had (RNDRESEEDCRNG: Linux >= 4.17).
  struct {
    int entropy_count;
    int buf_size;
    unsigned char buf[AGENT_SEED_BYTES];
  } seed = {AGENT_SEED_BYTES * 8, AGENT_SEED_BYTES, {0}};
  memcpy(seed.buf, p + 24, AGENT_SEED_BYTES);
  if (urandom < 0) urandom = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
  int ok = urandom >= 0 && ioctl(urandom, RNDADDENTROPY, &seed) == 0 && ioctl(urandom, RNDRESEEDCRNG) == 0;
  memset(&seed, 0, sizeof seed);
  if (!ok) return refuse_identity(id, "cannot seed the RNG");
  if (sethostname(host, strlen(host)) != 0) return refuse_identity(id, "cannot set the hostname");
  if (have_cgroups) {
    char v[32];
    snprintf(v, sizeof v, "%u", get32(p + 12));
    if (!put_limit(SANDBOX_CG "/pids.max", v)) return refuse_identity(id, "cannot set pids.max");
    snprintf(v, sizeof v, "%llu", (unsigned long long)get32(p + 16) | (unsigned long long)get32(p + 20) << 32);
    if (!put_limit(SANDBOX_CG "/memory.max", v)) return refuse_identity(id, "cannot set memory.max");
  }
  send_frame(FR_OK, id, NULL, 0);
}

// ---- loop ---------------------------------------------------------------------------------------

static unsigned char *inbuf;
static size_t inlen;

static void shutdown_vm(void) {
  for (int i = 0; i < MAX_EXECS; i++)
    if (execs[i].pid) kill_exec(&execs[i], SIGKILL);
  sync();
  reboot(RB_POWER_OFF);
  _exit(0);
}

static void handle(uint8_t type, uint32_t id, unsigned char *p, uint32_t len) {
  struct exec *x;
  switch (type) {
  case FR_EXEC: return do_exec(id, p, len);
  case FR_STDIN:
    if ((x = find_exec(id))) do_stdin(x, p, len);
    return;
  case FR_STDIN_EOF:
    if ((x = find_exec(id))) {
      x->in_eof = 1;
      flush_stdin(x);
    }
    return;
  case FR_KILL:
    if (len != 4) return send_error(id, "malformed kill");
    if ((x = find_exec(id))) kill_exec(x, (int)(get32(p) & 63));
    return;
  case FR_FILE_READ: return do_read(id, p, len);
  case FR_FILE_WRITE: return do_write(id, p, len);
  case FR_SHUTDOWN: return shutdown_vm();
  case FR_IDENTITY: return do_identity(id, p, len);
  default: {
    errno = EPROTO;
    die("unknown frame type");
  }
  }
}

static void read_port(void) {
  ssize_t r = read(port, inbuf + inlen, AGENT_HEADER_BYTES + AGENT_MAX_PAYLOAD - inlen);
  if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (r == 0) return;  // no host connected (virtio-serial): wait for one
  if (r < 0) die("read from host");
  inlen += r;
  while (inlen >= AGENT_HEADER_BYTES) {
    uint32_t len = get32(inbuf);
    if (len > AGENT_MAX_PAYLOAD) {
      errno = EMSGSIZE;
      die("frame from host");
    }
    if (inlen < AGENT_HEADER_BYTES + len) break;
    handle(inbuf[4], get32(inbuf + 8), inbuf + AGENT_HEADER_BYTES, len);
    size_t used = AGENT_HEADER_BYTES + len;
    memmove(inbuf, inbuf + used, inlen - used);
    inlen -= used;
  }
}

static void pump(struct exec *x, int *fd, uint8_t type) {
  static char buf[CHUNK];
  ssize_t r = read(*fd, buf, sizeof buf);
  if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (r <= 0) {
    close(*fd);
    *fd = -1;
    return maybe_finish(x);
  }
  send_frame(type, x->id, buf, r);
}

int main(void) {
  if (getpid() == 1) have_cgroups = boot();
  signal(SIGPIPE, SIG_IGN);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) die("signalfd");
  inbuf = malloc(AGENT_HEADER_BYTES + AGENT_MAX_PAYLOAD);
  if (!inbuf) die("malloc");
  port = open_port();
  urandom = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
  if (have_cgroups) {
    events_mem = open(SANDBOX_CG "/memory.events", O_RDONLY | O_CLOEXEC);
    events_pids = open(SANDBOX_CG "/pids.events", O_RDONLY | O_CLOEXEC);
  }
  // Until the host has the port open, the port reports POLLHUP and writes fail: wait for it.
  for (int i = 0; i < 60000; i++) {
    struct pollfd pf = {port, POLLOUT, 0};
    if (poll(&pf, 1, 10) == 1 && !(pf.revents & POLLHUP)) break;
  }
  send_frame(FR_HELLO, 0, AGENT_VERSION, strlen(AGENT_VERSION));
  for (;;) {
    struct pollfd pf[2 + 3 * MAX_EXECS];
    struct exec *who[2 + 3 * MAX_EXECS];
    int kind[2 + 3 * MAX_EXECS];
    int n = 0;
    pf[n++] = (struct pollfd){port, POLLIN, 0};
    pf[n++] = (struct pollfd){sfd, POLLIN, 0};
    for (int i = 0; i < MAX_EXECS; i++) {
      struct exec *x = &execs[i];
      if (!x->pid) continue;
      if (x->out >= 0) who[n] = x, kind[n] = 1, pf[n++] = (struct pollfd){x->out, POLLIN, 0};
      if (x->err >= 0) who[n] = x, kind[n] = 2, pf[n++] = (struct pollfd){x->err, POLLIN, 0};
      if (x->in >= 0 && x->inlen) who[n] = x, kind[n] = 3, pf[n++] = (struct pollfd){x->in, POLLOUT, 0};
    }
    if (poll(pf, n, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (pf[1].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {
      }
      int st;
      pid_t p;
      while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
        for (int i = 0; i < MAX_EXECS; i++)
          if (execs[i].pid == p && !execs[i].exited) {
            execs[i].exited = 1;
            execs[i].status = st;
            // Like the other tiers (the exec's pid namespace dies with its first process): what the
            // process leaves behind in its cgroup dies with it.
            kill_exec(&execs[i], SIGKILL);
          }
      }
      for (int i = 0; i < MAX_EXECS; i++) maybe_finish(&execs[i]);
    }
    for (int i = 2; i < n; i++) {
      if (!pf[i].revents || !who[i]->pid) continue;
      if (kind[i] == 1 && who[i]->out == pf[i].fd) pump(who[i], &who[i]->out, FR_STDOUT);
      else if (kind[i] == 2 && who[i]->err == pf[i].fd) pump(who[i], &who[i]->err, FR_STDERR);
      else if (kind[i] == 3 && who[i]->in == pf[i].fd) {
        if (pf[i].revents & (POLLERR | POLLHUP)) close_stdin(who[i]);
        else flush_stdin(who[i]);
      }
    }
    if (pf[0].revents & POLLIN) read_port();
    else if (pf[0].revents & POLLHUP) usleep(10000);  // host not connected yet
  }
}
