/*
 * The token store front and its memory backend: a mutex-protected chained
 * hash table keyed by the token's SHA-256 (uniformly distributed, so the
 * first bytes make a fine bucket index). Expired records are dropped when
 * met and swept when the table is full.
 */
#include <stdlib.h>
#include <string.h>
#include "store/store_int.h"
#include "util/util.h"

struct st_mem_entry_t {
    sb_token_t *tok;
    mem_entry_t *next;
};

sb_status_t sb_store_create(const sb_store_config_t *conf, sb_store_t **out, const char **err)
{
    sb_store_t *s = sb_mem_calloc(1, sizeof(*s));

    pthread_mutex_init(&s->mu, NULL);
    s->max_tokens = conf->max_tokens != 0 ? conf->max_tokens : 100000;
    s->timeout_ms = conf->timeout_ms != 0 ? conf->timeout_ms : 1000;
    s->prefix = sb_mem_strdup(conf->prefix != NULL ? conf->prefix : "sb:");
    if (strcmp(conf->url, "memory") == 0) {
        s->nbuckets = 1;
        while (s->nbuckets < s->max_tokens)
            s->nbuckets <<= 1;
        s->buckets = sb_mem_calloc(s->nbuckets, sizeof(*s->buckets));
    } else {
        sb_status_t st;
        s->is_redis = 1;
        if ((st = sb_store__redis_parse_url(s, conf->url, err)) != SB_OK) {
            sb_store_destroy(s);
            return st;
        }
    }
    *out = s;
    return SB_OK;
}

void sb_store_destroy(sb_store_t *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < s->nbuckets; ++i) {
        mem_entry_t *e = s->buckets[i];
        while (e != NULL) {
            mem_entry_t *next = e->next;
            sb_token_release(e->tok);
            free(e);
            e = next;
        }
    }
    free(s->buckets);
    free(s->prefix);
    free(s->unix_path);
    free(s->password);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

const char *sb_store_kind(const sb_store_t *s)
{
    return s->is_redis ? "redis" : "memory";
}

long long sb_store_live_tokens(sb_store_t *s)
{
    long long n;
    if (s->is_redis)
        return -1;
    pthread_mutex_lock(&s->mu);
    n = (long long)s->count;
    pthread_mutex_unlock(&s->mu);
    return n;
}

sb_store_conn_t *sb_store_conn_create(sb_store_t *s, h2o_loop_t *loop)
{
    sb_store_conn_t *c = sb_mem_calloc(1, sizeof(*c));
    c->store = s;
    c->loop = loop;
    if (s->is_redis)
        c->redis = sb_store__redis_conn_create(s, loop);
    return c;
}

void sb_store_conn_destroy(sb_store_conn_t *c)
{
    if (c == NULL)
        return;
    if (c->redis != NULL)
        sb_store__redis_conn_destroy(c->redis);
    free(c);
}

int sb_store_conn_healthy(sb_store_conn_t *c)
{
    return c->store->is_redis ? sb_store__redis_healthy(c->redis) : 1;
}

static size_t bucket_of(const sb_store_t *s, const uint8_t hash[32])
{
    uint64_t v;
    memcpy(&v, hash, sizeof(v));
    return (size_t)(v & (s->nbuckets - 1));
}

/* unlinks and releases every expired record; called with the lock held */
static void sweep_locked(sb_store_t *s, int64_t now)
{
    for (size_t i = 0; i < s->nbuckets; ++i) {
        mem_entry_t **pp = &s->buckets[i];
        while (*pp != NULL) {
            mem_entry_t *e = *pp;
            if (e->tok->expires_at_ms <= now) {
                *pp = e->next;
                sb_token_release(e->tok);
                free(e);
                --s->count;
            } else {
                pp = &e->next;
            }
        }
    }
}

void sb_store_get(sb_store_conn_t *c, const uint8_t hash[32], sb_store_get_cb cb, void *arg)
{
    sb_store_t *s = c->store;
    sb_token_t *found = NULL;
    int64_t now;

    if (s->is_redis) {
        sb_store__redis_get(c->redis, hash, cb, arg);
        return;
    }
    now = sb_now_ms();
    pthread_mutex_lock(&s->mu);
    for (mem_entry_t **pp = &s->buckets[bucket_of(s, hash)]; *pp != NULL; pp = &(*pp)->next) {
        mem_entry_t *e = *pp;
        if (memcmp(e->tok->hash, hash, 32) != 0)
            continue;
        if (e->tok->expires_at_ms <= now) {
            *pp = e->next;
            sb_token_release(e->tok);
            free(e);
            --s->count;
        } else {
            found = e->tok;
            sb_token_addref(found);
        }
        break;
    }
    pthread_mutex_unlock(&s->mu);
    cb(arg, found != NULL ? SB_OK : SB_E_UNAUTHORIZED, found);
}

void sb_store_put(sb_store_conn_t *c, sb_token_t *tok, const json_t *caps, sb_store_done_cb cb, void *arg)
{
    sb_store_t *s = c->store;
    sb_status_t st = SB_OK;
    size_t b;

    if (s->is_redis) {
        sb_store__redis_put(c->redis, tok, caps, cb, arg);
        return;
    }
    b = bucket_of(s, tok->hash);
    pthread_mutex_lock(&s->mu);
    for (mem_entry_t *e = s->buckets[b]; e != NULL; e = e->next) {
        if (memcmp(e->tok->hash, tok->hash, 32) == 0) {
            st = SB_E_BAD_ARGS;
            goto Exit;
        }
    }
    if (s->count >= s->max_tokens) {
        sweep_locked(s, sb_now_ms());
        if (s->count >= s->max_tokens) {
            st = SB_E_RATE_LIMITED;
            goto Exit;
        }
    }
    {
        mem_entry_t *e = sb_mem_alloc(sizeof(*e));
        sb_token_addref(tok);
        e->tok = tok;
        e->next = s->buckets[b];
        s->buckets[b] = e;
        ++s->count;
    }
Exit:
    pthread_mutex_unlock(&s->mu);
    cb(arg, st);
}

void sb_store_revoke_token(sb_store_conn_t *c, const uint8_t hash[32], sb_store_done_cb cb, void *arg)
{
    sb_store_t *s = c->store;

    if (s->is_redis) {
        sb_store__redis_revoke_token(c->redis, hash, cb, arg);
        return;
    }
    pthread_mutex_lock(&s->mu);
    for (mem_entry_t **pp = &s->buckets[bucket_of(s, hash)]; *pp != NULL; pp = &(*pp)->next) {
        mem_entry_t *e = *pp;
        if (memcmp(e->tok->hash, hash, 32) == 0) {
            *pp = e->next;
            sb_token_release(e->tok);
            free(e);
            --s->count;
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    cb(arg, SB_OK);
}

void sb_store_revoke_run(sb_store_conn_t *c, const char *run_id, sb_store_done_cb cb, void *arg)
{
    sb_store_t *s = c->store;

    if (s->is_redis) {
        sb_store__redis_revoke_run(c->redis, run_id, cb, arg);
        return;
    }
    /* a full scan: the table is capped at max_tokens, and run revocation is rare (once per run) */
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nbuckets; ++i) {
        mem_entry_t **pp = &s->buckets[i];
        while (*pp != NULL) {
            mem_entry_t *e = *pp;
            if (strcmp(e->tok->run_id, run_id) == 0) {
                *pp = e->next;
                sb_token_release(e->tok);
                free(e);
                --s->count;
            } else {
                pp = &e->next;
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
    cb(arg, SB_OK);
}
