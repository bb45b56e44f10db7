/*
 * sandbox-shim: spawning and signalling the guest process.
 *
 * The guest runs in its own process group (so one kill reaches everything it
 * started), with core dumps off, a small descriptor limit, an explicit
 * environment and working directory, and dies with the shim
 * (PR_SET_PDEATHSIG). Our pipe ends are non-blocking and close-on-exec.
 *
 * With a jail (jail.h) the guest is also started in its own session and
 * namespaces (it is pid 1 of its PID namespace), as its own uid, under
 * seccomp and rlimits; any step the kernel refuses fails the spawn.
 * PR_SET_PDEATHSIG fires when the *thread* that spawned the guest exits:
 * spawn from a thread that outlives the run.
 */
#ifndef SB_SHIM_CHILD_H
#define SB_SHIM_CHILD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "sb/status.h"
#include "jail/jail.h"

/* the most listeners a child makes (sb_shim_spawn_t.listen_ports) */
#define SB_SHIM_MAX_LISTEN 32u

typedef struct st_sb_shim_spawn_t {
    const char *path;     /* executable (absolute or relative to the shim's cwd) */
    char *const *argv;    /* NULL-terminated */
    char *const *envp;    /* NULL-terminated; the child's whole environment */
    const char *cwd;      /* NULL keeps the shim's (jailed: /work, the guest's scratch) */
    unsigned nofile;      /* RLIMIT_NOFILE for the child; 0 keeps the shim's */
    sb_shim_jail_t *jail; /* sb_shim_jail_new(); NULL or a jail that is off: no jail */
    unsigned memory_mb;   /* jailed: the run's memory limit, for its cgroup's memory.max (0: the default) */
    const char
        *home; /* jailed: a host directory to chown to the guest (unused by run and serve: HOME is in the guest's own root) */
    const char *root_exe; /* jailed: where `path` appears in the guest's root (NULL: at its resolved host path) */
    int root_system;      /* jailed: the guest's root also gets the host's /usr and argv's files, read-only (relay) */
    int threads_only;     /* jailed: the guest may start threads but no process (Deno guests; jail.h) */
    unsigned timeout_ms;  /* jailed: the run's wall clock, the base of RLIMIT_CPU (0: no RLIMIT_CPU) */
    void *scrub;          /* memory the child wipes first thing (the run token): NULL: none */
    size_t scrub_len;
    /* jailed: TCP ports the child listens on at 127.0.0.1 in its own network namespace before it execs (the module
     * path, relay/modules.h); the listeners come back to us in sb_shim_child_t.listen_fds */
    const uint16_t *listen_ports;
    unsigned nlisten;
} sb_shim_spawn_t;

typedef struct st_sb_shim_child_t {
    pid_t pid;  /* also the process group id */
    int pidfd;  /* readable when the child exits; -1 when the kernel lacks pidfd_open */
    int in_fd;  /* write end of the child's stdin */
    int out_fd; /* read end of the child's stdout */
    int err_fd; /* read end of the child's stderr */
    sb_shim_jail_t *jail;
    sb_shim_jail_run_t jail_run;        /* the run's uid and cgroup, given back by sb_shim_child_close */
    int listen_fds[SB_SHIM_MAX_LISTEN]; /* sb_shim_spawn_t.listen_ports, in their order; closed by sb_shim_child_close */
    unsigned nlisten;
} sb_shim_child_t;

/**
 * Starts the child. Exec failures are detected here (through a close-on-exec
 * pipe) rather than surfacing later as an early exit, and so is every jail
 * step: a guest that could not be jailed never runs.
 * `sp->path` NULL (jail probe only): the child exits 0 where it would exec.
 * @param err receives a message on failure (jail failures start with "jail: ")
 * @return SB_OK or SB_E_EXECUTION
 */
SB_WARN_UNUSED sb_status_t sb_shim_child_spawn(const sb_shim_spawn_t *sp, sb_shim_child_t *out, char *err, size_t errsz);

/**
 * Reads a small file (a /proc one) whole: at most `size` - 1 bytes, NUL-terminated.
 * @return the length read, or -1 (cannot open, cannot read, or empty)
 */
ssize_t sb_shim_read_small_file(const char *path, char *buf, size_t size);

/**
 * 1 once the child can no longer run: its pidfd (or, without one, its stdout) is readable, which
 * happens only after every thread of it has exited, or its leader is already a zombie in /proc (a
 * killed multi-threaded child shows so while its other threads are still going). 0 while it runs,
 * or when neither says otherwise (a /proc the caller cannot read).
 */
int sb_shim_child_gone(const sb_shim_child_t *c);

/**
 * sends `sig` to the child's whole process group; a jailed child (pid 1 of its namespace, which
 * the kernel shields from signals it does not catch) that does not catch SIGTERM is SIGKILLed
 */
void sb_shim_child_signal(const sb_shim_child_t *c, int sig);

/**
 * Closes whichever of our descriptors are still open and, for a jailed child,
 * gives its uid back and removes its cgroup; a jailed child not reaped yet
 * (c->pid > 0) is killed and reaped first, so a uid is never handed out while
 * a process still runs under it. Set c->pid to -1 after reaping it yourself.
 */
void sb_shim_child_close(sb_shim_child_t *c);

#endif
