/*
 * sandbox-shim: the relay's side of the module path (modules.h): Deno's module requests on the
 * listeners the jail made in the guest's network namespace, each answered by an import.fetch call
 * to the broker under the run's token (PROTOCOL.md section 6c). The calls take the relay's call and
 * connection slots like a guest's calls (relay.c); their answers go to Deno as HTTP, never to the
 * guest's stdin.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <msgpack.h>
#include "sb/buf.h"
#include "sb/limits.h"
#include "sb/mem.h"
#include "sb/value.h"
#include "relay/http.h"
#include "relay/modules.h"
#include "relay/relay_int.h"

void sb_shim_relay__mconn_close(mconn_t *mc)
{
    if (mc->fd >= 0)
        close(mc->fd);
    mc->fd = -1;
    sb_buf_free(&mc->out);
    mc->out_off = 0;
    mc->head_len = 0;
    mc->state = MC_FREE;
}

/* a value that may go into a header line (a content-type, a URL): visible ASCII and spaces, bounded */
static int plain_header_value(const char *v, size_t len)
{
    if (len == 0 || len > SB_SHIM_MAX_ORIGIN + SB_SHIM_MODULE_MAX_TARGET)
        return 0;
    for (size_t i = 0; i < len; ++i)
        if ((unsigned char)v[i] < 0x20 || (unsigned char)v[i] >= 0x7f)
            return 0;
    return 1;
}

void sb_shim_relay__module_write(mconn_t *mc)
{
    while (mc->out_off < mc->out.len) {
        ssize_t n = send(mc->fd, mc->out.base + mc->out_off, mc->out.len - mc->out_off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0)
            break;
        mc->out_off += (size_t)n;
    }
    sb_shim_relay__mconn_close(mc); /* written (Connection: close) or failed */
}

/* Deno's answer: the status, and for a module its type and bytes; a redirect points into another listener */
static void module_answer(relay_t *r, mconn_t *mc, int status, const char *type, const char *location, const uint8_t *body,
                          size_t len)
{
    const char *reason = status == 200   ? "OK"
                         : status == 302 ? "Found"
                         : status == 403 ? "Refused by the broker"
                         : status == 404 ? "Not Found"
                         : status == 429 ? "Over the run's module quota"
                                         : "Module fetch failed";
    sb_status_t st;

    sb_buf_init(&mc->out, len + 2 * SB_SHIM_MODULE_MAX_TARGET + 1024u);
    st = sb_buf_printf(&mc->out, "HTTP/1.1 %d %s\r\nContent-Length: %zu\r\nConnection: close\r\nCache-Control: no-store\r\n",
                       status, reason, len);
    if (st == SB_OK && type != NULL)
        st = sb_buf_printf(&mc->out, "Content-Type: %s\r\n", type);
    if (st == SB_OK && location != NULL)
        st = sb_buf_printf(&mc->out, "Location: %s\r\n", location);
    if (st == SB_OK)
        st = sb_buf_append_str(&mc->out, "\r\n");
    if (st == SB_OK && len != 0)
        st = sb_buf_append(&mc->out, body, len);
    if (st != SB_OK) {
        sb_shim_relay__mconn_close(mc);
        return;
    }
    mc->state = MC_WRITING;
    mc->out_off = 0;
    mc->deadline = sb_shim_relay__now_ms() + r->cfg->call_timeout_ms;
    sb_shim_relay__module_write(mc);
}

/* what the operator reads of a module that did not load (the run's `detail`; the guest sees Deno's error) */
static void module_note(relay_t *r, const char *url, const char *what)
{
    if (r->module_detail[0] == '\0')
        snprintf(r->module_detail, sizeof(r->module_detail), "module %.300s: %s", url, what);
}

void sb_shim_relay__ahead_free(module_ahead_t *a)
{
    sb_mem_free(a->url);
    sb_mem_free(a->type);
    sb_mem_free(a->body);
    memset(a, 0, sizeof(*a));
}

/* keeps a module the broker fetched at the end of a redirect, until Deno asks for it (the oldest goes first) */
static void ahead_keep(relay_t *r, const msgpack_object *url, const msgpack_object *type, const msgpack_object *body)
{
    module_ahead_t *a = &r->ahead[0];

    for (unsigned i = 0; i < MODULE_CACHE; ++i)
        if (r->ahead[i].url == NULL) {
            a = &r->ahead[i];
            break;
        }
    if (a->url != NULL) {
        sb_shim_relay__ahead_free(a);
        memmove(&r->ahead[0], &r->ahead[1], sizeof(r->ahead[0]) * (MODULE_CACHE - 1));
        a = &r->ahead[MODULE_CACHE - 1];
        memset(a, 0, sizeof(*a));
    }
    a->url = sb_mem_try_alloc(url->via.str.size + 1);
    a->type = type != NULL ? sb_mem_try_alloc(type->via.str.size + 1) : NULL;
    a->body = sb_mem_try_alloc(body->via.bin.size + 1);
    if (a->url == NULL || (type != NULL && a->type == NULL) || a->body == NULL) {
        sb_shim_relay__ahead_free(a);
        return; /* Deno's request for it is then fetched again */
    }
    memcpy(a->url, url->via.str.ptr, url->via.str.size);
    a->url[url->via.str.size] = '\0';
    if (type != NULL) {
        memcpy(a->type, type->via.str.ptr, type->via.str.size);
        a->type[type->via.str.size] = '\0';
    }
    memcpy(a->body, body->via.bin.ptr, body->via.bin.size);
    a->len = body->via.bin.size;
}

/* import.fetch's value (PROTOCOL.md section 6c): {url, status, contentType, body} */
void sb_shim_relay__module_value(relay_t *r, call_t *c, const msgpack_object *value)
{
    mconn_t *mc = c->module;
    const msgpack_object *url = sb_mp_get(value, "url"), *status = sb_mp_get(value, "status");
    const msgpack_object *type = sb_mp_get(value, "contentType"), *body = sb_mp_get(value, "body");
    const sb_shim_imports_t *im = r->cfg->imports;
    char t[300], loc[SB_SHIM_MODULE_MAX_TARGET + 64];
    size_t path;
    int k;

    c->module = NULL;
    sb_shim_relay__call_free(r, c);
    if (value->type != MSGPACK_OBJECT_MAP || value->via.map.size != 4 || url == NULL || url->type != MSGPACK_OBJECT_STR ||
        url->via.str.size > SB_SHIM_MAX_ORIGIN + SB_SHIM_MODULE_MAX_TARGET || memchr(url->via.str.ptr, '\0', url->via.str.size) ||
        status == NULL || status->type != MSGPACK_OBJECT_POSITIVE_INTEGER || status->via.u64 < 100 || status->via.u64 > 599 ||
        type == NULL || (type->type != MSGPACK_OBJECT_STR && type->type != MSGPACK_OBJECT_NIL) || body == NULL ||
        body->type != MSGPACK_OBJECT_BIN || !plain_header_value(url->via.str.ptr, url->via.str.size) ||
        memchr(url->via.str.ptr, ' ', url->via.str.size) != NULL) {
        module_note(r, mc->url, "import.fetch answered a value that is not {url, status, contentType, body}");
        module_answer(r, mc, 424, NULL, NULL, NULL, 0);
        return;
    }
    if (type->type == MSGPACK_OBJECT_STR && type->via.str.size < sizeof(t) &&
        plain_header_value(type->via.str.ptr, type->via.str.size))
        snprintf(t, sizeof(t), "%.*s", (int)type->via.str.size, type->via.str.ptr);
    else
        type = NULL;
    if (status->via.u64 < 200 || status->via.u64 > 299) {
        char what[64];
        snprintf(what, sizeof(what), "its server answered HTTP %u", (unsigned)status->via.u64);
        module_note(r, mc->url, what);
        module_answer(r, mc, status->via.u64 == 404 ? 404 : 424, NULL, NULL, NULL, 0);
        return;
    }
    if (url->via.str.size == strlen(mc->url) && memcmp(url->via.str.ptr, mc->url, url->via.str.size) == 0) {
        module_answer(r, mc, 200, type != NULL ? t : NULL, NULL, (const uint8_t *)body->via.bin.ptr, body->via.bin.size);
        return;
    }
    /* the broker followed redirects: Deno must learn the final URL, against which the module's own imports resolve */
    {
        char final[SB_SHIM_MAX_ORIGIN + SB_SHIM_MODULE_MAX_TARGET + 1];
        memcpy(final, url->via.str.ptr, url->via.str.size);
        final[url->via.str.size] = '\0';
        k = sb_shim_imports_find(im, final, url->via.str.size, &path);
        if (k < 0 || url->via.str.size - path > SB_SHIM_MODULE_MAX_TARGET) {
            module_note(r, mc->url, "redirected to a URL outside the run's import origins");
            module_answer(r, mc, 424, NULL, NULL, NULL, 0);
            return;
        }
        snprintf(loc, sizeof(loc), "http://127.0.0.1:%u%s%s", (unsigned)sb_shim_import_port((unsigned)k),
                 final[path] == '/' ? "" : "/", final + path);
    }
    ahead_keep(r, url, type, body);
    module_answer(r, mc, 302, NULL, loc, NULL, 0);
}

void sb_shim_relay__module_failed(relay_t *r, call_t *c, const char *code, const char *detail)
{
    mconn_t *mc = c->module;
    /* a 4xx, never a 5xx, which Deno would ask again for */
    int status = strcmp(code, "forbidden") == 0 || strcmp(code, "unauthorized") == 0 ? 403
                 : strcmp(code, "rate_limited") == 0                                 ? 429
                                                                                     : 424;

    c->module = NULL;
    sb_shim_relay__call_free(r, c);
    module_note(r, mc->url, detail);
    module_answer(r, mc, status, NULL, NULL, NULL, 0);
}

/* a whole request head from Deno: answered from what a redirect fetched ahead, or queued for the broker */
static void module_request(relay_t *r, mconn_t *mc)
{
    char target[SB_SHIM_MODULE_MAX_TARGET + 1];
    const char *why = NULL;
    size_t head_len;
    sb_status_t st = sb_shim_module_parse_request(mc->head, mc->head_len, &head_len, target, &why);

    if (st == SB_E_AGAIN)
        return;
    if (st != SB_OK || head_len != mc->head_len) {
        module_answer(r, mc, 400, NULL, NULL, NULL, 0);
        return;
    }
    snprintf(mc->url, sizeof(mc->url), "%s%s", r->cfg->imports->origin[mc->origin], target);
    for (unsigned i = 0; i < MODULE_CACHE; ++i) {
        module_ahead_t *a = &r->ahead[i];
        if (a->url != NULL && strcmp(a->url, mc->url) == 0) {
            module_answer(r, mc, 200, a->type, NULL, a->body, a->len);
            sb_shim_relay__ahead_free(a);
            return;
        }
    }
    mc->state = MC_WAITING;
}

void sb_shim_relay__module_readable(relay_t *r, mconn_t *mc)
{
    for (;;) {
        ssize_t n = recv(mc->fd, mc->head + mc->head_len, sizeof(mc->head) - mc->head_len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            sb_shim_relay__mconn_close(mc);
            return;
        }
        mc->head_len += (size_t)n;
        if (mc->head_len == sizeof(mc->head))
            break;
    }
    module_request(r, mc);
}

/* starts the broker fetches of the requests waiting for a call slot */
void sb_shim_relay__module_pump(relay_t *r)
{
    for (unsigned m = 0; m < MODULE_CONNS; ++m) {
        mconn_t *mc = &r->mconns[m];
        call_t *c = NULL;
        conn_t *cn = NULL;
        msgpack_sbuffer body;
        msgpack_packer pk;
        sb_status_t st;

        if (mc->state != MC_WAITING)
            continue;
        if (r->failed || r->cfg->calls_refused != NULL) {
            module_note(r, mc->url, "the run has no broker");
            module_answer(r, mc, 424, NULL, NULL, NULL, 0);
            continue;
        }
        if (!sb_shim_relay__free_slot(r, &c, &cn))
            return; /* every slot is taken: the next reply frees one */
        memset(c, 0, sizeof(*c));
        c->state = CALL_HTTP;
        ++r->active;
        ++r->modules;
        c->module = mc;
        snprintf(c->method, sizeof(c->method), "import.fetch");
        c->deadline = sb_shim_relay__now_ms() + r->cfg->call_timeout_ms;
        mc->state = MC_FETCHING;
        /* body: {method, args: {url}} (PROTOCOL.md section 6c); the request carries the token as a guest call does */
        msgpack_sbuffer_init(&body);
        msgpack_packer_init(&pk, &body, msgpack_sbuffer_write);
        (void)msgpack_pack_map(&pk, 2);
        sb_shim_relay__pack_cstr(&pk, "method");
        sb_shim_relay__pack_cstr(&pk, "import.fetch");
        sb_shim_relay__pack_cstr(&pk, "args");
        (void)msgpack_pack_map(&pk, 1);
        sb_shim_relay__pack_cstr(&pk, "url");
        sb_shim_relay__pack_cstr(&pk, mc->url);
        sb_buf_init_secret(&cn->out, SB_MAX_RPC_WIRE + 4096);
        sb_buf_init(&cn->in, SB_SHIM_MAX_RESPONSE_HEAD + SB_MAX_RPC_WIRE /* import.fetch's cap (sb_method_response_cap) */);
        st = body.data != NULL
                 ? sb_shim_http_build_module_request(&cn->out, &r->cfg->url, r->cfg->token, (const uint8_t *)body.data, body.size)
                 : SB_E_NOMEM;
        msgpack_sbuffer_destroy(&body);
        if (st != SB_OK) {
            sb_buf_free(&cn->out);
            sb_buf_free(&cn->in);
            sb_shim_relay__module_failed(r, c, "execution_error", "cannot build the broker request");
            continue;
        }
        sb_shim_relay__conn_start(r, cn, c);
    }
}

void sb_shim_relay__module_accept(relay_t *r, unsigned origin, int lfd)
{
    for (unsigned m = 0; m < MODULE_CONNS; ++m) {
        mconn_t *mc = &r->mconns[m];
        if (mc->state != MC_FREE)
            continue;
        mc->fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (mc->fd < 0) {
            /* out of descriptors or memory: the connection waits in the backlog, and the listeners rest a moment
             * instead of waking the loop again at once */
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                r->listen_rest_until = sb_shim_relay__now_ms() + MODULE_ACCEPT_REST_MS;
            return;
        }
        mc->state = MC_READING;
        mc->origin = origin;
        mc->head_len = 0;
        mc->deadline = sb_shim_relay__now_ms() + MODULE_HEAD_MS;
        return;
    }
}
