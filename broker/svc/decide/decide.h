/*
 * broker/svc/decide: the decider, a host's own judge in front of chosen calls
 * (PROTOCOL.md section 5a).
 *
 * A run's manifest may name calls in capabilities.decide (authz.h,
 * sb_authz_needs_decision). Such a call, once the manifest granted it, is
 * described to the decider (an HTTP(S) endpoint in the broker's configuration,
 * key "decider") as one compact JSON object, and runs only when the decider
 * answers allow. Everything else (deny, an error, a malformed answer, no answer
 * before the deadline, no decider configured) refuses the call: fail closed.
 *
 * The exchange runs on the worker's loop through the broker's pinned HTTP/1.1
 * client (fetch/client.h): a fresh connection per decision, to the configured
 * address only (an IP literal or localhost: nothing is resolved), TLS verified
 * against ca_file and tls_name. The wait is the smallest of the configured
 * timeout and the run's remaining lifetime. The decisions waiting in the
 * whole process are bounded (max_pending); past that a call is refused with
 * rate_limited before anything is sent. With reuse_ms, an answer (allow or
 * deny, never a failure) is reused for an identical call of the same run on
 * the same worker for that long.
 *
 * Loop affinity: a context lives on one worker loop; everything but the
 * configuration (immutable, shared) runs there.
 */
#ifndef SB_DECIDE_H
#define SB_DECIDE_H

#include <stddef.h>
#include <stdint.h>
#include <h2o.h>
#include <jansson.h>
#include "sb/buf.h"
#include "sb/limits.h"
#include "sb/status.h"
#include "call/call.h"
#include "store/store.h"

/* the version of the request and answer schema (PROTOCOL.md section 5a) */
#define SB_DECIDE_VERSION 1

typedef struct st_sb_decide_conf_t sb_decide_conf_t;
typedef struct st_sb_decide_ctx_t sb_decide_ctx_t;

typedef enum en_sb_decide_outcome_t {
    SB_DECIDE_ALLOW = 0,
    SB_DECIDE_DENY,     /* the decider said deny (reason: its own, possibly empty) */
    SB_DECIDE_FAIL,     /* no usable answer: the call is refused, reason says why */
    SB_DECIDE_OVERLOAD, /* too many decisions pending in this instance: rate_limited, nothing was sent */
    SB_DECIDE_OUTCOME_COUNT_
} sb_decide_outcome_t;

/** a decision; `reason` is NUL-terminated and valid during the callback (or until the next start) only */
typedef struct st_sb_decision_t {
    sb_decide_outcome_t outcome;
    const char *reason; /* DENY: the decider's reason ("" when none); FAIL: what went wrong; else "" */
    int reused;         /* an earlier answer for an identical call (reuse_ms) */
    uint64_t us;        /* how long the decision took */
} sb_decision_t;

/** the outcome's name in logs, audit and metrics: allow, deny, fail, overload */
const char *sb_decide_outcome_name(sb_decide_outcome_t o);

/* ---- configuration ---- */

/**
 * Validates the "decider" object and builds the configuration (the secret
 * file is read now, the TLS context created now). Keys: url (required),
 * tls_name, ca_file, secret_file, timeout_ms, max_pending, reuse_ms
 * (docs/config.md).
 * @param v the object, or NULL / an empty object for no decider (*out NULL)
 * @param err receives the first problem, naming the key
 * @return SB_OK or SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_decide_conf_create(const json_t *v, sb_decide_conf_t **out, char *err, size_t errsz);
/** frees the configuration (NULL is fine); the secret is wiped first */
void sb_decide_conf_free(sb_decide_conf_t *c);

/* ---- the per-worker context ---- */

/** creates the worker's context on `loop` */
sb_decide_ctx_t *sb_decide_ctx_create(h2o_loop_t *loop);
/**
 * Destroys the context: every decision still waiting completes with
 * SB_DECIDE_FAIL ("the broker is shutting down") before this returns.
 */
void sb_decide_ctx_destroy(sb_decide_ctx_t *ctx);

/** called exactly once, on the loop, unless the request is cancelled first */
typedef void (*sb_decide_cb)(void *arg, const sb_decision_t *d);

/**
 * Asks for a decision on a granted call. One log line per decision and the
 * metrics are written here, whichever way it ends.
 * @param conf the configuration in force (NULL: no decider, the call fails closed at once)
 * @param tok the run (its id goes into the description; its expiry caps the wait)
 * @param call the decoded call (its cid names the decision), valid until the callback has run
 * @param now_ms the wall clock, for the run's remaining time
 * @param d filled when decided at once (a reused answer, no decider, the pending bound, a call that cannot be
 *          described, no time left, a connect that failed at once)
 * @return 1 when *d holds the decision now (the callback will not run); 0 when pending (the callback runs
 *         later, exactly once, from the loop)
 */
int sb_decide_start(sb_decide_ctx_t *ctx, const sb_decide_conf_t *conf, const sb_token_t *tok, const sb_call_t *call,
                    int64_t now_ms, sb_decide_cb cb, void *arg, sb_decision_t *d);

/** decisions waiting in the whole process (the pending gauge) */
size_t sb_decide_pending(void);

/* ---- the wire (answer.c; no loop, no sockets: the fuzz harness drives these) ---- */

/**
 * Writes the description of a call (the request body, PROTOCOL.md section
 * 5a): {"v":1,"id","runId","target","method","deadlineMs","args":{...}}.
 * Never a header value, a body, a secret or a token. When the arguments that
 * matter (a where, a tool's arguments) do not fit the cap, or JSON cannot
 * carry them, they are left out and "omitted" lists their names.
 * @param out a buffer whose cap is SB_MAX_DECIDE_REQUEST
 * @param partial if not NULL, 1 when arguments were left out ("omitted" is written), else 0
 * @return SB_OK, SB_E_TOO_LARGE (even the short form does not fit) or SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_decide_describe(sb_buf_t *out, const char *cid, const char *run_id, const char *target,
                                              const sb_call_t *call, uint64_t deadline_ms, int *partial);

/** a parsed answer */
typedef struct st_sb_decide_answer_t {
    int allow;
    char reason[SB_MAX_DECIDE_REASON + 1]; /* "" when none */
} sb_decide_answer_t;

/**
 * Parses the decider's answer body: exactly {"v":1,"decision":"allow"|"deny",
 * "reason"?:string}, at most SB_MAX_DECIDE_ANSWER bytes, strict JSON (UTF-8,
 * unique keys), the reason at most SB_MAX_DECIDE_REASON bytes without control
 * characters. Anything else is malformed.
 * @param why receives a static description when malformed
 * @return SB_OK or SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_decide_parse_answer(const char *body, size_t len, sb_decide_answer_t *out, const char **why);

#endif
