/*
 * sandbox-shim: the relay loop.
 *
 * One thread, one poll() loop: guest frames in on the child's stdout (decoded
 * by frames.h), broker calls out over kept-alive HTTP/1.1 connections (TLS
 * for an https broker, tls.h), replies back on the child's
 * stdin in completion order (proto/PROTOCOL.md section 2). The loop ends when the guest has been
 * reaped; it then hands back the run's outcome as the JSON object the shim
 * prints.
 */
#ifndef SB_SHIM_RELAY_H
#define SB_SHIM_RELAY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <jansson.h>
#include "sb/status.h"
#include "jail/child.h"
#include "relay/tls.h"
#include "relay/url.h"

/* defaults (README.md, "Flags") */
#define SB_SHIM_DEFAULT_TIMEOUT_MS 30000
#define SB_SHIM_DEFAULT_CALL_TIMEOUT_MS 10000
#define SB_SHIM_DEFAULT_MAX_CALLS 256u
#define SB_SHIM_DEFAULT_MAX_INFLIGHT 16u
#define SB_SHIM_MAX_INFLIGHT_LIMIT 256u
/* the guest's stderr we keep (the rest is read and dropped) */
#define SB_SHIM_MAX_STDERR (256u * 1024u)
/* a guest that received SIGTERM gets this long before SIGKILL */
#define SB_SHIM_KILL_GRACE_MS 250
/* after a valid result, the guest gets this long to exit by itself */
#define SB_SHIM_EXIT_GRACE_MS 1000
/* the longest token the relay sends (run and relay take 64 hex; serve takes what upstream does) */
#define SB_SHIM_MAX_TOKEN 8192u

typedef struct st_sb_shim_config_t {
    sb_shim_url_t url;
    struct sockaddr_storage addr; /* the broker, resolved once before the guest starts */
    socklen_t addr_len;
    SSL_CTX *tls;                      /* https brokers: the verifying client context (tls.h); NULL for http */
    char token[SB_SHIM_MAX_TOKEN + 1]; /* visible ASCII; never logged, never given to the guest */
    int64_t timeout_ms;                /* wall clock for the whole run */
    int64_t call_timeout_ms;           /* per broker call */
    unsigned max_calls;
    unsigned max_inflight;
    int denial_reply; /* 1: hand broker errors to the guest; 0: end the run */
    /*
     * serve: a descriptor that becomes readable-hung-up when the run is cancelled
     * (the client's socket); -1 for none. On cancellation the guest's group is
     * SIGKILLed at once, every broker exchange in flight is dropped, and the run
     * ends with "sandbox request cancelled".
     */
    int cancel_fd;
    /* serve: a second such descriptor (a pipe whose write end the run's process closes when its
     * service asks it to end the run); -1 for none */
    int stop_fd;
    /* non-NULL: the run has no broker, and any call ends it with this error */
    const char *calls_refused;
    /* 1: stderr beyond SB_SHIM_MAX_STDERR ends the run ("sandbox output limit exceeded"); 0: it is dropped */
    int stderr_cap_fails;
    /* 1 (serve): one call beyond max_calls ends the run with upstream's "sandbox output limit exceeded"
     * (the count in `detail`); 0: "binding call limit exceeded (--max-calls N)" */
    int upstream_call_limit;
    /*
     * 1 (serve): a run that the broker's denial of a call ended (forbidden or unauthorized, with
     * denial_reply 0) has "denied":true in its outcome, for the caller to count and take out
     */
    int mark_denial;
    /* the run's import origins (modules.h), NULL for none: the relay answers Deno's module requests on the child's
     * listeners (sb_shim_child_t.listen_fds, origin i on listener i) by import.fetch calls to the broker */
    const struct st_sb_shim_imports_t *imports;
} sb_shim_config_t;

/**
 * Runs the relay until the guest is gone.
 * @param init the whole init frame (header included) written to the guest first
 * @param out receives the outcome object {ok, output?, error?, logs, timedOut?, ms, calls, denied?, detail?} (new
 *        reference); a run a failed binding call ended has upstream's fixed text for its code as `error` and the
 *        method, code, broker reason and correlation id in `detail` (for the operator, never the guest);
 *        a cancelled run (cancel_fd, stop_fd) has error "sandbox request cancelled"
 * @return SB_OK, or SB_E_NOMEM when the outcome could not be built
 */
SB_WARN_UNUSED sb_status_t sb_shim_relay_run(const sb_shim_config_t *cfg, sb_shim_child_t *child, const uint8_t *init,
                                             size_t init_len, json_t **out);

#endif
