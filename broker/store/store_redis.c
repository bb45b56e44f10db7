/*
 * The redis token-store backend: hiredis 0.14 async on a worker's h2o loop.
 *
 * hiredis ships no h2o adapter, so this file provides its five event hooks
 * over an h2o socket that wraps a dup() of the hiredis fd (hiredis closes its
 * own fd; we close only the wrapper). hiredis 0.14 has no timeouts at all, so
 * a 100 ms tick enforces them: a command older than the timeout, or a connect
 * that takes longer, tears the connection down, which fails every pending
 * command with SB_E_UNAVAILABLE. While the connection is not up, every call
 * fails at once with SB_E_UNAVAILABLE (fail closed); the tick reconnects with
 * backoff, so the broker recovers by itself when Redis returns.
 *
 * There is no cache: every RPC reads the record, so a revocation made through
 * any instance is refused by every instance on its next call.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include "obs/log.h"
#include "store/store_int.h"
#include "util/util.h"

enum { R_DOWN = 0, R_CONNECTING, R_UP };

typedef struct st_redis_conn_t {
    sb_store_t *store;
    h2o_loop_t *loop;
    redisAsyncContext *ac;
    h2o_socket_t *sock;
    int reading, want_write, write_armed;
    int state;
    int64_t state_since, next_attempt, last_ping;
    unsigned failures;
    h2o_timeout_t tick_timeout;
    h2o_timeout_entry_t tick;
    h2o_linklist_t pending;
    int was_up;
    int setup_left; /* AUTH / SELECT replies still awaited before the store counts as up */
} redis_conn_t;

typedef struct st_pending_t {
    h2o_linklist_t link;
    redis_conn_t *rc;
    int64_t deadline;
    sb_store_get_cb get_cb;
    sb_store_done_cb done_cb;
    void *arg;
    uint8_t hash[32];
} pending_t;

/* mint: SET NX with expiry, then index the token under its run */
static const char mint_script[] = "if not redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') then return 0 end "
                                  "redis.call('SADD', KEYS[2], ARGV[3]) "
                                  "if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then "
                                  "redis.call('PEXPIRE', KEYS[2], ARGV[2]) end "
                                  "return 1";
/* revoke a run: every token indexed under it, then the index */
static const char revoke_run_script[] = "local m = redis.call('SMEMBERS', KEYS[1]) "
                                        "for _, h in ipairs(m) do redis.call('DEL', ARGV[1] .. h) end "
                                        "redis.call('DEL', KEYS[1]) return #m";

sb_status_t sb_store__redis_parse_url(sb_store_t *s, const char *url, const char **err)
{
    const char *p, *host, *hend, *colon;
    char tmp[64];
    struct in6_addr a6;
    struct in_addr a4;

    if (strncmp(url, "unix://", 7) == 0) {
        const char *q = strchr(url + 7, '?');
        size_t n = q != NULL ? (size_t)(q - (url + 7)) : strlen(url + 7);
        if (n == 0 || url[7] != '/') {
            *err = "token_store: unix:// needs an absolute socket path";
            return SB_E_BAD_ARGS;
        }
        s->unix_path = sb_mem_alloc(n + 1);
        memcpy(s->unix_path, url + 7, n);
        s->unix_path[n] = '\0';
        if (q != NULL) {
            if (strncmp(q, "?db=", 4) != 0 || q[4] < '0' || q[4] > '9' || strlen(q + 4) > 2) {
                *err = "token_store: unix:// accepts only ?db=N";
                return SB_E_BAD_ARGS;
            }
            s->db = (int)strtol(q + 4, NULL, 10);
        }
        return SB_OK;
    }
    if (strncmp(url, "redis://", 8) != 0) {
        *err = "token_store: expected \"memory\", redis://host:port[/db] or unix:///path";
        return SB_E_BAD_ARGS;
    }
    p = url + 8;
    if ((host = strrchr(p, '@')) != NULL) {
        const char *pw = p;
        if (*pw == ':')
            ++pw;
        s->password = sb_mem_alloc((size_t)(host - pw) + 1);
        memcpy(s->password, pw, (size_t)(host - pw));
        s->password[host - pw] = '\0';
        p = host + 1;
    }
    if (*p == '[') {
        host = p + 1;
        if ((hend = strchr(host, ']')) == NULL) {
            *err = "token_store: unterminated IPv6 literal";
            return SB_E_BAD_ARGS;
        }
        colon = hend[1] == ':' ? hend + 1 : NULL;
    } else {
        host = p;
        hend = host + strcspn(host, ":/");
        colon = *hend == ':' ? hend : NULL;
    }
    if ((size_t)(hend - host) >= sizeof(tmp) || hend == host) {
        *err = "token_store: bad host";
        return SB_E_BAD_ARGS;
    }
    memcpy(tmp, host, (size_t)(hend - host));
    tmp[hend - host] = '\0';
    /* hiredis resolves names with a blocking getaddrinfo on the loop: accept literals only */
    if (strcmp(tmp, "localhost") == 0)
        memcpy(tmp, "127.0.0.1", sizeof("127.0.0.1"));
    if (inet_pton(AF_INET, tmp, &a4) != 1 && inet_pton(AF_INET6, tmp, &a6) != 1) {
        *err = "token_store: the redis host must be an IP literal or localhost";
        return SB_E_BAD_ARGS;
    }
    memcpy(s->host, tmp, strlen(tmp) + 1);
    s->port = 6379;
    p = colon != NULL ? colon + 1 : (*hend == ']' ? hend + 1 : hend);
    if (colon != NULL) {
        char *end;
        long port = strtol(p, &end, 10);
        if (end == p || port < 1 || port > 65535) {
            *err = "token_store: bad port";
            return SB_E_BAD_ARGS;
        }
        s->port = (int)port;
        p = end;
    }
    if (*p == '/' && p[1] != '\0') {
        char *end;
        long db = strtol(p + 1, &end, 10);
        if (*end != '\0' || db < 0 || db > 255) {
            *err = "token_store: bad database number";
            return SB_E_BAD_ARGS;
        }
        s->db = (int)db;
    } else if (*p != '\0' && !(p[0] == '/' && p[1] == '\0')) {
        *err = "token_store: trailing characters after the port";
        return SB_E_BAD_ARGS;
    }
    return SB_OK;
}

/* --- the h2o adapter for hiredis --- */

static void on_sock_read(h2o_socket_t *sock, const char *err)
{
    redis_conn_t *rc = sock->data;
    if (rc->ac != NULL)
        redisAsyncHandleRead(rc->ac);
}

static void on_sock_write(h2o_socket_t *sock, const char *err)
{
    redis_conn_t *rc = sock->data;
    rc->write_armed = 0;
    if (rc->want_write && rc->ac != NULL)
        redisAsyncHandleWrite(rc->ac);
}

static void ev_add_read(void *d)
{
    redis_conn_t *rc = d;
    if (!rc->reading && rc->sock != NULL) {
        rc->reading = 1;
        h2o_socket_read_start(rc->sock, on_sock_read);
    }
}

static void ev_del_read(void *d)
{
    redis_conn_t *rc = d;
    if (rc->reading && rc->sock != NULL) {
        rc->reading = 0;
        h2o_socket_read_stop(rc->sock);
    }
}

static void ev_add_write(void *d)
{
    redis_conn_t *rc = d;
    rc->want_write = 1;
    /* h2o asserts if notify_write is armed twice */
    if (!rc->write_armed && rc->sock != NULL) {
        rc->write_armed = 1;
        h2o_socket_notify_write(rc->sock, on_sock_write);
    }
}

static void ev_del_write(void *d)
{
    redis_conn_t *rc = d;
    rc->want_write = 0;
}

static void ev_cleanup(void *d)
{
    redis_conn_t *rc = d;
    if (rc->sock != NULL) {
        h2o_socket_close(rc->sock);
        rc->sock = NULL;
    }
    rc->reading = rc->want_write = rc->write_armed = 0;
    rc->ac = NULL;
}

/* --- connection life cycle --- */

static void set_down(redis_conn_t *rc, const char *why)
{
    int64_t now = sb_now_ms();
    uint64_t backoff = 100u << (rc->failures < 5 ? rc->failures : 5);
    if (rc->state == R_UP || rc->was_up == 0) {
        sb_logline_t l;
        sb_log_begin(&l, SB_LOG_WARN, "redis.down");
        sb_log_cstr(&l, "reason", why);
        sb_log_end(&l);
    }
    rc->state = R_DOWN;
    rc->was_up = 1;
    rc->state_since = now;
    rc->next_attempt = now + (int64_t)backoff;
    ++rc->failures;
}

static void mark_up(redis_conn_t *rc)
{
    rc->state = R_UP;
    rc->state_since = rc->last_ping = sb_now_ms();
    rc->failures = 0;
    sb_log_msg(SB_LOG_INFO, "redis.up", "token store connected");
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    redis_conn_t *rc = ac->data;
    if (status != REDIS_OK) {
        /* hiredis frees the context after this callback */
        set_down(rc, ac->errstr[0] != '\0' ? ac->errstr : "connect failed");
        return;
    }
    if (rc->setup_left == 0)
        mark_up(rc);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    redis_conn_t *rc = ac->data;
    if (rc->state == R_DOWN)
        return; /* we tore it down ourselves */
    set_down(rc, status == REDIS_OK ? "disconnected" : (ac->errstr[0] != '\0' ? ac->errstr : "connection lost"));
}

static void on_setup_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply *reply = r;
    redis_conn_t *rc = privdata;
    if (reply == NULL)
        return;
    if (reply->type != REDIS_REPLY_ERROR) {
        if (--rc->setup_left == 0 && rc->state == R_CONNECTING)
            mark_up(rc);
        return;
    }
    {
        sb_logline_t l;
        sb_log_begin(&l, SB_LOG_ERROR, "redis.setup_failed");
        sb_log_str(&l, "error", reply->str, reply->len);
        sb_log_end(&l);
        /* wrong password or database: stay "connecting" so the tick tears it down and retries */
        rc->setup_left = -1;
        rc->state_since = 0;
    }
}

static void try_connect(redis_conn_t *rc)
{
    sb_store_t *s = rc->store;
    redisAsyncContext *ac;
    int fd;

    ac = s->unix_path != NULL ? redisAsyncConnectUnix(s->unix_path) : redisAsyncConnect(s->host, s->port);
    if (ac == NULL) {
        set_down(rc, "out of memory");
        return;
    }
    if (ac->err) {
        set_down(rc, ac->errstr);
        redisAsyncFree(ac);
        return;
    }
    if ((fd = dup(ac->c.fd)) < 0) {
        set_down(rc, "dup failed");
        redisAsyncFree(ac);
        return;
    }
    rc->ac = ac;
    ac->data = rc;
    rc->sock = h2o_evloop_socket_create(rc->loop, fd, H2O_SOCKET_FLAG_DONT_READ);
    rc->sock->data = rc;
    ac->ev.data = rc;
    ac->ev.addRead = ev_add_read;
    ac->ev.delRead = ev_del_read;
    ac->ev.addWrite = ev_add_write;
    ac->ev.delWrite = ev_del_write;
    ac->ev.cleanup = ev_cleanup;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    rc->state = R_CONNECTING;
    rc->state_since = sb_now_ms();
    /* never HELLO 3: hiredis 0.14 cannot parse RESP3 */
    rc->setup_left = 0;
    if (s->password != NULL) {
        ++rc->setup_left;
        redisAsyncCommand(ac, on_setup_reply, rc, "AUTH %s", s->password);
    }
    if (s->db != 0) {
        ++rc->setup_left;
        redisAsyncCommand(ac, on_setup_reply, rc, "SELECT %d", s->db);
    }
    /* the connect callback fires on the first writable event */
    ev_add_write(rc);
}

static void teardown(redis_conn_t *rc, const char *why)
{
    if (rc->ac != NULL) {
        /* fails every pending command with a NULL reply, then calls ev_cleanup */
        redisAsyncContext *ac = rc->ac;
        set_down(rc, why);
        redisAsyncFree(ac);
    }
}

static void on_ping(redisAsyncContext *ac, void *r, void *privdata);

static void on_tick(h2o_timeout_entry_t *entry)
{
    redis_conn_t *rc = H2O_STRUCT_FROM_MEMBER(redis_conn_t, tick, entry);
    int64_t now = sb_now_ms();

    h2o_timeout_link(rc->loop, &rc->tick_timeout, &rc->tick);
    if (rc->state == R_CONNECTING && now - rc->state_since > (int64_t)rc->store->timeout_ms) {
        teardown(rc, "connect timed out");
    } else if (!h2o_linklist_is_empty(&rc->pending)) {
        pending_t *oldest = H2O_STRUCT_FROM_MEMBER(pending_t, link, rc->pending.next);
        if (oldest->deadline <= now)
            teardown(rc, "command timed out");
    }
    if (rc->state == R_UP && now - rc->last_ping >= 1000) {
        /* a heartbeat, so /readyz notices a silent Redis within a second */
        pending_t *p = sb_mem_calloc(1, sizeof(*p));
        p->rc = rc;
        p->deadline = now + (int64_t)rc->store->timeout_ms;
        h2o_linklist_insert(&rc->pending, &p->link);
        rc->last_ping = now;
        redisAsyncCommand(rc->ac, on_ping, p, "PING");
    }
    if (rc->state == R_DOWN && now >= rc->next_attempt)
        try_connect(rc);
}

void *sb_store__redis_conn_create(sb_store_t *s, h2o_loop_t *loop)
{
    redis_conn_t *rc = sb_mem_calloc(1, sizeof(*rc));
    rc->store = s;
    rc->loop = loop;
    h2o_linklist_init_anchor(&rc->pending);
    h2o_timeout_init(loop, &rc->tick_timeout, 100);
    rc->tick.cb = on_tick;
    h2o_timeout_link(loop, &rc->tick_timeout, &rc->tick);
    try_connect(rc);
    return rc;
}

void sb_store__redis_conn_destroy(void *p)
{
    redis_conn_t *rc = p;
    if (rc->ac != NULL)
        redisAsyncFree(rc->ac);
    if (h2o_timeout_is_linked(&rc->tick))
        h2o_timeout_unlink(&rc->tick);
    h2o_timeout_dispose(rc->loop, &rc->tick_timeout);
    free(rc);
}

int sb_store__redis_healthy(void *p)
{
    redis_conn_t *rc = p;
    return rc->state == R_UP;
}

/* --- commands --- */

static pending_t *begin(redis_conn_t *rc, sb_store_get_cb gcb, sb_store_done_cb dcb, void *arg)
{
    pending_t *p;
    if (rc->state != R_UP) {
        if (gcb != NULL)
            gcb(arg, SB_E_UNAVAILABLE, NULL);
        else
            dcb(arg, SB_E_UNAVAILABLE);
        return NULL;
    }
    p = sb_mem_calloc(1, sizeof(*p));
    p->rc = rc;
    p->get_cb = gcb;
    p->done_cb = dcb;
    p->arg = arg;
    p->deadline = sb_now_ms() + (int64_t)rc->store->timeout_ms;
    h2o_linklist_insert(&rc->pending, &p->link);
    return p;
}

static void finish(pending_t *p, sb_status_t st, sb_token_t *tok)
{
    h2o_linklist_unlink(&p->link);
    if (p->get_cb != NULL)
        p->get_cb(p->arg, st, tok);
    else if (p->done_cb != NULL)
        p->done_cb(p->arg, st);
    free(p);
}

static void on_ping(redisAsyncContext *ac, void *r, void *privdata)
{
    finish(privdata, SB_OK, NULL);
}

static void key_for(const sb_store_t *s, const char *kind, const char *id, size_t idlen, char *out, size_t outsz, size_t *len)
{
    int n = snprintf(out, outsz, "%s%s:%.*s", s->prefix, kind, (int)idlen, id);
    *len = (size_t)n < outsz ? (size_t)n : outsz - 1;
}

static void on_get(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply *reply = r;
    pending_t *p = privdata;
    sb_token_t *tok = NULL;
    sb_status_t st;

    if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
        st = SB_E_UNAVAILABLE;
    } else if (reply->type == REDIS_REPLY_NIL) {
        st = SB_E_UNAUTHORIZED;
    } else if (reply->type != REDIS_REPLY_STRING) {
        st = SB_E_UNAVAILABLE;
    } else if ((st = sb_token_deserialize(p->hash, reply->str, reply->len, &tok)) == SB_OK && tok->expires_at_ms <= sb_now_ms()) {
        /* Redis expiry and our clock disagree: believe the stricter one */
        sb_token_release(tok);
        tok = NULL;
        st = SB_E_UNAUTHORIZED;
    }
    finish(p, st, tok);
}

void sb_store__redis_get(void *rcp, const uint8_t hash[32], sb_store_get_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char hex[65], key[512];
    size_t klen;
    pending_t *p;

    if ((p = begin(rc, cb, NULL, arg)) == NULL)
        return;
    memcpy(p->hash, hash, 32);
    sb_hex(hash, 32, hex);
    key_for(rc->store, "tok", hex, 64, key, sizeof(key), &klen);
    redisAsyncCommand(rc->ac, on_get, p, "GET %b", key, klen);
}

static void on_put(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply *reply = r;
    sb_status_t st = SB_E_UNAVAILABLE;
    if (reply != NULL && reply->type == REDIS_REPLY_INTEGER)
        st = reply->integer == 1 ? SB_OK : SB_E_BAD_ARGS;
    finish(privdata, st, NULL);
}

void sb_store__redis_put(void *rcp, sb_token_t *tok, const json_t *caps, sb_store_done_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char hex[65], tkey[512], rkey[1024], ttl[32];
    size_t tlen, rlen;
    int64_t ttl_ms = tok->expires_at_ms - sb_now_ms();
    pending_t *p;
    char *rec;

    if ((p = begin(rc, NULL, cb, arg)) == NULL)
        return;
    sb_hex(tok->hash, 32, hex);
    key_for(rc->store, "tok", hex, 64, tkey, sizeof(tkey), &tlen);
    key_for(rc->store, "run", tok->run_id, strlen(tok->run_id), rkey, sizeof(rkey), &rlen);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)(ttl_ms > 0 ? ttl_ms : 1));
    rec = sb_token_serialize(tok, caps);
    redisAsyncCommand(rc->ac, on_put, p, "EVAL %s 2 %b %b %s %s %s", mint_script, tkey, tlen, rkey, rlen, rec, ttl, hex);
    free(rec);
}

static void on_done(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply *reply = r;
    finish(privdata, reply != NULL && reply->type == REDIS_REPLY_INTEGER ? SB_OK : SB_E_UNAVAILABLE, NULL);
}

void sb_store__redis_revoke_token(void *rcp, const uint8_t hash[32], sb_store_done_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char hex[65], key[512];
    size_t klen;
    pending_t *p;

    if ((p = begin(rc, NULL, cb, arg)) == NULL)
        return;
    sb_hex(hash, 32, hex);
    key_for(rc->store, "tok", hex, 64, key, sizeof(key), &klen);
    redisAsyncCommand(rc->ac, on_done, p, "DEL %b", key, klen);
}

void sb_store__redis_revoke_run(void *rcp, const char *run_id, sb_store_done_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char rkey[1024], tprefix[512];
    size_t rlen, plen;
    pending_t *p;

    if ((p = begin(rc, NULL, cb, arg)) == NULL)
        return;
    key_for(rc->store, "run", run_id, strlen(run_id), rkey, sizeof(rkey), &rlen);
    plen = (size_t)snprintf(tprefix, sizeof(tprefix), "%stok:", rc->store->prefix);
    redisAsyncCommand(rc->ac, on_done, p, "EVAL %s 1 %b %b", revoke_run_script, rkey, rlen, tprefix, plen);
}

/* ---- per-run quotas --------------------------------------------------------------------------------------------------- */

/*
 * One round trip, atomic: count the call (denied ones too), then take a
 * concurrency slot. Counters expire with the run's latest token.
 */
static const char quota_acquire_script[] = "local calls = redis.call('INCR', KEYS[1]) "
                                           "if redis.call('PEXPIRETIME', KEYS[1]) < tonumber(ARGV[3]) then "
                                           "redis.call('PEXPIREAT', KEYS[1], ARGV[3]) end "
                                           "if calls > tonumber(ARGV[1]) then return 1 end "
                                           "local inflight = redis.call('INCR', KEYS[2]) "
                                           "redis.call('PEXPIREAT', KEYS[2], ARGV[3]) "
                                           "if inflight > tonumber(ARGV[2]) then redis.call('DECR', KEYS[2]) return 2 end "
                                           "return 0";
static const char quota_release_script[] = "if tonumber(redis.call('GET', KEYS[1]) or '0') > 0 then "
                                           "redis.call('DECR', KEYS[1]) end return 0";

typedef struct st_quota_op_t {
    sb_quota_cb cb;
    void *arg;
    int64_t limit;
} quota_op_t;

static void quota_key(const sb_store_t *s, const sb_token_t *tok, const char *what, char *out, size_t outsz, size_t *len)
{
    int n = snprintf(out, outsz, "%sq:%s:%s", s->prefix, what, tok->run_id);
    *len = (size_t)n < outsz ? (size_t)n : outsz - 1;
}

static void on_quota_acquire(void *arg, sb_status_t st, sb_token_t *unused)
{
    quota_op_t *op = arg;
    (void)unused;
    op->cb(op->arg, st,
           st == SB_E_RATE_LIMITED  ? (op->limit == 1 ? "calls per run" : "concurrent calls per run")
           : st == SB_E_UNAVAILABLE ? "the token store is unavailable"
                                    : NULL);
    free(op);
}

static void on_quota_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply *reply = r;
    pending_t *p = privdata;
    quota_op_t *op = p->arg;
    sb_status_t st = SB_E_UNAVAILABLE;
    if (reply != NULL && reply->type == REDIS_REPLY_INTEGER) {
        st = reply->integer == 0 ? SB_OK : SB_E_RATE_LIMITED;
        op->limit = reply->integer;
    }
    finish(p, st, NULL);
}

void sb_store__redis_quota_acquire(void *rcp, const sb_token_t *tok, sb_quota_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char ck[512], ik[512], a1[32], a2[32], a3[32];
    size_t cl, il;
    quota_op_t *op = sb_mem_calloc(1, sizeof(*op));
    pending_t *p;

    op->cb = cb;
    op->arg = arg;
    if ((p = begin(rc, on_quota_acquire, NULL, op)) == NULL)
        return;
    quota_key(rc->store, tok, "calls", ck, sizeof(ck), &cl);
    quota_key(rc->store, tok, "inflight", ik, sizeof(ik), &il);
    snprintf(a1, sizeof(a1), "%lld", (long long)tok->quota.calls);
    snprintf(a2, sizeof(a2), "%lld", (long long)tok->quota.concurrent);
    snprintf(a3, sizeof(a3), "%lld", (long long)tok->expires_at_ms);
    redisAsyncCommand(rc->ac, on_quota_reply, p, "EVAL %s 2 %b %b %s %s %s", quota_acquire_script, ck, cl, ik, il, a1, a2, a3);
}

static void on_ignored(redisAsyncContext *ac, void *r, void *privdata)
{
    finish(privdata, SB_OK, NULL);
}

static void ignore_done(void *arg, sb_status_t st)
{
}

void sb_store__redis_quota_release(void *rcp, const sb_token_t *tok)
{
    redis_conn_t *rc = rcp;
    char ik[512];
    size_t il;
    pending_t *p;

    /* Redis down: the slot expires with the run's tokens */
    if ((p = begin(rc, NULL, ignore_done, NULL)) == NULL)
        return;
    quota_key(rc->store, tok, "inflight", ik, sizeof(ik), &il);
    redisAsyncCommand(rc->ac, on_ignored, p, "EVAL %s 1 %b", quota_release_script, ik, il);
}

static void on_fetch_check(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply *reply = r;
    pending_t *p = privdata;
    quota_op_t *op = p->arg;
    sb_status_t st = SB_E_UNAVAILABLE;
    if (reply != NULL && (reply->type == REDIS_REPLY_NIL || reply->type == REDIS_REPLY_STRING))
        st = reply->type == REDIS_REPLY_STRING && strtoll(reply->str, NULL, 10) >= op->limit ? SB_E_RATE_LIMITED : SB_OK;
    finish(p, st, NULL);
}

static void on_fetch_checked(void *arg, sb_status_t st, sb_token_t *unused)
{
    quota_op_t *op = arg;
    (void)unused;
    op->cb(op->arg, st,
           st == SB_E_RATE_LIMITED  ? "fetched bytes per run"
           : st == SB_E_UNAVAILABLE ? "the token store is unavailable"
                                    : NULL);
    free(op);
}

void sb_store__redis_quota_fetch_check(void *rcp, const sb_token_t *tok, sb_quota_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char bk[512];
    size_t bl;
    quota_op_t *op = sb_mem_calloc(1, sizeof(*op));
    pending_t *p;

    op->cb = cb;
    op->arg = arg;
    op->limit = tok->quota.fetch_bytes;
    if ((p = begin(rc, on_fetch_checked, NULL, op)) == NULL)
        return;
    quota_key(rc->store, tok, "bytes", bk, sizeof(bk), &bl);
    redisAsyncCommand(rc->ac, on_fetch_check, p, "GET %b", bk, bl);
}

void sb_store__redis_quota_fetch_add(void *rcp, const sb_token_t *tok, uint64_t bytes)
{
    redis_conn_t *rc = rcp;
    char bk[512], n[32], exp[32];
    size_t bl;
    pending_t *p;

    if ((p = begin(rc, NULL, ignore_done, NULL)) == NULL)
        return;
    quota_key(rc->store, tok, "bytes", bk, sizeof(bk), &bl);
    snprintf(n, sizeof(n), "%llu", (unsigned long long)bytes);
    snprintf(exp, sizeof(exp), "%lld", (long long)tok->expires_at_ms);
    redisAsyncCommand(rc->ac, on_ignored, p, "EVAL %s 1 %b %s %s",
                      "redis.call('INCRBY', KEYS[1], ARGV[1]) redis.call('PEXPIREAT', KEYS[1], ARGV[2]) return 0", bk, bl, n, exp);
}
