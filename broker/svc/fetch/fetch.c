/*
 * http.fetch: the hop state machine.
 *
 *   hop:  [allowlist] -> name policy -> resolve -> validate every answer
 *         -> connect to validated addresses in order -> request -> response
 *   3xx + Location: resolve the reference against the current URL with the
 *   same parser, then the next hop starts from the top.
 *
 * Why every step: a name can change between hops (TTL-0 rebinding), so
 * nothing learned on one hop is reused on the next; a redirect is a new
 * request the guest did not make, so it must pass the allowlist again; one
 * blocked answer rejects the name, because the resolver the upstream host
 * uses might have picked that one. (A kept-alive connection of the same run,
 * set_reuse below, is taken only after the hop's own answers validated and
 * still contain its address.)
 *
 * import.fetch (PROTOCOL.md section 6c) runs on the same machine: its first
 * URL and every redirect hop are judged by the run's import list (never by
 * net), the request is a GET with the broker's own two headers, the body is
 * capped per module, and the run's module count and module bytes are
 * counted in the token store before and after.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fetch/client.h"
#include "authz/secrets.h"
#include "svc/fetch/egress_check.h"
#include "obs/log.h"
#include "obs/metrics.h"
#include "sb/limits.h"
#include "sb/value.h"
#include "util/util.h"

#define MAX_REQ_HEADERS SB_CALL_MAX_FETCH_HEADERS
#define MAX_METHOD SB_CALL_MAX_FETCH_METHOD

/*
 * Owned by references (handlers.h): the creator's, then one per exchange. The
 * exchanges' deadlines and connect timers are entries on this context's
 * queues and their DNS queries run on its resolver, so both are disposed of
 * only after the last exchange has been freed, on the reaper's turn.
 */
struct st_sb_fetch_ctx_t {
    const sb_fetch_conf_t *conf;
    h2o_loop_t *loop;
    size_t refs;
    sb_reaper_t *reaper;
    h2o_timeout_entry_t reap;
    sb_resolver_t *resolver;
    sb_http_pool_t *conns; /* kept-alive upstream connections, reused within a run only (fetch/client.h) */
    h2o_timeout_t deadline, connect_timeout;
};

static void on_reap(h2o_timeout_entry_t *entry)
{
    sb_fetch_ctx_t *ctx = H2O_STRUCT_FROM_MEMBER(sb_fetch_ctx_t, reap, entry);
    sb_reaper_t *reaper = ctx->reaper;

    sb_http_pool_destroy(ctx->conns);
    sb_resolver_destroy(ctx->resolver);
    h2o_timeout_dispose(ctx->loop, &ctx->deadline);
    h2o_timeout_dispose(ctx->loop, &ctx->connect_timeout);
    sb_mem_free(ctx);
    sb_reaper__freed(reaper);
}

sb_fetch_ctx_t *sb_fetch_ctx_create(const sb_fetch_conf_t *conf, h2o_loop_t *loop, sb_reaper_t *reaper, const char **err)
{
    sb_fetch_ctx_t *ctx = sb_mem_calloc(1, sizeof(*ctx));
    ctx->conf = conf;
    ctx->loop = loop;
    if ((ctx->resolver = sb_resolver_create(loop, conf->dns_servers, conf->dns_timeout_ms, conf->dns_tries, err)) == NULL) {
        sb_mem_free(ctx);
        return NULL;
    }
    h2o_timeout_init(loop, &ctx->deadline, conf->deadline_ms);
    h2o_timeout_init(loop, &ctx->connect_timeout, conf->connect_timeout_ms);
    ctx->conns = sb_http_pool_create(loop, conf->keepalive_pool_size, conf->keepalive_idle_ms);
    ctx->refs = 1;
    ctx->reaper = reaper;
    ctx->reap.cb = on_reap;
    sb_reaper__created(reaper);
    return ctx;
}

void sb_fetch_ctx_release(sb_fetch_ctx_t *ctx)
{
    if (ctx == NULL || --ctx->refs != 0)
        return;
    sb_reaper__schedule(ctx->reaper, &ctx->reap);
}

/* ---- the exchange --------------------------------------------------------------------------------------------------- */

typedef struct st_req_header_t {
    char *name; /* lowercased */
    char *value;
    size_t value_len;
    /* the secret placeholders in value (call/placeholder.h), and the secret each one is granted on this hop */
    sb_placeholder_t *ph;
    const sb_secret_t **sec;
    size_t nph;
} req_header_t;

typedef struct st_fetch_t {
    sb_fetch_ctx_t *ctx;
    sb_store_conn_t *store; /* quotas; NULL in egress-check */
    sb_token_t *tok;
    int binary;
    char cid[37]; /* the call's correlation id, on every egress log line */
    sb_dispatch_cb cb;
    void *arg;
    unsigned hop;
    sb_url_t url;
    char method[MAX_METHOD + 1];
    req_header_t headers[MAX_REQ_HEADERS];
    size_t nheaders;
    uint8_t *body;
    size_t body_len;
    h2o_timeout_entry_t deadline;
    sb_resolve_t *dns;
    sb_http_t *http;
    sb_ip_t pins[2 * SB_MAX_DNS_ANSWERS];
    size_t npins;
    char *request;
    size_t request_len;
    int request_secret;  /* the request holds a secret value: wiped before it is freed */
    int import;          /* import.fetch: the import list judges every hop; the module caps apply */
    sb_result_t *module; /* import.fetch: the answer, held while the module's bytes are counted */
    size_t module_len;   /* its body's bytes */
    /* egress-check mode */
    sb_egress_check_cb check_cb;
    sb_egress_decision_t *decision;
} fetch_t;

static void free_header(req_header_t *h)
{
    sb_mem_free(h->name);
    sb_mem_free(h->value);
    sb_mem_free(h->ph);
    sb_mem_free(h->sec);
}

static void wipe_request(fetch_t *f)
{
    if (f->request != NULL && f->request_secret)
        explicit_bzero(f->request, f->request_len);
    sb_mem_free(f->request);
    f->request = NULL;
}

static void free_fetch(fetch_t *f)
{
    if (h2o_timeout_is_linked(&f->deadline))
        h2o_timeout_unlink(&f->deadline);
    sb_resolve_cancel(f->dns);
    sb_http_cancel(f->http);
    for (size_t i = 0; i < f->nheaders; ++i)
        free_header(&f->headers[i]);
    sb_mem_free(f->body);
    wipe_request(f);
    sb_mem_free(f->decision);
    if (f->module != NULL) {
        sb_result_dispose(f->module);
        sb_mem_free(f->module);
    }
    if (f->tok != NULL)
        sb_token_release(f->tok);
    /* last: the exchange's timers and query are gone from the context's queues and resolver */
    sb_fetch_ctx_release(f->ctx);
    sb_mem_free(f);
}

/*
 * Ends the exchange with an error. The reason goes to the egress.failed line
 * (and, through the RPC route, to the call's rpc and audit lines) under the
 * call's correlation id; for execution_error the guest sees only the fixed
 * message and that id (PROTOCOL.md section 6a).
 */
static void vfail(fetch_t *f, sb_status_t st, int policy, const char *fmt, va_list ap)
{
    sb_result_t res;

    sb_result_init(&res);
    sb_result_vfail(&res, st, fmt, ap);
    if (f->check_cb != NULL) {
        f->decision->allowed = 0;
        snprintf(f->decision->reason, sizeof(f->decision->reason), "%s", res.message);
        f->check_cb(f->arg, f->decision);
    } else {
        sb_logline_t l;
        sb_log_begin(&l, policy ? SB_LOG_WARN : SB_LOG_INFO, "egress.failed");
        sb_log_cstr(&l, "cid", f->cid);
        sb_log_cstr(&l, "runId", f->tok->run_id);
        if (f->import)
            sb_log_cstr(&l, "call", "import.fetch");
        sb_log_int(&l, "hop", f->hop);
        sb_log_cstr(&l, "host", f->url.host);
        sb_log_cstr(&l, "reason", res.message);
        sb_log_end(&l);
        if (f->import)
            sb_metrics_module(st == SB_E_RATE_LIMITED ? 1 : 2, 0);
        f->cb(f->arg, &res);
    }
    sb_result_dispose(&res);
    free_fetch(f);
}

__attribute__((format(printf, 3, 4))) static void fail(fetch_t *f, sb_status_t st, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vfail(f, st, 0, fmt, ap);
    va_end(ap);
}

/*
 * A refusal decided during the fetch, after the capability check: the name
 * or address policy, a redirect hop leaving the allowlist. It is an
 * execution_error like every other failure of the exchange (upstream's rule,
 * PROTOCOL.md section 6a): only the check before any I/O is forbidden, and
 * the guest never learns from a reason which private address a name
 * resolved to.
 */
__attribute__((format(printf, 2, 3))) static void deny(fetch_t *f, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vfail(f, f->check_cb != NULL ? SB_E_FORBIDDEN : SB_E_EXECUTION, 1, fmt, ap);
    va_end(ap);
}

static void on_deadline(h2o_timeout_entry_t *entry)
{
    fetch_t *f = H2O_STRUCT_FROM_MEMBER(fetch_t, deadline, entry);
    sb_metrics_egress("deadline exceeded", 0);
    fail(f, SB_E_EXECUTION, "http.fetch deadline exceeded (%llu ms)", (unsigned long long)f->ctx->conf->deadline_ms);
}

/* a hop to another origin: the guest's credentials and every header that carries a secret placeholder are dropped */
static void strip_credentials(fetch_t *f)
{
    size_t o = 0;
    for (size_t i = 0; i < f->nheaders; ++i) {
        const char *n = f->headers[i].name;
        if (strcmp(n, "authorization") == 0 || strcmp(n, "cookie") == 0 || strncmp(n, "proxy-", 6) == 0 || f->headers[i].nph != 0) {
            free_header(&f->headers[i]);
            continue;
        }
        f->headers[o++] = f->headers[i];
    }
    f->nheaders = o;
}

/*
 * Takes the typed call's request (call/call.h): the URL parsed once, the one
 * the check allowlisted, and the method, headers and body as decoded. Copied,
 * because the hop machine changes them (a 303 drops the body, a hop to
 * another origin drops credentials).
 */
static void take_request(fetch_t *f, const sb_call_fetch_t *c)
{
    f->url = c->url;
    memcpy(f->method, c->method, sizeof(f->method));
    for (size_t i = 0; i < c->nheaders && f->nheaders < MAX_REQ_HEADERS; ++i) {
        req_header_t *h = &f->headers[f->nheaders++];
        h->name = sb_mem_alloc(c->headers[i].name_len + 1);
        memcpy(h->name, c->headers[i].name, c->headers[i].name_len + 1);
        h->value = sb_mem_alloc(c->headers[i].value_len + 1);
        if (c->headers[i].value_len != 0)
            memcpy(h->value, c->headers[i].value, c->headers[i].value_len);
        h->value[c->headers[i].value_len] = '\0';
        h->value_len = c->headers[i].value_len;
        if ((h->nph = c->headers[i].nph) != 0) {
            h->ph = sb_mem_alloc(h->nph * sizeof(*h->ph));
            memcpy(h->ph, c->headers[i].ph, h->nph * sizeof(*h->ph));
            h->sec = sb_mem_calloc(h->nph, sizeof(*h->sec));
        }
    }
    if (c->body_len != 0) {
        f->body = sb_mem_alloc(c->body_len);
        memcpy(f->body, c->body, c->body_len);
    }
    f->body_len = c->body_len;
}

/*
 * import.fetch's request headers: what Deno asks a module server for, so that
 * a CDN that chooses its build by user agent (esm.sh) answers the build Deno
 * runs.
 */
#define IMPORT_ACCEPT "application/javascript, application/typescript, text/javascript, */*;q=0.8"
#define IMPORT_USER_AGENT "Deno/2.0 (sandbox-broker import.fetch)"

static void add_header(fetch_t *f, const char *name, const char *value)
{
    req_header_t *h;

    if (f->nheaders >= MAX_REQ_HEADERS)
        sb_fatal(__FILE__, __LINE__, "a fetch's own headers above MAX_REQ_HEADERS"); /* import.fetch adds 2 to none */
    h = &f->headers[f->nheaders++];
    h->name = sb_mem_strdup(name);
    h->value = sb_mem_strdup(value);
    h->value_len = strlen(value);
}

/* a header value with each placeholder replaced by the secret this hop granted it (decide_secrets) */
static size_t expanded_len(const req_header_t *h)
{
    size_t n = h->value_len;
    for (size_t k = 0; k < h->nph; ++k) {
        const char *v;
        size_t vlen;
        sb_secret_value(h->sec[k], &v, &vlen);
        n = n - h->ph[k].len + vlen;
    }
    return n;
}

static size_t write_value(char *out, const req_header_t *h)
{
    size_t o = 0, at = 0;
    for (size_t k = 0; k < h->nph; ++k) {
        const char *v;
        size_t vlen;
        memcpy(out + o, h->value + at, h->ph[k].start - at);
        o += h->ph[k].start - at;
        sb_secret_value(h->sec[k], &v, &vlen);
        memcpy(out + o, v, vlen);
        o += vlen;
        at = h->ph[k].start + h->ph[k].len;
    }
    memcpy(out + o, h->value + at, h->value_len - at);
    return o + h->value_len - at;
}

/*
 * Whether the connection may be parked after this hop (fetch/client.h): the
 * pool is on, a run owns it, and the request carries no body. A body the
 * upstream answered without reading to its end would otherwise be the start
 * of the next request it reads from the connection: bytes the guest chose,
 * ahead of a request of the broker's.
 */
static int may_park(const fetch_t *f)
{
    return f->ctx->conf->keepalive_pool_size != 0 && f->tok != NULL && f->body_len == 0;
}

/*
 * A run that holds secrets gets every answer redacted (PROTOCOL.md section 5,
 * "Secrets"), and redaction needs the value's bytes whole and in the clear:
 * such a run's requests ask for no content coding and no byte range (the
 * guest's accept-encoding, range and if-range are dropped; a coded or partial
 * answer is refused in succeed), and carry no method-override header that
 * would let a server run another method than the one the rules judged.
 */
#define GUARDED_ENCODING "accept-encoding: identity\r\n"

static int holds_secrets(const fetch_t *f)
{
    return f->tok != NULL && sb_secrets_count(f->tok->secrets) != 0;
}

static int guarded_drop(const char *name)
{
    static const char *const drop[] = {"accept-encoding",   "range", "if-range", "x-http-method-override", "x-http-method",
                                       "x-method-override", NULL};
    for (size_t i = 0; drop[i] != NULL; ++i)
        if (strcmp(drop[i], name) == 0)
            return 1;
    return 0;
}

/* why an answer to a run with secrets cannot be redacted (coded or partial), or NULL */
static const char *unredactable(const sb_http_response_t *res)
{
    if (res->status == 206)
        return "a partial (206) answer";
    for (size_t i = 0; i < res->nheaders; ++i) {
        const sb_http_header_t *h = &res->headers[i];
        if (h->name_len == 16 && memcmp(h->name, "content-encoding", 16) == 0) {
            const char *v = h->value;
            size_t n = h->value_len;
            while (n != 0 && (*v == ' ' || *v == '\t'))
                ++v, --n;
            while (n != 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
                --n;
            if (!h2o_lcstris(v, n, H2O_STRLIT("identity")))
                return "a content-coded answer";
        }
    }
    return NULL;
}

static void build_request(fetch_t *f)
{
    char host[SB_URL_MAX_HOST + 16];
    size_t cap = strlen(f->method) + f->url.target_len + sizeof(host) + 128 + f->body_len, len = 0;
    int with_length =
        f->body_len != 0 || strcmp(f->method, "POST") == 0 || strcmp(f->method, "PUT") == 0 || strcmp(f->method, "PATCH") == 0;

    int guarded = holds_secrets(f);

    for (size_t i = 0; i < f->nheaders; ++i)
        cap += strlen(f->headers[i].name) + expanded_len(&f->headers[i]) + 4;
    cap += sizeof(GUARDED_ENCODING);
    sb_url_host_header(&f->url, host, sizeof(host));
    wipe_request(f);
    f->request = sb_mem_alloc(cap);
    /* HTTP/1.1 connections persist by default (RFC 9112 section 9.3): "close" unless the worker may park this one */
    len += (size_t)snprintf(f->request + len, cap - len, "%s %s HTTP/1.1\r\nhost: %s\r\n%s%s", f->method, f->url.target, host,
                            may_park(f) ? "" : "connection: close\r\n", guarded ? GUARDED_ENCODING : "");
    f->request_secret = 0;
    for (size_t i = 0; i < f->nheaders; ++i) {
        if (guarded && guarded_drop(f->headers[i].name))
            continue;
        len += (size_t)snprintf(f->request + len, cap - len, "%s: ", f->headers[i].name);
        len += write_value(f->request + len, &f->headers[i]);
        f->request_secret |= f->headers[i].nph != 0;
        memcpy(f->request + len, "\r\n", 2);
        len += 2;
    }
    if (with_length)
        len += (size_t)snprintf(f->request + len, cap - len, "content-length: %zu\r\n", f->body_len);
    len += (size_t)snprintf(f->request + len, cap - len, "\r\n");
    if (f->body_len != 0)
        memcpy(f->request + len, f->body, f->body_len);
    len += f->body_len;
    f->request_len = len; /* the body may contain NULs: never strlen the request */
}

/*
 * Decides every placeholder for this hop (PROTOCOL.md section 5, "Secrets"),
 * before anything is resolved or sent: the run has the secret and the hop's
 * scheme, host and port, header, method and path are within its rules. A
 * refusal is forbidden with a reason naming the secret and the rule; the
 * value is never in it.
 */
static int decide_secrets(fetch_t *f)
{
    char reason[512];

    for (size_t i = 0; i < f->nheaders; ++i) {
        req_header_t *h = &f->headers[i];
        for (size_t k = 0; k < h->nph; ++k) {
            if (sb_secrets_decide(f->tok->secrets, h->value + h->ph[k].name, h->ph[k].name_len, h->name, &f->url, f->method,
                                  &h->sec[k], reason, sizeof(reason)) != SB_OK) {
                sb_metrics_egress("secret refused", 0);
                fail(f, SB_E_FORBIDDEN, "%s", reason);
                return 0;
            }
        }
    }
    /* the run's timeline: each secret placed on this hop, by name and host, never its value */
    if (f->store != NULL && sb_store_timeline_enabled(f->store)) {
        for (size_t i = 0; i < f->nheaders; ++i) {
            req_header_t *h = &f->headers[i];
            for (size_t k = 0; k < h->nph; ++k) {
                sb_logline_t l;
                sb_store_timeline_begin(&l, "secret");
                sb_log_cstr(&l, "cid", f->cid);
                sb_log_int(&l, "hop", f->hop);
                sb_log_str(&l, "name", h->value + h->ph[k].name, h->ph[k].name_len);
                sb_log_cstr(&l, "host", f->url.host);
                sb_log_cstr(&l, "header", h->name);
                sb_store_timeline_end(&l, f->store, f->tok->run_id, f->tok->expires_at_ms);
            }
        }
    }
    return 1;
}

/* ---- hops ------------------------------------------------------------------------------------------------------------ */

static void start_hop(fetch_t *f);

/* header bytes are ISO-8859-1 (RFC 9110 section 5.5): widen them to UTF-8 so any byte survives as text */
static void pack_latin1(msgpack_packer *pk, const char *s, size_t n)
{
    size_t wide = n;
    char small[512], *buf = small;
    size_t o = 0;
    for (size_t i = 0; i < n; ++i)
        if ((unsigned char)s[i] >= 0x80)
            ++wide;
    if (wide > sizeof(small))
        buf = sb_mem_alloc(wide);
    for (size_t i = 0; i < n; ++i) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            buf[o++] = (char)c;
        } else {
            buf[o++] = (char)(0xc0 | c >> 6);
            buf[o++] = (char)(0x80 | (c & 0x3f));
        }
    }
    msgpack_pack_str_with_body(pk, buf, o);
    if (buf != small)
        sb_mem_free(buf);
}

/*
 * Every occurrence of a run's secret in the answer, in any form the secrets
 * module knows, becomes its placeholder before the guest sees it
 * (PROTOCOL.md section 5): the status text, each header name and value, and
 * the whole body, which is complete here (a body over the cap was refused, so
 * no cut can leave half a value). The copies holding values are wiped.
 */
typedef struct st_redacted_t {
    char *reason;
    char *hdr[2 * SB_MAX_RESPONSE_HEADERS];
    char *body;
    size_t body_len;
} redacted_t;

static sb_status_t redact_one(const sb_secrets_t *s, const char **p, size_t *len, char **keep)
{
    char *out;
    size_t olen;
    sb_status_t st;
    if ((st = sb_secrets_redact(s, *p, *len, 2 * (size_t)SB_MAX_HTTP_BODY, &out, &olen)) != SB_OK)
        return st;
    if (out != NULL) {
        *keep = out;
        *p = out;
        *len = olen;
    }
    return SB_OK;
}

static sb_status_t redact_response(const sb_secrets_t *s, sb_http_response_t *res, redacted_t *r)
{
    sb_status_t st;
    const char *b = (const char *)res->body;
    size_t blen = res->body_len;

    memset(r, 0, sizeof(*r));
    if (sb_secrets_count(s) == 0)
        return SB_OK;
    if ((st = redact_one(s, &res->reason, &res->reason_len, &r->reason)) != SB_OK)
        return st;
    for (size_t i = 0; i < res->nheaders; ++i) {
        if ((st = redact_one(s, &res->headers[i].name, &res->headers[i].name_len, &r->hdr[2 * i])) != SB_OK ||
            (st = redact_one(s, &res->headers[i].value, &res->headers[i].value_len, &r->hdr[2 * i + 1])) != SB_OK)
            return st;
        /* a name that held a value is no header name once redacted (a placeholder is not a token): the header is dropped */
        if (r->hdr[2 * i] != NULL)
            res->headers[i].name_len = 0;
    }
    if (b != NULL && (st = redact_one(s, &b, &blen, &r->body)) != SB_OK)
        return st;
    if (r->body != NULL) {
        /* the exchange's copy held the value: wipe it, and answer the redacted one */
        explicit_bzero(res->body, res->body_len);
        r->body_len = blen;
    }
    return SB_OK;
}

static void free_redacted(redacted_t *r)
{
    sb_mem_free(r->reason);
    for (size_t i = 0; i < sizeof(r->hdr) / sizeof(r->hdr[0]); ++i)
        sb_mem_free(r->hdr[i]);
    sb_mem_free(r->body);
}

static void answer_module(fetch_t *f, sb_http_response_t *res, const char *body, size_t body_len);
static const char *find_header(sb_http_response_t *res, const char *name, size_t *len);

static void succeed(fetch_t *f, sb_http_response_t *res)
{
    sb_result_t out;
    msgpack_packer pk;
    size_t uniq[SB_MAX_RESPONSE_HEADERS], nuniq = 0, fetched = res->body_len, body_len = res->body_len;
    const char *body = res->body != NULL ? (const char *)res->body : "";
    redacted_t red;
    sb_status_t rst;
    const char *why;

    if (holds_secrets(f) && (why = unredactable(res)) != NULL) {
        fail(f, SB_E_EXECUTION, "%s to a run that holds secrets: it cannot be redacted", why);
        return;
    }
    if ((rst = redact_response(f->tok != NULL ? f->tok->secrets : NULL, res, &red)) != SB_OK) {
        free_redacted(&red);
        fail(f, SB_E_EXECUTION, "%s",
             rst == SB_E_TOO_LARGE ? "response body exceeds the cap once secrets are redacted"
                                   : "out of memory redacting the response");
        return;
    }
    /* the exchange owns res->body (and frees it): the redacted copy is ours */
    if (red.body != NULL) {
        body = red.body;
        body_len = red.body_len;
    }
    if (f->import) {
        answer_module(f, res, body, body_len);
        free_redacted(&red);
        return;
    }
    sb_result_init(&out);
    msgpack_packer_init(&pk, &out.value, msgpack_sbuffer_write);
    /* multi-valued headers are joined with ", " (set-cookie included), as upstream does */
    for (size_t i = 0; i < res->nheaders; ++i) {
        size_t j = 0;
        if (res->headers[i].name_len == 0)
            continue; /* dropped by redaction */
        while (j < nuniq && !(res->headers[uniq[j]].name_len == res->headers[i].name_len &&
                              memcmp(res->headers[uniq[j]].name, res->headers[i].name, res->headers[i].name_len) == 0))
            ++j;
        if (j == nuniq)
            uniq[nuniq++] = i;
    }
    msgpack_pack_map(&pk, 5);
    msgpack_pack_str_with_body(&pk, "status", 6);
    msgpack_pack_int(&pk, res->status);
    msgpack_pack_str_with_body(&pk, "statusText", 10);
    pack_latin1(&pk, res->reason, res->reason_len);
    msgpack_pack_str_with_body(&pk, "headers", 7);
    msgpack_pack_map(&pk, nuniq);
    for (size_t u = 0; u < nuniq; ++u) {
        const sb_http_header_t *h = &res->headers[uniq[u]];
        size_t total = 0, o = 0;
        char *joined;
        for (size_t i = uniq[u]; i < res->nheaders; ++i)
            if (res->headers[i].name_len == h->name_len && memcmp(res->headers[i].name, h->name, h->name_len) == 0)
                total += res->headers[i].value_len + 2;
        joined = sb_mem_alloc(total + 1);
        for (size_t i = uniq[u]; i < res->nheaders; ++i) {
            if (!(res->headers[i].name_len == h->name_len && memcmp(res->headers[i].name, h->name, h->name_len) == 0))
                continue;
            if (o != 0) {
                joined[o++] = ',';
                joined[o++] = ' ';
            }
            memcpy(joined + o, res->headers[i].value, res->headers[i].value_len);
            o += res->headers[i].value_len;
        }
        pack_latin1(&pk, h->name, h->name_len);
        pack_latin1(&pk, joined, o);
        sb_mem_free(joined);
    }
    /* JSON replies carry bin as base64 text: the field is named for what the guest reads */
    if (f->binary)
        msgpack_pack_str_with_body(&pk, "body", 4);
    else
        msgpack_pack_str_with_body(&pk, "bodyBase64", 10);
    msgpack_pack_bin_with_body(&pk, body, body_len);
    msgpack_pack_str_with_body(&pk, "truncated", 9);
    msgpack_pack_false(&pk);
    if (f->store != NULL)
        sb_store_quota_fetch_add(f->store, f->tok, fetched);
    f->cb(f->arg, &out);
    sb_result_dispose(&out);
    free_redacted(&red);
    free_fetch(f);
}

/* the module's bytes, counted against the run's module bytes cap: then the answer goes out, or the cap's refusal */
static void on_module_counted(void *arg, sb_status_t st, const char *why)
{
    fetch_t *f = arg;
    sb_result_t *out = f->module;

    if (st != SB_OK) {
        if (st == SB_E_RATE_LIMITED) {
            sb_metrics_quota_hit(why);
            fail(f, SB_E_RATE_LIMITED, "run quota exceeded: %s", why != NULL ? why : "module bytes per run");
        } else
            fail(f, SB_E_UNAVAILABLE, "%s", why != NULL ? why : "the token store is unavailable");
        return;
    }
    f->module = NULL;
    sb_metrics_module(0, f->module_len);
    f->cb(f->arg, out);
    sb_result_dispose(out);
    sb_mem_free(out);
    free_fetch(f);
}

/*
 * import.fetch's value (PROTOCOL.md section 6c): {url, status, contentType,
 * body | bodyBase64}, where url is the module's final URL (after the
 * redirects the broker followed and judged), so the supervisor resolves the
 * module's relative imports against it, as Deno does.
 */
static void answer_module(fetch_t *f, sb_http_response_t *res, const char *body, size_t body_len)
{
    msgpack_packer pk;
    char hp[SB_URL_MAX_HOST + 16], *url;
    size_t ulen, ctlen = 0;
    const char *ct = find_header(res, "content-type", &ctlen);
    sb_logline_t l;

    sb_url_hostport(&f->url, hp, sizeof(hp));
    ulen = strlen(hp) + f->url.target_len + 8;
    url = sb_mem_alloc(ulen + 1);
    ulen = (size_t)snprintf(url, ulen + 1, "%s://%s%.*s", f->url.scheme == SB_URL_HTTPS ? "https" : "http", hp,
                            (int)f->url.target_len, f->url.target);
    f->module = sb_mem_alloc(sizeof(*f->module));
    f->module_len = body_len;
    sb_result_init(f->module);
    msgpack_packer_init(&pk, &f->module->value, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    msgpack_pack_str_with_body(&pk, "url", 3);
    msgpack_pack_str_with_body(&pk, url, ulen);
    msgpack_pack_str_with_body(&pk, "status", 6);
    msgpack_pack_int(&pk, res->status);
    msgpack_pack_str_with_body(&pk, "contentType", 11);
    if (ct != NULL)
        pack_latin1(&pk, ct, ctlen);
    else
        msgpack_pack_nil(&pk);
    if (f->binary)
        msgpack_pack_str_with_body(&pk, "body", 4);
    else
        msgpack_pack_str_with_body(&pk, "bodyBase64", 10);
    msgpack_pack_bin_with_body(&pk, body, body_len);
    sb_mem_free(url);
    sb_log_begin(&l, SB_LOG_INFO, "import.module");
    sb_log_cstr(&l, "cid", f->cid);
    sb_log_cstr(&l, "runId", f->tok->run_id);
    sb_log_cstr(&l, "host", f->url.host);
    sb_log_int(&l, "port", f->url.port);
    sb_log_int(&l, "hops", f->hop + 1);
    sb_log_int(&l, "status", res->status);
    sb_log_int(&l, "bytes", (long long)body_len);
    sb_log_end(&l);
    if (f->store == NULL) {
        on_module_counted(f, SB_OK, NULL);
        return;
    }
    /* the exchange is over: from here the store's own timeout bounds the count, and the deadline must not end (and
     * free) the exchange while the store still holds it (it always calls back) */
    if (h2o_timeout_is_linked(&f->deadline))
        h2o_timeout_unlink(&f->deadline);
    sb_store_quota_modules(f->store, f->tok, 0, body_len, (int64_t)f->ctx->conf->import_max_modules,
                           (int64_t)f->ctx->conf->import_max_total_bytes, on_module_counted, f);
}

static int same_origin(const sb_url_t *a, const sb_url_t *b)
{
    return a->scheme == b->scheme && a->port == b->port && strcmp(a->host, b->host) == 0;
}

static const char *find_header(sb_http_response_t *res, const char *name, size_t *len)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < res->nheaders; ++i) {
        if (res->headers[i].name_len == n && memcmp(res->headers[i].name, name, n) == 0) {
            *len = res->headers[i].value_len;
            return res->headers[i].value;
        }
    }
    return NULL;
}

static void on_response(void *arg, const char *err, sb_http_response_t *res)
{
    fetch_t *f = arg;
    const char *loc;
    size_t loc_len;
    sb_url_t next;
    const char *why = NULL;
    char ipbuf[64];
    sb_status_t st_resolve;

    f->http = NULL;
    if (err != NULL) {
        sb_metrics_egress("upstream error", 0);
        fail(f, SB_E_EXECUTION, "http.fetch %s: %s", f->url.host, err);
        return;
    }
    sb_ip_format(&res->peer, ipbuf, sizeof(ipbuf));
    {
        sb_logline_t l;
        sb_log_begin(&l, SB_LOG_INFO, "egress.response");
        sb_log_cstr(&l, "cid", f->cid);
        sb_log_cstr(&l, "runId", f->tok->run_id);
        if (f->import)
            sb_log_cstr(&l, "call", "import.fetch");
        sb_log_int(&l, "hop", f->hop);
        sb_log_cstr(&l, "host", f->url.host);
        sb_log_cstr(&l, "address", ipbuf);
        sb_log_int(&l, "status", res->status);
        sb_log_int(&l, "bytes", (long long)res->body_len);
        sb_log_int(&l, "reused", res->reused);
        sb_log_end(&l);
    }
    loc = res->status >= 300 && res->status <= 399 ? find_header(res, "location", &loc_len) : NULL;
    if (f->store != NULL && f->tok != NULL && sb_store_timeline_enabled(f->store)) {
        /* the run's timeline: this hop, where it went (the pinned address) and what came back */
        sb_logline_t l;
        sb_store_timeline_begin(&l, "fetch");
        sb_log_cstr(&l, "cid", f->cid);
        sb_log_int(&l, "hop", f->hop);
        sb_log_cstr(&l, "method", f->method);
        sb_log_cstr(&l, "host", f->url.host);
        sb_log_int(&l, "port", f->url.port);
        sb_log_cstr(&l, "address", ipbuf);
        sb_log_int(&l, "status", res->status);
        sb_log_int(&l, "bytes", (long long)res->body_len);
        sb_log_int(&l, "redirect", loc != NULL);
        sb_store_timeline_end(&l, f->store, f->tok->run_id, f->tok->expires_at_ms);
    }
    /* RFC 9110 section 15.4: only a 3xx with Location is a redirect; anything else is the answer */
    if (loc == NULL) {
        succeed(f, res);
        return;
    }
    if (f->hop >= f->ctx->conf->max_redirects) {
        sb_metrics_egress("too many redirects", 0);
        fail(f, SB_E_EXECUTION, "too many redirects (> %u)", f->ctx->conf->max_redirects);
        return;
    }
    {
        /* a Location that carries a secret's value must not carry it to the next hop (which may be the guest's host) */
        char *rloc = NULL;
        size_t rlen = loc_len;
        if (f->tok != NULL && sb_secrets_count(f->tok->secrets) != 0 &&
            sb_secrets_redact(f->tok->secrets, loc, loc_len, SB_MAX_URL, &rloc, &rlen) != SB_OK) {
            sb_metrics_egress("invalid redirect", 0);
            fail(f, SB_E_EXECUTION, "invalid redirect Location: %s", "too long");
            return;
        }
        st_resolve = sb_url_resolve(&f->url, rloc != NULL ? rloc : loc, rlen, &next, &why);
        sb_mem_free(rloc);
    }
    if (st_resolve != SB_OK) {
        sb_metrics_egress("invalid redirect", 0);
        fail(f, SB_E_EXECUTION, "invalid redirect Location: %s", why != NULL ? why : "unparseable");
        return;
    }
    /* PROTOCOL.md section 6a: 303 -> GET (any method, HEAD too); 301/302 after anything but GET/HEAD -> GET; 307/308 keep both */
    if (res->status == 303 ||
        ((res->status == 301 || res->status == 302) && strcmp(f->method, "GET") != 0 && strcmp(f->method, "HEAD") != 0)) {
        memcpy(f->method, "GET", 4);
        sb_mem_free(f->body);
        f->body = NULL;
        f->body_len = 0;
    }
    /* credentials the guest meant for one origin never travel to another */
    if (!same_origin(&f->url, &next))
        strip_credentials(f);
    f->url = next;
    ++f->hop;
    start_hop(f);
}

/*
 * A parked connection serves this run only (the token's hash is the owner),
 * for the same scheme, host (the SNI and verified name) and port, and only
 * when its address is among the ones this hop has just resolved and
 * validated: the client checks that against the pins. Only idempotent
 * methods take one, since a parked connection the peer closed meanwhile
 * costs a retry (RFC 9112 section 9.3.1); only a request without a body
 * leaves its connection parked (may_park).
 */
static void set_reuse(fetch_t *f, sb_http_opts_t *o, sb_http_key_t *key)
{
    static const char *const idempotent[] = {"GET", "HEAD", "OPTIONS", "PUT", "DELETE", NULL};

    memset(key, 0, sizeof(*key));
    memcpy(key->owner, f->tok->hash, sizeof(key->owner));
    key->tls = f->url.scheme == SB_URL_HTTPS;
    key->port = f->url.port;
    snprintf(key->host, sizeof(key->host), "%s", f->url.host);
    o->pool = f->ctx->conns;
    o->key = key;
    o->may_park = may_park(f);
    for (size_t i = 0; idempotent[i] != NULL; ++i)
        if (strcmp(f->method, idempotent[i]) == 0)
            o->may_reuse = 1;
}

static void connect_pins(fetch_t *f)
{
    sb_http_opts_t o;
    sb_http_key_t key;

    if (f->check_cb != NULL) {
        /* egress-check stops here: the decision is made, nothing is connected */
        f->decision->allowed = 1;
        snprintf(f->decision->reason, sizeof(f->decision->reason), "allowed");
        f->check_cb(f->arg, f->decision);
        free_fetch(f);
        return;
    }
    build_request(f);
    memset(&o, 0, sizeof(o));
    o.loop = f->ctx->loop;
    o.addrs = f->pins;
    o.naddrs = f->npins;
    o.port = f->url.port;
    o.ssl_ctx = f->url.scheme == SB_URL_HTTPS ? f->ctx->conf->ssl_ctx : NULL;
    o.sni = f->url.host;
    o.request = f->request;
    o.request_len = f->request_len;
    o.head_request = strcmp(f->method, "HEAD") == 0;
    o.max_body = f->import ? f->ctx->conf->import_max_module_bytes : f->ctx->conf->max_body;
    o.connect_timeout = &f->ctx->connect_timeout;
    o.wipe = f->tok != NULL && sb_secrets_count(f->tok->secrets) != 0;
    if (f->ctx->conf->keepalive_pool_size != 0 && f->tok != NULL)
        set_reuse(f, &o, &key);
    {
        /* NULL means the callback already ran (and may have freed f): touch nothing */
        sb_http_t *h = sb_http_start(&o, on_response, f);
        if (h != NULL)
            f->http = h;
    }
}

/* validates every address; one denied answer denies the host */
static int validate(fetch_t *f, const sb_ip_t *addrs, size_t n)
{
    int all_ok = 1;
    char answers[1024];
    size_t alen = 0;
    const char *first_rule = NULL;
    char first_ip[64] = "";

    answers[0] = '\0';
    for (size_t i = 0; i < n; ++i) {
        const char *rule = "";
        int ok = sb_egress_check_ip(f->ctx->conf->policy, &addrs[i], &rule);
        char ip[64];
        sb_ip_format(&addrs[i], ip, sizeof(ip));
        sb_metrics_egress(rule, ok);
        if (f->decision != NULL && f->decision->nanswers < sizeof(f->decision->answers) / sizeof(f->decision->answers[0])) {
            sb_egress_answer_t *a = &f->decision->answers[f->decision->nanswers++];
            a->ip = addrs[i];
            a->allowed = ok;
            a->rule = rule;
        }
        if (alen < sizeof(answers) - 1)
            alen += (size_t)snprintf(answers + alen, sizeof(answers) - alen, "%s%s=%s(%s)", i ? "," : "", ip, ok ? "allow" : "deny",
                                     rule);
        if (!ok && all_ok) {
            all_ok = 0;
            first_rule = rule;
            memcpy(first_ip, ip, sizeof(first_ip));
        }
    }
    if (alen >= sizeof(answers))
        alen = sizeof(answers) - 1;
    if (f->check_cb == NULL) {
        sb_logline_t l;
        sb_log_begin(&l, all_ok ? SB_LOG_INFO : SB_LOG_WARN, "egress.decision");
        sb_log_cstr(&l, "cid", f->cid);
        sb_log_cstr(&l, "runId", f->tok->run_id);
        if (f->import)
            sb_log_cstr(&l, "call", "import.fetch");
        sb_log_int(&l, "hop", f->hop);
        sb_log_cstr(&l, "host", f->url.host);
        sb_log_int(&l, "port", f->url.port);
        sb_log_str(&l, "answers", answers, alen);
        sb_log_cstr(&l, "decision", all_ok ? "allow" : "deny");
        if (!all_ok)
            sb_log_cstr(&l, "reason", first_rule);
        sb_log_end(&l);
    }
    if (!all_ok) {
        if (f->url.host_kind == SB_URL_HOST_NAME)
            deny(f, "http.fetch host \"%s\" resolves to a blocked address %s (%s)", f->url.host, first_ip, first_rule);
        else
            deny(f, "http.fetch address %s is blocked (%s)", first_ip, first_rule);
        return 0;
    }
    memcpy(f->pins, addrs, n * sizeof(*addrs));
    f->npins = n;
    return 1;
}

static void on_resolved(void *arg, sb_status_t st, const sb_dns_result_t *res)
{
    fetch_t *f = arg;
    f->dns = NULL;
    if (st != SB_OK) {
        sb_metrics_egress("dns failure", 0);
        fail(f, SB_E_EXECUTION, "DNS resolution failed for \"%s\": %s", f->url.host, res->error);
        return;
    }
    if (validate(f, res->addrs, res->naddrs))
        connect_pins(f);
}

static void start_hop(fetch_t *f)
{
    const char *rule = NULL;

    if (f->decision != NULL)
        f->decision->url = f->url;
    /* a module's redirect hop must be in the run's import list, as its first URL was; net plays no part */
    if (f->hop != 0 && f->import) {
        if (!sb_authz_import_allows(f->tok->manifest, &f->url)) {
            char why[512];
            sb_authz_import_reason(&f->url, 1, why, sizeof(why));
            sb_metrics_egress("redirect leaves the import allowlist", 0);
            deny(f, "%s", why);
            return;
        }
        if (sb_authz_import_needs_decision(f->tok->manifest)) {
            char hp[SB_URL_MAX_HOST + 16];
            sb_url_hostport(&f->url, hp, sizeof(hp));
            sb_metrics_egress("redirect needs a decision", 0);
            deny(f, "import.fetch redirect to host \"%s\" matches a decide rule (redirects are not sent to the decider)", hp);
            return;
        }
    } else if (f->hop != 0 && f->tok != NULL) {
        /* the first URL passed the capability check; every redirect target must pass it again */
        sb_net_verdict_t v = sb_authz_fetch_verdict(f->tok->manifest, &f->url, f->method);
        if (v != SB_NET_OK) {
            char why[512];
            sb_authz_fetch_reason(v, &f->url, f->method, 1, why, sizeof(why));
            sb_metrics_egress("redirect leaves the net allowlist", 0);
            deny(f, "%s", why);
            return;
        }
        /*
         * A decide rule holds calls for the decider, which saw only the first
         * URL: a redirect hop a rule names is refused rather than followed
         * undecided (PROTOCOL.md section 5a), whatever the first hop was
         */
        if (sb_authz_fetch_needs_decision(f->tok->manifest, &f->url, f->method)) {
            char hp[SB_URL_MAX_HOST + 16];
            sb_url_hostport(&f->url, hp, sizeof(hp));
            sb_metrics_egress("redirect needs a decision", 0);
            deny(f, "http.fetch redirect to host \"%s\" matches a decide rule (redirects are not sent to the decider)", hp);
            return;
        }
    }
    /* the secrets, decided for this hop's origin, method and path before anything is resolved or sent */
    if (f->tok != NULL && !decide_secrets(f))
        return;
    if (f->url.host_kind == SB_URL_HOST_NAME) {
        if (!sb_egress_check_name(f->ctx->conf->policy, f->url.host, &rule)) {
            sb_metrics_egress(rule, 0);
            deny(f, "http.fetch host \"%s\" is blocked (%s)", f->url.host, rule);
            return;
        }
        {
            /* NULL means the callback already ran (and may have freed f): touch nothing */
            sb_resolve_t *q = sb_resolve(f->ctx->resolver, f->url.host, on_resolved, f);
            if (q != NULL)
                f->dns = q;
        }
        return;
    }
    {
        sb_ip_t ip;
        memset(&ip, 0, sizeof(ip));
        if (f->url.host_kind == SB_URL_HOST_IPV4) {
            ip.family = AF_INET;
            memcpy(ip.addr, &f->url.addr.v4, 4);
        } else {
            ip.family = AF_INET6;
            memcpy(ip.addr, &f->url.addr.v6, 16);
        }
        if (f->url.scheme == SB_URL_HTTPS && f->check_cb == NULL) {
            fail(f, SB_E_EXECUTION, "https to an IP-literal host is not supported (no name to verify)");
            return;
        }
        if (validate(f, &ip, 1))
            connect_pins(f);
    }
}

static void on_fetch_quota(void *arg, sb_status_t st, const char *why)
{
    fetch_t *f = arg;
    if (st != SB_OK) {
        if (st == SB_E_RATE_LIMITED) {
            const char *q = why != NULL ? why : f->import ? "modules per run" : "fetched bytes per run";
            sb_metrics_quota_hit(q);
            fail(f, SB_E_RATE_LIMITED, "run quota exceeded: %s", q);
        } else
            fail(f, SB_E_UNAVAILABLE, "%s", why != NULL ? why : "the token store is unavailable");
        return;
    }
    /* one deadline for the whole exchange: every hop, every connect, every byte */
    h2o_timeout_link(f->ctx->loop, &f->ctx->deadline, &f->deadline);
    start_hop(f);
}

void sb_fetch_start(sb_fetch_ctx_t *ctx, sb_store_conn_t *store, sb_token_t *tok, const sb_call_t *call, sb_dispatch_cb cb,
                    void *arg)
{
    fetch_t *f;

    if (call->fetch == NULL) {
        sb_answer_error(cb, arg, SB_E_BAD_ARGS, "http.fetch url is invalid: missing or not a string");
        return;
    }
    f = sb_mem_calloc(1, sizeof(*f));
    ++ctx->refs;
    f->ctx = ctx;
    f->store = store;
    f->binary = call->binary;
    if (call->cid != NULL)
        snprintf(f->cid, sizeof(f->cid), "%s", call->cid);
    f->cb = cb;
    f->arg = arg;
    sb_token_addref(tok);
    f->tok = tok;
    f->deadline.cb = on_deadline;
    take_request(f, call->fetch);
    if (call->m.kind == SB_MK_IMPORT) {
        /* the broker's own headers, the same on every hop: no credential, nothing of the guest's */
        f->import = 1;
        add_header(f, "accept", IMPORT_ACCEPT);
        add_header(f, "user-agent", IMPORT_USER_AGENT);
        if (store != NULL) {
            /* counted before anything is resolved: a module over the run's count is never fetched */
            sb_store_quota_modules(store, tok, 1, 0, (int64_t)ctx->conf->import_max_modules,
                                   (int64_t)ctx->conf->import_max_total_bytes, on_fetch_quota, f);
            return;
        }
    } else if (store != NULL) {
        sb_store_quota_fetch_check(store, tok, on_fetch_quota, f);
        return;
    }
    on_fetch_quota(f, SB_OK, NULL);
}

void sb_egress_check(sb_fetch_ctx_t *ctx, const sb_manifest_t *m, const char *url, size_t len, const char *method,
                     sb_egress_check_cb cb, void *arg)
{
    fetch_t *f = sb_mem_calloc(1, sizeof(*f));
    const char *why = NULL;

    ++ctx->refs;
    f->ctx = ctx;
    f->check_cb = cb;
    f->arg = arg;
    f->decision = sb_mem_calloc(1, sizeof(*f->decision));
    f->deadline.cb = on_deadline;
    if (sb_url_parse(url, len, &f->url, &why) != SB_OK) {
        f->decision->allowed = 0;
        snprintf(f->decision->reason, sizeof(f->decision->reason), "url is invalid: %s", why);
        cb(arg, f->decision);
        free_fetch(f);
        return;
    }
    f->decision->url = f->url;
    snprintf(f->method, sizeof(f->method), "%s", method != NULL ? method : "GET");
    if (m != NULL) {
        sb_net_verdict_t v = sb_authz_fetch_verdict(m, &f->url, f->method);
        sb_authz_fetch_reason(v, &f->url, f->method, 0, f->decision->rule, sizeof(f->decision->rule));
        if (v != SB_NET_OK) {
            fail(f, SB_E_FORBIDDEN, "%s", f->decision->rule);
            return;
        }
    }
    start_hop(f);
}
