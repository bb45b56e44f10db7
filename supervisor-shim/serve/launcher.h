/*
 * sandbox-shim serve: the launcher, and the pool of guests it keeps warm.
 *
 * The launcher is a process forked by the service at start-up, before the
 * listener takes its first request, so that its memory holds the service's
 * configuration and nothing of any run. Every run's process is forked from it
 * (never from the service, whose memory holds the bodies of the requests in
 * flight: other runs' sources, inputs, tokens and secrets), so a run's
 * processes hold that run's data and nothing else.
 *
 * The pool: for each memory class (`--pool-memory-mb`, the V8 heap cap is
 * fixed when Deno starts) the launcher keeps `--pool-size` run processes
 * whose guest is already started inside the full jail, its runtime loaded and
 * hardened (guest/runtime.js, prepare()), waiting for an init frame. A run
 * whose memoryMb matches a class takes one (a hit); any other, or one that
 * finds its class empty, gets a run process that starts its guest after the
 * run arrived (a cold start, as before the pool). A process and its guest
 * serve exactly one run and are never reused; the pool refills in the
 * background, and a pooled guest that dies while idle is replaced and
 * counted. Idle, a pooled process holds no token and no run data; its guest
 * holds a uid slot and the jail's per-run resources like any running guest.
 *
 * The service talks to the launcher over a SOCK_SEQPACKET pair: a run is one
 * message carrying its job (a sealed memfd written by the service) and the
 * run's report socket and client connection as descriptors; the launcher
 * answers with the run process's pid and a pidfd, so the service signals
 * exactly that process. The launcher reaps every run process (sweeping the
 * cgroups of one that was killed) and counts into a shared page the service
 * reads for /metrics.
 */
#ifndef SB_SERVE_LAUNCHER_H
#define SB_SERVE_LAUNCHER_H

#include <stdint.h>
#include <sys/types.h>
#include "sb/status.h"
#include "serve/serve_int.h"

#define SB_SERVE_POOL_MAX_CLASSES 8u
#define SB_SERVE_POOL_MAX_SIZE 64u
/* the default: one class, upstream's default memoryMb, two guests warm */
#define SB_SERVE_POOL_DEFAULT_SIZE 2u
/*
 * RLIMIT_CPU: a pooled guest starts with the longest run's (SB_SERVE_MAX_TIMEOUT_MS); its run lowers
 * it to the run's own plus this, for the CPU its start used while it waited (about 0.1 s measured)
 */
#define SB_SERVE_POOL_START_CPU_S 2u

typedef struct st_sb_serve_pool_conf_t {
    unsigned size;                                /* idle guests kept per class; 0: no pool (every run starts cold) */
    unsigned nclasses;                            /* memory classes */
    unsigned class_mb[SB_SERVE_POOL_MAX_CLASSES]; /* their memoryMb */
} sb_serve_pool_conf_t;

/* counted by the launcher into a page shared with the service; read with sb_serve_launcher_stats */
typedef struct st_sb_serve_pool_stats_t {
    uint64_t hits;            /* runs that took a pooled guest */
    uint64_t misses;          /* runs of a pooled class that found it empty (started cold) */
    uint64_t cold;            /* runs started cold, misses included */
    uint64_t refills;         /* pooled guests started */
    uint64_t refill_failures; /* pooled guests that could not be started (the spawn or the jail refused) */
    uint64_t died;            /* pooled guests that died while idle (replaced) */
    uint64_t idle;            /* pooled guests ready now */
    uint64_t starting;        /* pooled guests being started now */
    uint64_t processes;       /* run processes alive (pooled, starting and running) */
} sb_serve_pool_stats_t;

typedef struct st_sb_serve_launcher_t {
    pid_t pid;
    int pidfd; /* -1 without pidfd_open */
    int fd;    /* our end of the control pair; -1 once stopped */
    sb_serve_pool_stats_t *stats;
} sb_serve_launcher_t;

/**
 * Parses `--pool-memory-mb` ("128,256": classes within the request schema's memoryMb bounds,
 * distinct, at most SB_SERVE_POOL_MAX_CLASSES).
 * @return 0, or -1 with `why` set
 */
int sb_serve_pool_parse_classes(const char *s, sb_serve_pool_conf_t *pc, const char **why);

/**
 * Forks the launcher. Call it once, after the configuration is read and every secret the
 * runs do not need is wiped, before the first request; the launcher keeps no descriptor of
 * the service's but its standard streams and the jail's cgroup directory.
 * @return SB_OK, or SB_E_EXECUTION with `err` set
 */
SB_WARN_UNUSED sb_status_t sb_serve_launcher_start(sb_serve_launcher_t *l, const sb_serve_conf_t *conf,
                                                   const sb_serve_pool_conf_t *pc, char *err, size_t errsz);

/**
 * Hands a run to the launcher and waits (briefly: it forks or hands over, never spawns a guest
 * itself) for its process.
 * @param report_fd the run process's end of the report socket (sent, not closed)
 * @param cancel_fd the client's connection, or -1
 * @param pid, pidfd the run's process (*pidfd -1 without pidfd_open)
 * @param pooled 1 when the run took a pooled guest
 * @return SB_OK, or SB_E_EXECUTION with `err` set (no run process exists)
 */
SB_WARN_UNUSED sb_status_t sb_serve_launcher_submit(sb_serve_launcher_t *l, const sb_serve_job_t *job, int report_fd, int cancel_fd,
                                                    pid_t *pid, int *pidfd, int *pooled, char *err, size_t errsz);

/** a copy of the launcher's counters */
void sb_serve_launcher_stats(const sb_serve_launcher_t *l, sb_serve_pool_stats_t *out);

/**
 * 1 while the launcher process is alive and answering. A launcher that died is not restarted
 * (runs then fail with a spawn error, and the service's health says so).
 */
int sb_serve_launcher_alive(const sb_serve_launcher_t *l);

/**
 * Stops the launcher: its pooled guests are killed at once, the runs in flight are left to
 * end (the service drains them first), then it exits; waits up to `wait_ms` for that.
 */
void sb_serve_launcher_stop(sb_serve_launcher_t *l, int wait_ms);

/* ---- the run process (serve_run.c), forked by the launcher ---- */

/**
 * The job as the service writes it for the launcher (a memfd): packed by the service, read back
 * by the run process with every length bounded.
 */
SB_WARN_UNUSED sb_status_t sb_serve_job_write(int fd, const sb_serve_job_t *job);
SB_WARN_UNUSED sb_status_t sb_serve_job_read(int fd, const sb_serve_conf_t *conf, sb_serve_job_t *job);

#endif
