/*
 * A worker's connection to Redis: the h2o adapter for hiredis, the data
 * link's life cycle, its commands and timeouts, and Sentinel (store_redis.c
 * says how the backend behaves as a whole).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "obs/log.h"
#include "obs/metrics.h"
#include "store/store_redis_int.h"
#include "util/util.h"

/* ---- the h2o adapter for hiredis --------------------------------------------------------------------------------------- */

static void on_sock_read(h2o_socket_t *sock, const char *err)
{
    link_t *l = sock->data;
    if (l->ac != NULL)
        redisAsyncHandleRead(l->ac);
}

static void on_sock_write(h2o_socket_t *sock, const char *err)
{
    link_t *l = sock->data;
    l->write_armed = 0;
    if (l->want_write && l->ac != NULL)
        redisAsyncHandleWrite(l->ac);
}

static void ev_add_read(void *d)
{
    link_t *l = d;
    if (!l->reading && l->sock != NULL) {
        l->reading = 1;
        h2o_socket_read_start(l->sock, on_sock_read);
    }
}

static void ev_del_read(void *d)
{
    link_t *l = d;
    if (l->reading && l->sock != NULL) {
        l->reading = 0;
        h2o_socket_read_stop(l->sock);
    }
}

static void on_wflush(h2o_timeout_entry_t *entry)
{
    link_t *l = H2O_STRUCT_FROM_MEMBER(link_t, wflush, entry);
    if (l->want_write && l->ac != NULL) {
        l->in_flush = 1;
        redisAsyncHandleWrite(l->ac);
        l->in_flush = 0;
    }
}

static void ev_add_write(void *d)
{
    link_t *l = d;
    l->want_write = 1;
    if (l->sock == NULL)
        return;
    /*
     * Connected: the commands queued during this loop pass go out in one
     * write at its end (a socket to Redis is almost always writable, so
     * waiting for epoll to say so costs two epoll_ctl calls and a loop pass).
     * Still connecting, or the socket was full: wait until it is writable
     * (hiredis learns that the connect completed from the first writable
     * event).
     */
    if (l->state != L_CONNECTING && !l->in_flush) {
        if (!h2o_timeout_is_linked(&l->wflush))
            h2o_timeout_link(l->loop, l->flush_timeout, &l->wflush);
        return;
    }
    /* h2o asserts if notify_write is armed twice */
    if (!l->write_armed) {
        l->write_armed = 1;
        h2o_socket_notify_write(l->sock, on_sock_write);
    }
}

static void ev_del_write(void *d)
{
    link_t *l = d;
    l->want_write = 0;
}

static void ev_cleanup(void *d)
{
    link_t *l = d;
    if (h2o_timeout_is_linked(&l->wflush))
        h2o_timeout_unlink(&l->wflush);
    if (l->sock != NULL) {
        h2o_socket_close(l->sock);
        l->sock = NULL;
    }
    l->reading = l->want_write = l->write_armed = l->freeing = 0;
    l->ac = NULL;
}

/* opens a connection (unix path, or a numeric address); NULL, or why it could not even start */
static const char *link_open(link_t *l, h2o_loop_t *loop, const sb_store_addr_t *to, const char *path,
                             redisConnectCallback *on_connect, redisDisconnectCallback *on_disconnect, char *why, size_t whysz)
{
    redisAsyncContext *ac;
    int fd;

    if (path != NULL)
        snprintf(l->addr, sizeof(l->addr), "%s", path);
    else
        sb_store__redis_format_addr(to, l->addr, sizeof(l->addr));
    ac = path != NULL ? redisAsyncConnectUnix(path) : redisAsyncConnect(to->host, to->port);
    if (ac == NULL)
        return "out of memory";
    if (ac->err) {
        snprintf(why, whysz, "connect failed: %s", ac->errstr);
        redisAsyncFree(ac);
        return why;
    }
    if ((fd = dup(ac->c.fd)) < 0) {
        snprintf(why, whysz, "dup failed: %s", strerror(errno));
        redisAsyncFree(ac);
        return why;
    }
    l->ac = ac;
    ac->data = l;
    /* before the hooks: hiredis asks to write at once, and nothing may be written before the connect completes */
    l->state = L_CONNECTING;
    l->since = (int64_t)(sb_mono_us() / 1000);
    l->sock = h2o_evloop_socket_create(loop, fd, H2O_SOCKET_FLAG_DONT_READ);
    l->sock->data = l;
    ac->ev.data = l;
    ac->ev.addRead = ev_add_read;
    ac->ev.delRead = ev_del_read;
    ac->ev.addWrite = ev_add_write;
    ac->ev.delWrite = ev_del_write;
    ac->ev.cleanup = ev_cleanup;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    /* the connect callback fires on the first writable event */
    ev_add_write(l);
    return NULL;
}

/*
 * Lets go of a link. Pending commands are answered with NULL replies. From
 * inside one of the link's own reply callbacks hiredis defers the free until
 * the callback returns; the link is only reopened once ac is NULL again.
 */
static void link_release(link_t *l)
{
    l->state = L_DOWN;
    if (l->ac != NULL && !l->freeing) {
        l->freeing = 1;
        redisAsyncFree(l->ac);
    }
}

/* as link_release, for a link not already given up (one hiredis is freeing itself is left alone) */
static void link_close(link_t *l)
{
    if (l->state != L_DOWN)
        link_release(l);
}

static int is_sentinel(const redis_conn_t *rc)
{
    return rc->store->nsentinels != 0;
}

/* how long the primary stays in use without a sentinel confirming it */
static int64_t sentinel_grace_ms(const redis_conn_t *rc)
{
    return 2 * SENTINEL_QUERY_MS + (int64_t)rc->store->timeout_ms;
}

int sb_store__redis_usable_now(const redis_conn_t *rc, int64_t now)
{
    if (rc->data.state != L_UP)
        return 0;
    return !is_sentinel(rc) || now - rc->confirmed_at <= sentinel_grace_ms(rc);
}

static const char *data_addr(const redis_conn_t *rc, char *buf, size_t sz)
{
    if (rc->store->unix_path != NULL)
        return rc->store->unix_path;
    if (!is_sentinel(rc)) {
        sb_store__redis_format_addr(&rc->store->addr, buf, sz);
    } else if (rc->have_primary) {
        sb_store__redis_format_addr(&rc->primary, buf, sz);
    } else {
        snprintf(buf, sz, "%s (no primary known yet)", rc->store->master);
    }
    return buf;
}

/*
 * Publishes whether calls may use the store and logs the change: redis.up
 * when it becomes usable, redis.down when it stops being usable or the
 * reason changes. Retries that fail the same way stay silent.
 */
static void update_usable(redis_conn_t *rc, const char *why)
{
    int64_t now = mono_ms();
    int u = sb_store__redis_usable_now(rc, now);
    char addr[96], reason[192];
    sb_logline_t l;

    atomic_store_explicit(&rc->usable, u, memory_order_relaxed);
    if (u) {
        if (!rc->logged_up) {
            rc->logged_up = 1;
            rc->last_down[0] = '\0';
            sb_log_begin(&l, SB_LOG_INFO, "redis.up");
            sb_log_cstr(&l, "addr", data_addr(rc, addr, sizeof(addr)));
            if (is_sentinel(rc))
                sb_log_cstr(&l, "master", rc->store->master);
            sb_log_cstr(&l, "msg", "token store connected");
            sb_log_end(&l);
        }
        return;
    }
    if (why == NULL) {
        /* every other change comes with its reason: the one left is a sentinel confirmation that is overdue */
        if (rc->data.state != L_UP)
            return;
        snprintf(reason, sizeof(reason), "no sentinel has confirmed this primary within %lld ms", (long long)sentinel_grace_ms(rc));
        why = reason;
    }
    if (!rc->logged_up && strcmp(rc->last_down, why) == 0)
        return;
    rc->logged_up = 0;
    snprintf(rc->last_down, sizeof(rc->last_down), "%s", why);
    sb_log_begin(&l, SB_LOG_WARN, "redis.down");
    sb_log_cstr(&l, "addr", data_addr(rc, addr, sizeof(addr)));
    sb_log_cstr(&l, "reason", why);
    sb_log_end(&l);
}

static void on_cmd_reply(redisAsyncContext *ac, void *r, void *privdata);

static void cmd_finish(cmd_t *cmd, redisReply *reply)
{
    h2o_linklist_unlink(&cmd->link);
    cmd->done(cmd, reply);
    sb_token_release(cmd->known);
    sb_mem_free(cmd);
}

/* decimal digits of v at p; returns the end */
char *sb_store__redis_put_u64(char *p, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0)
        *p++ = tmp[--n];
    return p;
}

/* the room one bulk string of `len` bytes takes: "$<len>\r\n<bytes>\r\n" */
static size_t bulk_size(size_t len)
{
    return 1 + 20 + 2 + len + 2;
}

static char *put_bulk(char *p, const char *s, size_t len)
{
    *p++ = '$';
    p = sb_store__redis_put_u64(p, len);
    *p++ = '\r';
    *p++ = '\n';
    memcpy(p, s, len);
    p += len;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

void sb_store__redis_cmd_send(cmd_t *cmd)
{
    redis_conn_t *rc = cmd->rc;
    redisAsyncContext *ac = rc->data.freeing ? NULL : rc->data.ac;
    int ok;

    if (ac == NULL) {
        cmd_finish(cmd, NULL); /* hiredis is freeing or disconnecting the context: answer now */
        return;
    }
    if (!cmd->resent) {
        ok = redisAsyncFormattedCommand(ac, on_cmd_reply, cmd, cmd->resp, cmd->len) == REDIS_OK;
    } else {
        /* the same count and arguments after EVAL and the script's text */
        size_t hdr = (size_t)((const char *)memchr(cmd->resp, '\n', cmd->len) - cmd->resp) + 1, rest = cmd->len - cmd->args;
        char *buf = sb_mem_alloc(hdr + bulk_size(4) + bulk_size(sb_store__redis_scripts[cmd->script].len) + rest), *p = buf;
        memcpy(p, cmd->resp, hdr);
        p = put_bulk(p + hdr, "EVAL", 4);
        p = put_bulk(p, sb_store__redis_scripts[cmd->script].body, sb_store__redis_scripts[cmd->script].len);
        memcpy(p, cmd->resp + cmd->args, rest);
        p += rest;
        ok = redisAsyncFormattedCommand(ac, on_cmd_reply, cmd, buf, (size_t)(p - buf)) == REDIS_OK;
        sb_mem_free(buf);
    }
    if (!ok)
        cmd_finish(cmd, NULL);
}

/*
 * A command with its arguments written as RESP; queued in the pending list,
 * not sent yet. `rel_first` and `nrel` name the arguments that are release
 * keys (for the log, should they fail).
 */
cmd_t *sb_store__redis_cmd_new_rel(redis_conn_t *rc, const char *what, cmd_done_fn done, int script, int argc, const char **argv,
                                   const size_t *lens, int rel_first, int nrel)
{
    size_t total = 1 + 20 + 2 + (script >= 0 ? bulk_size(7) + bulk_size(40) : 0);
    cmd_t *cmd;
    char *p;

    for (int i = 0; i < argc; ++i)
        total += bulk_size(lens[i]);
    cmd = sb_mem_alloc(offsetof(cmd_t, resp) + total);
    memset(cmd, 0, offsetof(cmd_t, resp));
    cmd->rc = rc;
    cmd->what = what;
    cmd->done = done;
    cmd->script = script;
    cmd->deadline = mono_ms() + (int64_t)rc->store->timeout_ms;
    p = cmd->resp;
    *p++ = '*';
    p = sb_store__redis_put_u64(p, (uint64_t)argc + (script >= 0 ? 2 : 0));
    *p++ = '\r';
    *p++ = '\n';
    if (script >= 0) {
        p = put_bulk(p, "EVALSHA", 7);
        p = put_bulk(p, rc->store->sha[script], 40);
    }
    cmd->args = (size_t)(p - cmd->resp);
    for (int i = 0; i < argc; ++i) {
        p = put_bulk(p, argv[i], lens[i]);
        if (i >= rel_first && i < rel_first + nrel) {
            /* where the key's bytes are: just before the closing CRLF */
            cmd->rel_key_off[i - rel_first] = (uint32_t)(p - 2 - lens[i] - cmd->resp);
            cmd->rel_key_len[i - rel_first] = (uint32_t)lens[i];
        }
    }
    cmd->nrel = nrel;
    cmd->len = (size_t)(p - cmd->resp);
    h2o_linklist_insert(&rc->pending, &cmd->link);
    return cmd;
}

cmd_t *sb_store__redis_cmd_new(redis_conn_t *rc, const char *what, cmd_done_fn done, int script, int argc, const char **argv,
                               const size_t *lens)
{
    return sb_store__redis_cmd_new_rel(rc, what, done, script, argc, argv, lens, 0, 0);
}

static int reply_is_error(const redisReply *r, const char *prefix)
{
    size_t n = strlen(prefix);
    return r != NULL && r->type == REDIS_REPLY_ERROR && r->len >= n && memcmp(r->str, prefix, n) == 0;
}

static void data_teardown(redis_conn_t *rc, const char *why, int slow);
static void sentinel_query(redis_conn_t *rc);

static void on_cmd_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply *reply = r;
    cmd_t *cmd = privdata;
    redis_conn_t *rc = cmd->rc;

    if (cmd->script >= 0 && !cmd->resent && reply_is_error(reply, "NOSCRIPT")) {
        /* the script cache was emptied (SCRIPT FLUSH, a restart): EVAL runs the script and caches it again */
        cmd->resent = 1;
        sb_metrics_store_event(SB_STORE_EV_SCRIPT_RELOAD);
        sb_store__redis_cmd_send(cmd);
        return;
    }
    if (reply_is_error(reply, "READONLY") && rc->data.state != L_DOWN) {
        /* a replica: nothing it says can be trusted to be current */
        data_teardown(rc, "the node answered READONLY: it is a replica", 0);
        if (is_sentinel(rc))
            sentinel_query(rc);
    }
    cmd_finish(cmd, reply);
}

/* ---- the data link's life cycle ---------------------------------------------------------------------------------------- */

/*
 * The data link is down (or going): so is the invalidation link, and nothing
 * this worker read is tracked any more. Both come back together.
 */
static void data_failed(redis_conn_t *rc, const char *why, int slow)
{
    unsigned cap = slow ? RECONNECT_SLOW_CAP_MS : RECONNECT_CAP_MS;
    uint64_t backoff = (uint64_t)RECONNECT_FIRST_MS << (rc->failures < 6 ? rc->failures : 6);

    rc->data.state = L_DOWN;
    rc->next_attempt = mono_ms() + (int64_t)(backoff < cap ? backoff : cap);
    ++rc->failures;
    link_close(&rc->inv);
    sb_store__redis_untrack_all(rc);
    update_usable(rc, why);
}

/* tears the data link down; every pending command is answered SB_E_UNAVAILABLE */
static void data_teardown(redis_conn_t *rc, const char *why, int slow)
{
    if (rc->data.state == L_DOWN)
        return;
    data_failed(rc, why, slow);
    link_release(&rc->data);
}

/* errors that say "not now" rather than "wrong configuration" */
static int is_transient(const redisReply *r)
{
    return reply_is_error(r, "LOADING") || reply_is_error(r, "BUSY") || reply_is_error(r, "MASTERDOWN") ||
           reply_is_error(r, "TRYAGAIN");
}

/* one step of the set-up done: the link is up after the last one (the data link's commands, tracking, the subscription) */
static void setup_step(redis_conn_t *rc)
{
    if (--rc->setup_left == 0) {
        rc->data.state = L_UP;
        rc->failures = 0;
        rc->last_heartbeat = mono_ms();
        rc->hb_sent = 0;
        update_usable(rc, NULL);
    }
}

static void on_setup(cmd_t *cmd, redisReply *reply)
{
    redis_conn_t *rc = cmd->rc;
    char why[192];
    int ok, slow = 0;

    if (reply == NULL || rc->data.state == L_DOWN)
        return; /* the link is already going down, for a reason logged elsewhere */
    if (strcmp(cmd->what, "SCRIPT LOAD") == 0) {
        ok =
            reply->type == REDIS_REPLY_STRING && reply->len == 40 && memcmp(reply->str, rc->store->sha[cmd->setup_script], 40) == 0;
    } else if (strcmp(cmd->what, "ROLE") == 0) {
        ok = reply->type == REDIS_REPLY_ARRAY && reply->elements >= 1 && reply->element[0]->type == REDIS_REPLY_STRING &&
             strcmp(reply->element[0]->str, "master") == 0;
        if (!ok && reply->type == REDIS_REPLY_ARRAY && reply->elements >= 1 && reply->element[0]->type == REDIS_REPLY_STRING) {
            snprintf(why, sizeof(why), "the node is not a primary (ROLE: %.32s)", reply->element[0]->str);
            data_teardown(rc, why, 0);
            if (is_sentinel(rc))
                sentinel_query(rc);
            return;
        }
    } else {
        ok = reply->type == REDIS_REPLY_STATUS && strcmp(reply->str, "OK") == 0;
    }
    if (!ok) {
        if (reply->type == REDIS_REPLY_ERROR) {
            slow = !is_transient(reply);
            snprintf(why, sizeof(why), "%s refused: %.140s", cmd->what, reply->str);
        } else {
            slow = 1;
            snprintf(why, sizeof(why), "%s: unexpected answer", cmd->what);
        }
        data_teardown(rc, why, slow);
        return;
    }
    setup_step(rc);
}

static void on_data_connect(const redisAsyncContext *ac, int status)
{
    link_t *l = ac->data;
    redis_conn_t *rc = l->rc;
    char why[192];

    if (status != REDIS_OK) {
        /* hiredis frees the context after this callback */
        snprintf(why, sizeof(why), "connect failed: %s", ac->errstr[0] != '\0' ? ac->errstr : "unknown error");
        if (l->state != L_DOWN)
            data_failed(rc, why, 0);
        if (is_sentinel(rc))
            sentinel_query(rc);
        return;
    }
    if (l->state == L_CONNECTING)
        l->state = L_SETUP;
}

static void on_data_disconnect(const redisAsyncContext *ac, int status)
{
    link_t *l = ac->data;
    redis_conn_t *rc = l->rc;
    char why[192];

    if (l->state == L_DOWN)
        return; /* we tore it down ourselves */
    snprintf(why, sizeof(why), "connection lost: %s",
             status == REDIS_OK ? "closed by the server" : (ac->errstr[0] != '\0' ? ac->errstr : "unknown error"));
    data_failed(rc, why, 0);
    if (is_sentinel(rc))
        sentinel_query(rc);
}

static void setup_cmd(redis_conn_t *rc, const char *what, int setup_script, int argc, const char **argv, const size_t *lens)
{
    cmd_t *cmd = sb_store__redis_cmd_new(rc, what, on_setup, -1, argc, argv, lens);
    cmd->setup_script = setup_script;
    ++rc->setup_left;
    sb_store__redis_cmd_send(cmd);
}

/* ---- the invalidation link --------------------------------------------------------------------------------------------- */

/*
 * Each worker's data link runs CLIENT TRACKING in broadcast mode for the
 * token keys, redirected to a second connection of the same worker that is
 * subscribed to __redis__:invalidate (hiredis 0.14 speaks RESP2 only, so
 * invalidations cannot come on the data link itself). Redis then tells every
 * instance of every change to a token key (a mint, a revocation, an expiry)
 * as it happens, and a worker answers calls on a token it read since without
 * asking Redis (store_redis.c). The two links live and die together: while
 * either is down nothing is tracked and every call fails closed. A heartbeat
 * key of the worker's own (a second tracked prefix), written every
 * INV_HEARTBEAT_MS on the data link, must come back as an invalidation within
 * the store timeout, or the link is treated as lost (a connection that died
 * without a word, or a Redis that stopped pushing): what a silent link can
 * let through is bounded by the two together.
 */

static void on_inv_connect(const redisAsyncContext *ac, int status)
{
    link_t *l = ac->data;
    char why[192];

    if (status != REDIS_OK) {
        /* hiredis frees the context after this callback */
        snprintf(why, sizeof(why), "the invalidation link could not connect: %s",
                 ac->errstr[0] != '\0' ? ac->errstr : "unknown error");
        if (l->state != L_DOWN) {
            l->state = L_DOWN;
            data_teardown(l->rc, why, 0);
        }
        return;
    }
    if (l->state == L_CONNECTING)
        l->state = L_SETUP;
}

static void on_inv_disconnect(const redisAsyncContext *ac, int status)
{
    link_t *l = ac->data;
    char why[192];

    if (l->state == L_DOWN)
        return; /* we tore it down ourselves */
    l->state = L_DOWN;
    sb_metrics_store_event(SB_STORE_EV_TRACKING_LOST);
    snprintf(why, sizeof(why), "the invalidation link was lost: %s",
             status == REDIS_OK ? "closed by the server" : (ac->errstr[0] != '\0' ? ac->errstr : "unknown error"));
    data_teardown(l->rc, why, 0);
}

/* AUTH and CLIENT SETNAME on the invalidation link: a refusal reads as the data link's would (one line for both) */
static void inv_setup_answer(redis_conn_t *rc, const char *what, const redisReply *reply)
{
    char why[192];

    if (reply == NULL || rc->inv.state == L_DOWN)
        return;
    if (reply->type == REDIS_REPLY_STATUS && strcmp(reply->str, "OK") == 0)
        return;
    if (reply->type == REDIS_REPLY_ERROR)
        snprintf(why, sizeof(why), "%s refused: %.140s", what, reply->str);
    else
        snprintf(why, sizeof(why), "%s: unexpected answer", what);
    data_teardown(rc, why, reply->type != REDIS_REPLY_ERROR || !is_transient(reply));
}

static void on_inv_auth(redisAsyncContext *ac, void *r, void *privdata)
{
    inv_setup_answer(privdata, "AUTH", r);
}

static void on_inv_setname(redisAsyncContext *ac, void *r, void *privdata)
{
    inv_setup_answer(privdata, "CLIENT SETNAME", r);
}

/* the invalidation link's CLIENT ID: the data link's tracking is redirected there */
static void on_inv_id(redisAsyncContext *ac, void *r, void *privdata)
{
    redis_conn_t *rc = privdata;
    redisReply *reply = r;
    const sb_store_t *s = rc->store;
    char id[24], prefix[KEY_MAX], salt[8], hex[17];
    const char *argv[10] = {"CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", prefix, "PREFIX", rc->hb_key};
    size_t lens[10] = {6, 8, 2, 8, 0, 5, 6, 0, 6, 0};
    cmd_t *cmd;

    if (reply == NULL || rc->inv.state == L_DOWN || rc->data.state == L_DOWN)
        return;
    if (reply->type != REDIS_REPLY_INTEGER || sb_random(salt, sizeof(salt)) != SB_OK) {
        data_teardown(rc, "the invalidation link's CLIENT ID gave no id", 1);
        return;
    }
    rc->inv_id = reply->integer;
    lens[4] = (size_t)snprintf(id, sizeof(id), "%lld", rc->inv_id);
    sb_hex((const uint8_t *)salt, sizeof(salt), hex);
    /* the heartbeat key is a prefix of its own, so other workers' heartbeats never reach this link */
    rc->hb_key_len = (size_t)snprintf(rc->hb_key, sizeof(rc->hb_key), "%shb:%lld.%s", s->prefix, rc->inv_id, hex);
    lens[7] = (size_t)snprintf(prefix, sizeof(prefix), "%stok:", s->prefix);
    lens[9] = rc->hb_key_len;
    /* counted in the set-up already (data_connect) */
    cmd = sb_store__redis_cmd_new(rc, "CLIENT TRACKING", on_setup, -1, 10, argv, lens);
    cmd->setup_script = -1;
    sb_store__redis_cmd_send(cmd);
}

/* the subscription's confirmation, then invalidations */
static void on_inv_message(redisAsyncContext *ac, void *r, void *privdata)
{
    redis_conn_t *rc = privdata;
    redisReply *reply = r;

    if (reply == NULL || rc->inv.state == L_DOWN)
        return;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 3 && reply->element[0]->type == REDIS_REPLY_STRING) {
        if (strcmp(reply->element[0]->str, "message") == 0) {
            sb_store__redis_invalidate(rc, reply->element[2]);
            return;
        }
        if (strcmp(reply->element[0]->str, "subscribe") == 0 && rc->inv.state == L_SETUP) {
            rc->inv.state = L_UP;
            setup_step(rc);
            return;
        }
    }
    data_teardown(rc, "the invalidation link sent something other than an invalidation", 0);
}

/* opens the invalidation link beside a data link being opened; 0, or -1 (the data link is torn down) */
static int inv_open(redis_conn_t *rc, const sb_store_addr_t *to, const char *path)
{
    const char *pw = rc->store->password;
    char why[192];
    const char *err;

    if ((err = link_open(&rc->inv, rc->loop, to, path, on_inv_connect, on_inv_disconnect, why, sizeof(why))) != NULL) {
        char msg[240];
        snprintf(msg, sizeof(msg), "the invalidation link could not connect: %s", err);
        data_teardown(rc, msg, 0);
        return -1;
    }
    /* the commands wait in hiredis until the connect completes */
    if (pw != NULL) {
        const char *argv[] = {"AUTH", pw};
        size_t lens[] = {4, strlen(pw)};
        redisAsyncCommandArgv(rc->inv.ac, on_inv_auth, rc, 2, argv, lens);
    }
    {
        const char *argv[] = {"CLIENT", "SETNAME", "sandbox-broker:inv"};
        size_t lens[] = {6, 7, 18};
        redisAsyncCommandArgv(rc->inv.ac, on_inv_setname, rc, 3, argv, lens);
    }
    {
        const char *argv[] = {"CLIENT", "ID"};
        size_t lens[] = {6, 2};
        redisAsyncCommandArgv(rc->inv.ac, on_inv_id, rc, 2, argv, lens);
    }
    {
        const char *argv[] = {"SUBSCRIBE", "__redis__:invalidate"};
        size_t lens[] = {9, 20};
        redisAsyncCommandArgv(rc->inv.ac, on_inv_message, rc, 2, argv, lens);
    }
    return 0;
}

static void on_hb_set(cmd_t *cmd, redisReply *reply)
{
    redis_conn_t *rc = cmd->rc;
    char why[192];

    if (reply == NULL || rc->data.state != L_UP || (reply->type == REDIS_REPLY_STATUS && strcmp(reply->str, "OK") == 0))
        return;
    snprintf(why, sizeof(why), "the heartbeat key could not be written: %.140s",
             reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected answer");
    data_teardown(rc, why, 0);
}

/* writes the heartbeat key; its invalidation must come back on the invalidation link */
static void hb_send(redis_conn_t *rc, int64_t now)
{
    char v[24];
    const char *argv[5] = {"SET", rc->hb_key, v, "PX", "10000"};
    size_t lens[5] = {3, rc->hb_key_len, 0, 2, 5};

    lens[2] = (size_t)snprintf(v, sizeof(v), "%lld", (long long)now);
    rc->hb_sent = rc->hb_last = now;
    sb_store__redis_cmd_send(sb_store__redis_cmd_new(rc, "the heartbeat key", on_hb_set, -1, 5, argv, lens));
}

static void data_connect(redis_conn_t *rc)
{
    sb_store_t *s = rc->store;
    char why[192], db[8];
    const char *err;

    const sb_store_addr_t *to = s->unix_path != NULL ? NULL : is_sentinel(rc) ? &rc->primary : &s->addr;

    err = link_open(&rc->data, rc->loop, to, s->unix_path, on_data_connect, on_data_disconnect, why, sizeof(why));
    if (err != NULL) {
        data_failed(rc, err, 0);
        return;
    }
    /* never HELLO 3: hiredis 0.14 cannot parse RESP3. The commands wait in hiredis until the connect completes */
    rc->setup_left = 2; /* CLIENT TRACKING (sent once the invalidation link has its id), and the subscription */
    if (inv_open(rc, to, s->unix_path) != 0)
        return;
    if (s->password != NULL) {
        const char *argv[] = {"AUTH", s->password};
        size_t lens[] = {4, strlen(s->password)};
        setup_cmd(rc, "AUTH", -1, 2, argv, lens);
    }
    if (s->db != 0) {
        const char *argv[] = {"SELECT", db};
        size_t lens[] = {6, (size_t)snprintf(db, sizeof(db), "%d", s->db)};
        setup_cmd(rc, "SELECT", -1, 2, argv, lens);
    }
    for (int i = 0; i < SB_STORE_NSCRIPTS; ++i) {
        const char *argv[] = {"SCRIPT", "LOAD", sb_store__redis_scripts[i].body};
        size_t lens[] = {6, 4, sb_store__redis_scripts[i].len};
        setup_cmd(rc, "SCRIPT LOAD", i, 3, argv, lens);
    }
    {
        const char *argv[] = {"CLIENT", "SETNAME", "sandbox-broker:data"};
        size_t lens[] = {6, 7, 19};
        setup_cmd(rc, "CLIENT SETNAME", -1, 3, argv, lens);
    }
    {
        const char *argv[] = {"ROLE"};
        size_t lens[] = {4};
        setup_cmd(rc, "ROLE", -1, 1, argv, lens);
    }
}

static void on_heartbeat(cmd_t *cmd, redisReply *reply)
{
    redis_conn_t *rc = cmd->rc;
    char why[192];

    if (reply == NULL || rc->data.state != L_UP)
        return;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements >= 1 && reply->element[0]->type == REDIS_REPLY_STRING &&
        strcmp(reply->element[0]->str, "master") == 0)
        return;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements >= 1 && reply->element[0]->type == REDIS_REPLY_STRING)
        snprintf(why, sizeof(why), "the node is no longer a primary (ROLE: %.32s)", reply->element[0]->str);
    else
        snprintf(why, sizeof(why), "ROLE: %.140s", reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected answer");
    data_teardown(rc, why, 0);
    if (is_sentinel(rc))
        sentinel_query(rc);
}

/* ---- Sentinel ---------------------------------------------------------------------------------------------------------- */

static void sentinel_log_down(redis_conn_t *rc, const char *why)
{
    sb_logline_t l;
    if (rc->s_logged_down && strcmp(rc->s_last_down, why) == 0)
        return;
    rc->s_logged_down = 1;
    snprintf(rc->s_last_down, sizeof(rc->s_last_down), "%s", why);
    sb_log_begin(&l, SB_LOG_WARN, "redis.sentinel_down");
    sb_log_cstr(&l, "addr", rc->sq.addr);
    sb_log_cstr(&l, "reason", why);
    sb_log_end(&l);
}

/* drops both links to the current sentinel and moves on to the next one */
static void sentinel_fail(redis_conn_t *rc, const char *why)
{
    int64_t now = mono_ms();

    sentinel_log_down(rc, why);
    link_close(&rc->sq);
    link_close(&rc->ss);
    rc->query_sent = 0;
    rc->ss_subscribed = 0;
    rc->sidx = (rc->sidx + 1) % rc->store->nsentinels;
    ++rc->s_failures;
    /* the next sentinel at once; after a round of failures, probe at the reconnect cap */
    rc->s_next_attempt = now + (rc->s_failures % rc->store->nsentinels == 0 ? RECONNECT_CAP_MS : 0);
}

/* a sentinel named `to` as the primary (via its answer or +switch-master) */
static void primary_named(redis_conn_t *rc, const sb_store_addr_t *to, const char *via)
{
    char from[96], dest[96], why[256];
    sb_logline_t l;

    if (rc->have_primary && strcmp(rc->primary.host, to->host) == 0 && rc->primary.port == to->port) {
        rc->confirmed_at = mono_ms();
        update_usable(rc, NULL);
        return;
    }
    sb_store__redis_format_addr(to, dest, sizeof(dest));
    if (rc->have_primary) {
        sb_store__redis_format_addr(&rc->primary, from, sizeof(from));
        sb_metrics_store_event(SB_STORE_EV_PRIMARY_SWITCH);
        sb_log_begin(&l, SB_LOG_WARN, "redis.switch");
        sb_log_cstr(&l, "from", from);
        sb_log_cstr(&l, "to", dest);
        sb_log_cstr(&l, "via", via);
        sb_log_cstr(&l, "sentinel", rc->sq.addr);
        sb_log_end(&l);
    }
    rc->primary = *to;
    rc->have_primary = 1;
    rc->confirmed_at = mono_ms();
    if (rc->data.state != L_DOWN) {
        snprintf(why, sizeof(why), "the primary moved to %s", dest);
        data_teardown(rc, why, 0);
    }
    /* not inside one of the data link's callbacks here, so it is gone already: connect to the new primary now */
    rc->failures = 0;
    rc->next_attempt = 0;
    if (rc->data.ac == NULL)
        data_connect(rc);
}

static void on_sentinel_query(redisAsyncContext *ac, void *r, void *privdata)
{
    redis_conn_t *rc = privdata;
    redisReply *reply = r;
    sb_store_addr_t to;
    char why[192];

    if (reply == NULL || rc->sq.state == L_DOWN)
        return;
    rc->query_sent = 0;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 && reply->element[0]->type == REDIS_REPLY_STRING &&
        reply->element[1]->type == REDIS_REPLY_STRING) {
        if (sb_store__redis_addr_from(reply->element[0]->str, reply->element[0]->len, reply->element[1]->str,
                                      reply->element[1]->len, &to) != 0) {
            snprintf(why, sizeof(why), "the sentinel named the primary \"%.64s\" port \"%.8s\": only IP addresses are used",
                     reply->element[0]->str, reply->element[1]->str);
            sentinel_fail(rc, why);
            return;
        }
        if (rc->s_logged_down) {
            sb_logline_t l;
            rc->s_logged_down = 0;
            rc->s_last_down[0] = '\0';
            sb_log_begin(&l, SB_LOG_INFO, "redis.sentinel_up");
            sb_log_cstr(&l, "addr", rc->sq.addr);
            sb_log_end(&l);
        }
        rc->s_failures = 0;
        primary_named(rc, &to, "sentinel answer");
        return;
    }
    if (reply->type == REDIS_REPLY_NIL)
        snprintf(why, sizeof(why), "the sentinel does not know master \"%s\"", rc->store->master);
    else if (reply->type == REDIS_REPLY_ERROR)
        snprintf(why, sizeof(why), "the sentinel refused the query: %.140s", reply->str);
    else
        snprintf(why, sizeof(why), "the sentinel gave an unexpected answer");
    sentinel_fail(rc, why);
}

/* asks for the primary now, unless the query link is not up or a question is already out */
static void sentinel_query(redis_conn_t *rc)
{
    const char *argv[] = {"SENTINEL", "get-master-addr-by-name", rc->store->master};
    size_t lens[] = {8, 23, strlen(rc->store->master)};

    if (rc->sq.state != L_UP || rc->query_sent != 0 || rc->sq.ac == NULL)
        return;
    if (redisAsyncCommandArgv(rc->sq.ac, on_sentinel_query, rc, 3, argv, lens) != REDIS_OK)
        return;
    rc->query_sent = rc->last_query = mono_ms();
}

static void on_sentinel_auth(redisAsyncContext *ac, void *r, void *privdata)
{
    link_t *l = privdata;
    redisReply *reply = r;
    char why[192];

    if (reply == NULL || l->state == L_DOWN)
        return;
    if (reply->type == REDIS_REPLY_STATUS && strcmp(reply->str, "OK") == 0)
        return;
    snprintf(why, sizeof(why), "AUTH refused: %.140s", reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected answer");
    sentinel_fail(l->rc, why);
}

static void on_switch_message(redisAsyncContext *ac, void *r, void *privdata)
{
    redis_conn_t *rc = privdata;
    redisReply *reply = r;
    sb_store_addr_t to;

    if (reply == NULL || rc->ss.state == L_DOWN || reply->type != REDIS_REPLY_ARRAY || reply->elements != 3 ||
        reply->element[0]->type != REDIS_REPLY_STRING)
        return;
    if (strcmp(reply->element[0]->str, "subscribe") == 0) {
        rc->ss_subscribed = 1;
        rc->ss.state = L_UP;
        return;
    }
    if (strcmp(reply->element[0]->str, "message") != 0 || reply->element[2]->type != REDIS_REPLY_STRING)
        return;
    switch (sb_store__parse_switch_master(reply->element[2]->str, reply->element[2]->len, rc->store->master, &to)) {
    case 1:
        primary_named(rc, &to, "+switch-master");
        break;
    case 0:
        break; /* another master this sentinel watches */
    default:
        sentinel_fail(rc, "malformed +switch-master message (or a primary named by a hostname)");
        break;
    }
}

static void on_sentinel_connect(const redisAsyncContext *ac, int status)
{
    link_t *l = ac->data;
    char why[192];

    if (status != REDIS_OK) {
        /* hiredis frees this context after the callback: only the other link is closed here */
        snprintf(why, sizeof(why), "connect failed: %s", ac->errstr[0] != '\0' ? ac->errstr : "unknown error");
        if (l->state != L_DOWN) {
            l->state = L_DOWN;
            sentinel_fail(l->rc, why);
        }
        return;
    }
    if (l == &l->rc->sq && l->state == L_CONNECTING) {
        l->state = L_UP;
        sentinel_query(l->rc);
    }
}

static void on_sentinel_disconnect(const redisAsyncContext *ac, int status)
{
    link_t *l = ac->data;
    char why[192];

    if (l->state == L_DOWN)
        return;
    l->state = L_DOWN;
    snprintf(why, sizeof(why), "connection lost: %s",
             status == REDIS_OK ? "closed by the sentinel" : (ac->errstr[0] != '\0' ? ac->errstr : "unknown error"));
    sentinel_fail(l->rc, why);
}

static void sentinel_open(redis_conn_t *rc)
{
    sb_store_t *s = rc->store;
    const sb_store_addr_t *to = &s->sentinels[rc->sidx];
    const char *pw = s->sentinel_password;
    char why[192];
    const char *err;

    rc->query_sent = 0;
    rc->ss_subscribed = 0;
    if ((err = link_open(&rc->sq, rc->loop, to, NULL, on_sentinel_connect, on_sentinel_disconnect, why, sizeof(why))) != NULL ||
        (err = link_open(&rc->ss, rc->loop, to, NULL, on_sentinel_connect, on_sentinel_disconnect, why, sizeof(why))) != NULL) {
        sb_store__redis_format_addr(to, rc->sq.addr, sizeof(rc->sq.addr));
        sentinel_fail(rc, err);
        return;
    }
    if (pw != NULL) {
        const char *argv[] = {"AUTH", pw};
        size_t lens[] = {4, strlen(pw)};
        redisAsyncCommandArgv(rc->sq.ac, on_sentinel_auth, &rc->sq, 2, argv, lens);
        redisAsyncCommandArgv(rc->ss.ac, on_sentinel_auth, &rc->ss, 2, argv, lens);
    }
    {
        const char *argv[] = {"SUBSCRIBE", "+switch-master"};
        size_t lens[] = {9, 14};
        redisAsyncCommandArgv(rc->ss.ac, on_switch_message, rc, 2, argv, lens);
        rc->ss_sent = mono_ms();
    }
    /* the query goes out once the query link is connected (on_sentinel_connect) */
}

static void sentinel_tick(redis_conn_t *rc, int64_t now)
{
    int64_t timeout = (int64_t)rc->store->timeout_ms;
    char why[128];

    if (rc->sq.state == L_CONNECTING && now - rc->sq.since > timeout) {
        snprintf(why, sizeof(why), "connect timed out after %lld ms", (long long)timeout);
        sentinel_fail(rc, why);
    } else if (rc->query_sent != 0 && now - rc->query_sent > timeout) {
        snprintf(why, sizeof(why), "no answer to SENTINEL get-master-addr-by-name within %lld ms", (long long)timeout);
        sentinel_fail(rc, why);
    } else if (rc->ss.state != L_DOWN && !rc->ss_subscribed && now - rc->ss_sent > timeout) {
        snprintf(why, sizeof(why), "SUBSCRIBE +switch-master not confirmed within %lld ms", (long long)timeout);
        sentinel_fail(rc, why);
    }
    if (rc->sq.state == L_UP && rc->query_sent == 0 && now - rc->last_query >= SENTINEL_QUERY_MS)
        sentinel_query(rc);
    if (rc->sq.state == L_DOWN && rc->ss.state == L_DOWN && rc->sq.ac == NULL && rc->ss.ac == NULL && now >= rc->s_next_attempt)
        sentinel_open(rc);
}

/* ---- the tick ---------------------------------------------------------------------------------------------------------- */

static void on_tick(h2o_timeout_entry_t *entry)
{
    redis_conn_t *rc = H2O_STRUCT_FROM_MEMBER(redis_conn_t, tick, entry);
    int64_t now = mono_ms(), timeout = (int64_t)rc->store->timeout_ms;
    char why[192];

    h2o_timeout_link(rc->loop, &rc->tick_timeout, &rc->tick);
    if (rc->data.state == L_CONNECTING && now - rc->data.since > timeout) {
        snprintf(why, sizeof(why), "connect timed out after %lld ms", (long long)timeout);
        data_teardown(rc, why, 0);
    } else if (rc->data.state == L_SETUP && now - rc->data.since > 2 * timeout) {
        /* the data link's own commands time out below: this is the invalidation link's part */
        snprintf(why, sizeof(why), "the invalidation link was not set up within %lld ms", (long long)(2 * timeout));
        data_teardown(rc, why, 0);
    } else if (rc->data.state == L_UP && rc->hb_sent != 0 && now - rc->hb_sent > timeout) {
        snprintf(why, sizeof(why), "the heartbeat's invalidation did not come back within %lld ms: the invalidation link is lost",
                 (long long)timeout);
        sb_metrics_store_event(SB_STORE_EV_TRACKING_LOST);
        data_teardown(rc, why, 0);
    } else if (!h2o_linklist_is_empty(&rc->pending)) {
        cmd_t *oldest = H2O_STRUCT_FROM_MEMBER(cmd_t, link, rc->pending.next);
        if (oldest->deadline <= now) {
            snprintf(why, sizeof(why), "no answer to %s within %lld ms", oldest->what, (long long)timeout);
            data_teardown(rc, why, 0);
        }
    }
    if (rc->data.state == L_UP && now - rc->last_heartbeat >= HEARTBEAT_MS) {
        /* a heartbeat that also notices a primary turned replica, so /readyz follows within a second */
        const char *argv[] = {"ROLE"};
        size_t lens[] = {4};
        rc->last_heartbeat = now;
        sb_store__redis_cmd_send(sb_store__redis_cmd_new(rc, "ROLE", on_heartbeat, -1, 1, argv, lens));
    }
    if (rc->data.state == L_UP && rc->hb_sent == 0 && now - rc->hb_last >= INV_HEARTBEAT_MS)
        hb_send(rc, now);
    sb_store__redis_leases_tick(rc, now, 0);
    if (is_sentinel(rc))
        sentinel_tick(rc, now);
    if (rc->data.state == L_DOWN && rc->data.ac == NULL && rc->inv.ac == NULL && now >= rc->next_attempt &&
        (!is_sentinel(rc) || rc->have_primary))
        data_connect(rc);
    update_usable(rc, NULL);
}

void *sb_store__redis_conn_create(sb_store_t *s, h2o_loop_t *loop)
{
    redis_conn_t *rc = sb_mem_calloc(1, sizeof(*rc));
    rc->store = s;
    rc->loop = loop;
    rc->data.rc = rc->inv.rc = rc->sq.rc = rc->ss.rc = rc;
    rc->data.flush_timeout = rc->inv.flush_timeout = rc->sq.flush_timeout = rc->ss.flush_timeout = &rc->flush_timeout;
    rc->data.loop = rc->inv.loop = rc->sq.loop = rc->ss.loop = loop;
    rc->data.wflush.cb = rc->inv.wflush.cb = rc->sq.wflush.cb = rc->ss.wflush.cb = on_wflush;
    h2o_linklist_init_anchor(&rc->pending);
    h2o_timeout_init(loop, &rc->tick_timeout, TICK_MS);
    h2o_timeout_init(loop, &rc->flush_timeout, 0);
    rc->flush.cb = sb_store__redis_on_flush;
    rc->tick.cb = on_tick;
    h2o_timeout_link(loop, &rc->tick_timeout, &rc->tick);
    if (is_sentinel(rc))
        sentinel_open(rc);
    else
        data_connect(rc);
    return rc;
}

void sb_store__redis_conn_destroy(void *p)
{
    redis_conn_t *rc = p;
    link_t *links[] = {&rc->data, &rc->inv, &rc->sq, &rc->ss};

    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); ++i) {
        links[i]->state = L_DOWN;
        if (links[i]->ac != NULL)
            redisAsyncFree(links[i]->ac);
    }
    /* leases not given back by sb_store__redis_settle: counted as releases that failed */
    sb_store__redis_leases_tick(rc, mono_ms(), 1);
    for (size_t i = 0; i < rc->nrel; ++i)
        sb_store__redis_update_failed("release", rc->rel[i].run_id, "the worker stopped before it was sent");
    sb_store__redis_timeline_dispose(rc);
    if (h2o_timeout_is_linked(&rc->tick))
        h2o_timeout_unlink(&rc->tick);
    if (h2o_timeout_is_linked(&rc->flush))
        h2o_timeout_unlink(&rc->flush);
    h2o_timeout_dispose(rc->loop, &rc->tick_timeout);
    h2o_timeout_dispose(rc->loop, &rc->flush_timeout);
    for (size_t i = 0; i < RCACHE_SLOTS; ++i) {
        sb_token_release(rc->cache[i].tok);
        sb_token_release(rc->cache[i].ltok);
    }
    sb_mem_free(rc);
}

int sb_store__redis_healthy(void *p)
{
    redis_conn_t *rc = p;
    return atomic_load_explicit(&rc->usable, memory_order_relaxed);
}
