/*
 * The token store front and its memory backend: a mutex-protected chained
 * hash table keyed by the token's SHA-256 (uniformly distributed, so the
 * first bytes make a fine bucket index), chained through the records
 * themselves, so a live token costs its record (one allocation, its
 * manifest shared: store.h) and one bucket pointer. The table doubles when
 * it holds as many records as buckets, up to the power of two above
 * max_tokens. Expired records are dropped when met and swept when the table
 * is full.
 */
#include <stdlib.h>
#include <string.h>
#include "store/store_int.h"
#include "util/util.h"
#include "sb/mem.h"

/* the tables' first size; they double from there */
#define MIN_BUCKETS 1024u

struct st_quota_entry_t {
    quota_entry_t *next;
    int64_t calls, inflight, fetched;
    int64_t tool_calls;            /* tools.call of the run (the target's max_calls) */
    int64_t modules, module_bytes; /* import.fetch of the run: modules started, module bytes received */
    int64_t expires_at_ms;         /* the latest expiry of the run's tokens seen */
    char run_id[];                 /* NUL-terminated, at most SB_MAX_RUN_ID bytes */
};

sb_status_t sb_store_create(const sb_store_config_t *conf, sb_store_t **out, const char **err)
{
    sb_store_t *s = sb_mem_calloc(1, sizeof(*s));

    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->tl_mu, NULL);
    s->tl_max_events = conf->timeline_max_events;
    s->tl_retention_ms = conf->timeline_retention_ms;
    s->tl_max_bytes = SB_TIMELINE_MAX_BYTES;
    s->max_tokens = conf->max_tokens != 0 ? conf->max_tokens : 100000;
    s->timeout_ms = conf->timeout_ms != 0 ? conf->timeout_ms : 1000;
    s->prefix = sb_mem_strdup(conf->prefix != NULL ? conf->prefix : "sb:");
    if (strcmp(conf->url, "memory") == 0) {
        if (conf->password != NULL || conf->password_file != NULL || conf->sentinel_password != NULL ||
            conf->sentinel_password_file != NULL) {
            *err = "redis_password and redis_sentinel_password need a Redis token_store";
            sb_store_destroy(s);
            return SB_E_BAD_ARGS;
        }
        s->nbuckets = s->nqbuckets = MIN_BUCKETS;
        s->buckets = sb_mem_calloc(s->nbuckets, sizeof(*s->buckets));
        s->qbuckets = sb_mem_calloc(s->nqbuckets, sizeof(*s->qbuckets));
    } else {
        sb_status_t st;
        s->is_redis = 1;
        if ((st = sb_store__redis_init(s, conf, err)) != SB_OK) {
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
        sb_token_t *t = s->buckets[i];
        while (t != NULL) {
            sb_token_t *next = t->_next;
            sb_token_release(t);
            t = next;
        }
    }
    sb_mem_free(s->buckets);
    for (size_t i = 0; i < s->nqbuckets; ++i) {
        quota_entry_t *q = s->qbuckets[i];
        while (q != NULL) {
            quota_entry_t *next = q->next;
            sb_mem_free(q);
            q = next;
        }
    }
    sb_mem_free(s->qbuckets);
    sb_store__timeline_free(s);
    sb_mem_free(s->prefix);
    if (s->is_redis)
        sb_store__redis_free(s);
    pthread_mutex_destroy(&s->mu);
    sb_mem_free(s);
}

sb_status_t sb_store_check(sb_store_t *s, char *err, size_t errsz)
{
    err[0] = '\0';
    return s->is_redis ? sb_store__redis_check(s, err, errsz) : SB_OK;
}

const char *sb_store_kind(const sb_store_t *s)
{
    return !s->is_redis ? "memory" : s->nsentinels != 0 ? "redis-sentinel" : "redis";
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
    sb_mem_free(c);
}

int sb_store_conn_settle(sb_store_conn_t *c)
{
    return c->store->is_redis ? sb_store__redis_settle(c->redis) : 0;
}

int sb_store_conn_healthy(sb_store_conn_t *c)
{
    return c->store->is_redis ? sb_store__redis_healthy(c->redis) : 1;
}

static size_t bucket_of(size_t nbuckets, const uint8_t hash[32])
{
    uint64_t v;
    memcpy(&v, hash, sizeof(v));
    return (size_t)(v & (nbuckets - 1));
}

/* the smallest power of two >= n (n >= 1) */
static size_t pow2_at_least(size_t n)
{
    size_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

/*
 * Doubles the token table when it holds as many records as buckets, never
 * past max_tokens' power of two; called with the lock held. A table that
 * cannot grow (no memory) keeps working with longer chains.
 */
static void grow_tokens_locked(sb_store_t *s)
{
    size_t n = s->nbuckets * 2;
    sb_token_t **nb;

    if (s->count < s->nbuckets || s->nbuckets >= pow2_at_least(s->max_tokens) || (nb = sb_mem_try_calloc(n, sizeof(*nb))) == NULL)
        return;
    for (size_t i = 0; i < s->nbuckets; ++i) {
        sb_token_t *t = s->buckets[i];
        while (t != NULL) {
            sb_token_t *next = t->_next;
            size_t b = bucket_of(n, t->hash);
            t->_next = nb[b];
            nb[b] = t;
            t = next;
        }
    }
    sb_mem_free(s->buckets);
    s->buckets = nb;
    s->nbuckets = n;
}

/* unlinks *pp (a record in the table) and releases the table's reference; called with the lock held */
static void unlink_locked(sb_store_t *s, sb_token_t **pp)
{
    sb_token_t *t = *pp;
    *pp = t->_next;
    t->_next = NULL;
    sb_token_release(t);
    --s->count;
}

/* unlinks and releases every expired record; called with the lock held */
static void sweep_locked(sb_store_t *s, int64_t now)
{
    for (size_t i = 0; i < s->nbuckets; ++i) {
        sb_token_t **pp = &s->buckets[i];
        while (*pp != NULL) {
            if ((*pp)->expires_at_ms <= now)
                unlink_locked(s, pp);
            else
                pp = &(*pp)->_next;
        }
    }
}

/* the live record for `hash` (a new reference), or NULL; an expired one met on the way is dropped; with the lock held */
static sb_token_t *find_locked(sb_store_t *s, const uint8_t hash[32], int64_t now)
{
    for (sb_token_t **pp = &s->buckets[bucket_of(s->nbuckets, hash)]; *pp != NULL; pp = &(*pp)->_next) {
        sb_token_t *t = *pp;
        if (memcmp(t->hash, hash, 32) != 0)
            continue;
        if (t->expires_at_ms <= now) {
            unlink_locked(s, pp);
            return NULL;
        }
        sb_token_addref(t);
        return t;
    }
    return NULL;
}

void sb_store_get(sb_store_conn_t *c, const uint8_t hash[32], sb_store_get_cb cb, void *arg)
{
    sb_store_t *s = c->store;
    sb_token_t *found;
    int64_t now;

    if (s->is_redis) {
        sb_store__redis_get(c->redis, hash, cb, arg);
        return;
    }
    now = sb_now_ms();
    pthread_mutex_lock(&s->mu);
    found = find_locked(s, hash, now);
    pthread_mutex_unlock(&s->mu);
    cb(arg, found != NULL ? SB_OK : SB_E_UNAUTHORIZED, found);
}

void sb_store_put(sb_store_conn_t *c, sb_token_t *tok, const json_t *caps, sb_store_done_cb cb, void *arg)
{
    sb_store_t *s = c->store;
    sb_status_t st = SB_OK;

    if (s->is_redis) {
        sb_store__redis_put(c->redis, tok, caps, cb, arg);
        return;
    }
    pthread_mutex_lock(&s->mu);
    for (sb_token_t *t = s->buckets[bucket_of(s->nbuckets, tok->hash)]; t != NULL; t = t->_next) {
        if (memcmp(t->hash, tok->hash, 32) == 0) {
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
    grow_tokens_locked(s);
    {
        size_t b = bucket_of(s->nbuckets, tok->hash);
        sb_token_addref(tok);
        tok->_next = s->buckets[b];
        s->buckets[b] = tok;
        ++s->count;
    }
Exit:
    pthread_mutex_unlock(&s->mu);
    cb(arg, st);
}

void sb_store_revoke_token(sb_store_conn_t *c, const uint8_t hash[32], sb_store_revoked_cb cb, void *arg)
{
    sb_store_t *s = c->store;
    char run_id[SB_MAX_RUN_ID + 1];
    int found = 0;

    if (s->is_redis) {
        sb_store__redis_revoke_token(c->redis, hash, cb, arg);
        return;
    }
    pthread_mutex_lock(&s->mu);
    for (sb_token_t **pp = &s->buckets[bucket_of(s->nbuckets, hash)]; *pp != NULL; pp = &(*pp)->_next) {
        if (memcmp((*pp)->hash, hash, 32) == 0) {
            snprintf(run_id, sizeof(run_id), "%s", (*pp)->run_id);
            found = 1;
            unlink_locked(s, pp);
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    cb(arg, SB_OK, found ? run_id : NULL);
}

static size_t run_bucket(size_t nqbuckets, const char *run_id)
{
    /* FNV-1a: run ids come from the host, not the guest */
    uint64_t h = 1469598103934665603ull;
    for (const char *p = run_id; *p != '\0'; ++p)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return (size_t)(h & (nqbuckets - 1));
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
    {
        /* the run is over: its counters go too, unless calls are still in flight */
        quota_entry_t **qp = &s->qbuckets[run_bucket(s->nqbuckets, run_id)];
        while (*qp != NULL) {
            quota_entry_t *q = *qp;
            if (strcmp(q->run_id, run_id) == 0 && q->inflight == 0) {
                *qp = q->next;
                sb_mem_free(q);
                --s->qcount;
            } else {
                qp = &q->next;
            }
        }
    }
    for (size_t i = 0; i < s->nbuckets; ++i) {
        sb_token_t **pp = &s->buckets[i];
        while (*pp != NULL) {
            if (strcmp((*pp)->run_id, run_id) == 0)
                unlink_locked(s, pp);
            else
                pp = &(*pp)->_next;
        }
    }
    pthread_mutex_unlock(&s->mu);
    cb(arg, SB_OK);
}

void sb_store_inspect_run(sb_store_conn_t *c, const char *run_id, size_t max, sb_store_inspect_cb cb, void *arg)
{
    sb_store_t *s = c->store;
    sb_token_t *toks[SB_MAX_INSPECT_TOKENS];
    sb_store_usage_t usage = {0, 0, 0};
    size_t ntoks = 0, nlive = 0;
    int64_t now;

    if (max > SB_MAX_INSPECT_TOKENS)
        max = SB_MAX_INSPECT_TOKENS;
    if (s->is_redis) {
        sb_store__redis_inspect_run(c->redis, run_id, max, cb, arg);
        return;
    }
    now = sb_now_ms();
    pthread_mutex_lock(&s->mu);
    /* read only: the counters are found, never created or expired here */
    for (quota_entry_t *q = s->qbuckets[run_bucket(s->nqbuckets, run_id)]; q != NULL; q = q->next) {
        if (strcmp(q->run_id, run_id) == 0 && (q->expires_at_ms > now || q->inflight != 0)) {
            usage.calls = q->calls;
            usage.inflight = q->inflight;
            usage.fetched_bytes = q->fetched;
            break;
        }
    }
    /* a full scan, as a run revocation does: inspection is an operator's request, not the call path */
    for (size_t i = 0; max != 0 && i < s->nbuckets; ++i) {
        for (sb_token_t *t = s->buckets[i]; t != NULL; t = t->_next) {
            if (t->expires_at_ms <= now || strcmp(t->run_id, run_id) != 0)
                continue;
            if (ntoks < max) {
                sb_token_addref(t);
                toks[ntoks++] = t;
            }
            ++nlive;
        }
    }
    pthread_mutex_unlock(&s->mu);
    cb(arg, SB_OK, toks, ntoks, nlive, &usage);
    for (size_t i = 0; i < ntoks; ++i)
        sb_token_release(toks[i]);
}

/* ---- per-run quotas (memory backend) --------------------------------------------------------------------------------- */

/* drops the counters of runs whose tokens have all expired and that have nothing in flight; with the lock held */
static void sweep_quotas_locked(sb_store_t *s, int64_t now)
{
    for (size_t i = 0; i < s->nqbuckets; ++i) {
        quota_entry_t **qp = &s->qbuckets[i];
        while (*qp != NULL) {
            quota_entry_t *q = *qp;
            if (q->expires_at_ms <= now && q->inflight == 0) {
                *qp = q->next;
                sb_mem_free(q);
                --s->qcount;
            } else {
                qp = &q->next;
            }
        }
    }
}

/* doubles the counters' table as grow_tokens_locked does, up to the power of two above 2 * max_tokens */
static void grow_quotas_locked(sb_store_t *s)
{
    size_t n = s->nqbuckets * 2;
    quota_entry_t **nb;

    if (s->qcount < s->nqbuckets || s->nqbuckets >= pow2_at_least(2 * s->max_tokens) ||
        (nb = sb_mem_try_calloc(n, sizeof(*nb))) == NULL)
        return;
    for (size_t i = 0; i < s->nqbuckets; ++i) {
        quota_entry_t *q = s->qbuckets[i];
        while (q != NULL) {
            quota_entry_t *next = q->next;
            size_t b = run_bucket(n, q->run_id);
            q->next = nb[b];
            nb[b] = q;
            q = next;
        }
    }
    sb_mem_free(s->qbuckets);
    s->qbuckets = nb;
    s->nqbuckets = n;
}

/* finds (or creates) the run's counters; called with the lock held; NULL when the table is full */
/*
 * The run's counters, created when `create`. Counters of runs whose tokens
 * have all expired by `now` are dropped on the way; 0 drops none (a release,
 * which needs no clock read).
 */
static quota_entry_t *quota_entry(sb_store_t *s, const sb_token_t *tok, int create, int64_t now)
{
    quota_entry_t **pp = &s->qbuckets[run_bucket(s->nqbuckets, tok->run_id)];

    while (*pp != NULL) {
        quota_entry_t *q = *pp;
        if (q->expires_at_ms <= now && q->inflight == 0) {
            /* the run's tokens are all gone: so are its counters */
            *pp = q->next;
            sb_mem_free(q);
            --s->qcount;
            continue;
        }
        if (strcmp(q->run_id, tok->run_id) == 0) {
            if (q->expires_at_ms < tok->expires_at_ms)
                q->expires_at_ms = tok->expires_at_ms;
            return q;
        }
        pp = &q->next;
    }
    if (!create)
        return NULL;
    if (s->qcount >= 2 * s->max_tokens) {
        /* full: drop the counters of runs whose tokens have all expired, then try once more */
        sweep_quotas_locked(s, now);
        if (s->qcount >= 2 * s->max_tokens)
            return NULL;
    }
    grow_quotas_locked(s);
    {
        size_t rlen = strlen(tok->run_id), b = run_bucket(s->nqbuckets, tok->run_id);
        quota_entry_t *q = sb_mem_try_calloc(1, sizeof(*q) + rlen + 1); /* rlen <= SB_MAX_RUN_ID (sb_token_build) */
        if (q == NULL)
            return NULL;
        memcpy(q->run_id, tok->run_id, rlen + 1);
        q->expires_at_ms = tok->expires_at_ms;
        q->next = s->qbuckets[b];
        s->qbuckets[b] = q;
        ++s->qcount;
        return q;
    }
}

void sb_store_lookup_acquire(sb_store_conn_t *c, const uint8_t hash[32], sb_store_lookup_cb cb, void *arg)
{
    sb_store_t *s = c->store;
    sb_token_t *found;
    quota_entry_t *q;
    sb_status_t st = SB_OK;
    const char *why = NULL;
    int64_t now;

    if (s->is_redis) {
        sb_store__redis_lookup_acquire(c->redis, hash, cb, arg);
        return;
    }
    now = sb_now_ms();
    pthread_mutex_lock(&s->mu);
    found = find_locked(s, hash, now);
    if (found == NULL) {
        st = SB_E_UNAUTHORIZED;
    } else if ((q = quota_entry(s, found, 1, now)) == NULL) {
        st = SB_E_UNAVAILABLE;
        why = "the quota table is full";
    } else if (++q->calls > found->quota.calls) {
        st = SB_E_RATE_LIMITED;
        why = "calls per run";
    } else if (q->inflight >= found->quota.concurrent) {
        st = SB_E_RATE_LIMITED;
        why = "concurrent calls per run";
    } else {
        ++q->inflight;
    }
    pthread_mutex_unlock(&s->mu);
    if (st == SB_E_UNAVAILABLE) {
        sb_token_release(found);
        found = NULL;
    }
    cb(arg, st, found, why);
}

void sb_store_quota_release(sb_store_conn_t *c, const sb_token_t *tok)
{
    sb_store_t *s = c->store;
    quota_entry_t *q;

    if (s->is_redis) {
        sb_store__redis_quota_release(c->redis, tok);
        return;
    }
    pthread_mutex_lock(&s->mu);
    if ((q = quota_entry(s, tok, 0, 0)) != NULL && q->inflight > 0)
        --q->inflight;
    pthread_mutex_unlock(&s->mu);
}

void sb_store_quota_fetch_check(sb_store_conn_t *c, const sb_token_t *tok, sb_quota_cb cb, void *arg)
{
    sb_store_t *s = c->store;
    quota_entry_t *q;
    int over;

    if (s->is_redis) {
        sb_store__redis_quota_fetch_check(c->redis, tok, cb, arg);
        return;
    }
    pthread_mutex_lock(&s->mu);
    q = quota_entry(s, tok, 0, sb_now_ms());
    over = q != NULL && q->fetched >= tok->quota.fetch_bytes;
    pthread_mutex_unlock(&s->mu);
    cb(arg, over ? SB_E_RATE_LIMITED : SB_OK, over ? "fetched bytes per run" : NULL);
}

void sb_store_quota_fetch_add(sb_store_conn_t *c, const sb_token_t *tok, uint64_t bytes)
{
    sb_store_t *s = c->store;
    quota_entry_t *q;

    if (s->is_redis) {
        sb_store__redis_quota_fetch_add(c->redis, tok, bytes);
        return;
    }
    pthread_mutex_lock(&s->mu);
    if ((q = quota_entry(s, tok, 1, sb_now_ms())) != NULL)
        q->fetched += (int64_t)bytes;
    pthread_mutex_unlock(&s->mu);
}

void sb_store_quota_tool_call(sb_store_conn_t *c, const sb_token_t *tok, unsigned max_calls, sb_quota_cb cb, void *arg)
{
    sb_store_t *s = c->store;
    quota_entry_t *q;
    sb_status_t st = SB_OK;
    const char *why = NULL;

    if (s->is_redis) {
        sb_store__redis_quota_tool_call(c->redis, tok, max_calls, cb, arg);
        return;
    }
    pthread_mutex_lock(&s->mu);
    if ((q = quota_entry(s, tok, 1, sb_now_ms())) == NULL) {
        st = SB_E_UNAVAILABLE;
        why = "the quota table is full";
    } else if (++q->tool_calls > (int64_t)max_calls) {
        st = SB_E_RATE_LIMITED;
        why = "tools.call per run";
    }
    pthread_mutex_unlock(&s->mu);
    cb(arg, st, why);
}

const char *sb_store__modules_verdict(int64_t modules, int64_t bytes, unsigned add_modules, uint64_t add_bytes, int64_t max_modules,
                                      int64_t max_bytes)
{
    if (add_modules != 0 && modules > max_modules)
        return "modules per run";
    if (bytes > max_bytes || (add_bytes == 0 && bytes >= max_bytes))
        return "module bytes per run";
    return NULL;
}

void sb_store_quota_modules(sb_store_conn_t *c, const sb_token_t *tok, unsigned add_modules, uint64_t add_bytes,
                            int64_t max_modules, int64_t max_bytes, sb_quota_cb cb, void *arg)
{
    sb_store_t *s = c->store;
    quota_entry_t *q;
    sb_status_t st = SB_OK;
    const char *why = NULL;

    if (s->is_redis) {
        sb_store__redis_quota_modules(c->redis, tok, add_modules, add_bytes, max_modules, max_bytes, cb, arg);
        return;
    }
    pthread_mutex_lock(&s->mu);
    if ((q = quota_entry(s, tok, 1, sb_now_ms())) == NULL) {
        st = SB_E_UNAVAILABLE;
        why = "the quota table is full";
    } else {
        q->modules += add_modules;
        q->module_bytes += (int64_t)add_bytes;
        if ((why = sb_store__modules_verdict(q->modules, q->module_bytes, add_modules, add_bytes, max_modules, max_bytes)) != NULL)
            st = SB_E_RATE_LIMITED;
    }
    pthread_mutex_unlock(&s->mu);
    cb(arg, st, why);
}
