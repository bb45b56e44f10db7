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
#include "relay/modules.h"

/* descriptors the guest may hold (Deno needs a few dozen for its runtime threads) */
#define SB_SHIM_GUEST_NOFILE 64u

typedef struct st_sb_shim_deno_t {
    const char *exe;         /* the Deno binary, found before (find_exe) */
    const char *runtime_url; /* sb_shim_runtime_url() */
    unsigned long memory_mb; /* V8 old-space cap; jailed, also the run's cgroup memory.max and RLIMIT_DATA */
    unsigned timeout_ms;     /* jailed: the base of RLIMIT_CPU (jail.h); sb_shim_deno_run takes the run's */
    sb_shim_jail_t *jail;    /* sb_shim_jail_new(), made once at start-up; NULL or a jail that is off: none */
    /* the run's import origins (relay/modules.h): NULL or none, no module is ever fetched (--no-remote); else Deno
     * imports them from the module path's listeners in its network namespace, which needs the jail */
    const sb_shim_imports_t *imports;
} sb_shim_deno_t;

/**
 * The embedded guest runtime as a data: URL ("data:application/javascript;base64,...").
 * @return a new string owned by the caller (free), or NULL when out of memory
 */
char *sb_shim_runtime_url(void);

/** a started guest, waiting for its init frame (sb_shim_deno_start) */
typedef struct st_sb_shim_guest_t {
    sb_shim_child_t child;
    char workdir[256]; /* its private work directory ("" once removed) */
    char home[270];
    int started;
    int reaped; /* the relay reaped it */
} sb_shim_guest_t;

/**
 * Starts a guest: `deno run` with no permissions inside the jail (jail.h;
 * `d->jail`), its HOME, DENO_DIR and TMPDIR in the scratch of its own root
 * (with --jail=off: a fresh private directory under TMPDIR, removed after). The runtime prepares itself (guest/runtime.js,
 * prepare()) and waits for its init frame, so a guest may be started before
 * its run is known (serve's pool). The child wipes its copy of `scrub` (a run
 * token, or NULL) before anything else. A spawn that fails because the jail
 * could not be set up is counted (sb_shim_hook_jail_failure).
 * @param err on SB_E_EXECUTION, what could not be set up: "failed to create sandbox work root[: <why>]"
 *        or "failed to spawn sandbox subprocess: <why>" (a jail refusal: "<...>: jail: ...")
 * @return SB_OK, or SB_E_EXECUTION (no guest runs; nothing is left behind)
 */
SB_WARN_UNUSED sb_status_t sb_shim_deno_start(const sb_shim_deno_t *d, void *scrub, size_t scrub_len, sb_shim_guest_t *g, char *err,
                                              size_t errsz);

/**
 * Hands a started guest its run: the init frame, then the relay until the guest
 * is gone (the run's timeout counts from here). Call sb_shim_deno_release after
 * (serve answers first: the guest is already reaped).
 * @param outcome receives the relay's outcome (new reference) on SB_OK
 * @return SB_OK or SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_shim_deno_relay(sb_shim_guest_t *g, const sb_shim_config_t *cfg, const uint8_t *init, size_t init_len,
                                              json_t **outcome);

/** after sb_shim_deno_relay: the guest's directory is removed, the jail's uid and cgroup given back */
void sb_shim_deno_release(sb_shim_guest_t *g);

/** kills a started guest that gets no run (or gets no more of it), and releases what it holds */
void sb_shim_deno_discard(sb_shim_guest_t *g);

/** called once the guest has been started, before the relay runs */
typedef void (*sb_shim_on_spawned_cb)(void *arg, const sb_shim_child_t *child);

/**
 * Runs one guest, cold: sb_shim_deno_start (wiping the child's copy of
 * `cfg->token`), then sb_shim_deno_relay.
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
