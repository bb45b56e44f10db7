/*
 * sandbox-shim: the relay's state, shared by the relay loop (relay.c) and its module path
 * (module_server.c). Private to relay/.
 */
#ifndef SB_SHIM_RELAY_INT_H
#define SB_SHIM_RELAY_INT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <msgpack.h>
#include <openssl/ssl.h>
#include "sb/buf.h"
#include "sb/limits.h"
#include "relay/frames.h"
#include "relay/http.h"
#include "relay/modules.h"
#include "relay/relay.h"

/* the module path (modules.h): Deno's module requests at once, how long one may take to send its head, and the
 * modules a redirect answered ahead of Deno's request for them (each at most the broker's module cap) */
#define MODULE_CONNS 8u
#define MODULE_HEAD_MS 5000
#define MODULE_CACHE 8u
/* after an accept that failed for want of descriptors or memory */
#define MODULE_ACCEPT_REST_MS 100

typedef enum en_conn_state_t { CONN_CLOSED = 0, CONN_CONNECTING, CONN_HANDSHAKE, CONN_ACTIVE, CONN_IDLE } conn_state_t;
typedef enum en_call_state_t { CALL_FREE = 0, CALL_HTTP, CALL_REPLYING } call_state_t;
typedef enum en_mconn_state_t { MC_FREE = 0, MC_READING, MC_WAITING, MC_FETCHING, MC_WRITING } mconn_state_t;

struct st_call_t;

/* one of Deno's module requests, on a connection it made to a listener of the module path */
typedef struct st_mconn_t {
    mconn_state_t state;
    int fd;
    unsigned origin; /* the listener's index: the origin in cfg->imports */
    uint8_t head[SB_SHIM_MODULE_MAX_HEAD];
    size_t head_len;
    char url[SB_SHIM_MAX_ORIGIN + SB_SHIM_MODULE_MAX_TARGET + 1];
    sb_buf_t out; /* the answer */
    size_t out_off;
    int64_t deadline; /* for its head (MC_READING) and its answer to be written (MC_WRITING) */
} mconn_t;

/* a module fetched ahead: the broker followed a redirect, Deno asks for the final URL next */
typedef struct st_module_ahead_t {
    char *url, *type;
    uint8_t *body;
    size_t len;
} module_ahead_t;

typedef struct st_conn_t {
    int fd;
    conn_state_t state;
    int reused;     /* a previous exchange completed on this connection */
    sb_buf_t out;   /* the request */
    size_t out_off; /* bytes of it written */
    sb_buf_t in;    /* the response so far */
    int head_done;
    sb_shim_http_head_t head;
    struct st_call_t *call;
    SSL *ssl;       /* https only: set up once TCP connects, verified before any request byte */
    short ssl_want; /* the poll event an SSL operation waits for (0: none pending) */
    int tls_clean;  /* no TLS error so far: an idle connection may say close_notify */
} conn_t;

typedef struct st_call_t {
    call_state_t state;
    uint64_t id;
    char method[SB_MAX_METHOD_LEN + 1];
    int64_t deadline;
    int retried; /* resent once after a stale kept-alive connection */
    conn_t *conn;
    mconn_t *module;       /* an import.fetch for this module request (no guest call: no id, no reply frame) */
    msgpack_sbuffer reply; /* the reply frame, header included */
    size_t reply_off;
    struct st_call_t *next_out;
} call_t;

typedef struct st_relay_t {
    const sb_shim_config_t *cfg;
    sb_shim_child_t *child;
    int64_t start, deadline;

    /* guest -> shim */
    sb_frame_reader_t reader;
    uint8_t *rbuf;
    size_t roff, rlen;
    int out_eof;
    int stop_reading;

    /* shim -> guest */
    const uint8_t *init;
    size_t init_len, init_off;
    call_t *outq_head, *outq_tail;

    /* calls and connections */
    call_t *calls;
    conn_t *conns;
    unsigned active; /* slots not CALL_FREE */
    unsigned ncalls; /* calls accepted */

    /* the module path */
    mconn_t *mconns;
    module_ahead_t ahead[MODULE_CACHE];
    unsigned modules;          /* import.fetch calls made */
    int64_t listen_rest_until; /* the listeners are not polled before (module_accept) */

    /* stderr */
    sb_buf_t err;
    int err_eof;

    /* lifecycle */
    int reaped;
    int wstatus;
    int64_t kill_at; /* SIGKILL the group at this time (0: not scheduled) */
    int sent_term;
    int64_t drain_until; /* after reaping, read stdout until EOF or this time */

    /* outcome */
    int cancelled; /* cancel_fd or stop_fd hung up: the run was abandoned */
    int failed;
    int denied; /* the run's error is the broker's denial of a call (cfg->mark_denial) */
    char error[2048];
    char detail[1024];        /* what the operator sees of a failed binding call (never the guest): "" for none */
    char module_detail[1024]; /* the first module that did not load, and why (never the guest): "" for none */
    int timed_out;
    int have_result;
    int result_ok;
    json_t *output;
    json_t *result_error;
    json_t *logs;
} relay_t;

static inline int64_t sb_shim_relay__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void sb_shim_relay__pack_cstr(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    (void)msgpack_pack_str(pk, n);
    (void)msgpack_pack_str_body(pk, s, n);
}

/* relay.c */
/** gives a call's slot back (its connection closed, its module request answered by the connection's close) */
void sb_shim_relay__call_free(relay_t *r, call_t *c);
/** a free call slot and a connection for it (a kept-alive one first); 0 when either is taken */
int sb_shim_relay__free_slot(relay_t *r, call_t **c, conn_t **cn);
/** sends the call's request on the connection (kept alive, or a new one) */
void sb_shim_relay__conn_start(relay_t *r, conn_t *cn, call_t *c);

/* module_server.c */
void sb_shim_relay__mconn_close(mconn_t *mc);
void sb_shim_relay__ahead_free(module_ahead_t *a);
/** writes what is left of the answer; closes the connection once it is written or failed */
void sb_shim_relay__module_write(mconn_t *mc);
/** reads Deno's request head; a whole one is answered from ahead or waits for a call slot */
void sb_shim_relay__module_readable(relay_t *r, mconn_t *mc);
/** starts the broker fetches of the requests waiting for a call slot */
void sb_shim_relay__module_pump(relay_t *r);
/** takes a new connection on listener `origin` while a module slot is free */
void sb_shim_relay__module_accept(relay_t *r, unsigned origin, int lfd);
/** import.fetch answered: Deno gets the module, or a redirect into the module path */
void sb_shim_relay__module_value(relay_t *r, call_t *c, const msgpack_object *value);
/** import.fetch failed: Deno gets a 4xx, the operator the broker's reason */
void sb_shim_relay__module_failed(relay_t *r, call_t *c, const char *code, const char *detail);

#endif
