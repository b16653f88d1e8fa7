// The guest's boot, as PID 1 (see agent.c for the whole picture): mounts, modules, the root overlay,
// the sandbox cgroup with its limits, and the host's virtio-serial port.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "guest.h"
#include "protocol.h"

void die(const char *what) {
  dprintf(2, "airlock-agent: %s: %s\n", what, strerror(errno));
  sync();
  reboot(RB_POWER_OFF);
  _exit(1);
}

static void load_modules(const char *list) {
  FILE *f = fopen(list, "r");
  if (!f) return;
  char line[256];
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    if (!line[0]) continue;
    int fd = open(line, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die(line);
    if (syscall(SYS_finit_module, fd, "", 0) != 0 && errno != EEXIST) die(line);
    close(fd);
  }
  fclose(f);
}

// The value of airlock.<key>= on the kernel command line, or def.
const char *cmdline(const char *key, const char *def) {
  static char buf[4096];
  int fd = open("/proc/cmdline", O_RDONLY);
  if (fd < 0) return def;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return def;
  buf[n] = 0;
  char pat[64];
  snprintf(pat, sizeof pat, "airlock.%s=", key);
  for (char *t = strtok(buf, " \n"); t; t = strtok(NULL, " \n")) {
    if (strncmp(t, pat, strlen(pat)) == 0) {
      static char val[256];
      snprintf(val, sizeof val, "%s", t + strlen(pat));
      return val;
    }
  }
  return def;
}

static void set_addr(int s, unsigned long req, const char *ifname, const char *addr) {
  struct ifreq ifr = {0};
  struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;
  snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifname);
  sin->sin_family = AF_INET;
  if (inet_pton(AF_INET, addr, &sin->sin_addr) != 1) {
    errno = EINVAL;
    die(addr);
  }
  if (ioctl(s, req, &ifr) != 0) die(ifname);
}

static void link_up(int s, const char *ifname) {
  struct ifreq ifr = {0};
  snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifname);
  if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0) die(ifname);
  ifr.ifr_flags |= IFF_UP;
  if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) die(ifname);
}

// lo always; eth0 only for a sandbox with a network policy (airlock.ip and airlock.gw on the command
// line): ip/30, default route via gw, where the host's egress gateway listens (proxy and DNS). The
// kernel has no CONFIG_IP_PNP, so this is done here. The host side decides what any of it reaches.
static void net_up(const char *ip, const char *gw) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) die("socket");
  link_up(s, "lo");
  if (ip[0]) {
    set_addr(s, SIOCSIFADDR, "eth0", ip);
    set_addr(s, SIOCSIFNETMASK, "eth0", "255.255.255.252");
    link_up(s, "eth0");
    struct rtentry rt = {0};
    struct sockaddr_in *g = (struct sockaddr_in *)&rt.rt_gateway;
    ((struct sockaddr_in *)&rt.rt_dst)->sin_family = AF_INET;
    ((struct sockaddr_in *)&rt.rt_genmask)->sin_family = AF_INET;
    g->sin_family = AF_INET;
    if (inet_pton(AF_INET, gw, &g->sin_addr) != 1) {
      errno = EINVAL;
      die(gw);
    }
    rt.rt_flags = RTF_UP | RTF_GATEWAY;
    if (ioctl(s, SIOCADDRT, &rt) != 0) die("default route");
  }
  close(s);
}

static void wait_for(const char *path) {
  for (int i = 0; i < 5000 && access(path, F_OK) != 0; i++) usleep(1000);
  if (access(path, F_OK) != 0) die(path);
}

int put_file(const char *path, const char *value) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = write(fd, value, strlen(value));
  close(fd);
  return n == (ssize_t)strlen(value);
}

// The sandbox cgroup's limits as this agent last wrote them. A snapshot restores the guest's memory
// whole, this table and the kernel's cgroup state alike, so a restored agent knows what its cgroup
// holds and IDENTITY writes only a limit that changes (a restore of the baked boot snapshot of the
// same shape, or a fork with its parent's limits, writes none). Nothing else in the guest writes
// these root-owned files: every exec runs as the sandbox's user, with no_new_privs.
static struct {
  const char *file;
  char last[32];  // empty: unknown (never written, or the last write failed)
} limits[] = {{SANDBOX_CG "/pids.max", ""}, {SANDBOX_CG "/memory.max", ""}};

int put_limit(const char *file, const char *value) {
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
    if (strcmp(limits[i].file, file) != 0) continue;
    if (limits[i].last[0] && strcmp(limits[i].last, value) == 0) return 1;
    limits[i].last[0] = 0;
    if (!put_file(file, value)) return 0;
    if (strlen(value) < sizeof limits[i].last) strcpy(limits[i].last, value);
    return 1;
  }
  return put_file(file, value);
}

static void mnt(const char *src, const char *dst, const char *type, unsigned long fl, const char *data) {
  mkdir(dst, 0755);
  if (mount(src, dst, type, fl, data) != 0) die(dst);
}

int boot(void) {
  int have_cgroups;
  mnt("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, NULL);
  mnt("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  mnt("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  // The accelerator probe (src/backends/microvm/accel.ts) only asks whether a guest reaches init.
  if (strcmp(cmdline("probe", "0"), "1") == 0) {
    write(1, "AIRLOCK-PROBE-OK\n", 17);
    reboot(RB_POWER_OFF);
  }
  load_modules("/modules.order");
  char ip[64], gw[64];
  snprintf(ip, sizeof ip, "%s", cmdline("ip", ""));
  snprintf(gw, sizeof gw, "%s", cmdline("gw", ""));
  if (ip[0]) load_modules("/modules.net");
  net_up(ip, gw);
  const char *root = cmdline("root", "/dev/vda");
  const char *fstype = cmdline("fstype", "erofs");
  char tmpopt[64];
  snprintf(tmpopt, sizeof tmpopt, "size=%s,mode=0755", cmdline("disk", "536870912"));
  wait_for(root);
  mnt(root, "/lower", fstype, MS_RDONLY | MS_NODEV, NULL);
  mnt("rw", "/rw", "tmpfs", MS_NOSUID | MS_NODEV, tmpopt);
  mkdir("/rw/upper", 0755);
  mkdir("/rw/work", 0755);
  mnt("overlay", "/newroot", "overlay", MS_NODEV,
      "lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work");
  const char *moves[] = {"/dev", "/proc", "/sys"};
  for (int i = 0; i < 3; i++) {
    char to[64];
    snprintf(to, sizeof to, "/newroot%s", moves[i]);
    mkdir(to, 0755);
    if (mount(moves[i], to, NULL, MS_MOVE, NULL) != 0) die(to);
  }
  if (chdir("/newroot") != 0 || mount(".", "/", NULL, MS_MOVE, NULL) != 0 || chroot(".") != 0 ||
      chdir("/") != 0)
    die("switch root");
  mnt("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
  mnt("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  mkdir("/sys/fs/cgroup", 0755);
  have_cgroups = mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0;
  // Every exec runs in a cgroup under SANDBOX_CG, which holds the sandbox's limits (airlock.pids,
  // airlock.mem on the command line); its memory.events and pids.events are the limit counters.
  if (have_cgroups) {
    have_cgroups = put_file("/sys/fs/cgroup/cgroup.subtree_control", "+pids +memory") &&
                   mkdir(SANDBOX_CG, 0755) == 0 &&
                   put_limit(SANDBOX_CG "/pids.max", cmdline("pids", "max")) &&
                   put_limit(SANDBOX_CG "/memory.max", cmdline("mem", "max")) &&
                   put_file(SANDBOX_CG "/cgroup.subtree_control", "+pids +memory");
    if (!have_cgroups) die("sandbox cgroup");
  }
  // The resolver is the egress gateway's DNS on the host side of eth0 (the guest's own 127.0.0.1,
  // which the generated /etc names, has no DNS server).
  if (ip[0]) {
    char conf[128];
    snprintf(conf, sizeof conf, "nameserver %s\noptions timeout:1 attempts:2\n", gw);
    unlink("/etc/resolv.conf");
    int fd = open("/etc/resolv.conf", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, conf, strlen(conf)) != (ssize_t)strlen(conf)) die("/etc/resolv.conf");
    close(fd);
  }
  // The guest's RAM is the limit plus the kernel's share: without overcommit one large allocation
  // (over total RAM) would fail with ENOMEM instead of meeting the sandbox cgroup's OOM killer.
  put_file("/proc/sys/vm/overcommit_memory", "1");
  // The sandbox's own dirs, owned by its user (airlock.uid on the command line).
  uid_t uid = (uid_t)strtoul(cmdline("uid", "1000"), NULL, 10);
  mkdir("/workspace", 0755);
  if (chown("/workspace", uid, uid) != 0) die("/workspace");
  mkdir("/tmp", 01777);
  chmod("/tmp", 01777);
  return have_cgroups;
}

int open_port(void) {
  // /sys/class/virtio-ports/vportNpM/name holds the port's name; the device is /dev/vportNpM.
  for (int i = 0; i < 5000; i++) {
    DIR *d = opendir("/sys/class/virtio-ports");
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char p[300], name[64] = {0};
      snprintf(p, sizeof p, "/sys/class/virtio-ports/%s/name", e->d_name);
      int fd = open(p, O_RDONLY);
      if (fd < 0) continue;
      ssize_t n = read(fd, name, sizeof name - 1);
      close(fd);
      if (n > 0 && strncmp(name, AGENT_PORT_NAME "\n", strlen(AGENT_PORT_NAME) + 1) == 0) {
        snprintf(p, sizeof p, "/dev/%s", e->d_name);
        closedir(d);
        wait_for(p);
        int f = open(p, O_RDWR | O_CLOEXEC);
        if (f < 0) die(p);
        return f;
      }
    }
    if (d) closedir(d);
    usleep(1000);
  }
  errno = ENODEV;
  die("virtio port " AGENT_PORT_NAME);
  return -1;
}

