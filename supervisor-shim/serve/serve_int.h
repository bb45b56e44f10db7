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
    SB_SERVE_NET          /* no bindings, net: a token minted for the run (netmint.h) */
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
    int64_t started_ms;                /* CLOCK_MONOTONIC, when the request was taken */
} sb_serve_job_t;

/**
 * The run's process: does the run and reports it on `report_fd`, then exits.
 * @param cancel_fd the client's connection (hang-up cancels the run), or -1
 */
__attribute__((noreturn)) void sb_serve_run_main(const sb_serve_job_t *job, int report_fd, int cancel_fd);

/** CLOCK_MONOTONIC in milliseconds */
int64_t sb_serve_now_ms(void);

#endif
