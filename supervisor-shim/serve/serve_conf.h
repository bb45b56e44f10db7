/*
 * sandbox-shim serve: its configuration (flags, environment, secret files), checked once at
 * start-up the way every run will meet it: the broker URLs resolved, the jail built and probed,
 * and Deno started once as a guest. serve.c keeps the result for the life of the service; SIGHUP
 * re-reads the secret files alone (sb_serve_read_secret).
 */
#ifndef SB_SERVE_CONF_H
#define SB_SERVE_CONF_H

#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include "serve/serve_int.h"
#include "serve/launcher.h"

#define SB_SERVE_EXIT_USAGE 2
/* the host admission secret and the net-mint secret: at most this long; admission at least 32 bytes */
#define SB_SERVE_MAX_SECRET 1024u
#define SB_SERVE_MIN_ADMISSION_SECRET 32u
/* how long the start-up check waits for `deno --version` as a guest, and /health's (which holds the loop) */
#define SB_SERVE_DENO_CHECK_START_MS 20000
#define SB_SERVE_DENO_CHECK_HEALTH_MS 2000

/** what the flags and the environment said, checked */
typedef struct st_sb_serve_settings_t {
    sb_serve_conf_t conf; /* what every run's process gets */
    char deno_version[64];
    unsigned max_runs, max_connections;
    struct sockaddr_storage listen_addr;
    socklen_t listen_len;
    sb_serve_pool_conf_t pool;
    const char *log_path;             /* --log-file, or NULL: stderr as it was given */
    const char *adm_file, *mint_file; /* the secret files, re-read on SIGHUP */
} sb_serve_settings_t;

/**
 * Parses serve's flags and environment into `set` and checks them as start-up does. The
 * admission secret goes to `admission` (the caller hashes and wipes it), scrubbed from the
 * environment when it came from there.
 * @return 0; -1 after --help; or SB_SERVE_EXIT_USAGE with the reason written to stderr
 */
int sb_serve_configure(int argc, char **argv, sb_serve_settings_t *set, char *admission, size_t admsz, int *check_only);
/** writes "sandbox-shim serve: " and the message to stderr; @return SB_SERVE_EXIT_USAGE */
int sb_serve_fail_usage(const char *fmt, const char *arg);
/**
 * A secret from a file, or from the environment (then scrubbed from it, as the token is in `run`).
 * Messages name where it came from and never carry it.
 * @return 0 (out is "" when neither gave one), or -1 with `err` set
 */
int sb_serve_read_secret(const char *file, const char *env, char *out, size_t outsz, const char *what, char *err, size_t errsz);
/** the admission secret's own rule, with the name of where it came from; @return 0 or -1 with `err` */
int sb_serve_check_admission(const char *secret, const char *file, char *err, size_t errsz);
/**
 * Deno as a guest meets it: `deno --version` started through the spawn path every guest takes
 * (child.c with the service's jail: the guests' uid, their view of the files, their limits), so
 * that a binary the guests cannot reach, a jail the kernel refuses, or no free guest uid shows here
 * rather than in a failed run. At start-up (and --check-config) and behind /health.
 * @return 0 with the version; -1 with `err` saying what is wrong: "spawn: <why>" when no guest
 *         started (child.c's reason: "jail: ..." or "cannot execute ..."), else what Deno answered
 */
int sb_serve_deno_version(const sb_serve_conf_t *conf, char *version, size_t vsz, int64_t limit_ms, char *err, size_t errsz);
/** --log-file: the path opened for appending onto descriptor 2, where every line goes */
int sb_serve_log_open(const char *path, char *err, size_t errsz);

#endif
