/*
 * The decider client (decide.h).
 *
 * Why every failure refuses: the decide rules exist because the host wants a
 * judgement before these calls run. A decider that is down, slow, confused
 * or unreachable has not judged, so nothing it did not explicitly allow may
 * run (PROTOCOL.md section 5a). The guest learns only that the decider did
 * not allow the call and the coarse reason (no answer in time, unreachable,
 * an HTTP error, a malformed answer); the log line has the detail.
 *
 * One decision is one POST on a fresh connection through the broker's pinned
 * client (fetch/client.h), to the configured addresses only. h2o 2.2.5 has
 * no timer of arbitrary length, so the deadlines (each decision's own: the
 * configured timeout, or less when the run ends sooner) are watched by one
 * tick per worker, linked only while a decision waits.
 *
 * The pending bound is per process (every worker counts into one atomic
 * counter): held calls tie up a concurrency slot of their run and a little
 * memory each, and a decider that stops answering must not let them pile up
 * without end.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "fetch/client.h"
#include "call/url.h"
#include "obs/log.h"
#include "obs/metrics.h"
#include "sb/mem.h"
#include "svc/decide/decide.h"
#include "util/util.h"

#define DEFAULT_TIMEOUT_MS 5000u
#define MAX_TIMEOUT_MS 600000u
#define DEFAULT_MAX_PENDING 256u
#define MAX_REUSE_MS 3600000u
/* how often waiting decisions are checked against their deadlines */
#define TICK_MS 10u
/* a connect attempt's own bound; the decision's deadline ends it sooner */
#define CONNECT_TIMEOUT_MS 60000u
/* the request head around the body: request line, Host, the bearer secret, the fixed headers */
#define MAX_SECRET 1024u
/* the request's head: the target and Host (the URL), the bearer secret, and the fixed lines (about 200 bytes) */
#define REQUEST_HEAD_ROOM (SB_URL_MAX_HOST + SB_MAX_URL + MAX_SECRET + 1024u)

struct st_sb_decide_conf_t {
    char *url_text;
    sb_url_t url;
    char host_header[SB_URL_MAX_HOST + 16];
    sb_ip_t addrs[2];
    size_t naddrs;
    SSL_CTX *ssl_ctx; /* https only */
    char *tls_name;   /* https: the SNI name and the name the certificate must show */
    char *secret;     /* the bearer secret, or NULL */
    size_t secret_len;
    uint64_t timeout_ms;
    size_t max_pending;
    uint64_t reuse_ms; /* 0: no reuse */
};

/* one answer kept for reuse: an identical call of the same run (the key), until `expires_ms` */
typedef struct st_cache_entry_t {
    uint8_t key[32];
    const sb_decide_conf_t *conf; /* answers of a replaced decider are not reused */
    int64_t expires_ms;           /* monotonic */
    int allow;
    char reason[SB_MAX_DECIDE_REASON + 1];
} cache_entry_t;

struct st_sb_decide_ctx_t {
    h2o_loop_t *loop;
    h2o_timeout_t tick_timeout, connect_timeout;
    h2o_timeout_entry_t tick;
    h2o_linklist_t pending;
    cache_entry_t *cache; /* SB_MAX_DECIDE_CACHE entries, allocated when reuse is first asked for */
    size_t cache_next;    /* the slot the next answer replaces (round robin) */
};

typedef struct st_decide_req_t {
    h2o_linklist_t link;
    sb_decide_ctx_t *ctx;
    const sb_decide_conf_t *conf;
    sb_http_t *http;
    int starting; /* inside sb_http_start: a failure there is reported by the start */
    const char *early_err;
    sb_buf_t request; /* holds the bearer secret: a secret buffer, wiped when freed */
    uint64_t started_us;
    uint64_t deadline_us; /* monotonic */
    uint64_t wait_ms;
    uint8_t key[32];
    int cacheable;
    /* for the log line */
    char cid[40];
    char run_id[SB_MAX_RUN_ID + 1];
    char method[SB_MAX_METHOD_LEN + 1];
    sb_decide_cb cb;
    void *arg;
} decide_req_t;

static _Atomic size_t pending_total;

size_t sb_decide_pending(void)
{
    return atomic_load_explicit(&pending_total, memory_order_relaxed);
}

const char *sb_decide_outcome_name(sb_decide_outcome_t o)
{
    static const char *const names[SB_DECIDE_OUTCOME_COUNT_] = {"allow", "deny", "fail", "overload"};
    return (unsigned)o < SB_DECIDE_OUTCOME_COUNT_ ? names[o] : "fail";
}

/* ---- configuration -------------------------------------------------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static sb_status_t conf_fail(char *err, size_t errsz, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errsz, fmt, ap);
    va_end(ap);
    return SB_E_BAD_ARGS;
}

static sb_status_t conf_uint(const json_t *v, const char *key, uint64_t lo, uint64_t hi, uint64_t *out, char *err, size_t errsz)
{
    if (v == NULL)
        return SB_OK;
    if (!json_is_integer(v) || json_integer_value(v) < (json_int_t)lo || json_integer_value(v) > (json_int_t)hi)
        return conf_fail(err, errsz, "decider.%s: expected an integer from %llu to %llu", key, (unsigned long long)lo,
                         (unsigned long long)hi);
    *out = (uint64_t)json_integer_value(v);
    return SB_OK;
}

static const char *conf_str(const json_t *v)
{
    return json_is_string(v) && json_string_length(v) != 0 && strlen(json_string_value(v)) == json_string_length(v)
               ? json_string_value(v)
               : NULL;
}

/* the bearer secret: the file's bytes, one trailing newline dropped; visible ASCII only (it goes into a header) */
static sb_status_t read_secret(sb_decide_conf_t *c, const char *path, char *err, size_t errsz)
{
    char buf[MAX_SECRET + 3];
    FILE *fp = fopen(path, "rb");
    size_t n;

    if (fp == NULL)
        return conf_fail(err, errsz, "decider.secret_file: cannot open %s: %s", path, strerror(errno));
    n = fread(buf, 1, sizeof(buf), fp);
    if (ferror(fp)) {
        fclose(fp);
        explicit_bzero(buf, sizeof(buf));
        return conf_fail(err, errsz, "decider.secret_file: cannot read %s", path);
    }
    fclose(fp);
    if (n > 0 && buf[n - 1] == '\n')
        --n;
    if (n > 0 && buf[n - 1] == '\r')
        --n;
    if (n == 0 || n > MAX_SECRET) {
        explicit_bzero(buf, sizeof(buf));
        return conf_fail(err, errsz, "decider.secret_file: expected 1 to %u bytes", MAX_SECRET);
    }
    for (size_t i = 0; i < n; ++i) {
        if (buf[i] < 0x21 || buf[i] > 0x7e) {
            explicit_bzero(buf, sizeof(buf));
            return conf_fail(err, errsz, "decider.secret_file: the secret must be visible ASCII");
        }
    }
    c->secret = sb_mem_alloc(n + 1);
    memcpy(c->secret, buf, n);
    c->secret[n] = '\0';
    c->secret_len = n;
    explicit_bzero(buf, sizeof(buf));
    return SB_OK;
}

void sb_decide_conf_free(sb_decide_conf_t *c)
{
    if (c == NULL)
        return;
    if (c->secret != NULL)
        explicit_bzero(c->secret, c->secret_len);
    sb_mem_free(c->secret);
    sb_mem_free(c->url_text);
    sb_mem_free(c->tls_name);
    if (c->ssl_ctx != NULL)
        SSL_CTX_free(c->ssl_ctx);
    sb_mem_free(c);
}

sb_status_t sb_decide_conf_create(const json_t *v, sb_decide_conf_t **out, char *err, size_t errsz)
{
    const json_t *url = NULL, *tls_name = NULL, *ca_file = NULL, *secret_file = NULL, *timeout = NULL, *max_pending = NULL,
                 *reuse = NULL;
    sb_decide_conf_t *c = NULL;
    const char *key, *why = NULL, *s;
    json_t *val;
    uint64_t n;
    sb_status_t st;

    *out = NULL;
    if (v == NULL || json_is_null(v) || (json_is_object(v) && json_object_size(v) == 0))
        return SB_OK;
    if (!json_is_object(v))
        return conf_fail(err, errsz, "decider: expected an object");
    json_object_foreach((json_t *)v, key, val)
    {
        if (strcmp(key, "url") == 0)
            url = val;
        else if (strcmp(key, "tls_name") == 0)
            tls_name = val;
        else if (strcmp(key, "ca_file") == 0)
            ca_file = val;
        else if (strcmp(key, "secret_file") == 0)
            secret_file = val;
        else if (strcmp(key, "timeout_ms") == 0)
            timeout = val;
        else if (strcmp(key, "max_pending") == 0)
            max_pending = val;
        else if (strcmp(key, "reuse_ms") == 0)
            reuse = val;
        else
            return conf_fail(err, errsz, "decider.%.64s: unknown key", key);
    }
    c = sb_mem_calloc(1, sizeof(*c));
    c->timeout_ms = DEFAULT_TIMEOUT_MS;
    c->max_pending = DEFAULT_MAX_PENDING;
    if ((s = conf_str(url)) == NULL) {
        st = conf_fail(err, errsz, "decider.url: expected the decider's http:// or https:// URL");
        goto Error;
    }
    if (sb_url_parse(s, strlen(s), &c->url, &why) != SB_OK) {
        st = conf_fail(err, errsz, "decider.url: %s", why != NULL ? why : "the URL does not parse");
        goto Error;
    }
    /*
     * Nothing is resolved: the decider is named by address, or as localhost,
     * which means the loopback addresses (RFC 6761 section 6.3) and nothing a
     * resolver could change. The egress policy of http.fetch does not apply:
     * the operator points the broker at its own decider on purpose.
     */
    switch (c->url.host_kind) {
    case SB_URL_HOST_IPV4:
        c->addrs[0].family = AF_INET;
        memcpy(c->addrs[0].addr, &c->url.addr.v4, 4);
        c->naddrs = 1;
        break;
    case SB_URL_HOST_IPV6:
        c->addrs[0].family = AF_INET6;
        memcpy(c->addrs[0].addr, &c->url.addr.v6, 16);
        c->naddrs = 1;
        break;
    default:
        if (strcmp(c->url.host, "localhost") != 0) {
            st = conf_fail(err, errsz, "decider.url: the host must be an IP address or localhost (no name is resolved)");
            goto Error;
        }
        c->addrs[0].family = AF_INET;
        c->addrs[0].addr[0] = 127;
        c->addrs[0].addr[3] = 1;
        c->addrs[1].family = AF_INET6;
        c->addrs[1].addr[15] = 1;
        c->naddrs = 2;
        break;
    }
    sb_url_host_header(&c->url, c->host_header, sizeof(c->host_header));
    c->url_text = sb_mem_strdup(s);
    if (tls_name != NULL && conf_str(tls_name) == NULL) {
        st = conf_fail(err, errsz, "decider.tls_name: expected a host name");
        goto Error;
    }
    if (ca_file != NULL && conf_str(ca_file) == NULL) {
        st = conf_fail(err, errsz, "decider.ca_file: expected a file path");
        goto Error;
    }
    if (c->url.scheme == SB_URL_HTTPS) {
        const char *name = tls_name != NULL                       ? json_string_value(tls_name)
                           : c->url.host_kind == SB_URL_HOST_NAME ? c->url.host
                                                                  : NULL;
        if (name == NULL) {
            st = conf_fail(err, errsz, "decider.tls_name: required when an https:// url names an IP address");
            goto Error;
        }
        c->tls_name = sb_mem_strdup(name);
        if ((c->ssl_ctx = sb_http_ssl_ctx_create(ca_file != NULL ? json_string_value(ca_file) : NULL, &why)) == NULL) {
            st = conf_fail(err, errsz, "decider.ca_file: %s", ca_file != NULL ? "cannot load CA certificates" : why);
            goto Error;
        }
    } else if (tls_name != NULL || ca_file != NULL) {
        st = conf_fail(err, errsz, "decider.%s: only for an https:// url", tls_name != NULL ? "tls_name" : "ca_file");
        goto Error;
    }
    if (secret_file != NULL) {
        if (conf_str(secret_file) == NULL) {
            st = conf_fail(err, errsz, "decider.secret_file: expected a file path");
            goto Error;
        }
        if ((st = read_secret(c, json_string_value(secret_file), err, errsz)) != SB_OK)
            goto Error;
    }
    if ((st = conf_uint(timeout, "timeout_ms", 1, MAX_TIMEOUT_MS, &c->timeout_ms, err, errsz)) != SB_OK)
        goto Error;
    n = c->max_pending;
    if ((st = conf_uint(max_pending, "max_pending", 1, SB_MAX_DECIDE_PENDING, &n, err, errsz)) != SB_OK)
        goto Error;
    c->max_pending = (size_t)n;
    if ((st = conf_uint(reuse, "reuse_ms", 0, MAX_REUSE_MS, &c->reuse_ms, err, errsz)) != SB_OK)
        goto Error;
    *out = c;
    return SB_OK;
Error:
    sb_decide_conf_free(c);
    return st;
}

/* ---- the context ---------------------------------------------------------------------------------------------------- */

static void finish(decide_req_t *r, sb_decide_outcome_t o, const char *reason);

static void on_tick(h2o_timeout_entry_t *entry)
{
    sb_decide_ctx_t *ctx = H2O_STRUCT_FROM_MEMBER(sb_decide_ctx_t, tick, entry);
    uint64_t now = sb_mono_us();
    h2o_linklist_t expired;
    char why[96];

    /* collected first: a callback may start new decisions (they wait for their own deadline) */
    h2o_linklist_init_anchor(&expired);
    for (h2o_linklist_t *l = ctx->pending.next, *next; l != &ctx->pending; l = next) {
        decide_req_t *r = H2O_STRUCT_FROM_MEMBER(decide_req_t, link, l);
        next = l->next;
        if (r->deadline_us <= now) {
            h2o_linklist_unlink(&r->link);
            h2o_linklist_insert(&expired, &r->link);
        }
    }
    while (!h2o_linklist_is_empty(&expired)) {
        decide_req_t *r = H2O_STRUCT_FROM_MEMBER(decide_req_t, link, expired.next);
        snprintf(why, sizeof(why), "no answer within %llu ms", (unsigned long long)r->wait_ms);
        finish(r, SB_DECIDE_FAIL, why);
    }
    if (!h2o_linklist_is_empty(&ctx->pending) && !h2o_timeout_is_linked(&ctx->tick))
        h2o_timeout_link(ctx->loop, &ctx->tick_timeout, &ctx->tick);
}

sb_decide_ctx_t *sb_decide_ctx_create(h2o_loop_t *loop)
{
    sb_decide_ctx_t *ctx = sb_mem_calloc(1, sizeof(*ctx));
    ctx->loop = loop;
    h2o_timeout_init(loop, &ctx->tick_timeout, TICK_MS);
    h2o_timeout_init(loop, &ctx->connect_timeout, CONNECT_TIMEOUT_MS);
    ctx->tick.cb = on_tick;
    h2o_linklist_init_anchor(&ctx->pending);
    return ctx;
}

void sb_decide_ctx_destroy(sb_decide_ctx_t *ctx)
{
    if (ctx == NULL)
        return;
    while (!h2o_linklist_is_empty(&ctx->pending)) {
        decide_req_t *r = H2O_STRUCT_FROM_MEMBER(decide_req_t, link, ctx->pending.next);
        finish(r, SB_DECIDE_FAIL, "the broker is shutting down");
    }
    if (h2o_timeout_is_linked(&ctx->tick))
        h2o_timeout_unlink(&ctx->tick);
    h2o_timeout_dispose(ctx->loop, &ctx->tick_timeout);
    h2o_timeout_dispose(ctx->loop, &ctx->connect_timeout);
    sb_mem_free(ctx->cache);
    sb_mem_free(ctx);
}

/* ---- reuse ---------------------------------------------------------------------------------------------------------- */

static cache_entry_t *cache_find(sb_decide_ctx_t *ctx, const sb_decide_conf_t *conf, const uint8_t key[32], int64_t now_ms)
{
    if (ctx->cache == NULL)
        return NULL;
    for (size_t i = 0; i < SB_MAX_DECIDE_CACHE; ++i) {
        cache_entry_t *e = &ctx->cache[i];
        if (e->conf == conf && e->expires_ms > now_ms && memcmp(e->key, key, 32) == 0)
            return e;
    }
    return NULL;
}

static void cache_put(sb_decide_ctx_t *ctx, const sb_decide_conf_t *conf, const uint8_t key[32], int allow, const char *reason)
{
    cache_entry_t *e;

    if (ctx->cache == NULL)
        ctx->cache = sb_mem_calloc(SB_MAX_DECIDE_CACHE, sizeof(*ctx->cache));
    e = &ctx->cache[ctx->cache_next];
    ctx->cache_next = (ctx->cache_next + 1) % SB_MAX_DECIDE_CACHE;
    memcpy(e->key, key, 32);
    e->conf = conf;
    e->expires_ms = (int64_t)(sb_mono_us() / 1000u + conf->reuse_ms);
    e->allow = allow;
    snprintf(e->reason, sizeof(e->reason), "%s", reason);
}

/* ---- one decision --------------------------------------------------------------------------------------------------- */

static void log_decision(const char *cid, const char *run_id, const char *method, sb_decide_outcome_t o, const char *reason,
                         int reused, uint64_t us)
{
    sb_logline_t l;
    sb_log_begin(&l, o == SB_DECIDE_ALLOW ? SB_LOG_INFO : SB_LOG_WARN, "decide");
    sb_log_cstr(&l, "cid", cid);
    sb_log_cstr(&l, "runId", run_id);
    sb_log_cstr(&l, "method", method);
    sb_log_cstr(&l, "outcome", sb_decide_outcome_name(o));
    if (reason != NULL && reason[0] != '\0')
        sb_log_cstr(&l, "reason", reason);
    if (reused)
        sb_log_int(&l, "reused", 1);
    sb_log_int(&l, "us", (long long)us);
    sb_log_end(&l);
    sb_metrics_decision((int)o, reused, us);
}

static void finish(decide_req_t *r, sb_decide_outcome_t o, const char *reason)
{
    sb_decision_t d;

    if (h2o_linklist_is_linked(&r->link))
        h2o_linklist_unlink(&r->link);
    if (r->http != NULL) {
        sb_http_cancel(r->http);
        r->http = NULL;
    }
    atomic_fetch_sub_explicit(&pending_total, 1, memory_order_relaxed);
    if (r->cacheable && (o == SB_DECIDE_ALLOW || o == SB_DECIDE_DENY))
        cache_put(r->ctx, r->conf, r->key, o == SB_DECIDE_ALLOW, reason);
    d.outcome = o;
    d.reason = reason != NULL ? reason : "";
    d.reused = 0;
    d.us = sb_mono_us() - r->started_us;
    log_decision(r->cid, r->run_id, r->method, o, d.reason, 0, d.us);
    sb_buf_free(&r->request);
    r->cb(r->arg, &d);
    sb_mem_free(r);
}

static const sb_http_header_t *find_header(const sb_http_response_t *res, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < res->nheaders; ++i)
        if (res->headers[i].name_len == n && memcmp(res->headers[i].name, name, n) == 0)
            return &res->headers[i];
    return NULL;
}

static void on_http(void *arg, const char *err, sb_http_response_t *res)
{
    decide_req_t *r = arg;
    const sb_http_header_t *ce;
    sb_decide_answer_t ans;
    const char *why = NULL;
    char detail[128];

    if (r->starting) {
        r->early_err = err != NULL ? err : "connect failed";
        return;
    }
    r->http = NULL;
    if (err != NULL) {
        snprintf(detail, sizeof(detail), "the exchange with the decider failed (%s)", err);
        finish(r, SB_DECIDE_FAIL, detail);
        return;
    }
    if (res->status != 200) {
        snprintf(detail, sizeof(detail), "the decider answered HTTP %d", res->status);
        finish(r, SB_DECIDE_FAIL, detail);
        return;
    }
    /* no Accept-Encoding was sent: a content coding is the decider's fault */
    if ((ce = find_header(res, "content-encoding")) != NULL && !(ce->value_len == 8 && memcmp(ce->value, "identity", 8) == 0)) {
        finish(r, SB_DECIDE_FAIL, "malformed answer: a Content-Encoding was not asked for");
        return;
    }
    if (sb_decide_parse_answer((const char *)res->body, res->body_len, &ans, &why) != SB_OK) {
        snprintf(detail, sizeof(detail), "malformed answer: %s", why);
        finish(r, SB_DECIDE_FAIL, detail);
        return;
    }
    finish(r, ans.allow ? SB_DECIDE_ALLOW : SB_DECIDE_DENY, ans.allow ? "" : ans.reason);
}

/* the request: head and body, the bearer secret in the head (a secret buffer, wiped when freed) */
static sb_status_t build_request(decide_req_t *r, const sb_buf_t *body)
{
    const sb_decide_conf_t *c = r->conf;
    sb_status_t st;

    sb_buf_init_secret(&r->request, SB_MAX_DECIDE_REQUEST + REQUEST_HEAD_ROOM);
    if ((st = sb_buf_printf(&r->request, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: sandbox-broker\r\n", c->url.target,
                            c->host_header)) != SB_OK)
        return st;
    if (c->secret != NULL) {
        if ((st = sb_buf_append_str(&r->request, "Authorization: Bearer ")) != SB_OK ||
            (st = sb_buf_append(&r->request, c->secret, c->secret_len)) != SB_OK ||
            (st = sb_buf_append_str(&r->request, "\r\n")) != SB_OK)
            return st;
    }
    if ((st = sb_buf_printf(&r->request,
                            "Content-Type: application/json\r\nAccept: application/json\r\nContent-Length: %zu\r\n"
                            "Connection: close\r\n\r\n",
                            body->len)) != SB_OK)
        return st;
    return sb_buf_append(&r->request, body->base, body->len);
}

static int decided_now(sb_decision_t *d, sb_decide_outcome_t o, const char *reason, const char *cid, const char *run_id,
                       const char *method, uint64_t started_us)
{
    d->outcome = o;
    d->reason = reason;
    d->reused = 0;
    d->us = sb_mono_us() - started_us;
    log_decision(cid, run_id, method, o, reason, 0, d->us);
    return 1;
}

int sb_decide_start(sb_decide_ctx_t *ctx, const sb_decide_conf_t *conf, const sb_token_t *tok, const sb_call_t *call,
                    int64_t now_ms, sb_decide_cb cb, void *arg, sb_decision_t *d)
{
    static __thread char reason[SB_MAX_DECIDE_REASON + 64];
    uint64_t started_us = sb_mono_us(), wait_ms;
    int64_t left_ms = tok->expires_at_ms - now_ms;
    char method[SB_MAX_METHOD_LEN + 1];
    const char *cid = call->cid != NULL ? call->cid : "";
    decide_req_t *r;
    sb_buf_t body;
    sb_status_t st;
    size_t pending;

    snprintf(method, sizeof(method), "%.*s", (int)call->method_len, call->method);
    if (ctx == NULL) /* the worker's last turn after the drain */
        return decided_now(d, SB_DECIDE_FAIL, "the broker is shutting down", cid, tok->run_id, method, started_us);
    if (conf == NULL)
        return decided_now(d, SB_DECIDE_FAIL, "no decider is configured", cid, tok->run_id, method, started_us);
    if (left_ms <= 0)
        return decided_now(d, SB_DECIDE_FAIL, "the run has no time left to wait for a decision", cid, tok->run_id, method,
                           started_us);
    /* the wait: the configured deadline, or the run's remaining lifetime when that is shorter */
    wait_ms = (uint64_t)left_ms < conf->timeout_ms ? (uint64_t)left_ms : conf->timeout_ms;

    sb_buf_init(&body, SB_MAX_DECIDE_REQUEST);
    r = NULL;
    if (conf->reuse_ms != 0) {
        /* the key: the run (its token) and the call as described, without what differs between identical calls */
        uint8_t in[32 + 32];
        int partial = 0;
        cache_entry_t *e;
        if ((st = sb_decide_describe(&body, "", tok->run_id, tok->target, call, 0, &partial)) != SB_OK) {
            sb_buf_free(&body);
            return decided_now(d, SB_DECIDE_FAIL, "the call cannot be described to the decider", cid, tok->run_id, method,
                               started_us);
        }
        memcpy(in, tok->hash, 32);
        sb_sha256(body.base, body.len, in + 32);
        /*
         * A description that left arguments out (too large for the decider's request) names
         * different calls alike: such a call is decided on its own, never from another's answer
         */
        r = sb_mem_calloc(1, sizeof(*r));
        r->cacheable = !partial;
        sb_buf_reset(&body);
        sb_sha256(in, sizeof(in), r->key);
        if (r->cacheable && (e = cache_find(ctx, conf, r->key, (int64_t)(started_us / 1000u))) != NULL) {
            snprintf(reason, sizeof(reason), "%s", e->reason);
            sb_mem_free(r);
            sb_buf_free(&body);
            d->outcome = e->allow ? SB_DECIDE_ALLOW : SB_DECIDE_DENY;
            d->reason = reason;
            d->reused = 1;
            d->us = sb_mono_us() - started_us;
            log_decision(cid, tok->run_id, method, d->outcome, reason, 1, d->us);
            return 1;
        }
    }
    /* the bound on waiting decisions, before anything is sent */
    pending = atomic_fetch_add_explicit(&pending_total, 1, memory_order_relaxed);
    if (pending >= conf->max_pending) {
        atomic_fetch_sub_explicit(&pending_total, 1, memory_order_relaxed);
        sb_mem_free(r);
        sb_buf_free(&body);
        return decided_now(d, SB_DECIDE_OVERLOAD, "too many calls are waiting for a decision", cid, tok->run_id, method,
                           started_us);
    }
    if (r == NULL)
        r = sb_mem_calloc(1, sizeof(*r));
    r->ctx = ctx;
    r->conf = conf;
    r->cb = cb;
    r->arg = arg;
    r->started_us = started_us;
    r->wait_ms = wait_ms;
    r->deadline_us = started_us + wait_ms * 1000u;
    snprintf(r->cid, sizeof(r->cid), "%s", cid);
    snprintf(r->run_id, sizeof(r->run_id), "%s", tok->run_id);
    memcpy(r->method, method, sizeof(method));
    if ((st = sb_decide_describe(&body, cid, tok->run_id, tok->target, call, wait_ms, NULL)) != SB_OK ||
        (st = build_request(r, &body)) != SB_OK) {
        sb_buf_free(&body);
        sb_buf_free(&r->request);
        atomic_fetch_sub_explicit(&pending_total, 1, memory_order_relaxed);
        sb_mem_free(r);
        return decided_now(d, SB_DECIDE_FAIL, "the call cannot be described to the decider", cid, tok->run_id, method, started_us);
    }
    sb_buf_free(&body);
    {
        sb_http_opts_t o;
        memset(&o, 0, sizeof(o));
        o.loop = ctx->loop;
        o.addrs = conf->addrs;
        o.naddrs = conf->naddrs;
        o.port = conf->url.port;
        o.ssl_ctx = conf->ssl_ctx;
        o.sni = conf->tls_name;
        o.request = r->request.base;
        o.request_len = r->request.len;
        o.max_body = SB_MAX_DECIDE_ANSWER;
        o.connect_timeout = &ctx->connect_timeout;
        r->starting = 1;
        r->http = sb_http_start(&o, on_http, r);
        r->starting = 0;
    }
    if (r->http == NULL) {
        snprintf(reason, sizeof(reason), "the exchange with the decider failed (%s)",
                 r->early_err != NULL ? r->early_err : "connect failed");
        sb_buf_free(&r->request);
        atomic_fetch_sub_explicit(&pending_total, 1, memory_order_relaxed);
        sb_mem_free(r);
        return decided_now(d, SB_DECIDE_FAIL, reason, cid, tok->run_id, method, started_us);
    }
    h2o_linklist_insert(&ctx->pending, &r->link);
    if (!h2o_timeout_is_linked(&ctx->tick))
        h2o_timeout_link(ctx->loop, &ctx->tick_timeout, &ctx->tick);
    return 0;
}
