/*
 * POST <rpc_path>: the RPC route (PROTOCOL.md, "HTTP RPC").
 *
 * Validation follows the upstream route step by step, so an upstream
 * supervisor sees the same codes and statuses: size, body, shape, method,
 * per-method size, then the token, the method grammar, the capability check
 * (on every call), and dispatch. The body is JSON unless Content-Type is
 * application/msgpack, and the reply uses the request's encoding.
 */
#include <stdio.h>
#include <string.h>
#include "http/framing.h"
#include "http/async.h"
#include "http/reply.h"
#include "http/reqid.h"
#include "http/routes.h"
#include "http/worker.h"
#include "obs/audit.h"
#include "obs/log.h"
#include "obs/metrics.h"
#include "sb/limits.h"
#include "sb/method.h"
#include "sb/value.h"
#include "call/call.h"
#include "svc/dispatch.h"
#include "svc/decide/decide.h"
#include "util/util.h"

typedef struct st_rpc_call_t {
    sb_async_t super;
    int binary;        /* msgpack in and out */
    msgpack_zone zone; /* the decoded body, the typed call and the reply value */
    msgpack_object root;
    const msgpack_object *args;
    const char *method;
    size_t method_len;
    int kind; /* sb_method_kind_t, or SB_MK_COUNT_ while unknown */
    sb_method_t m;
    int method_parsed; /* m holds the method, parsed once for its request cap (step 5) */
    sb_call_t call;    /* the typed call: decoded once, checked, dispatched */
    uint8_t hash[32];
    char tokref[13];
    char run_id[SB_MAX_RUN_ID + 1];
    char cid[37];
    char request_id[SB_MAX_REQUEST_ID + 1]; /* the proxy's X-Request-Id (reqid.h), or "" */
    uint64_t started_us;
    uint64_t elapsed_us; /* read once when the answer is decided: the metric and the log line say the same */
    sb_token_t *tok;     /* referenced from the token lookup on */
    int quota_held;      /* a concurrency slot to give back */
    int granted;         /* the capability check passed */
    /* a decide rule held the call (PROTOCOL.md section 5a): the decider's outcome, for the log and the audit line */
    int decided;
    sb_decide_outcome_t decision;
    int decision_reused;
    uint64_t decision_us;
} rpc_call_t;

/*
 * The supervisor's module path (PROTOCOL.md section 6c): exactly one
 * x-sandbox-module-fetch header of value "1". A supervisor relays a guest's
 * call as {method, args} under headers of its own, so a guest cannot send it:
 * an import grant lets the supervisor load modules, never lets the guest's
 * own calls fetch from import hosts.
 */
static int module_path(h2o_req_t *req)
{
    ssize_t i = h2o_find_header_by_str(&req->headers, H2O_STRLIT("x-sandbox-module-fetch"), -1);
    return i >= 0 && h2o_find_header_by_str(&req->headers, H2O_STRLIT("x-sandbox-module-fetch"), i) < 0 &&
           h2o_memis(req->headers.entries[i].value.base, req->headers.entries[i].value.len, H2O_STRLIT("1"));
}

static void call_dispose(sb_async_t *a)
{
    rpc_call_t *c = (rpc_call_t *)a;
    if (c->quota_held)
        sb_store_quota_release(c->super.worker->store, c->tok);
    if (c->tok != NULL)
        sb_token_release(c->tok);
}

/*
 * Calls this worker answered, kept for its next ones with their zone's
 * first chunk: a call costs no malloc of its own in a steady state (two
 * allocations and two frees per call before). Loop-local, like the calls.
 */
#define CALL_CACHE 32
static __thread rpc_call_t *call_cache[CALL_CACHE];
static __thread size_t ncall_cache;

static rpc_call_t *call_new(void)
{
    rpc_call_t *c;

    if (ncall_cache == 0) {
        c = sb_mem_calloc(1, sizeof(*c));
        if (!msgpack_zone_init(&c->zone, 2048))
            sb_fatal(__FILE__, __LINE__, "out of memory for a call's zone");
        return c;
    }
    c = call_cache[--ncall_cache];
    {
        msgpack_zone zone = c->zone; /* emptied when the call was put back; no pointer into the struct itself */
        memset(c, 0, sizeof(*c));
        c->zone = zone;
    }
    return c;
}

static void call_free(sb_async_t *a)
{
    rpc_call_t *c = (rpc_call_t *)a;

    if (ncall_cache < CALL_CACHE) {
        msgpack_zone_clear(&c->zone); /* frees every chunk but the first */
        call_cache[ncall_cache++] = c;
        return;
    }
    msgpack_zone_destroy(&c->zone);
    sb_mem_free(c);
}

/*
 * The worker's error body: built here and copied into the request's pool, so an error answer needs no
 * allocation of its own (the pool may still take a chunk). Emptied before each use (a reply nested in
 * another's send finds it free).
 */
static __thread sb_buf_t error_body;
static __thread int error_body_ready;

void sb_rpc_worker_done(void)
{
    if (error_body_ready) {
        sb_buf_free(&error_body);
        error_body_ready = 0;
    }
    while (ncall_cache > 0) {
        rpc_call_t *c = call_cache[--ncall_cache];
        msgpack_zone_destroy(&c->zone);
        sb_mem_free(c);
    }
}

/* the slot goes back as soon as the answer is decided, not when the connection lets go of the request */
static void release_quota(rpc_call_t *c)
{
    if (c->quota_held) {
        c->quota_held = 0;
        sb_store_quota_release(sb_current_worker->store, c->tok);
    }
}

static void describe_call(sb_logline_t *l, rpc_call_t *c, sb_status_t st, const char *message, size_t bytes_out)
{
    sb_log_cstr(l, "cid", c->cid);
    if (c->request_id[0] != '\0')
        sb_log_cstr(l, "requestId", c->request_id);
    if (c->run_id[0] != '\0')
        sb_log_cstr(l, "runId", c->run_id);
    if (c->tokref[0] != '\0')
        sb_log_cstr(l, "token", c->tokref);
    if (c->method != NULL)
        sb_log_str(l, "method", c->method, c->method_len);
    sb_log_cstr(l, "code", sb_status_code(st));
    sb_log_int(l, "status", sb_status_http(st));
    if (message != NULL && st != SB_OK)
        sb_log_cstr(l, "reason", message);
    sb_log_int(l, "us", (long long)c->elapsed_us);
    sb_log_int(l, "bytesIn", c->super.req != NULL ? (long long)c->super.req->entity.len : 0);
    sb_log_int(l, "bytesOut", (long long)bytes_out);
}

/* the secret names an http.fetch's placeholders used (grammar-checked names, never values), comma-separated */
static void audit_secrets(sb_logline_t *l, const sb_call_t *call)
{
    char names[SB_MAX_FETCH_PLACEHOLDERS * (SB_MAX_SECRET_NAME + 1)];
    size_t o = 0;

    if (call->fetch == NULL || call->fetch->nsecrets == 0)
        return;
    for (size_t i = 0; i < call->fetch->nsecrets; ++i) {
        if (i != 0)
            names[o++] = ',';
        memcpy(names + o, call->fetch->secrets[i].name, call->fetch->secrets[i].len);
        o += call->fetch->secrets[i].len;
    }
    sb_log_str(l, "secrets", names, o);
}

/* one log line (log_calls) and one audit line (audit sink) per call */
static void log_call(rpc_call_t *c, sb_status_t st, const char *message, size_t bytes_out)
{
    sb_logline_t l, al;
    size_t from = 0;
    int described = 0;
    if (sb_current_worker->server->conf->log_calls) {
        sb_log_begin(&l, st == SB_OK ? SB_LOG_INFO : SB_LOG_WARN, "rpc");
        from = l.len;
        describe_call(&l, c, st, message, bytes_out);
        described = l.enabled;
    }
    if (sb_audit_enabled() || (c->run_id[0] != '\0' && sb_store_timeline_enabled(sb_current_worker->store))) {
        sb_log_begin_always_as(&al, "audit", described ? &l : NULL); /* the rpc line's time, when there is one */
        /* the call's fields once: the rpc line's, copied (so both say the same "us"), else described here */
        if (!described || !sb_log_copy_fields(&al, &l, from))
            describe_call(&al, c, st, message, bytes_out);
        /* the capability decision; the outcome of a granted call is in code/status */
        sb_log_cstr(&al, "decision", c->granted ? "allow" : "deny");
        if (c->decided) {
            sb_log_cstr(&al, "decider", sb_decide_outcome_name(c->decision));
            if (c->decision_reused)
                sb_log_int(&al, "deciderReused", 1);
            sb_log_int(&al, "deciderUs", (long long)c->decision_us);
        }
        audit_secrets(&al, &c->call);
        /* the run's timeline (store.h): the same fields, kept with the token store, sent after the reply */
        if (c->run_id[0] != '\0' && sb_store_timeline_enabled(sb_current_worker->store))
            sb_store_timeline_from(&al, "call", sb_current_worker->store, c->run_id, c->tok != NULL ? c->tok->expires_at_ms : 0);
        if (sb_audit_enabled())
            sb_log_end_audit(&al);
    }
    if (sb_current_worker->server->conf->log_calls)
        sb_log_end(&l); /* after the copy: the end appends the line's closing bytes */
}

/* logs the call and sends `body`, whose storage goes to the request */
static void send_body(rpc_call_t *c, sb_status_t st, const char *message, sb_buf_t *body)
{
    log_call(c, st, message, body->len);
    sb_reply_send_buf(c->super.req, st, c->binary ? "application/msgpack" : "application/json", body);
}

/*
 * Answers an error. A redacted status (execution_error) never carries its
 * detail to the guest: the wire gets the stable upstream message plus a
 * correlation id that finds the detail in the log (PROTOCOL.md section 7).
 */
static void reply_error(rpc_call_t *c, sb_status_t st, const char *message)
{
    sb_buf_t *body = &error_body;
    const char *ctype = c->binary ? "application/msgpack" : "application/json";

    st = sb_status_on_wire(st);
    release_quota(c);
    if (!error_body_ready) {
        sb_buf_init(body, SB_REPLY_ERROR_MAX);
        error_body_ready = 1;
    }
    sb_buf_reset(body);
    if (sb_reply_error_body(body, st, message, c->cid, c->binary) != SB_OK) {
        /* no memory even for the error body: the fixed execution_error one, never an abort */
        sb_view_t v = sb_reply_error_fallback(c->binary);
        sb_buf_free(body);
        c->elapsed_us = sb_mono_us() - c->started_us;
        sb_metrics_call(c->kind, SB_E_EXECUTION, c->elapsed_us);
        log_call(c, SB_E_EXECUTION, "out of memory writing the error reply", v.len);
        sb_reply_send(c->super.req, SB_E_EXECUTION, ctype, (const char *)v.base, v.len);
        return;
    }
    c->elapsed_us = sb_mono_us() - c->started_us;
    sb_metrics_call(c->kind, st, c->elapsed_us);
    if (st == SB_E_UNAUTHORIZED)
        sb_metrics_deny(c->tokref[0] == '\0' ? SB_DENY_TOKEN_MISSING : SB_DENY_TOKEN_INVALID);
    else if (st == SB_E_FORBIDDEN && c->kind < SB_MK_COUNT_ && !c->decided)
        sb_metrics_deny(SB_DENY_AXIS + c->kind); /* a decider's refusal is counted in sb_decisions_total */
    log_call(c, st, message, body->len);
    /* copied into the request's pool first: the buffer is free again before anything else can run */
    sb_reply_send(c->super.req, st, ctype, body->base, body->len);
}

/* {"ok":true,"value":V} in msgpack: the handler's packed value after a fixed head, within the buffer's cap */
static sb_status_t encode_mp_value(sb_buf_t *out, const char *packed, size_t len)
{
    static const char head[] = "\x82\xa2ok\xc3\xa5value";
    char *room;
    sb_status_t st;

    /* the size is known: one allocation, or the cap refused before any */
    if ((st = sb_buf_reserve(out, sizeof(head) - 1 + len, &room)) != SB_OK)
        return st;
    memcpy(room, head, sizeof(head) - 1);
    if (len != 0)
        memcpy(room + sizeof(head) - 1, packed, len);
    sb_buf_commit(out, sizeof(head) - 1 + len);
    return SB_OK;
}

/*
 * The JSON reply {"ok":true,"value":V} for a value a handler packed as
 * msgpack, written in one pass by sb_json_write into `out`, whose cap is the
 * method's response cap: the writer stops at the first byte past it, so an
 * oversize result is never written whole.
 * @return SB_OK, SB_E_TOO_LARGE (the cap), SB_E_NOMEM, or SB_E_BAD_ARGS with *why set
 */
static sb_status_t encode_json_value(rpc_call_t *c, sb_buf_t *out, const char *packed, size_t len, const char **why)
{
    msgpack_object value;
    sb_status_t st;
    char *room;

    /* the handler packed it in this process: no pre-check (sb_json_write still checks every string) */
    if ((st = sb_mp_decode_packed((const uint8_t *)packed, len, &c->zone, &value)) != SB_OK) {
        if (st == SB_E_BAD_ARGS)
            *why = "handler produced an invalid value";
        return st;
    }
    /* JSON is rarely shorter than the msgpack it comes from: start with that much room (within the cap) */
    if (sb_buf_reserve(out, len + 32 < sb_buf_room(out) ? len + 32 : sb_buf_room(out), &room) == SB_E_NOMEM)
        return SB_E_NOMEM;
    if ((st = sb_buf_append(out, "{\"ok\":true,\"value\":", 19)) != SB_OK)
        return st;
    if ((st = sb_json_write(out, &value, NULL)) != SB_OK) {
        if (st == SB_E_BAD_ARGS)
            *why = "handler produced a value JSON cannot carry";
        return st;
    }
    return sb_buf_append_char(out, '}');
}

/* answers {ok:true, value} from a packed msgpack value, enforcing the method's response cap */
static void reply_value(rpc_call_t *c, const char *packed, size_t len)
{
    sb_buf_t out;
    const char *why = NULL;
    sb_status_t st;

    release_quota(c);
    sb_buf_init(&out, sb_method_response_cap(&c->m));
    st = c->binary ? encode_mp_value(&out, packed, len) : encode_json_value(c, &out, packed, len, &why);
    if (st != SB_OK) {
        sb_buf_free(&out);
        if (st == SB_E_TOO_LARGE)
            reply_error(c, SB_E_EXECUTION, "result exceeds the method's response cap");
        else if (st == SB_E_NOMEM)
            reply_error(c, SB_E_EXECUTION, "out of memory writing the result");
        else
            reply_error(c, SB_E_EXECUTION, why);
        return;
    }
    c->elapsed_us = sb_mono_us() - c->started_us;
    sb_metrics_call(c->kind, SB_OK, c->elapsed_us);
    send_body(c, SB_OK, NULL, &out);
}

static void on_dispatched(void *arg, sb_result_t *res)
{
    rpc_call_t *c = arg;
    if (c->super.req != NULL) {
        if (res->status == SB_OK)
            reply_value(c, res->value.data, res->value.size);
        else
            reply_error(c, res->status, res->message);
    }
    sb_async_release(&c->super);
}

/*
 * The decider's outcome for a call a decide rule holds: an allow dispatches
 * it, anything else answers forbidden (rate_limited when too many wait) and
 * nothing is dispatched. The guest sees the decider's reason on a deny.
 */
static void apply_decision(rpc_call_t *c, const sb_decision_t *d)
{
    char msg[SB_MAX_DECIDE_REASON + 2 * SB_MAX_METHOD_LEN];

    c->decided = 1;
    c->decision = d->outcome;
    c->decision_reused = d->reused;
    c->decision_us = d->us;
    if (c->super.req == NULL)
        return; /* the client left: nothing is dispatched for nobody */
    switch (d->outcome) {
    case SB_DECIDE_ALLOW:
        sb_async_retain(&c->super);
        sb_dispatch(&sb_current_worker->svc, c->tok, &c->call, on_dispatched, c);
        return;
    case SB_DECIDE_DENY:
        if (d->reason[0] != '\0')
            snprintf(msg, sizeof(msg), "the decider denied %.*s: %s", (int)c->method_len, c->method, d->reason);
        else
            snprintf(msg, sizeof(msg), "the decider denied %.*s", (int)c->method_len, c->method);
        reply_error(c, SB_E_FORBIDDEN, msg);
        return;
    case SB_DECIDE_OVERLOAD:
        snprintf(msg, sizeof(msg), "the decider did not allow %.*s: %s", (int)c->method_len, c->method, d->reason);
        reply_error(c, SB_E_RATE_LIMITED, msg);
        return;
    default:
        snprintf(msg, sizeof(msg), "the decider did not allow %.*s: %s", (int)c->method_len, c->method, d->reason);
        reply_error(c, SB_E_FORBIDDEN, msg);
        return;
    }
}

static void on_decided(void *arg, const sb_decision_t *d)
{
    rpc_call_t *c = arg;
    apply_decision(c, d);
    sb_async_release(&c->super);
}

static void on_quota(void *arg, sb_status_t st, const char *why)
{
    rpc_call_t *c = arg;
    char reason[512];

    if (c->super.req == NULL) {
        /* nobody to answer: hand a slot taken for nothing straight back */
        if (st == SB_OK)
            sb_store_quota_release(sb_current_worker->store, c->tok);
        goto Exit;
    }
    if (st != SB_OK) {
        if (st == SB_E_RATE_LIMITED)
            sb_metrics_quota_hit(why);
        snprintf(reason, sizeof(reason), "run quota exceeded: %s", why != NULL ? why : "unknown");
        reply_error(c, st == SB_E_RATE_LIMITED ? SB_E_RATE_LIMITED : SB_E_UNAVAILABLE,
                    st == SB_E_RATE_LIMITED ? reason : "sandbox token store is unavailable");
        goto Exit;
    }
    c->quota_held = 1;
    if (!c->method_parsed) {
        char msg[300];
        snprintf(msg, sizeof(msg), "unrecognized method \"%.*s\"", (int)c->method_len, c->method);
        reply_error(c, SB_E_BAD_METHOD, msg);
        goto Exit;
    }
    c->kind = c->m.kind;
    /* the args, decoded once: the check decides on this call, and the handler receives the same one */
    if (sb_call_decode(&c->call, &c->m, c->method, c->method_len, c->args, c->binary, &c->zone) != SB_OK &&
        c->call.err_stage == SB_CALL_ERR_NOW) {
        reply_error(c, c->call.err_status, c->call.err);
        goto Exit;
    }
    c->call.cid = c->cid;
    /* read only for the one method that asks: no header scan on every other call */
    c->call.module_path = c->m.kind == SB_MK_IMPORT && module_path(c->super.req);
    /* the manifest is checked on every call: nothing about a grant is cached */
    reason[0] = '\0';
    if ((st = sb_authz_check(c->tok->manifest, &c->call, reason, sizeof(reason))) != SB_OK) {
        reply_error(c, st, reason[0] != '\0' ? reason : NULL);
        goto Exit;
    }
    c->granted = 1;
    /*
     * A decide rule may hold a granted call for the decider (never one the
     * manifest refused: the check came first). The call keeps its concurrency
     * slot while it waits, and nothing is dispatched before an allow. A
     * manifest without decide rules pays one load and compare here. A call
     * whose args the decoder refused is not described: dispatch answers its
     * error without running any handler.
     */
    if (sb_authz_has_decide(c->tok->manifest) && c->call.err_stage == SB_CALL_ERR_NONE &&
        sb_authz_needs_decision(c->tok->manifest, &c->call)) {
        sb_worker_t *w = sb_current_worker;
        sb_decision_t d;
        sb_async_retain(&c->super);
        if (sb_decide_start(w->decide, w->server->decide_conf, c->tok, &c->call, sb_now_ms(), on_decided, c, &d)) {
            apply_decision(c, &d);
            sb_async_release(&c->super);
        }
        goto Exit;
    }
    /* the handler's callback holds its own reference: it may run long after this one is dropped (and the call with it) */
    sb_async_retain(&c->super);
    sb_dispatch(&sb_current_worker->svc, c->tok, &c->call, on_dispatched, c);
Exit:
    sb_async_release(&c->super);
}

static void on_token(void *arg, sb_status_t st, sb_token_t *tok, const char *why)
{
    rpc_call_t *c = arg;

    if (tok != NULL) {
        memcpy(c->run_id, tok->run_id, strlen(tok->run_id) + 1);
        c->tok = tok; /* the lookup's reference, released with the call */
    }
    if (st == SB_E_UNAUTHORIZED && c->super.req != NULL) {
        reply_error(c, SB_E_UNAUTHORIZED, NULL);
        sb_async_release(&c->super);
        return;
    }
    /* the lookup also counted the call against the run's quotas, denied ones included (PROTOCOL.md section 9, quotas) */
    on_quota(c, st, why);
}

/*
 * The request body as one value in the call's zone, decoded once: msgpack
 * pre-checked and unpacked, or JSON parsed in one pass (sb_json_parse: no
 * jansson tree, no packed copy). Either way the value obeys PROTOCOL.md
 * section 1 (caps, strict UTF-8, unique string keys), and its strings may
 * point into the body, which the request holds until the call is answered.
 * @return SB_OK, SB_E_BAD_ARGS, SB_E_TOO_LARGE (nesting or node caps) or SB_E_NOMEM
 */
static sb_status_t decode_body(rpc_call_t *c, const char *body, size_t len, const char **why)
{
    if (c->binary)
        return sb_mp_decode((const uint8_t *)body, len, &c->zone, &c->root, why);
    return sb_json_parse(body, len, &c->zone, &c->root, why);
}

static int is_msgpack(h2o_req_t *req)
{
    ssize_t i = h2o_find_header(&req->headers, H2O_TOKEN_CONTENT_TYPE, -1);
    h2o_iovec_t v;
    if (i < 0)
        return 0;
    v = req->headers.entries[i].value;
    return v.len >= 19 && h2o_lcstris(v.base, 19, H2O_STRLIT("application/msgpack")) && (v.len == 19 || v.base[19] == ';');
}

int sb_rpc_on_req(h2o_handler_t *self, h2o_req_t *req)
{
    sb_worker_t *w = sb_current_worker;
    rpc_call_t *c;
    const char *why = NULL;
    sb_status_t st;
    ssize_t hi;

    if (sb_http_framing_refuse(req))
        return 0;
    if (!h2o_memis(req->method.base, req->method.len, H2O_STRLIT("POST"))) {
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ALLOW, NULL, H2O_STRLIT("POST"));
        sb_reply_send(req, SB_E_METHOD_NOT_ALLOWED, "text/plain", H2O_STRLIT("method not allowed\n"));
        return 0;
    }
    c = call_new();
    sb_async_attach_to(req, &c->super, call_dispose, call_free);
    c->started_us = sb_mono_us();
    c->kind = SB_MK_COUNT_;
    c->binary = is_msgpack(req);
    /* logged beside the correlation id, which stays the broker's own */
    (void)sb_http_request_id(req, c->request_id);
    if (sb_uuid4(c->cid) != SB_OK) {
        /* no randomness: fail closed, without an id */
        memcpy(c->cid, "00000000-0000-0000-0000-000000000000", 37);
        reply_error(c, SB_E_UNAVAILABLE, "no randomness available");
        return 0;
    }

    /* 1. size (Content-Length above SB_MAX_HTTP_ENTITY never reaches us: h2o answers 413 itself) */
    if (req->entity.len > SB_MAX_RPC_WIRE) {
        reply_error(c, SB_E_TOO_LARGE, NULL);
        return 0;
    }
    /* 2. a body that decodes */
    if (req->entity.base == NULL || req->entity.len == 0) {
        reply_error(c, SB_E_BAD_ARGS, c->binary ? "invalid msgpack body" : "invalid JSON body");
        return 0;
    }
    if ((st = decode_body(c, req->entity.base, req->entity.len, &why)) != SB_OK) {
        if (st == SB_E_NOMEM)
            reply_error(c, SB_E_EXECUTION, "out of memory decoding the body");
        else if (st == SB_E_TOO_LARGE)
            reply_error(c, SB_E_BAD_ARGS, "request value exceeds the nesting or node limits");
        else
            reply_error(c, SB_E_BAD_ARGS, c->binary ? "invalid msgpack body" : "invalid JSON body");
        return 0;
    }
    /* 3. exactly {method, args?} */
    if (c->root.type != MSGPACK_OBJECT_MAP) {
        reply_error(c, SB_E_BAD_ARGS, "invalid request body");
        return 0;
    }
    for (uint32_t i = 0; i < c->root.via.map.size; ++i) {
        const msgpack_object *k = &c->root.via.map.ptr[i].key;
        if (!sb_mp_str_is(k, "method") && !sb_mp_str_is(k, "args")) {
            reply_error(c, SB_E_BAD_ARGS, "invalid request body");
            return 0;
        }
    }
    c->args = sb_mp_get(&c->root, "args");
    {
        const msgpack_object *m = sb_mp_get(&c->root, "method");
        /* 4. method: a non-empty string of at most 256 bytes */
        if (m == NULL || m->type != MSGPACK_OBJECT_STR || m->via.str.size == 0 || m->via.str.size > SB_MAX_METHOD_LEN) {
            reply_error(c, SB_E_BAD_METHOD, "invalid method");
            return 0;
        }
        c->method = m->via.str.ptr;
        c->method_len = m->via.str.size;
    }
    /* 5. the method's own request cap (an unknown method has the native one; it is refused after the token) */
    c->method_parsed = sb_method_parse(c->method, c->method_len, &c->m) == SB_OK;
    if (req->entity.len > sb_method_request_cap(c->method_parsed ? &c->m : NULL)) {
        reply_error(c, SB_E_TOO_LARGE, NULL);
        return 0;
    }
    /* 6. the token: only well-formed ones are looked up, and only by hash */
    hi = h2o_find_header_by_str(&req->headers, H2O_STRLIT("x-questpie-sandbox-token"), -1);
    if (hi < 0 || req->headers.entries[hi].value.len == 0) {
        reply_error(c, SB_E_UNAUTHORIZED, NULL);
        return 0;
    }
    /* two token headers are ambiguous: no token is "the" token, and a proxy and the broker could each pick another */
    if (h2o_find_header_by_str(&req->headers, H2O_STRLIT("x-questpie-sandbox-token"), hi) >= 0) {
        reply_error(c, SB_E_UNAUTHORIZED, NULL);
        return 0;
    }
    {
        h2o_iovec_t tv = req->headers.entries[hi].value;
        char hex[65];
        sb_sha256(tv.base, tv.len, c->hash);
        sb_hex(c->hash, 6, hex);
        memcpy(c->tokref, hex, 13);
        if (!sb_is_token_format(tv.base, tv.len)) {
            reply_error(c, SB_E_UNAUTHORIZED, NULL);
            return 0;
        }
    }
    sb_async_retain(&c->super);
    sb_store_lookup_acquire(w->store, c->hash, on_token, c);
    return 0;
}
