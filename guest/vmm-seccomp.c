// A host-side helper of the VMM jail (not part of the guest; built with the agent by assets.ts):
// installs a seccomp filter read from fd 6 (a raw struct sock_filter[] program, as
// src/backends/host/seccomp.privileged.ts builds it), then execs argv[1..] under it. It runs after
// setpriv dropped to the sandbox's uid with no_new_privs set, so an unprivileged process installs
// the filter and everything it execs (QEMU, which adds its own -sandbox filter on top) keeps it.
// Any failure exits 126 before the exec: QEMU never runs unfiltered.
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define FILTER_FD 6
#define MAX_INSNS 4096

int main(int argc, char **argv) {
  static struct sock_filter insns[MAX_INSNS];
  if (argc < 2) {
    fprintf(stderr, "vmm-seccomp: usage: vmm-seccomp PROGRAM [ARGS...] (filter on fd %d)\n", FILTER_FD);
    return 126;
  }
  size_t got = 0;
  for (;;) {
    if (got == sizeof insns) {
      fprintf(stderr, "vmm-seccomp: filter longer than %d instructions\n", MAX_INSNS);
      return 126;
    }
    ssize_t n = read(FILTER_FD, (char *)insns + got, sizeof insns - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      fprintf(stderr, "vmm-seccomp: reading the filter: %s\n", strerror(errno));
      return 126;
    }
    if (n == 0) break;
    got += (size_t)n;
  }
  close(FILTER_FD);
  if (got == 0 || got % sizeof insns[0]) {
    fprintf(stderr, "vmm-seccomp: the filter is empty or not whole instructions\n");
    return 126;
  }
  struct sock_fprog prog = {(unsigned short)(got / sizeof insns[0]), insns};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
    fprintf(stderr, "vmm-seccomp: installing the filter: %s\n", strerror(errno));
    return 126;
  }
  execv(argv[1], argv + 1);
  fprintf(stderr, "vmm-seccomp: exec %s: %s\n", argv[1], strerror(errno));
  return 126;
}
