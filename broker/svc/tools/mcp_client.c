/*
 * The MCP Streamable HTTP client (mcp_client.h).
 *
 * Session life cycle, per upstream and worker loop:
 *
 *   IDLE --first call--> INIT (POST initialize) --> NOTIFY (POST notifications/initialized) --> READY
 *     ^                    |  failure: every waiting call fails           |
 *     +--------------------+----------------------------------------------+  404/400 with our session id
 *
 * Calls wait in `waiting` until the session is READY, then each is one POST
 * in `running`. A call never starts from inside sb_mcp_call: a zero timer
 * ("kick") runs the queue from the loop, so callbacks never re-enter the
 * caller's stack.
 *
 * Why 400 as well as 404 re-initialises: the transport spec says a server
 * that ended a session answers 404 to its id, and a client MUST then start a
 * new session (MCP 2025-06-18, basic/transports, "Session Management", items
 * 3-4). The reference servers built on the TypeScript SDK (server-everything
 * among them) keep sessions in memory and, after a restart, answer an unknown
 * id with 400 "No valid session ID provided" instead. Either answer to a
 * request that carried our session id re-initialises, at most once per call,
 * so a genuine 400 costs one extra initialize and then fails as it would.
 */
#include <stdio.h>
#include <string.h>
#include "fetch/client.h"
#include "call/url.h"
#include "obs/log.h"
#include "sb/value.h"
#include "svc/tools/mcp_client.h"
#include "svc/tools/mcp_wire.h"
#include "util/util.h"

enum { S_IDLE = 0, S_INIT, S_NOTIFY, S_READY };

/* room around a message's cap for the SSE framing and for notifications sent before the response */
#define BODY_SLACK (256u * 1024u)
/* an InitializeResult: capabilities, server info, instructions */
#define MAX_INIT_MSG (256u * 1024u)
/* the client identity sent in initialize (lifecycle, "Initialization") */
#define CLIENT_NAME "sandbox-broker"
#define CLIENT_VERSION "0.1.0"

static const char timed_out[] = "timed out";
static const char shutting_down[] = "the worker is shutting down";

typedef struct st_exchange_t exchange_t;
typedef void (*exchange_done_cb)(exchange_t *ex, const char *err, sb_http_response_t *res);

/* one POST: its connection, its timer and its request bytes (which must outlive the write) */
struct st_exchange_t {
    sb_mcp_t *m;
    sb_http_t *http;
    h2o_timeout_entry_t timer;
    sb_buf_t request; /* capped at SB_MCP_MAX_REQUEST */
    size_t max_body;
    int64_t id;   /* the JSON-RPC id sent, 0 for a notification */
    int with_sid; /* the request carried Mcp-Session-Id */
    int starting; /* inside sb_http_start */
    const char *early_err;
    exchange_done_cb done;
};

struct st_sb_mcp_call_t {
    h2o_linklist_t link; /* in waiting or running */
    sb_mcp_t *m;
    const char *method;
    json_t *params;
    size_t max_msg;
    sb_mcp_cb cb;
    void *arg;
    exchange_t ex;
    uint64_t generation; /* the session it was sent on */
    int retried;
};

struct st_sb_mcp_t {
    h2o_loop_t *loop;
    char *url_text;
    sb_url_t url;
    char host_header[SB_URL_MAX_HOST + 16];
    sb_ip_t addrs[2];
    size_t naddrs;
    uint64_t timeout_ms;
    h2o_timeout_t timeout, zero;
    h2o_timeout_entry_t kick;
    int state;
    uint64_t generation;
    int64_t next_id;
    char sid[SB_MCP_MAX_SESSION_ID + 1];
    size_t sid_len;
    const char *version; /* one of supported_versions once negotiated */
    exchange_t init;     /* the initialize, then the initialized notification */
    h2o_linklist_t waiting, running;
};

/*
 * Versions whose Streamable HTTP transport we speak (lifecycle, "Version
 * Negotiation": the server answers the version we asked for or another it
 * supports; a client that does not support the answer SHOULD disconnect).
 * 2024-11-05 and earlier used the HTTP+SSE transport, which this is not.
 */
static const char *const supported_versions[] = {"2025-11-25", SB_MCP_PROTOCOL_VERSION, "2025-03-26", NULL};

static void pump(sb_mcp_t *m);

/* ---- one exchange --------------------------------------------------------------------------------------------------- */

static void exchange_release(exchange_t *ex)
{
    if (ex->http != NULL) {
        sb_http_cancel(ex->http);
        ex->http = NULL;
    }
    if (h2o_timeout_is_linked(&ex->timer))
        h2o_timeout_unlink(&ex->timer);
    sb_buf_free(&ex->request);
}

static void on_http(void *arg, const char *err, sb_http_response_t *res)
{
    exchange_t *ex = arg;

    if (ex->starting) {
        /* failed before sb_http_start returned: exchange_start reports it */
        ex->early_err = err != NULL ? err : "connect failed";
        return;
    }
    ex->http = NULL;
    if (h2o_timeout_is_linked(&ex->timer))
        h2o_timeout_unlink(&ex->timer);
    ex->done(ex, err, res);
}

static void on_exchange_timeout(h2o_timeout_entry_t *entry)
{
    exchange_t *ex = H2O_STRUCT_FROM_MEMBER(exchange_t, timer, entry);

    if (ex->http != NULL) {
        sb_http_cancel(ex->http);
        ex->http = NULL;
    }
    ex->done(ex, timed_out, NULL);
}

/* POSTs one JSON-RPC message; `done` runs exactly once, possibly before this returns (a connect that fails at once) */
static void exchange_start(sb_mcp_t *m, exchange_t *ex, const char *body, size_t body_len, int64_t id, size_t max_msg,
                           exchange_done_cb done)
{
    sb_http_opts_t o;
    sb_status_t st;

    exchange_release(ex);
    ex->m = m;
    ex->id = id;
    ex->done = done;
    ex->timer.cb = on_exchange_timeout;
    ex->max_body = max_msg + BODY_SLACK;
    ex->with_sid = m->sid_len != 0 && m->state != S_INIT;
    /* transports, "Session Management" item 2 and "Protocol Version Header": every request after initialize
     * carries the session id (when the server gave one) and names the negotiated version */
    sb_buf_init(&ex->request, SB_MCP_MAX_REQUEST);
    st = sb_mcp_build_request(&ex->request, m->url.target, m->host_header, CLIENT_NAME "/" CLIENT_VERSION,
                              ex->with_sid ? m->sid : NULL, m->version != NULL && m->state != S_INIT ? m->version : NULL, body,
                              body_len);
    if (st != SB_OK) {
        done(ex, st == SB_E_TOO_LARGE ? "the request exceeds its size cap" : "out of memory", NULL);
        return;
    }

    memset(&o, 0, sizeof(o));
    o.loop = m->loop;
    o.addrs = m->addrs;
    o.naddrs = m->naddrs;
    o.port = m->url.port;
    o.request = ex->request.base;
    o.request_len = ex->request.len;
    o.max_body = ex->max_body;
    o.connect_timeout = &m->timeout;
    ex->starting = 1;
    ex->early_err = NULL;
    ex->http = sb_http_start(&o, on_http, ex);
    ex->starting = 0;
    if (ex->http == NULL) {
        done(ex, ex->early_err != NULL ? ex->early_err : "connect failed", NULL);
        return;
    }
    h2o_timeout_link(m->loop, &m->timeout, &ex->timer);
}

static const sb_http_header_t *find_header(const sb_http_response_t *res, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < res->nheaders; ++i)
        if (res->headers[i].name_len == n && memcmp(res->headers[i].name, name, n) == 0)
            return &res->headers[i];
    return NULL;
}

/* "tools/call: connection refused", "initialize: timed out after 5000 ms" */
static void describe_transport_error(const sb_mcp_t *m, const char *what, const char *err, char *out, size_t outsz)
{
    if (err == timed_out)
        snprintf(out, outsz, "%s: no answer within %llu ms", what, (unsigned long long)m->timeout_ms);
    else
        snprintf(out, outsz, "%s: %s", what, err);
}

/* "tools/call: upstream answered HTTP 500 (JSON-RPC error -32603: ...)" */
static void describe_status(const char *what, const sb_http_response_t *res, char *out, size_t outsz)
{
    char hint[300];
    if (sb_mcp_error_hint((const char *)res->body, res->body_len, hint, sizeof(hint)) != 0)
        snprintf(out, outsz, "%s: upstream answered HTTP %d (%s)", what, res->status, hint);
    else
        snprintf(out, outsz, "%s: upstream answered HTTP %d", what, res->status);
}

/*
 * The JSON-RPC answer to exchange `ex` in a 200 response, packed into out.
 * We never send Accept-Encoding, so a content coding is an upstream fault.
 */
static sb_status_t read_answer(const char *what, exchange_t *ex, sb_http_response_t *res, size_t max_msg, msgpack_sbuffer *out,
                               char *detail, size_t detailsz)
{
    const sb_http_header_t *ct = find_header(res, "content-type"), *ce = find_header(res, "content-encoding");
    char why[400];
    sb_status_t st;

    if (ce != NULL && !(ce->value_len == 8 && memcmp(ce->value, "identity", 8) == 0)) {
        snprintf(detail, detailsz, "%s: upstream answered with a Content-Encoding we did not ask for", what);
        return SB_E_EXECUTION;
    }
    st = sb_mcp_pick_response(ct != NULL ? sb_mcp_body_kind(ct->value, ct->value_len) : SB_MCP_BODY_OTHER, (const char *)res->body,
                              res->body_len, ex->id, max_msg, out, why, sizeof(why));
    if (st != SB_OK) {
        snprintf(detail, detailsz, "%s: %s", what, why);
        return SB_E_EXECUTION;
    }
    return SB_OK;
}

/* ---- the session ---------------------------------------------------------------------------------------------------- */

static void log_session(const sb_mcp_t *m, const char *event, const char *reason)
{
    sb_logline_t l;
    sb_log_begin(&l, reason != NULL ? SB_LOG_WARN : SB_LOG_INFO, event);
    sb_log_cstr(&l, "upstream", m->url_text);
    if (m->version != NULL && reason == NULL)
        sb_log_cstr(&l, "protocolVersion", m->version);
    sb_log_int(&l, "session", (long long)m->generation);
    if (reason != NULL)
        sb_log_cstr(&l, "reason", reason);
    sb_log_end(&l);
}

static void call_finish(sb_mcp_call_t *c, sb_status_t st, const char *detail, const char *result, size_t len)
{
    if (h2o_linklist_is_linked(&c->link))
        h2o_linklist_unlink(&c->link);
    exchange_release(&c->ex);
    c->cb(c->arg, st, detail, result, len);
    json_decref(c->params);
    sb_mem_free(c);
}

/* fails every call that waits for a session (not those already sent on an earlier one) */
static void fail_waiting(sb_mcp_t *m, const char *detail)
{
    h2o_linklist_t doomed;

    /* a callback may queue new calls: those wait for the next attempt, they are not failed here */
    h2o_linklist_init_anchor(&doomed);
    h2o_linklist_insert_list(&doomed, &m->waiting);
    while (!h2o_linklist_is_empty(&doomed)) {
        sb_mcp_call_t *c = H2O_STRUCT_FROM_MEMBER(sb_mcp_call_t, link, doomed.next);
        call_finish(c, SB_E_EXECUTION, detail, NULL, 0);
    }
}

static void init_failed(sb_mcp_t *m, const char *detail)
{
    exchange_release(&m->init);
    m->state = S_IDLE;
    m->sid_len = 0;
    m->sid[0] = '\0';
    m->version = NULL;
    log_session(m, "tools.session_failed", detail);
    fail_waiting(m, detail);
    /* calls queued by those callbacks get a fresh attempt, from the loop (never recursively from here) */
    if (!h2o_linklist_is_empty(&m->waiting) && !h2o_timeout_is_linked(&m->kick))
        h2o_timeout_link(m->loop, &m->zero, &m->kick);
}

static void on_initialized_answer(exchange_t *ex, const char *err, sb_http_response_t *res)
{
    sb_mcp_t *m = ex->m;
    char detail[512];

    if (err != NULL) {
        describe_transport_error(m, "notifications/initialized", err, detail, sizeof(detail));
        init_failed(m, detail);
        return;
    }
    /* transports, "Sending Messages to the Server" item 4: an accepted notification is 202 with no body */
    if (res->status < 200 || res->status > 299) {
        describe_status("notifications/initialized", res, detail, sizeof(detail));
        init_failed(m, detail);
        return;
    }
    exchange_release(&m->init);
    m->state = S_READY;
    log_session(m, "tools.session", NULL);
    pump(m);
}

/* a session id we will echo in a header: visible ASCII only (transports, "Session Management" item 1) */
static int valid_session_id(const char *s, size_t len)
{
    if (len == 0 || len > SB_MCP_MAX_SESSION_ID)
        return 0;
    for (size_t i = 0; i < len; ++i)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
            return 0;
    return 1;
}

static void on_initialize_answer(exchange_t *ex, const char *err, sb_http_response_t *res)
{
    sb_mcp_t *m = ex->m;
    msgpack_sbuffer out;
    msgpack_zone zone;
    msgpack_object result;
    const msgpack_object *ver, *caps;
    const sb_http_header_t *sid;
    const char *why = NULL;
    char detail[512];
    json_t *note;
    char *text;

    msgpack_sbuffer_init(&out);
    msgpack_zone_init(&zone, 1024);
    if (err != NULL) {
        describe_transport_error(m, "initialize", err, detail, sizeof(detail));
        goto Fail;
    }
    if (res->status != 200) {
        describe_status("initialize", res, detail, sizeof(detail));
        goto Fail;
    }
    if (read_answer("initialize", ex, res, MAX_INIT_MSG, &out, detail, sizeof(detail)) != SB_OK)
        goto Fail;
    if (sb_mp_decode((const uint8_t *)out.data, out.size, &zone, &result, &why) != SB_OK) {
        snprintf(detail, sizeof(detail), "initialize: unreadable result");
        goto Fail;
    }
    ver = sb_mp_get(&result, "protocolVersion");
    m->version = NULL;
    for (size_t i = 0; ver != NULL && supported_versions[i] != NULL; ++i)
        if (sb_mp_str_is(ver, supported_versions[i]))
            m->version = supported_versions[i];
    if (m->version == NULL) {
        char v[64];
        if (ver != NULL && ver->type == MSGPACK_OBJECT_STR)
            sb_mcp_sanitize(ver->via.str.ptr, ver->via.str.size, 40, v, sizeof(v));
        else
            memcpy(v, "(none)", 7);
        snprintf(detail, sizeof(detail), "initialize: the server speaks protocol version %s, which we do not support", v);
        goto Fail;
    }
    /* lifecycle, "Capability Negotiation": a server with tools declares the tools capability */
    caps = sb_mp_get(&result, "capabilities");
    if (caps == NULL || caps->type != MSGPACK_OBJECT_MAP || sb_mp_get(caps, "tools") == NULL) {
        snprintf(detail, sizeof(detail), "initialize: the server does not offer the tools capability");
        goto Fail;
    }
    if ((sid = find_header(res, "mcp-session-id")) != NULL) {
        if (!valid_session_id(sid->value, sid->value_len)) {
            snprintf(detail, sizeof(detail),
                     "initialize: the Mcp-Session-Id header is empty, longer than %u bytes or not "
                     "visible ASCII",
                     SB_MCP_MAX_SESSION_ID);
            goto Fail;
        }
        memcpy(m->sid, sid->value, sid->value_len);
        m->sid[sid->value_len] = '\0';
        m->sid_len = sid->value_len;
    } else {
        m->sid_len = 0; /* a server without sessions (transports: "MAY assign a session ID") */
    }
    msgpack_zone_destroy(&zone);
    msgpack_sbuffer_destroy(&out);

    /* lifecycle, "Initialization": after the result, the client MUST send notifications/initialized */
    m->state = S_NOTIFY;
    note = json_pack("{s:s, s:s}", "jsonrpc", "2.0", "method", "notifications/initialized");
    text = note != NULL ? json_dumps(note, JSON_COMPACT) : NULL;
    json_decref(note);
    if (text == NULL)
        sb_fatal(__FILE__, __LINE__, "out of memory");
    exchange_start(m, &m->init, text, strlen(text), 0, 0, on_initialized_answer);
    sb_mem_free_foreign(text);
    return;
Fail:
    msgpack_zone_destroy(&zone);
    msgpack_sbuffer_destroy(&out);
    init_failed(m, detail);
}

static void start_init(sb_mcp_t *m)
{
    json_t *req;
    char *text;
    int64_t id = m->next_id++;

    m->state = S_INIT;
    ++m->generation;
    m->sid_len = 0;
    m->sid[0] = '\0';
    m->version = NULL;
    /* lifecycle, "Initialization": protocolVersion, capabilities (we offer no client features), clientInfo */
    req = json_pack("{s:s, s:I, s:s, s:{s:s, s:{}, s:{s:s, s:s}}}", "jsonrpc", "2.0", "id", (json_int_t)id, "method", "initialize",
                    "params", "protocolVersion", SB_MCP_PROTOCOL_VERSION, "capabilities", "clientInfo", "name", CLIENT_NAME,
                    "version", CLIENT_VERSION);
    text = req != NULL ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (text == NULL)
        sb_fatal(__FILE__, __LINE__, "out of memory");
    exchange_start(m, &m->init, text, strlen(text), id, MAX_INIT_MSG, on_initialize_answer);
    sb_mem_free_foreign(text);
}

/* ---- calls ---------------------------------------------------------------------------------------------------------- */

static void on_call_answer(exchange_t *ex, const char *err, sb_http_response_t *res)
{
    sb_mcp_call_t *c = H2O_STRUCT_FROM_MEMBER(sb_mcp_call_t, ex, ex);
    sb_mcp_t *m = c->m;
    msgpack_sbuffer out;
    char detail[512];

    if (err != NULL) {
        describe_transport_error(m, c->method, err, detail, sizeof(detail));
        call_finish(c, SB_E_EXECUTION, detail, NULL, 0);
        return;
    }
    if ((res->status == 404 || res->status == 400) && ex->with_sid && !c->retried) {
        /* the session is gone (see the top of this file): a new one, and this call again, once */
        c->retried = 1;
        h2o_linklist_unlink(&c->link);
        exchange_release(&c->ex);
        if (c->generation == m->generation && m->state == S_READY) {
            char why[64];
            snprintf(why, sizeof(why), "HTTP %d to the session id", res->status);
            log_session(m, "tools.session_expired", why);
            m->state = S_IDLE;
            m->sid_len = 0;
            m->sid[0] = '\0';
        }
        h2o_linklist_insert(&m->waiting, &c->link);
        pump(m);
        return;
    }
    if (res->status != 200) {
        describe_status(c->method, res, detail, sizeof(detail));
        call_finish(c, SB_E_EXECUTION, detail, NULL, 0);
        return;
    }
    msgpack_sbuffer_init(&out);
    if (read_answer(c->method, ex, res, c->max_msg, &out, detail, sizeof(detail)) != SB_OK)
        call_finish(c, SB_E_EXECUTION, detail, NULL, 0);
    else
        call_finish(c, SB_OK, NULL, out.data, out.size);
    msgpack_sbuffer_destroy(&out);
}

static void start_call(sb_mcp_t *m, sb_mcp_call_t *c)
{
    int64_t id = m->next_id++;
    json_t *req;
    char *text;

    c->generation = m->generation;
    h2o_linklist_insert(&m->running, &c->link);
    req = json_pack("{s:s, s:I, s:s}", "jsonrpc", "2.0", "id", (json_int_t)id, "method", c->method);
    if (req == NULL || (c->params != NULL && json_object_set(req, "params", c->params) != 0) ||
        (text = json_dumps(req, JSON_COMPACT)) == NULL)
        sb_fatal(__FILE__, __LINE__, "out of memory");
    json_decref(req);
    exchange_start(m, &c->ex, text, strlen(text), id, c->max_msg, on_call_answer);
    sb_mem_free_foreign(text);
}

static void pump(sb_mcp_t *m)
{
    if (m->state == S_IDLE && !h2o_linklist_is_empty(&m->waiting)) {
        start_init(m);
        return;
    }
    while (m->state == S_READY && !h2o_linklist_is_empty(&m->waiting)) {
        sb_mcp_call_t *c = H2O_STRUCT_FROM_MEMBER(sb_mcp_call_t, link, m->waiting.next);
        h2o_linklist_unlink(&c->link);
        start_call(m, c);
    }
}

static void on_kick(h2o_timeout_entry_t *entry)
{
    sb_mcp_t *m = H2O_STRUCT_FROM_MEMBER(sb_mcp_t, kick, entry);
    pump(m);
}

sb_mcp_call_t *sb_mcp_call(sb_mcp_t *m, const char *method, json_t *params, size_t max_msg, sb_mcp_cb cb, void *arg)
{
    sb_mcp_call_t *c = sb_mem_calloc(1, sizeof(*c));

    c->m = m;
    c->method = method;
    c->params = params;
    c->max_msg = max_msg;
    c->cb = cb;
    c->arg = arg;
    h2o_linklist_insert(&m->waiting, &c->link);
    if (!h2o_timeout_is_linked(&m->kick))
        h2o_timeout_link(m->loop, &m->zero, &m->kick);
    return c;
}

void sb_mcp_call_cancel(sb_mcp_call_t *c)
{
    if (c == NULL)
        return;
    if (h2o_linklist_is_linked(&c->link))
        h2o_linklist_unlink(&c->link);
    exchange_release(&c->ex);
    json_decref(c->params);
    sb_mem_free(c);
}

/* ---- the client ----------------------------------------------------------------------------------------------------- */

sb_status_t sb_mcp_create(h2o_loop_t *loop, const char *url, uint64_t timeout_ms, sb_mcp_t **out, const char **why)
{
    sb_mcp_t *m = sb_mem_calloc(1, sizeof(*m));
    const char *uwhy = NULL;

    *out = NULL;
    if (sb_url_parse(url, strlen(url), &m->url, &uwhy) != SB_OK) {
        *why = uwhy != NULL ? uwhy : "the URL does not parse";
        goto Error;
    }
    if (m->url.scheme != SB_URL_HTTP) {
        *why = "only http:// upstreams are supported";
        goto Error;
    }
    /*
     * No name is ever resolved here: the operator names the tool server by
     * address, or as localhost, which means the loopback addresses (RFC 6761
     * section 6.3) and nothing a resolver could redirect.
     */
    switch (m->url.host_kind) {
    case SB_URL_HOST_IPV4:
        m->addrs[0].family = AF_INET;
        memcpy(m->addrs[0].addr, &m->url.addr.v4, 4);
        m->naddrs = 1;
        break;
    case SB_URL_HOST_IPV6:
        m->addrs[0].family = AF_INET6;
        memcpy(m->addrs[0].addr, &m->url.addr.v6, 16);
        m->naddrs = 1;
        break;
    default:
        if (strcmp(m->url.host, "localhost") != 0) {
            *why = "the host must be an IP address or localhost (no name is resolved)";
            goto Error;
        }
        m->addrs[0].family = AF_INET;
        m->addrs[0].addr[0] = 127;
        m->addrs[0].addr[3] = 1;
        m->addrs[1].family = AF_INET6;
        m->addrs[1].addr[15] = 1;
        m->naddrs = 2;
        break;
    }
    sb_url_host_header(&m->url, m->host_header, sizeof(m->host_header));
    m->url_text = sb_mem_strdup(url);
    m->loop = loop;
    m->timeout_ms = timeout_ms;
    m->next_id = 1;
    h2o_timeout_init(loop, &m->timeout, timeout_ms);
    h2o_timeout_init(loop, &m->zero, 0);
    m->kick.cb = on_kick;
    m->init.timer.cb = on_exchange_timeout;
    h2o_linklist_init_anchor(&m->waiting);
    h2o_linklist_init_anchor(&m->running);
    *out = m;
    return SB_OK;
Error:
    sb_mem_free(m);
    return SB_E_BAD_ARGS;
}

void sb_mcp_destroy(sb_mcp_t *m)
{
    if (m == NULL)
        return;
    exchange_release(&m->init);
    m->state = S_NOTIFY; /* nothing starts from here on: pump only acts on IDLE and READY */
    while (!h2o_linklist_is_empty(&m->waiting) || !h2o_linklist_is_empty(&m->running)) {
        h2o_linklist_t *l = !h2o_linklist_is_empty(&m->running) ? &m->running : &m->waiting;
        call_finish(H2O_STRUCT_FROM_MEMBER(sb_mcp_call_t, link, l->next), SB_E_EXECUTION, shutting_down, NULL, 0);
    }
    if (h2o_timeout_is_linked(&m->kick))
        h2o_timeout_unlink(&m->kick);
    h2o_timeout_dispose(m->loop, &m->timeout);
    h2o_timeout_dispose(m->loop, &m->zero);
    sb_mem_free(m->url_text);
    sb_mem_free(m);
}

const char *sb_mcp_url(const sb_mcp_t *m)
{
    return m->url_text;
}
