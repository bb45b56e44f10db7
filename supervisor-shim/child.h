/*
 * sandbox-shim: spawning and signalling the guest process.
 *
 * The guest runs in its own process group (so one kill reaches everything it
 * started), with core dumps off, a small descriptor limit, an explicit
 * environment and working directory, and dies with the shim
 * (PR_SET_PDEATHSIG). Our pipe ends are non-blocking and close-on-exec.
 */
#ifndef SB_SHIM_CHILD_H
#define SB_SHIM_CHILD_H

#include <stddef.h>
#include <sys/types.h>
#include "sb/status.h"

typedef struct st_sb_shim_spawn_t {
    const char *path;  /* executable (absolute or relative to the shim's cwd) */
    char *const *argv; /* NULL-terminated */
    char *const *envp; /* NULL-terminated; the child's whole environment */
    const char *cwd;   /* NULL keeps the shim's */
    unsigned nofile;   /* RLIMIT_NOFILE for the child; 0 keeps the shim's */
} sb_shim_spawn_t;

typedef struct st_sb_shim_child_t {
    pid_t pid;  /* also the process group id */
    int pidfd;  /* readable when the child exits; -1 when the kernel lacks pidfd_open */
    int in_fd;  /* write end of the child's stdin */
    int out_fd; /* read end of the child's stdout */
    int err_fd; /* read end of the child's stderr */
} sb_shim_child_t;

/**
 * Starts the child. Exec failures are detected here (through a close-on-exec
 * pipe) rather than surfacing later as an early exit.
 * @param err receives a message on failure
 * @return SB_OK or SB_E_EXECUTION
 */
SB_WARN_UNUSED sb_status_t sb_shim_child_spawn(const sb_shim_spawn_t *sp, sb_shim_child_t *out, char *err, size_t errsz);

/** sends `sig` to the child's whole process group */
void sb_shim_child_signal(const sb_shim_child_t *c, int sig);

/** closes whichever of our descriptors are still open */
void sb_shim_child_close(sb_shim_child_t *c);

#endif
