/*
 * sandbox-shim: counters the spawn path reports into, for serve's metrics.
 *
 * A guest is started in a process of its own run (serve forks one per run),
 * so these are process-local counts that the run reports back to the service
 * with its outcome (serve.c adds them to /metrics). In `run` and `relay` they
 * are counted and ignored.
 */
#ifndef SB_SHIM_HOOKS_H
#define SB_SHIM_HOOKS_H

/**
 * The kernel jail around a guest could not be set up (a namespace, the
 * seccomp filter, the uid switch, an rlimit or the cgroup was refused). Call
 * it once per guest that was not started because of it, from the process that
 * called sb_shim_child_spawn (not from the forked child).
 */
void sb_shim_hook_jail_failure(void);

/** jail set-up failures counted in this process so far */
unsigned long sb_shim_hook_jail_failures(void);

#endif
