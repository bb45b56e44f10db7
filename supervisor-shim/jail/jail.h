/*
 * sandbox-shim: the kernel jail around every guest (README.md, "The jail").
 *
 * A guest starts, before exec, in new user, mount, PID, network, IPC, UTS and
 * cgroup namespaces (no network interface up), in a root of its own (a tmpfs
 * holding its executable and libraries read-only, four device nodes and a
 * capped scratch: mounts.c), as an unprivileged uid and gid of its own with no
 * supplementary groups and no capabilities, under PR_SET_NO_NEW_PRIVS and a
 * seccomp-bpf allow-list (seccomp.c), with RLIMIT_CPU, RLIMIT_NPROC,
 * RLIMIT_FSIZE, RLIMIT_CORE and RLIMIT_NOFILE set, and, when a delegated
 * cgroup v2 directory is configured, in a cgroup of its own with memory.max
 * and pids.max. Anything the kernel refuses fails the spawn with a message:
 * there is no half-jailed guest.
 *
 * Split: sb_shim_jail_new() does everything that allocates or may block
 * (the seccomp program is compiled once with libseccomp and kept as raw BPF),
 * once at start-up. Per run, sb_shim_jail_begin() takes a guest uid (one no
 * process runs as) and makes the cgroup, sb_shim_jail_plan_fs() works out the
 * guest's root, sb_shim_jail_attach() (parent, after clone) writes the child's
 * uid/gid maps and moves it into the cgroup, sb_shim_jail_enter() (child,
 * before exec) drops everything using raw system calls only, and
 * sb_shim_jail_end() (after the guest was reaped) removes the cgroup and gives
 * the uid back. child.c drives these; callers only pass the jail to
 * sb_shim_child_spawn (child.h).
 *
 * Thread affinity: a jail object may be shared by runs on several threads;
 * begin/attach/end touch only the run's own state plus an atomic counter.
 */
#ifndef SB_SHIM_JAIL_H
#define SB_SHIM_JAIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "sb/status.h"

/* defaults (README.md, "The jail") */
#define SB_SHIM_JAIL_UID_BASE 1879048192ul /* 0x70000000: above systemd's container ranges, below 2^31 */
#define SB_SHIM_JAIL_SLOTS 1024u
#define SB_SHIM_JAIL_NPROC 128u                    /* tasks per run: Deno alone runs about cores + 4 threads */
#define SB_SHIM_JAIL_FSIZE (64ull * 1024u * 1024u) /* largest file a guest may write (Deno's caches: < 1 MiB) */
#define SB_SHIM_JAIL_LOCK_FILE "/run/sandbox-shim/uids.lock"
/* cgroup memory.max = the run's memory limit plus this (Deno beyond its V8 old space; README.md) */
#define SB_SHIM_JAIL_DENO_OVERHEAD_MB 160u
/*
 * RLIMIT_DATA (writable private memory, resident or not) = the run's memory limit plus this plus
 * SB_SHIM_JAIL_DATA_PER_CPU_MB per CPU. The V8 heap cap does not cover ArrayBuffer backing stores
 * (a guest filling Uint8Arrays under --max-old-space-size=32 reached 6.6 GiB resident in 20 s);
 * this bounds them where no cgroup does. Deno 2.9 maps about 545 MiB of it when idle (a 512 MiB
 * code range, thread stacks, malloc arenas) on 2 CPUs.
 */
#define SB_SHIM_JAIL_DATA_BASE_MB 768u
#define SB_SHIM_JAIL_DATA_PER_CPU_MB 16u
/* RLIMIT_CPU = CPUs x the run's wall clock (rounded up to seconds) + this: every thread busy for the
 * whole run still fits; a guest that outlives its run (or blocks SIGXCPU) cannot spin past it */
#define SB_SHIM_JAIL_CPU_MARGIN_S 5u
/* the memory limit of a run that names none (relay without --memory-mb) */
#define SB_SHIM_JAIL_DEFAULT_MEMORY_MB 256u

typedef struct st_sb_shim_jail_t sb_shim_jail_t;

typedef struct st_sb_shim_jail_config_t {
    int off;                /* 1: --jail=off, the explicit opt-out; everything below is ignored */
    unsigned long uid_base; /* root only: guests run as uid and gid uid_base + slot */
    unsigned slots;         /* root only: how many guests may run at once on this machine */
    unsigned nproc;         /* RLIMIT_NPROC and pids.max of one run */
    unsigned long long fsize;
    const char *cgroup;    /* NULL: none; else a cgroup v2 directory with memory and pids delegated */
    const char *lock_file; /* root only: the byte-range lock file that hands out the guest uids */
} sb_shim_jail_config_t;

/* ---- the guest's filesystem (mounts.c) ---- */

/* a scratch (/work: HOME, TMPDIR, DENO_DIR, the cwd) of a run: bytes and inodes */
#define SB_SHIM_JAIL_SCRATCH_INODES 4096u

/* one entry of the guest's root: a read-only bind of a host path, or a symlink */
typedef struct st_sb_shim_jail_bind_t {
    char *src; /* the host path (resolved); for a symlink, its target */
    char *dst; /* the path inside the guest's root */
    unsigned flags;
} sb_shim_jail_bind_t;
#define SB_SHIM_JAIL_BIND_DIR 1u     /* a directory (else a file) */
#define SB_SHIM_JAIL_BIND_EXEC 2u    /* code: not noexec */
#define SB_SHIM_JAIL_BIND_DEV 4u     /* a device node: not nodev */
#define SB_SHIM_JAIL_BIND_SYMLINK 8u /* a symlink at the top of the root */
#define SB_SHIM_JAIL_BIND_EXE 16u    /* the executable itself: a source the guest cannot reach is an exec failure */

typedef struct st_sb_shim_jail_fs_t sb_shim_jail_fs_t;

/* what goes into one guest's root */
typedef struct st_sb_shim_jail_fs_spec_t {
    const char *exe;         /* the executable on the host; NULL: none (the probe) */
    const char *exe_in_root; /* where it appears in the root; NULL: at its resolved host path */
    char *const *argv;       /* with `system`: regular files named by absolute paths here are bound read-only */
    int system;              /* 1 (relay): the host's /usr read-only, /bin, /lib, /lib64, /sbin as the host has them */
    unsigned long long scratch_bytes;
    unsigned scratch_inodes;
} sb_shim_jail_fs_spec_t;

/**
 * Works out a guest's root (mounts.c has the layout and why): the executable, its ELF interpreter and
 * libraries (DT_NEEDED, recursively, in the loader's default directories), /dev, the scratch.
 * Allocates; call before the child exists.
 * @return a plan for sb_shim_jail_mount (free with sb_shim_jail_fs_free), or NULL with the reason in `err`
 */
sb_shim_jail_fs_t *sb_shim_jail_plan_fs(const sb_shim_jail_fs_spec_t *spec, char *err, size_t errsz);
void sb_shim_jail_fs_free(sb_shim_jail_fs_t *fs);
/** @return the executable's path inside the root, or NULL */
const char *sb_shim_jail_fs_exe(const sb_shim_jail_fs_t *fs);
/**
 * Child side, with CAP_SYS_ADMIN in the guest's user namespace, inside its new mount namespace: builds
 * the root and pivots into it. Async-signal-safe.
 * @return 0, or -1 with errno and the failing SB_SHIM_JAIL_STAGE_* in `stage`
 */
int sb_shim_jail_mount(const sb_shim_jail_fs_t *fs, int *stage);

/* one run's jail state; lives in sb_shim_child_t */
typedef struct st_sb_shim_jail_run_t {
    int active; /* begin succeeded and end has not run */
    uid_t uid;  /* the guest's uid and gid, inside and outside its user namespace */
    gid_t gid;
    int lock_fd;                   /* holds the byte lock on `uid` in the lock file; -1: none (not root) */
    int cgroup_fd;                 /* the run's cgroup directory; -1: none */
    unsigned long long data_limit; /* RLIMIT_DATA in bytes */
    unsigned long long cpu_limit;  /* RLIMIT_CPU in seconds; 0: none */
    sb_shim_jail_fs_t *fs;         /* the guest's root (sb_shim_jail_plan_fs); freed by sb_shim_jail_end */
    int parent_fd;                 /* child side: a socket whose peer closes when the spawning process dies; -1: none */
    int threads_only;              /* the filter: SB_SHIM_JAIL_FILTER_* */
    char cgroup_name[48];
} sb_shim_jail_run_t;

/* a failure inside the child, reported through the exec-status pipe */
typedef struct st_sb_shim_jail_fail_t {
    int stage; /* one of the SB_SHIM_JAIL_STAGE_* values below, or 0 for exec itself */
    int err;   /* errno */
} sb_shim_jail_fail_t;

/**
 * Fills `cfg` with the defaults (jail on, no cgroup).
 */
void sb_shim_jail_config_init(sb_shim_jail_config_t *cfg);

/**
 * Applies one command-line option to `cfg`: `--jail on|off` (also `--jail=on|off`), `--jail-uid-base N`,
 * `--jail-slots N`, `--jail-nproc N`, `--jail-fsize-mb N`, `--jail-cgroup DIR`, `--jail-lock-file F`.
 * @param name the option, `--jail=...` included
 * @param val its value (NULL for `--jail=...`); the string must outlive `cfg`
 * @param why receives a static message when the value is invalid
 * @return 1 when the option was a jail option and was applied, 0 when it is not one, -1 when the value is invalid
 */
int sb_shim_jail_config_option(sb_shim_jail_config_t *cfg, const char *name, const char *val, const char **why);

/**
 * Validates the configuration against this kernel and process, once at start-up: compiles the seccomp
 * filter, checks the uid range is mapped in our user namespace and the lock file can be opened (root),
 * and that a configured cgroup directory is cgroup v2 with the memory and pids controllers delegated.
 * Namespaces themselves are only tried by a spawn (or sb_shim_jail_probe).
 * @param err receives the reason on failure (never a secret)
 * @return a new jail (free with sb_shim_jail_free), or NULL; a config with `off` gives a jail that jails nothing
 */
sb_shim_jail_t *sb_shim_jail_new(const sb_shim_jail_config_t *cfg, char *err, size_t errsz);

void sb_shim_jail_free(sb_shim_jail_t *j);

/** @return 1 when the jail is on */
int sb_shim_jail_enabled(const sb_shim_jail_t *j);

/** @return 1 when the shim runs as root and gives each guest a uid of its own */
int sb_shim_jail_privileged(const sb_shim_jail_t *j);

/**
 * @return a one-line, static-lifetime description of what the jail applies (or that it is off, or
 * that no cgroup is configured and the V8 heap cap is the memory bound); the shim prints it at start-up
 */
const char *sb_shim_jail_describe(const sb_shim_jail_t *j);

/**
 * Starts one guest with the full jail and nothing to run (it exits as soon as the seccomp filter is
 * loaded), so that a service can refuse to start on a kernel that refuses namespaces or seccomp.
 * @return SB_OK, or SB_E_EXECUTION with the reason in `err` (also counted by sb_shim_jail_failures)
 */
SB_WARN_UNUSED sb_status_t sb_shim_jail_probe(sb_shim_jail_t *j, char *err, size_t errsz);

/**
 * Compiles a Deno guest filter (SB_SHIM_JAIL_FILTER_THREADS or _LOOPBACK) if it is not yet
 * (sb_shim_jail_new compiles the relay filter; sb_shim_jail_probe every one, so a service that
 * probes at start-up compiles nothing per run). Mutates the jail: call it from the thread that made it, before runs share it.
 * @return 0, or -1 with the reason in `err`
 */
int sb_shim_jail_prepare(sb_shim_jail_t *j, int threads_only, char *err, size_t errsz);

/**
 * For a process that closes every descriptor it inherited (serve's run processes): moves the one
 * descriptor the jail keeps open (its cgroup directory) to `fd`, close-on-exec, closing the old one.
 * `fd` is overwritten if open. Nothing to do when the jail holds none.
 * @return 1 when the jail holds a descriptor (now `fd`), 0 when it holds none, -1 on error (errno set)
 */
int sb_shim_jail_move_fd(sb_shim_jail_t *j, int fd);

/**
 * Removes the cgroups of the runs of process `owner` (created by its sb_shim_jail_begin) that it
 * left behind because it was killed, killing anything still in them (cgroup.kill). Call it while
 * `owner` is a zombie not reaped yet, so that its pid cannot name another process's cgroups.
 * Nothing to do without a configured cgroup.
 * @return how many were removed
 */
unsigned sb_shim_jail_sweep(sb_shim_jail_t *j, pid_t owner);

/**
 * @return how many jailed spawns failed because the jail could not be set up (not exec failures of the
 * guest program), since the process started; safe from any thread (an exported metric)
 */
uint64_t sb_shim_jail_failures(void);

/* ---- leftovers.c: what guests of older shims left on the host ---- */

/** 1 when a process runs as `uid`, or when that cannot be known (jail.c) */
int sb_shim_jail__uid_in_use(uid_t uid);

/**
 * 1 when `uid` owns an entry at the top of /tmp, /var/tmp, /dev/shm or TMPDIR, or the `home` of an
 * old work directory (TMPDIR/sb-shim-*): such a uid is never handed out
 */
int sb_shim_jail__uid_owns_files(uid_t uid);

/**
 * Removes the old work directories under TMPDIR whose guest uid is in [base, base + slots) and runs
 * nothing, fd-relative and bounded; counts what went and what had to stay.
 */
void sb_shim_jail__sweep(uid_t base, unsigned slots, unsigned *removed, unsigned *kept);

/* ---- used by child.c ---- */

/* failure stages inside the child (sb_shim_jail_fail_t.stage) */
#define SB_SHIM_JAIL_STAGE_HANDSHAKE 1
#define SB_SHIM_JAIL_STAGE_HOSTNAME 2
#define SB_SHIM_JAIL_STAGE_GROUPS 3
#define SB_SHIM_JAIL_STAGE_GID 4
#define SB_SHIM_JAIL_STAGE_UID 5
#define SB_SHIM_JAIL_STAGE_CAPS 6
#define SB_SHIM_JAIL_STAGE_RLIMIT 7
#define SB_SHIM_JAIL_STAGE_NO_NEW_PRIVS 8
#define SB_SHIM_JAIL_STAGE_SECCOMP 9
#define SB_SHIM_JAIL_STAGE_SETUP 10 /* not a jail stage: dup2, chdir, ... */
#define SB_SHIM_JAIL_STAGE_CGROUPNS 11
#define SB_SHIM_JAIL_STAGE_PROPAGATION 12
#define SB_SHIM_JAIL_STAGE_ROOT 13
#define SB_SHIM_JAIL_STAGE_BIND 14
#define SB_SHIM_JAIL_STAGE_SCRATCH 15
#define SB_SHIM_JAIL_STAGE_PIVOT 16
#define SB_SHIM_JAIL_STAGE_PDEATHSIG 17
#define SB_SHIM_JAIL_STAGE_CWD 18
#define SB_SHIM_JAIL_STAGE_PROC 19
#define SB_SHIM_JAIL_STAGE_LOOPBACK 20 /* the module path's listeners in the guest's network namespace */

/** @return RLIMIT_CPU in seconds for a run of `timeout_ms` (0: none) */
unsigned long long sb_shim_jail_cpu_limit(unsigned timeout_ms);

/** @return the byte cap of a run's scratch tmpfs (--jail-fsize-mb) */
unsigned long long sb_shim_jail_scratch_bytes(const sb_shim_jail_t *j);

struct sock_fprog;
/**
 * Compiles the guest's seccomp allow-list (seccomp.c) with libseccomp and exports it as raw BPF into
 * `prog` (its filter allocated with sb_mem), so that the child only has to hand it to the kernel.
 * @param threads_only SB_SHIM_JAIL_FILTER_THREADS: clone only for threads (no fork, vfork or process clone), for
 *        Deno guests; SB_SHIM_JAIL_FILTER_LOOPBACK: that, and TCP clients in the guest's own network namespace
 * @return 0, or -1 with the reason in `err`
 */
/* the seccomp filters (sb_shim_spawn_t.threads_only) */
#define SB_SHIM_JAIL_FILTER_PROCESSES 0 /* relay guests: processes allowed */
#define SB_SHIM_JAIL_FILTER_THREADS 1   /* Deno guests: threads only */
/* Deno guests of runs with imports: also socket(AF_INET, SOCK_STREAM) and connect, which reach only what the
 * guest's private network namespace holds: its loopback and the module path's listeners there (relay/modules.h) */
#define SB_SHIM_JAIL_FILTER_LOOPBACK 2

int sb_shim_jail_build_filter(struct sock_fprog *prog, unsigned *rules, int threads_only, char *err, size_t errsz);

/** @return the clone(2) namespace flags a jailed guest is started with (the cgroup namespace follows in enter) */
unsigned long sb_shim_jail_clone_flags(void);

/**
 * Per run, before the child exists: takes a free guest uid and, with a cgroup, creates the run's
 * cgroup with memory.max = memory_mb + SB_SHIM_JAIL_DENO_OVERHEAD_MB and pids.max = nproc; sets
 * the run's RLIMIT_DATA from memory_mb.
 * @param memory_mb the run's memory limit in MiB (0: the shim's default)
 * @param home when not NULL, a directory handed to the guest: chowned to its uid and gid
 */
SB_WARN_UNUSED sb_status_t sb_shim_jail_begin(sb_shim_jail_t *j, unsigned memory_mb, const char *home, sb_shim_jail_run_t *run,
                                              char *err, size_t errsz);

/**
 * Parent side, after clone and before the child may go on: writes the child's uid_map, gid_map (and
 * setgroups) and moves it into the run's cgroup.
 */
SB_WARN_UNUSED sb_status_t sb_shim_jail_attach(const sb_shim_jail_t *j, const sb_shim_jail_run_t *run, pid_t pid, char *err,
                                               size_t errsz);

/**
 * Child side, between the parent's attach and exec. Async-signal-safe: raw system calls only, no
 * allocation. Sets the hostname, enters a new cgroup namespace, drops groups, gid, uid and every capability, sets the rlimits
 * (NPROC, FSIZE, DATA, CORE 0, and NOFILE to `nofile` when not 0), then no_new_privs and the
 * seccomp filter.
 * @return 0, or -1 with `fail` filled in
 */
int sb_shim_jail_enter(const sb_shim_jail_t *j, const sb_shim_jail_run_t *run, unsigned nofile, sb_shim_jail_fail_t *fail);

/**
 * Per run, after the guest was reaped: removes the cgroup (killing anything left in it) and gives the
 * uid back. Idempotent.
 */
void sb_shim_jail_end(sb_shim_jail_t *j, sb_shim_jail_run_t *run);

/** counts one jail set-up failure (sb_shim_jail_failures) */
void sb_shim_jail_count_failure(void);

/** @return the words for a child failure stage, e.g. "setting the guest uid" */
const char *sb_shim_jail_stage_name(int stage);

#endif
