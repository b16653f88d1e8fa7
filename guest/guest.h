// What boot.c gives agent.c.
#ifndef AIRLOCK_GUEST_H
#define AIRLOCK_GUEST_H

/** The cgroup every exec's own cgroup lives under; it holds the sandbox's limits. */
#define SANDBOX_CG "/sys/fs/cgroup/sbx"

/** Report, then power the VM off (the host sees the agent's connection end). */
void die(const char *what);
/** The value of airlock.<key>= on the kernel command line, or def. */
const char *cmdline(const char *key, const char *def);
/** Mount the guest's root and cgroups (PID 1 only); returns whether per-exec cgroups work. */
int boot(void);
/** Write value to the file at path (a cgroup or /proc knob); returns whether all of it was written. */
int put_file(const char *path, const char *value);
/** put_file for a limit of SANDBOX_CG, skipped when it already holds that value (boot.c limits). */
int put_limit(const char *path, const char *value);
/** Open the virtio-serial port named AGENT_PORT_NAME. */
int open_port(void);

#endif
