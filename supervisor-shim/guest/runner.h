/*
 * sandbox-shim: one run of a Deno guest, start to finish.
 *
 * `run` and `serve` start every guest through this one function, so both get
 * the same private work directory, the same Deno command line and
 * environment, the same spawn path (child.c) and the same relay (relay.c).
 * The embedded runtime is loaded from a data: URL on the command line, so no
 * host path of it exists for the guest to see.
 */
#ifndef SB_SHIM_RUNNER_H
#define SB_SHIM_RUNNER_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "sb/status.h"
#include "jail/child.h"
#include "relay/relay.h"

/* descriptors the guest may hold (Deno needs a few dozen for its runtime threads) */
#define SB_SHIM_GUEST_NOFILE 64u

typedef struct st_sb_shim_deno_t {
    const char *exe;         /* the Deno binary, found before (find_exe) */
    const char *runtime_url; /* sb_shim_runtime_url() */
    unsigned long memory_mb; /* V8 old-space cap; jailed, also the run's cgroup memory.max and RLIMIT_DATA */
    sb_shim_jail_t *jail;    /* sb_shim_jail_new(), made once at start-up; NULL or a jail that is off: none */
} sb_shim_deno_t;

/**
 * The embedded guest runtime as a data: URL ("data:application/javascript;base64,...").
 * @return a new string owned by the caller (free), or NULL when out of memory
 */
char *sb_shim_runtime_url(void);

/** called once the guest has been started, before the relay runs */
typedef void (*sb_shim_on_spawned_cb)(void *arg, const sb_shim_child_t *child);

/**
 * Runs one guest: a fresh private work directory whose `home` (HOME, DENO_DIR,
 * TMPDIR) belongs to the guest's uid, `deno run` with no permissions inside
 * the jail (jail.h; `d->jail`), the relay until the guest is gone, then the
 * directory is removed and the jail's uid and cgroup given back. The child
 * wipes its copy of `cfg->token` before anything else. A spawn that fails
 * because the jail could not be set up is counted (sb_shim_hook_jail_failure).
 * @param init the whole init frame (header included)
 * @param on_spawned may be NULL
 * @param outcome receives the relay's outcome (new reference) on SB_OK
 * @param err on SB_E_EXECUTION, what could not be set up: "failed to create sandbox work root[: <why>]"
 *        or "failed to spawn sandbox subprocess: <why>" (a jail refusal: "<...>: jail: ...")
 * @return SB_OK, SB_E_EXECUTION (no guest ran) or SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_shim_deno_run(const sb_shim_deno_t *d, const sb_shim_config_t *cfg, const uint8_t *init,
                                            size_t init_len, sb_shim_on_spawned_cb on_spawned, void *arg, json_t **outcome,
                                            char *err, size_t errsz);

/**
 * Finds an executable the way execvp would (a name with a '/' is taken as it is).
 * @return a new string owned by the caller, or NULL when none is found
 */
char *sb_shim_find_exe(const char *name);

#endif
