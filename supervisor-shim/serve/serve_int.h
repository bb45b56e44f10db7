/*
 * sandbox-shim serve: what the service (serve.c) and the process of one run
 * (serve_run.c) share.
 *
 * Each run gets a process of its own, forked from the service: it starts the
 * guest through runner.c (the path `run` takes), relays its calls (relay.c),
 * and reports back over a socketpair in records of
 *   [kind: 1 byte][length: 4 bytes big-endian][payload]
 *   'G' the guest started; payload: its pid (4 bytes big-endian), also its process group
 *   'X' the guest is gone (reaped)
 *   'R' the run's end; payload: one line of JSON metadata, '\n', the HTTP answer body
 * The service answers the request with the body, counts the run and logs it.
 */
#ifndef SB_SERVE_INT_H
#define SB_SERVE_INT_H

#include <stdint.h>
#include <sys/socket.h>
#include <jansson.h>
#include <msgpack.h>
#include "serve/netmint.h"
#include "relay/relay.h"
#include "guest/runner.h"
#include "relay/modules.h"
#include "serve/serve_req.h"
#include "relay/url.h"

#define SB_SERVE_REC_GUEST 'G'
#define SB_SERVE_REC_GONE 'X'
#define SB_SERVE_REC_RESULT 'R'
/* an answer body is at most 2 MiB (upstream's adapter reads no more); the record adds its metadata */
#define SB_SERVE_MAX_ANSWER (2u * 1024u * 1024u)
#define SB_SERVE_MAX_RECORD (SB_SERVE_MAX_ANSWER + 4096u)
/* per broker call, as upstream */
#define SB_SERVE_CALL_TIMEOUT_MS 10000

/*
 * How a POST /run ended: the "outcome" of its log line and the label of
 * sb_serve_runs_total. This is the one list; supervisor-shim/README.md, "Run
 * outcomes", says what each means, in this order.
 *   ok              the guest ran and returned
 *   failed          the guest ran and failed: it threw, exited without a result, broke the frame
 *                   protocol, overran an output cap, or a binding call failed (not a denial)
 *   call_denied     the broker denied one of the guest's binding calls (forbidden, unauthorized):
 *                   the run ended there
 *   timeout         the guest overran timeoutMs
 *   cancelled       the client went away; the run was abandoned
 *   rejected        the bindings were refused before any process (URL, token)
 *   egress_blocked  imports, or net without the net-mint credential (or a refused mint)
 *   spawn_failed    no guest started: Deno could not be started, or its jail not set up
 *   busy            --max-runs runs were going: 503, no process
 *   denied          the request was not admitted (mode or admission secret): 403
 *   invalid         the request was malformed (JSON, schema, body cap): 400 or 413
 *   error           the run's process died or overran its deadline: "sandbox IO error"
 */
#define SB_SERVE_OUTCOMES(X)                                                                                                       \
    X(OK, "ok")                                                                                                                    \
    X(FAILED, "failed")                                                                                                            \
    X(CALL_DENIED, "call_denied")                                                                                                  \
    X(TIMEOUT, "timeout")                                                                                                          \
    X(CANCELLED, "cancelled")                                                                                                      \
    X(REJECTED, "rejected")                                                                                                        \
    X(EGRESS_BLOCKED, "egress_blocked")                                                                                            \
    X(SPAWN_FAILED, "spawn_failed")                                                                                                \
    X(BUSY, "busy")                                                                                                                \
    X(DENIED, "denied")                                                                                                            \
    X(INVALID, "invalid")                                                                                                          \
    X(ERROR, "error")

#define SB_SERVE_OUTCOME_ENUM(id, name) SB_SERVE_OUT_##id,
typedef enum en_sb_serve_outcome_t { SB_SERVE_OUTCOMES(SB_SERVE_OUTCOME_ENUM) SB_SERVE_OUT_COUNT } sb_serve_outcome_t;
#undef SB_SERVE_OUTCOME_ENUM

/** @return the outcome's name, as logged and as the metric's label */
const char *sb_serve_outcome_name(sb_serve_outcome_t o);

/** @return the outcome of that name; SB_SERVE_OUT_ERROR for any other name */
sb_serve_outcome_t sb_serve_outcome_parse(const char *name);

typedef struct st_sb_serve_conf_t {
    int have_broker;                     /* SANDBOX_BROKER_URL was given */
    sb_shim_url_t broker;                /* normalised */
    struct sockaddr_storage broker_addr; /* resolved once at start */
    socklen_t broker_addr_len;
    SSL_CTX *tls;     /* https brokers */
    int have_netmint; /* the admin URL and the net-mint secret were given */
    sb_shim_netmint_t netmint;
    sb_shim_deno_t deno;
} sb_serve_conf_t;

typedef enum en_sb_serve_kind_t {
    SB_SERVE_COMPUTE = 0, /* no bindings, no net: no broker at all */
    SB_SERVE_BINDINGS,    /* the host's bindings: its broker URL and token */
    SB_SERVE_NET          /* no bindings, net or import: a token minted for the run (netmint.h) */
} sb_serve_kind_t;

/** what one run's process needs; built by the service before the fork */
typedef struct st_sb_serve_job_t {
    const sb_serve_conf_t *conf;
    sb_serve_kind_t kind;
    msgpack_sbuffer init; /* the init frame */
    int64_t timeout_ms;
    unsigned memory_mb;
    char token[SB_SHIM_MAX_TOKEN + 1]; /* SB_SERVE_BINDINGS */
    json_t *net;                       /* SB_SERVE_NET: capabilities.net (a reference) */
    json_t *imports;                   /* capabilities.import when not empty (a reference), else NULL: for the mint */
    sb_shim_imports_t origins;         /* the same as origins, parsed once by the service (relay/modules.h) */
    /* SB_SERVE_NET: the net-mint credential as the service holds it now (a reload changes it); the
     * launcher keeps no copy, so the run gets it with its job */
    char netmint_secret[SB_SHIM_NETMINT_MAX_SECRET + 1];
    int64_t started_ms; /* CLOCK_MONOTONIC, when the request was taken */
} sb_serve_job_t;

/* the run process's fixed descriptors (launcher.c arranges them; serve_run.c uses them) */
#define SB_SERVE_REPORT_FD 3  /* the report socket */
#define SB_SERVE_CANCEL_FD 4  /* the client's connection (closed when there is none) */
#define SB_SERVE_JAIL_FD 5    /* the jail's cgroup directory, when it has one (sb_shim_jail_move_fd) */
#define SB_SERVE_CONTROL_FD 6 /* the launcher's control pair (the launcher), or a pooled process's own (until its run) */

/**
 * The run's process: does the run and reports it on SB_SERVE_REPORT_FD, then exits.
 * @param pre a guest started before the run (the pool), or NULL to start one now
 */
__attribute__((noreturn)) void sb_serve_run_main(const sb_serve_job_t *job, sb_shim_guest_t *pre);

/** CLOCK_MONOTONIC in milliseconds */
int64_t sb_serve_now_ms(void);

#endif
