/*
 * The redis token-store backend: hiredis 0.14 async on a worker's h2o loop.
 *
 * No round trip for a granted call in steady state. A worker answers a call
 * on its own when it holds the token's record while Redis tracks it (the
 * invalidation link, store_redis_conn.c: any change to the key, a revocation
 * or an expiry, reaches every instance as it happens, and losing that link
 * stops every call until it is back) and has a call and a concurrency slot
 * of the run leased. Otherwise one script (EVALSHA) reads the record and
 * leases more: calls in blocks that grow from 1 to LEASE_MAX_CALLS while the
 * token is used and shrink to a sixteenth of what the run has left, slots one
 * at a time (PROTOCOL.md section 9). A slot a call gives back stays in the
 * worker's lease; what a lease holds unused goes back to Redis once the token
 * has been idle for LEASE_IDLE_MS, when the table slot is wanted for another
 * token, and at the drain; it is carried by the next script or sent on its
 * own, and a return that fails is logged and counted. Scripts are loaded once
 * per connection (SCRIPT LOAD); a NOSCRIPT answer (SCRIPT FLUSH, a restarted
 * or replaced primary) resends that one command as EVAL, which runs and
 * caches the script again, so callers never see it.
 *
 * A record read from Redis is kept parsed (records never change once
 * written); it answers calls alone only while tracked: read while the
 * invalidation link was up, with no invalidation between the read and its
 * answer, and no revocation answered by this process since (those tell every
 * worker at once, before the revocation's answer goes out).
 *
 * The primary is a fixed address (redis://, unix://) or the one Redis
 * Sentinel names (redis-sentinel://). With Sentinel each worker keeps two
 * links to one sentinel: a query link asking for the primary every second,
 * and a subscription to +switch-master. A node is used only after ROLE says
 * "master", and ROLE is asked again every second. Any doubt makes every call
 * answer SB_E_UNAVAILABLE until a verified primary is back: no sentinel has
 * confirmed the primary for a while, the node says it is a replica, a command
 * answers READONLY. Scripts carry a "#!lua" line without flags, so a replica
 * refuses them outright (READONLY) instead of reading stale records.
 *
 * hiredis ships no h2o adapter, so this file provides its five event hooks
 * over an h2o socket that wraps a dup() of the hiredis fd (hiredis closes its
 * own fd; we close only the wrapper). hiredis 0.14 has no timeouts, so a
 * 50 ms tick enforces them: a command older than store_timeout_ms, or a
 * connect that takes longer, tears the connection down, which fails every
 * pending command with SB_E_UNAVAILABLE. While the store is not usable, calls
 * fail at once (fail closed). Reconnects back off from 100 ms to a cap of
 * 250 ms while the node refuses connections or does not answer (so its return
 * is noticed within a few hundred milliseconds however long it was away), and
 * to 3.2 s when it answers with an error an operator must fix (a refused
 * AUTH or SELECT).
 *
 * hiredis would resolve a host name with a blocking getaddrinfo: only IP
 * literals are ever passed to it, including the addresses Sentinel reports.
 *
 * This file holds the token records, the quota updates, the call path and the
 * admin requests; store_redis_int.h lists the backend's other files.
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

/* ---- records ----------------------------------------------------------------------------------------------------------- */

/* the mint id token.c writes at a fixed offset, or NULL (a record from an older version) */
static const char *mint_of(const char *rec, size_t len)
{
    static const char head[] = "{\"v\":1,\"mint\":\"";
    if (len < sizeof(head) - 1 + 33 || memcmp(rec, head, sizeof(head) - 1) != 0 || rec[sizeof(head) - 1 + 32] != '"')
        return NULL;
    for (size_t i = 0; i < 32; ++i) {
        char ch = rec[sizeof(head) - 1 + i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
            return NULL;
    }
    return rec + sizeof(head) - 1;
}

_Atomic uint64_t sb_store__redis_revoke_gen;

/* the table slot of a token (hashes are SHA-256 of secrets: uniform) */
static rcache_t *slot_of(redis_conn_t *rc, const uint8_t hash[32])
{
    uint32_t h;
    memcpy(&h, hash + 28, sizeof(h));
    return &rc->cache[h % RCACHE_SLOTS];
}

static int owns(const rcache_t *e, const uint8_t hash[32])
{
    return (e->tok != NULL || e->ltok != NULL) && memcmp(e->hash, hash, 32) == 0;
}

/* what this worker holds for `hash` (a record, a lease or both), or NULL */
static rcache_t *entry_of(redis_conn_t *rc, const uint8_t hash[32])
{
    rcache_t *e = slot_of(rc, hash);
    return owns(e, hash) ? e : NULL;
}

static void release_add(redis_conn_t *rc, int calls, const char *run_id, size_t rlen, unsigned n);

/* gives the lease's unused quota back to Redis (queued); the lease goes once no slot of it is in use */
static void lease_return(redis_conn_t *rc, rcache_t *e)
{
    const char *run = e->ltok->run_id;
    if (e->calls_left != 0)
        release_add(rc, 1, run, strlen(run), e->calls_left);
    if (e->slots_free != 0)
        release_add(rc, 0, run, strlen(run), e->slots_free);
    e->calls_left = e->slots_free = 0;
    e->next_block = 1;
    if (e->slots_used == 0) {
        sb_token_release(e->ltok);
        e->ltok = NULL;
    }
}

/*
 * The entry for `hash`, taken over from another token when that one has no
 * slot in use (its lease is given back); NULL when it has: the call then
 * goes without a lease.
 */
static rcache_t *entry_claim(redis_conn_t *rc, const uint8_t hash[32])
{
    rcache_t *e = slot_of(rc, hash);
    if (owns(e, hash))
        return e;
    if (e->ltok != NULL) {
        if (e->slots_used != 0)
            return NULL;
        lease_return(rc, e);
    }
    sb_token_release(e->tok);
    memset(e, 0, sizeof(*e));
    memcpy(e->hash, hash, 32);
    e->next_block = 1;
    return e;
}

/*
 * The record for `hash` from the bytes Redis returned: the parsed form this
 * worker already holds for the same record (same mint id and length), else a
 * fresh parse, kept for next time (`tracked`: Redis will say when it
 * changes). A reference the caller must release, or NULL (unreadable).
 */
static sb_token_t *record_token(redis_conn_t *rc, const uint8_t hash[32], const char *rec, size_t len, int tracked)
{
    rcache_t *e = entry_of(rc, hash);
    const char *mint = mint_of(rec, len);
    sb_token_t *tok;

    if (mint != NULL && e != NULL && e->tok != NULL && e->len == len && memcmp(e->mint, mint, 32) == 0) {
        e->tracked |= tracked;
        sb_token_addref(e->tok);
        return e->tok;
    }
    if (sb_token_deserialize(hash, rec, len, &tok) != SB_OK)
        return NULL;
    if (mint != NULL && (e = entry_claim(rc, hash)) != NULL) {
        uint64_t v[4] = {len, (uint64_t)tok->expires_at_ms, (uint64_t)tok->quota.calls, (uint64_t)tok->quota.concurrent};
        sb_token_release(e->tok);
        memcpy(e->mint, mint, 32);
        e->len = len;
        e->tracked = tracked;
        sb_token_addref(tok);
        e->tok = tok;
        for (int i = 0; i < 4; ++i)
            e->numlen[i] = (size_t)(sb_store__redis_put_u64(e->num[i], v[i]) - e->num[i]);
    }
    return tok;
}

/* the parsed record this worker holds for `hash`, or NULL */
static rcache_t *known_record(redis_conn_t *rc, const uint8_t hash[32])
{
    rcache_t *e = entry_of(rc, hash);
    return e != NULL && e->tok != NULL ? e : NULL;
}

/* drops the parsed record (its lease stays until it is given back) */
static void forget_record(redis_conn_t *rc, const uint8_t hash[32])
{
    rcache_t *e = entry_of(rc, hash);
    if (e == NULL)
        return;
    sb_token_release(e->tok);
    e->tok = NULL;
    e->tracked = 0;
    e->len = 0;
    if (e->ltok == NULL)
        memset(e, 0, sizeof(*e));
}

void sb_store__redis_untrack_all(redis_conn_t *rc)
{
    ++rc->inv_seq;
    for (size_t i = 0; i < RCACHE_SLOTS; ++i)
        rc->cache[i].tracked = 0;
}

static int unhex32(const char *s, size_t len, uint8_t out[32]);

void sb_store__redis_invalidate(redis_conn_t *rc, const redisReply *keys)
{
    size_t plen = strlen(rc->store->prefix);
    uint8_t hash[32];

    if (keys == NULL || keys->type != REDIS_REPLY_ARRAY) {
        /* FLUSHALL, FLUSHDB, or a message we cannot read: nothing is known any more */
        for (size_t i = 0; i < RCACHE_SLOTS; ++i)
            if (rc->cache[i].tok != NULL)
                forget_record(rc, rc->cache[i].hash);
        sb_store__redis_untrack_all(rc);
        return;
    }
    for (size_t i = 0; i < keys->elements; ++i) {
        const redisReply *k = keys->element[i];
        if (k->type != REDIS_REPLY_STRING)
            continue;
        if (k->len == rc->hb_key_len && memcmp(k->str, rc->hb_key, k->len) == 0) {
            rc->hb_sent = 0; /* our own heartbeat came round: the link is alive */
        } else if (k->len == plen + 4 + 64 && memcmp(k->str, rc->store->prefix, plen) == 0 &&
                   memcmp(k->str + plen, "tok:", 4) == 0 && unhex32(k->str + plen + 4, 64, hash)) {
            ++rc->inv_seq;
            forget_record(rc, hash);
        }
        /* nothing else is tracked */
    }
}

static size_t key_for(const sb_store_t *s, const char *kind, const char *id, size_t idlen, char *out, size_t outsz)
{
    int n = snprintf(out, outsz, "%s%s:%.*s", s->prefix, kind, (int)idlen, id);
    return (size_t)n < outsz ? (size_t)n : outsz - 1;
}

/* "<prefix>tok:<64 hex>" into out (the prefix is at most a few hundred bytes: checked at create) */
static size_t tok_key(const sb_store_t *s, const uint8_t hash[32], char *out)
{
    size_t plen = strlen(s->prefix);
    memcpy(out, s->prefix, plen);
    memcpy(out + plen, "tok:", 4);
    sb_hex(hash, 32, out + plen + 4);
    return plen + 4 + 64;
}

static size_t quota_key(const sb_store_t *s, const char *what, const char *run_id, size_t rlen, char *out, size_t outsz)
{
    int n = snprintf(out, outsz, "%sq:%s:%.*s", s->prefix, what, (int)rlen, run_id);
    return (size_t)n < outsz ? (size_t)n : outsz - 1;
}

/* a command may go out only while the store is usable; otherwise the caller answers SB_E_UNAVAILABLE at once */
static int usable(redis_conn_t *rc)
{
    return sb_store__redis_usable_now(rc, mono_ms());
}

/* ---- quota updates nobody waits for ------------------------------------------------------------------------------------ */

void sb_store__redis_update_failed(const char *update, const char *run_id, const char *why)
{
    sb_logline_t l;
    sb_metrics_store_event(strcmp(update, "release") == 0 ? SB_STORE_EV_RELEASE_FAILED : SB_STORE_EV_FETCH_ADD_FAILED);
    sb_log_begin(&l, SB_LOG_WARN, "redis.quota_update_failed");
    sb_log_cstr(&l, "update", update);
    sb_log_cstr(&l, "runId", run_id);
    sb_log_cstr(&l, "reason", why);
    sb_log_end(&l);
}

/* the run id of a counter key a command carried ("<prefix>q:inflight:<run>" or "<prefix>q:calls:<run>") */
static void run_of_key(const redis_conn_t *rc, const char *key, size_t klen, char *out)
{
    size_t skip = strlen(rc->store->prefix) + sizeof("q:") - 1, n;
    const char *colon = klen > skip ? memchr(key + skip, ':', klen - skip) : NULL;
    skip = colon != NULL ? (size_t)(colon - key) + 1 : klen;
    n = klen > skip ? klen - skip : 0;
    if (n > SB_MAX_RUN_ID)
        n = SB_MAX_RUN_ID;
    memcpy(out, key + skip, n);
    out[n] = '\0';
}

/*
 * Checks what became of the releases a command carried: `reply` is the
 * script's mask of counters it could not decrement, or NULL when the command
 * got no usable answer (then none of them is known to have happened).
 */
static void check_releases(cmd_t *cmd, const redisReply *mask, const char *why)
{
    char run[SB_MAX_RUN_ID + 1], buf[192];

    for (int i = 0; i < cmd->nrel; ++i) {
        if (mask != NULL && (mask->type != REDIS_REPLY_INTEGER || (mask->integer & (1LL << i)) == 0))
            continue;
        run_of_key(cmd->rc, cmd->resp + cmd->rel_key_off[i], cmd->rel_key_len[i], run);
        if (mask == NULL)
            snprintf(buf, sizeof(buf), "%s", why);
        else
            snprintf(buf, sizeof(buf), "the %s counter is not a number",
                     cmd->rel_key_len[i] > strlen(cmd->rc->store->prefix) + 2 &&
                             memcmp(cmd->resp + cmd->rel_key_off[i] + strlen(cmd->rc->store->prefix), "q:calls:", 8) == 0
                         ? "calls"
                         : "in-flight");
        sb_store__redis_update_failed("release", run, buf);
    }
}

/* moves the queued releases into a command: their keys appended at argv[*argc..], their counts formatted into counts[] */
static size_t take_releases(redis_conn_t *rc, char keys[][KEY_MAX], char counts[][12], const char **argv, size_t *lens, int *argc)
{
    size_t n = rc->nrel;
    for (size_t i = 0; i < n; ++i) {
        argv[*argc] = keys[i];
        lens[(*argc)++] = quota_key(rc->store, rc->rel[i].calls ? "calls" : "inflight", rc->rel[i].run_id,
                                    strlen(rc->rel[i].run_id), keys[i], sizeof(keys[i]));
        *sb_store__redis_put_u64(counts[i], rc->rel[i].n) = '\0';
    }
    rc->nrel = 0;
    return n;
}

static void why_of(const redisReply *reply, char *why, size_t sz)
{
    if (reply == NULL)
        snprintf(why, sz, "the connection went down before the answer");
    else
        snprintf(why, sz, "%.180s", reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected answer");
}

static void on_release(cmd_t *cmd, redisReply *reply)
{
    char why[192];
    if (reply != NULL && reply->type == REDIS_REPLY_INTEGER) {
        check_releases(cmd, reply, NULL);
        return;
    }
    why_of(reply, why, sizeof(why));
    check_releases(cmd, NULL, why);
}

/* sends the queued releases on their own */
static void flush_releases(redis_conn_t *rc)
{
    char keys[REL_MAX][KEY_MAX], counts[REL_MAX][12];
    const char *argv[1 + 2 * REL_MAX];
    size_t lens[1 + 2 * REL_MAX], n;
    char nk[8];
    int argc = 1;
    cmd_t *cmd;

    if (h2o_timeout_is_linked(&rc->flush))
        h2o_timeout_unlink(&rc->flush);
    if (rc->nrel == 0)
        return;
    if (!usable(rc)) {
        /* the slots expire with the runs' tokens */
        for (size_t i = 0; i < rc->nrel; ++i)
            sb_store__redis_update_failed("release", rc->rel[i].run_id, "the token store is unavailable");
        rc->nrel = 0;
        return;
    }
    n = take_releases(rc, keys, counts, argv, lens, &argc);
    argv[0] = nk;
    lens[0] = (size_t)snprintf(nk, sizeof(nk), "%zu", n);
    for (size_t i = 0; i < n; ++i) {
        argv[argc] = counts[i];
        lens[argc++] = strlen(counts[i]);
    }
    cmd = sb_store__redis_cmd_new_rel(rc, "the release", on_release, SC_RELEASE, argc, argv, lens, 1, (int)n);
    sb_store__redis_cmd_send(cmd);
}

int sb_store__redis_settle(void *rcp)
{
    redis_conn_t *rc = rcp;
    if (usable(rc)) {
        sb_store__redis_leases_tick(rc, mono_ms(), 1);
        flush_releases(rc);
    }
    return !h2o_linklist_is_empty(&rc->pending);
}

void sb_store__redis_on_flush(h2o_timeout_entry_t *entry)
{
    flush_releases(H2O_STRUCT_FROM_MEMBER(redis_conn_t, flush, entry));
}

/*
 * Queues `n` of a run's slots (or leased calls) to go back. They ride on the
 * next call's script when one follows within this loop pass (one command per
 * call), else they go on their own once the pass's I/O is handled: never
 * later than a separate command would have been written.
 */
static void release_add(redis_conn_t *rc, int calls, const char *run_id, size_t rlen, unsigned n)
{
    size_t i;

    if (rlen > SB_MAX_RUN_ID || memchr(run_id, '\0', rlen) != NULL) {
        /* no run the broker registered has such an id (a record changed behind its back): never another run's prefix */
        sb_store__redis_update_failed("release", "", "the record's run id is not one the broker writes");
        return;
    }
    for (i = 0; i < rc->nrel; ++i)
        if (rc->rel[i].calls == calls && strlen(rc->rel[i].run_id) == rlen && memcmp(rc->rel[i].run_id, run_id, rlen) == 0)
            break;
    if (i == rc->nrel) {
        if (rc->nrel == REL_MAX)
            flush_releases(rc);
        i = rc->nrel++;
        memcpy(rc->rel[i].run_id, run_id, rlen);
        rc->rel[i].run_id[rlen] = '\0';
        rc->rel[i].calls = calls;
        rc->rel[i].n = 0;
    }
    rc->rel[i].n += n;
    if (!h2o_timeout_is_linked(&rc->flush))
        h2o_timeout_link(rc->loop, &rc->flush_timeout, &rc->flush);
}

static void release_run(redis_conn_t *rc, const char *run_id, size_t rlen)
{
    release_add(rc, 0, run_id, rlen, 1);
}

/*
 * The free slots a lease may keep for the token's next calls: a sixteenth of
 * the run's concurrency quota, so a run with fewer than 16 takes and gives
 * back every slot in Redis (exact to the call), and workers holding slots
 * another worker's call could use keep at most a sixteenth of them each
 */
static uint32_t slots_kept(const sb_token_t *tok)
{
    int64_t n = tok->quota.concurrent / 16;
    return n > LEASE_MAX_CALLS ? LEASE_MAX_CALLS : (uint32_t)(n > 0 ? n : 0);
}

/*
 * Whether a lease taken under record `a` may count calls made under record
 * `b` of the same token: the same run and the same quotas. A token revoked
 * and registered again under another run is another lease.
 */
static int same_lease(const sb_token_t *a, const sb_token_t *b)
{
    return a == b ||
           (strcmp(a->run_id, b->run_id) == 0 && a->quota.calls == b->quota.calls && a->quota.concurrent == b->quota.concurrent);
}

/*
 * Quota a call took from its lease and does not use: back to the lease it
 * came from (the run `run_id`), or to that run's counters in Redis when the
 * lease has gone or is another run's now
 */
static void give_back(redis_conn_t *rc, const uint8_t hash[32], const char *run_id, uint32_t calls, uint32_t slots)
{
    rcache_t *e = entry_of(rc, hash);

    if (e != NULL && e->ltok != NULL && strcmp(e->ltok->run_id, run_id) == 0) {
        e->calls_left += calls;
        e->slots_free += slots;
        return;
    }
    if (calls != 0)
        release_add(rc, 1, run_id, strlen(run_id), calls);
    if (slots != 0)
        release_add(rc, 0, run_id, strlen(run_id), slots);
}

void sb_store__redis_quota_release(void *rcp, const sb_token_t *tok)
{
    redis_conn_t *rc = rcp;
    rcache_t *e = entry_of(rc, tok->hash);

    if (e != NULL && e->ltok != NULL && e->slots_used != 0 && same_lease(e->ltok, tok)) {
        /* slots of a run are alike: one in use by this worker's calls becomes free in the lease, up to what a lease may keep */
        --e->slots_used;
        e->last_use = mono_ms();
        if (e->slots_free < slots_kept(e->ltok)) {
            ++e->slots_free;
            return;
        }
    }
    if (!usable(rc)) {
        /* the slot expires with the run's tokens */
        sb_store__redis_update_failed("release", tok->run_id, "the token store is unavailable");
        return;
    }
    release_run(rc, tok->run_id, strlen(tok->run_id));
}

void sb_store__redis_leases_tick(redis_conn_t *rc, int64_t now, int all)
{
    if (!all && !usable(rc))
        return; /* kept until Redis can take them */
    for (size_t i = 0; i < RCACHE_SLOTS; ++i) {
        rcache_t *e = &rc->cache[i];
        if (e->ltok != NULL && (all || now - e->last_use >= LEASE_IDLE_MS)) {
            lease_return(rc, e);
            if (e->ltok == NULL && e->tok == NULL)
                memset(e, 0, sizeof(*e));
        }
    }
}

static void on_update(cmd_t *cmd, redisReply *reply)
{
    char why[192];

    if (reply != NULL && reply->type == REDIS_REPLY_INTEGER)
        return;
    why_of(reply, why, sizeof(why));
    sb_store__redis_update_failed("fetch_bytes", cmd->run_id, why);
}

void sb_store__redis_quota_fetch_add(void *rcp, const sb_token_t *tok, uint64_t bytes)
{
    redis_conn_t *rc = rcp;
    char bk[KEY_MAX], n[32], exp[32];
    const char *argv[4] = {"1", bk, n, exp};
    size_t lens[4];
    cmd_t *cmd;

    if (!usable(rc)) {
        sb_store__redis_update_failed("fetch_bytes", tok->run_id, "the token store is unavailable");
        return;
    }
    lens[0] = 1;
    lens[1] = quota_key(rc->store, "bytes", tok->run_id, strlen(tok->run_id), bk, sizeof(bk));
    lens[2] = (size_t)snprintf(n, sizeof(n), "%llu", (unsigned long long)bytes);
    lens[3] = (size_t)snprintf(exp, sizeof(exp), "%lld", (long long)tok->expires_at_ms);
    cmd = sb_store__redis_cmd_new(rc, "fetch_add", on_update, SC_FETCH_ADD, 4, argv, lens);
    memcpy(cmd->run_id, tok->run_id, strlen(tok->run_id) + 1);
    sb_store__redis_cmd_send(cmd);
}

/* ---- the call path ----------------------------------------------------------------------------------------------------- */

/* a count the script returned: an integer from 0 to LEASE_MAX_CALLS */
static int grant_of(const redisReply *r, uint32_t *out)
{
    if (r->type != REDIS_REPLY_INTEGER || r->integer < 0 || r->integer > LEASE_MAX_CALLS)
        return 0;
    *out = (uint32_t)r->integer;
    return 1;
}

/*
 * What the call took and was granted, into the lease: this call uses one
 * call and (when `slot`) one slot, the rest is kept for the next calls. With
 * no lease to hold them (the table slot is busy with another token's calls),
 * the extras go straight back, and so do slots beyond what a lease keeps.
 */
static void lease_take(redis_conn_t *rc, cmd_t *cmd, sb_token_t *tok, uint32_t gc, uint32_t gs, int slot)
{
    uint32_t calls = cmd->res_call + gc, slots = cmd->res_slot + gs;
    rcache_t *e = entry_claim(rc, cmd->hash);

    /* the call uses one call; a call refused a slot uses none */
    calls = calls != 0 ? calls - 1 : 0;
    if (slot)
        slots = slots != 0 ? slots - 1 : 0;
    if (e != NULL && e->ltok != NULL && !same_lease(e->ltok, tok))
        lease_return(rc, e); /* the token is another run's now: the old lease goes back (once its slots are) */
    if (e == NULL || (e->ltok != NULL && !same_lease(e->ltok, tok))) {
        if (calls != 0)
            release_add(rc, 1, tok->run_id, strlen(tok->run_id), calls);
        if (slots != 0)
            release_add(rc, 0, tok->run_id, strlen(tok->run_id), slots);
        return;
    }
    if (e->ltok == NULL) {
        sb_token_addref(tok);
        e->ltok = tok;
    }
    if (e->calls_left + calls > LEASE_MAX_CALLS) {
        /* calls that missed the lease together each brought a block: a lease holds at most LEASE_MAX_CALLS */
        uint32_t over = e->calls_left + calls - LEASE_MAX_CALLS;
        release_add(rc, 1, tok->run_id, strlen(tok->run_id), over);
        calls -= over;
    }
    e->calls_left += calls;
    if (e->slots_free + slots > slots_kept(tok)) {
        uint32_t keep = e->slots_free < slots_kept(tok) ? slots_kept(tok) - e->slots_free : 0;
        release_add(rc, 0, tok->run_id, strlen(tok->run_id), slots - keep);
        slots = keep;
    }
    e->slots_free += slots;
    if (slot)
        ++e->slots_used;
    if (gc != 0 && gc < cmd->want_calls)
        e->next_block = gc; /* the run is near its limit: the blocks shrink with what it has left */
    else if (gc != 0 && (cmd->asked || e->next_block == 1) && e->next_block < LEASE_MAX_CALLS)
        e->next_block *= 2;
    e->last_use = mono_ms();
}

/*
 * The head of every call-path answer, {failed releases, code, ...}: checks
 * what became of the releases the command carried. 0 with *code set, or -1
 * when the answer is not one (the releases it carried are logged as lost).
 */
static int lookup_head(cmd_t *cmd, const redisReply *reply, long long *code)
{
    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY || reply->elements < 2 ||
        reply->element[0]->type != REDIS_REPLY_INTEGER || reply->element[1]->type != REDIS_REPLY_INTEGER) {
        char lost[192];
        why_of(reply, lost, sizeof(lost));
        check_releases(cmd, NULL, lost);
        return -1;
    }
    check_releases(cmd, reply->element[0], NULL);
    *code = reply->element[1]->integer;
    return 0;
}

static void on_lookup(cmd_t *cmd, redisReply *reply)
{
    redis_conn_t *rc = cmd->rc;
    sb_token_t *tok = NULL;
    sb_status_t st = SB_E_UNAVAILABLE;
    const char *why = NULL;
    long long code;
    redisReply *rec, *run;
    const char *run_id;
    size_t run_len;
    uint32_t gc = 0, gs = 0;
    int tracked = cmd->inv_seq == rc->inv_seq &&
                  cmd->gen == atomic_load_explicit(&sb_store__redis_revoke_gen, memory_order_acquire) && rc->data.state == L_UP;

    if (cmd->asked) {
        rcache_t *e = entry_of(rc, cmd->hash);
        if (e != NULL)
            e->asking = 0;
    }

    if (lookup_head(cmd, reply, &code) != 0)
        goto Done;
    if (code == 0) {
        rcache_t *e;
        forget_record(rc, cmd->hash);
        /* the token is gone: so is its lease */
        if ((e = entry_of(rc, cmd->hash)) != NULL)
            lease_return(rc, e);
        st = SB_E_UNAUTHORIZED;
        goto Done;
    }
    if ((code != 1 && code != 2 && code != 4) || reply->elements < 4 || !grant_of(reply->element[2], &gc) ||
        !grant_of(reply->element[3], &gs))
        goto Done; /* 3: a record the script cannot read */
    if (reply->elements == 4 && cmd->known != NULL) {
        /* the record the lookup named: counted against the run id it sent */
        rcache_t *e = known_record(rc, cmd->hash);
        tok = cmd->known;
        cmd->known = NULL;
        if (e != NULL && e->tok == tok && tracked)
            e->tracked = 1;
        run_id = tok->run_id;
        run_len = strlen(run_id);
    } else if (reply->elements == 6 && (rec = reply->element[4])->type == REDIS_REPLY_STRING &&
               (run = reply->element[5])->type == REDIS_REPLY_STRING) {
        tok = record_token(rc, cmd->hash, rec->str, rec->len, tracked);
        run_id = run->str;
        run_len = run->len;
    } else {
        goto Done;
    }
    /*
     * The script counted against the run it read; the record must agree. And
     * quota taken from the lease counts only for the lease's own run: a
     * record that is not the one the lease was taken under (the token was
     * registered again for another run) leaves this call uncounted, so it is
     * not answered (it never is in a steady state).
     */
    if (tok == NULL || strlen(tok->run_id) != run_len || memcmp(tok->run_id, run_id, run_len) != 0 ||
        ((cmd->res_call != 0 || cmd->res_slot != 0) &&
         (cmd->known == NULL ? reply->elements == 6 : !same_lease(cmd->known, tok)))) {
        /* what was granted is counted against `run_id`: it goes back there */
        if (gc != 0)
            release_add(rc, 1, run_id, run_len, gc);
        if (gs != 0)
            release_add(rc, 0, run_id, run_len, gs);
        gc = gs = 0;
        st = SB_E_UNAVAILABLE;
    } else if (tok->expires_at_ms <= sb_now_ms()) {
        /* Redis expiry and our clock disagree: believe the stricter one */
        st = SB_E_UNAUTHORIZED;
    } else if (code == 4) {
        st = SB_OK;
    } else {
        st = SB_E_RATE_LIMITED;
        why = code == 1 ? "calls per run" : "concurrent calls per run";
    }
    if (tok != NULL && st != SB_E_UNAVAILABLE) {
        /* the call is counted (a refusal for the calls quota is not), and holds a slot when granted */
        if (code == 1)
            give_back(rc, cmd->hash, cmd->res_call != 0 || cmd->res_slot != 0 ? cmd->run_id : tok->run_id, cmd->res_call,
                      cmd->res_slot);
        else
            lease_take(rc, cmd, tok, gc, gs, st == SB_OK);
        cmd->res_call = cmd->res_slot = 0;
    }
    if (st != SB_OK && st != SB_E_RATE_LIMITED) {
        sb_token_release(tok);
        tok = NULL;
    }
Done:
    if (cmd->res_call != 0 || cmd->res_slot != 0)
        give_back(rc, cmd->hash, cmd->run_id, cmd->res_call, cmd->res_slot);
    if (st == SB_E_UNAVAILABLE)
        why = "the token store is unavailable";
    cmd->cb.lookup(cmd->arg, st, tok, why);
}

/*
 * The call-path script for `hash`, asking for `want_calls` calls and
 * `want_slots` slots, telling it the record `known` holds (or none), with
 * the releases queued since the last command carried first. Not sent yet.
 */
static cmd_t *lookup_cmd(redis_conn_t *rc, const uint8_t hash[32], rcache_t *known, uint32_t want_calls, uint32_t want_slots,
                         const char *what, cmd_done_fn done)
{
    char key[KEY_MAX], nk[8], keys[REL_MAX][KEY_MAX], counts[REL_MAX][12], want[2][12];
    const char *argv[CMD_MAX_ARGS];
    size_t lens[CMD_MAX_ARGS], nrel;
    int argc = 2;
    cmd_t *cmd;

    argv[1] = key;
    lens[1] = tok_key(rc->store, hash, key);
    nrel = take_releases(rc, keys, counts, argv, lens, &argc);
    argv[0] = nk;
    lens[0] = (size_t)(sb_store__redis_put_u64(nk, 1 + nrel) - nk);
    argv[argc] = rc->store->prefix;
    lens[argc++] = strlen(rc->store->prefix);
    if (known != NULL) {
        const sb_token_t *t = known->tok;
        argv[argc] = known->mint;
        lens[argc++] = 32;
        argv[argc] = known->num[0];
        lens[argc++] = known->numlen[0];
        argv[argc] = t->run_id;
        lens[argc++] = strlen(t->run_id);
        for (int i = 1; i < 4; ++i) {
            argv[argc] = known->num[i];
            lens[argc++] = known->numlen[i];
        }
    } else {
        for (int i = 0; i < 6; ++i) {
            argv[argc] = "";
            lens[argc++] = 0;
        }
    }
    argv[argc] = want[0];
    lens[argc++] = (size_t)(sb_store__redis_put_u64(want[0], want_calls) - want[0]);
    argv[argc] = want[1];
    lens[argc++] = (size_t)(sb_store__redis_put_u64(want[1], want_slots) - want[1]);
    for (size_t i = 0; i < nrel; ++i) {
        argv[argc] = counts[i];
        lens[argc++] = strlen(counts[i]);
    }
    if (h2o_timeout_is_linked(&rc->flush))
        h2o_timeout_unlink(&rc->flush);
    cmd = sb_store__redis_cmd_new_rel(rc, what, done, SC_LOOKUP, argc, argv, lens, 2, (int)nrel);
    if (known != NULL) {
        sb_token_addref(known->tok);
        cmd->known = known->tok;
    }
    memcpy(cmd->hash, hash, 32);
    return cmd;
}

/*
 * A refill's answer: the calls granted go into the lease they were asked
 * for, or back to the run when the lease or the record is not that one any
 * more; no call is answered from it.
 */
static void on_refill(cmd_t *cmd, redisReply *reply)
{
    redis_conn_t *rc = cmd->rc;
    rcache_t *e = entry_of(rc, cmd->hash);
    uint32_t gc = 0, gs = 0;
    long long code;

    if (e != NULL)
        e->asking = 0;
    if (lookup_head(cmd, reply, &code) != 0)
        return;
    if (code == 0) {
        /* the token is gone: so is its record, and its lease */
        forget_record(rc, cmd->hash);
        if ((e = entry_of(rc, cmd->hash)) != NULL && e->ltok != NULL)
            lease_return(rc, e);
        return;
    }
    if (code != 4 || reply->elements < 4 || !grant_of(reply->element[2], &gc) || !grant_of(reply->element[3], &gs) || gc == 0)
        return; /* nothing granted (the run has no calls left, or the answer is not one) */
    if (reply->elements == 4 && cmd->known != NULL && e != NULL && e->ltok != NULL && same_lease(e->ltok, cmd->known)) {
        uint32_t room = e->calls_left < LEASE_MAX_CALLS ? LEASE_MAX_CALLS - e->calls_left : 0, keep = gc < room ? gc : room;
        e->calls_left += keep;
        if (gc < cmd->want_calls)
            e->next_block = gc; /* near the limit: no more refills ahead of the calls (see LEASE_REFILL_MIN) */
        if (gc > keep)
            release_add(rc, 1, cmd->known->run_id, strlen(cmd->known->run_id), gc - keep);
        return;
    }
    /* counted against the run the script read */
    if (reply->elements == 6 && reply->element[5]->type == REDIS_REPLY_STRING)
        release_add(rc, 1, reply->element[5]->str, reply->element[5]->len, gc);
    else if (cmd->known != NULL)
        release_add(rc, 1, cmd->known->run_id, strlen(cmd->known->run_id), gc);
    if (reply->elements == 6)
        forget_record(rc, cmd->hash); /* the record changed: read it again on the next call */
}

/*
 * Leases the next block before the current one runs out, while calls keep
 * being answered from it: a token in steady use never waits for Redis.
 */
static void lease_refill(redis_conn_t *rc, rcache_t *e)
{
    uint32_t want = e->next_block < LEASE_MAX_CALLS - e->calls_left ? e->next_block : LEASE_MAX_CALLS - e->calls_left;
    cmd_t *cmd;

    e->asking = 1;
    cmd = lookup_cmd(rc, e->hash, e, want, 0, "a lease refill", on_refill);
    cmd->asked = 1;
    cmd->want_calls = want;
    if (e->next_block < LEASE_MAX_CALLS)
        e->next_block *= 2;
    sb_store__redis_cmd_send(cmd);
}

void sb_store__redis_lookup_acquire(void *rcp, const uint8_t hash[32], sb_store_lookup_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    uint64_t gen = atomic_load_explicit(&sb_store__redis_revoke_gen, memory_order_acquire);
    uint32_t res_call = 0, res_slot = 0, want_block = 1;
    rcache_t *e, *known;
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE, NULL, "the token store is unavailable");
        return;
    }
    if (gen != rc->seen_gen) {
        /* a revocation was answered by this process: what this worker tracks may not have heard of it yet */
        rc->seen_gen = gen;
        sb_store__redis_untrack_all(rc);
    }
    e = entry_of(rc, hash);
    if (e != NULL && e->tok != NULL && e->tracked) {
        sb_token_t *tok = e->tok;
        if (tok->expires_at_ms <= sb_now_ms()) {
            forget_record(rc, hash);
            cb(arg, SB_E_UNAUTHORIZED, NULL, NULL);
            return;
        }
        if (e->ltok != NULL && e->calls_left != 0 && e->slots_free != 0 && same_lease(e->ltok, tok)) {
            /* the record is current (Redis would have said otherwise) and its run's quota is leased: no round trip */
            --e->calls_left;
            --e->slots_free;
            ++e->slots_used;
            e->last_use = mono_ms();
            if (e->next_block >= LEASE_REFILL_MIN && e->calls_left < e->next_block / 4 && !e->asking)
                lease_refill(rc, e);
            sb_token_addref(tok);
            sb_metrics_store_event(SB_STORE_EV_LOOKUP_LOCAL);
            cb(arg, SB_OK, tok, NULL);
            return;
        }
    }
    known = e != NULL && e->tok != NULL ? e : NULL;
    if (known != NULL && e->ltok != NULL && same_lease(e->ltok, e->tok)) {
        /* what the lease has goes first (the script checks the record is still the one it was taken for); Redis is asked for the
         * rest */
        res_call = e->calls_left != 0;
        res_slot = e->slots_free != 0;
        e->calls_left -= res_call;
        e->slots_free -= res_slot;
        e->last_use = mono_ms();
    }
    if (!res_call && e != NULL && !e->asking && e->next_block > 1) {
        /* one lease of a block at a time per token: calls that miss it meanwhile ask for their own call only */
        want_block = e->next_block;
        e->asking = 1;
    }
    sb_metrics_store_event(SB_STORE_EV_LOOKUP_REDIS);
    cmd = lookup_cmd(rc, hash, known, res_call ? 0 : want_block, res_slot ? 0 : 1, "the call lookup", on_lookup);
    if (res_call != 0 || res_slot != 0)
        snprintf(cmd->run_id, sizeof(cmd->run_id), "%s", e->ltok->run_id);
    cmd->res_call = res_call;
    cmd->res_slot = res_slot;
    cmd->asked = want_block > 1;
    cmd->want_calls = res_call ? 0 : want_block;
    cmd->inv_seq = rc->inv_seq;
    cmd->gen = gen;
    cmd->cb.lookup = cb;
    cmd->arg = arg;
    sb_store__redis_cmd_send(cmd);
}

static void on_get(cmd_t *cmd, redisReply *reply)
{
    sb_token_t *tok = NULL;
    sb_status_t st = SB_E_UNAVAILABLE;

    if (reply != NULL && reply->type == REDIS_REPLY_NIL) {
        forget_record(cmd->rc, cmd->hash);
        st = SB_E_UNAUTHORIZED;
    } else if (reply != NULL && reply->type == REDIS_REPLY_STRING &&
               (tok = record_token(cmd->rc, cmd->hash, reply->str, reply->len, 0)) != NULL) {
        st = SB_OK;
        if (tok->expires_at_ms <= sb_now_ms()) {
            sb_token_release(tok);
            tok = NULL;
            st = SB_E_UNAUTHORIZED;
        }
    }
    cmd->cb.get(cmd->arg, st, tok);
}

void sb_store__redis_get(void *rcp, const uint8_t hash[32], sb_store_get_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char hex[65], key[KEY_MAX];
    const char *argv[2] = {"GET", key};
    size_t lens[2];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE, NULL);
        return;
    }
    sb_hex(hash, 32, hex);
    lens[0] = 3;
    lens[1] = key_for(rc->store, "tok", hex, 64, key, sizeof(key));
    cmd = sb_store__redis_cmd_new(rc, "GET", on_get, -1, 2, argv, lens);
    cmd->cb.get = cb;
    cmd->arg = arg;
    memcpy(cmd->hash, hash, 32);
    sb_store__redis_cmd_send(cmd);
}

/* ---- admin writes ------------------------------------------------------------------------------------------------------ */

static void on_put(cmd_t *cmd, redisReply *reply)
{
    sb_status_t st = SB_E_UNAVAILABLE;
    if (reply != NULL && reply->type == REDIS_REPLY_INTEGER)
        st = reply->integer == 1 ? SB_OK : SB_E_BAD_ARGS;
    cmd->cb.done(cmd->arg, st);
}

void sb_store__redis_put(void *rcp, sb_token_t *tok, const json_t *caps, sb_store_done_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char hex[65], tkey[KEY_MAX], rkey[1024], ttl[32], ck[KEY_MAX], ik[KEY_MAX], exp[32];
    int64_t ttl_ms = tok->expires_at_ms - sb_now_ms();
    const char *argv[9];
    size_t lens[9];
    cmd_t *cmd;
    char *rec;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE);
        return;
    }
    sb_hex(tok->hash, 32, hex);
    if ((rec = sb_token_serialize(tok, caps)) == NULL) {
        cb(arg, SB_E_UNAVAILABLE);
        return;
    }
    argv[0] = "4";
    lens[0] = 1;
    argv[1] = tkey;
    lens[1] = key_for(rc->store, "tok", hex, 64, tkey, sizeof(tkey));
    argv[2] = rkey;
    lens[2] = key_for(rc->store, "run", tok->run_id, strlen(tok->run_id), rkey, sizeof(rkey));
    argv[3] = ck;
    lens[3] = quota_key(rc->store, "calls", tok->run_id, strlen(tok->run_id), ck, sizeof(ck));
    argv[4] = ik;
    lens[4] = quota_key(rc->store, "inflight", tok->run_id, strlen(tok->run_id), ik, sizeof(ik));
    argv[5] = rec;
    lens[5] = strlen(rec);
    argv[6] = ttl;
    lens[6] = (size_t)snprintf(ttl, sizeof(ttl), "%lld", (long long)(ttl_ms > 0 ? ttl_ms : 1));
    argv[7] = hex;
    lens[7] = 64;
    argv[8] = exp;
    lens[8] = (size_t)snprintf(exp, sizeof(exp), "%lld", (long long)tok->expires_at_ms);
    cmd = sb_store__redis_cmd_new(rc, "the mint", on_put, SC_MINT, 9, argv, lens);
    sb_mem_free_foreign(rec); /* json_dumps text */
    cmd->cb.done = cb;
    cmd->arg = arg;
    sb_store__redis_cmd_send(cmd);
}

/*
 * A revocation done: before it is answered, every worker of this process is
 * told to stop answering from what it tracks (other instances hear it from
 * Redis, on their invalidation links)
 */
static void revoked_here(void)
{
    atomic_fetch_add_explicit(&sb_store__redis_revoke_gen, 1, memory_order_acq_rel);
}

static void on_revoked(cmd_t *cmd, redisReply *reply)
{
    revoked_here();
    cmd->cb.done(cmd->arg, reply != NULL && reply->type == REDIS_REPLY_INTEGER ? SB_OK : SB_E_UNAVAILABLE);
}

/* GETDEL's answer: the record that was deleted (its run goes to the timeline), or nil */
static void on_token_revoked(cmd_t *cmd, redisReply *reply)
{
    sb_token_t *tok = NULL;

    revoked_here();
    if (reply == NULL || (reply->type != REDIS_REPLY_NIL && reply->type != REDIS_REPLY_STRING)) {
        cmd->cb.revoked(cmd->arg, SB_E_UNAVAILABLE, NULL);
        return;
    }
    /* a record the broker cannot read is deleted all the same; only its run stays unknown */
    if (reply->type == REDIS_REPLY_STRING && sb_token_deserialize(cmd->hash, reply->str, reply->len, &tok) != SB_OK)
        tok = NULL;
    cmd->cb.revoked(cmd->arg, SB_OK, tok != NULL ? tok->run_id : NULL);
    sb_token_release(tok);
}

void sb_store__redis_revoke_token(void *rcp, const uint8_t hash[32], sb_store_revoked_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char hex[65], key[KEY_MAX];
    const char *argv[2] = {"GETDEL", key};
    size_t lens[2];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE, NULL);
        return;
    }
    sb_hex(hash, 32, hex);
    forget_record(rc, hash);
    lens[0] = 6;
    lens[1] = key_for(rc->store, "tok", hex, 64, key, sizeof(key));
    cmd = sb_store__redis_cmd_new(rc, "GETDEL", on_token_revoked, -1, 2, argv, lens);
    cmd->cb.revoked = cb;
    cmd->arg = arg;
    memcpy(cmd->hash, hash, 32);
    sb_store__redis_cmd_send(cmd);
}

void sb_store__redis_revoke_run(void *rcp, const char *run_id, sb_store_done_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char rkey[1024], tprefix[KEY_MAX];
    const char *argv[3] = {"1", rkey, tprefix};
    size_t lens[3];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE);
        return;
    }
    lens[0] = 1;
    lens[1] = key_for(rc->store, "run", run_id, strlen(run_id), rkey, sizeof(rkey));
    lens[2] = (size_t)snprintf(tprefix, sizeof(tprefix), "%stok:", rc->store->prefix);
    cmd = sb_store__redis_cmd_new(rc, "the run revocation", on_revoked, SC_REVOKE_RUN, 3, argv, lens);
    cmd->cb.done = cb;
    cmd->arg = arg;
    sb_store__redis_cmd_send(cmd);
}

/* ---- admin inspection ------------------------------------------------------------------------------------------------ */

/* a counter as the script returned it: the decimal text Redis holds ("0" when absent) */
static int counter_of(const redisReply *r, int64_t *out)
{
    char *end;
    long long v;

    if (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len > 20)
        return 0;
    v = strtoll(r->str, &end, 10);
    if (end != r->str + r->len || v < 0)
        return 0;
    *out = (int64_t)v;
    return 1;
}

static int unhex32(const char *s, size_t len, uint8_t out[32])
{
    if (len != 64 || !sb_is_token_format(s, len))
        return 0;
    for (size_t i = 0; i < 32; ++i) {
        int hi = s[2 * i] <= '9' ? s[2 * i] - '0' : s[2 * i] - 'a' + 10,
            lo = s[2 * i + 1] <= '9' ? s[2 * i + 1] - '0' : s[2 * i + 1] - 'a' + 10;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 1;
}

static void on_inspect_run(cmd_t *cmd, redisReply *reply)
{
    sb_token_t *toks[SB_MAX_INSPECT_TOKENS];
    sb_store_usage_t usage = {0, 0, 0};
    size_t ntoks = 0, nlive = 0, npairs;
    int64_t now = sb_now_ms();
    sb_status_t st = SB_E_UNAVAILABLE;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY || reply->elements < 4 || (reply->elements - 4) % 2 != 0 ||
        !counter_of(reply->element[0], &usage.calls) || !counter_of(reply->element[1], &usage.inflight) ||
        !counter_of(reply->element[2], &usage.fetched_bytes) || reply->element[3]->type != REDIS_REPLY_INTEGER ||
        reply->element[3]->integer < 0)
        goto Done;
    nlive = (size_t)reply->element[3]->integer;
    npairs = (reply->elements - 4) / 2;
    if (npairs > (size_t)cmd->limit || npairs > nlive)
        goto Done;
    for (size_t i = 0; i < npairs; ++i) {
        const redisReply *h = reply->element[4 + 2 * i], *rec = reply->element[5 + 2 * i];
        uint8_t hash[32];
        sb_token_t *tok;
        /* a record under the run's index that is not the run's, or that we cannot read: no answer rather than a wrong one */
        if (h->type != REDIS_REPLY_STRING || rec->type != REDIS_REPLY_STRING || !unhex32(h->str, h->len, hash) ||
            sb_token_deserialize(hash, rec->str, rec->len, &tok) != SB_OK)
            goto Done;
        toks[ntoks++] = tok;
        if (strcmp(tok->run_id, cmd->run_id) != 0)
            goto Done;
        if (tok->expires_at_ms <= now) {
            /* Redis expiry and our clock disagree: believe the stricter one */
            sb_token_release(toks[--ntoks]);
            --nlive;
        }
    }
    st = SB_OK;
Done:
    if (st == SB_OK) {
        cmd->cb.inspect(cmd->arg, SB_OK, toks, ntoks, nlive, &usage);
    } else {
        cmd->cb.inspect(cmd->arg, SB_E_UNAVAILABLE, NULL, 0, 0, NULL);
    }
    for (size_t i = 0; i < ntoks; ++i)
        sb_token_release(toks[i]);
}

void sb_store__redis_inspect_run(void *rcp, const char *run_id, size_t max, sb_store_inspect_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    size_t rlen = strlen(run_id);
    char rkey[1024], ck[KEY_MAX], ik[KEY_MAX], bk[KEY_MAX], tprefix[KEY_MAX], maxs[24];
    const char *argv[7] = {"4", rkey, ck, ik, bk, tprefix, maxs};
    size_t lens[7];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE, NULL, 0, 0, NULL);
        return;
    }
    lens[0] = 1;
    lens[1] = key_for(rc->store, "run", run_id, rlen, rkey, sizeof(rkey));
    lens[2] = quota_key(rc->store, "calls", run_id, rlen, ck, sizeof(ck));
    lens[3] = quota_key(rc->store, "inflight", run_id, rlen, ik, sizeof(ik));
    lens[4] = quota_key(rc->store, "bytes", run_id, rlen, bk, sizeof(bk));
    lens[5] = (size_t)snprintf(tprefix, sizeof(tprefix), "%stok:", rc->store->prefix);
    lens[6] = (size_t)snprintf(maxs, sizeof(maxs), "%zu", max);
    cmd = sb_store__redis_cmd_new(rc, "the run inspection", on_inspect_run, SC_INSPECT_RUN, 7, argv, lens);
    cmd->cb.inspect = cb;
    cmd->arg = arg;
    cmd->limit = (int64_t)max;
    memcpy(cmd->run_id, run_id, rlen + 1);
    sb_store__redis_cmd_send(cmd);
}

/* ---- fetched bytes ----------------------------------------------------------------------------------------------------- */

static void on_fetch_check(cmd_t *cmd, redisReply *reply)
{
    sb_status_t st = SB_E_UNAVAILABLE;
    const char *why = "the token store is unavailable";

    if (reply != NULL && (reply->type == REDIS_REPLY_NIL || reply->type == REDIS_REPLY_STRING)) {
        long long have = 0;
        if (reply->type == REDIS_REPLY_STRING) {
            char *end;
            have = strtoll(reply->str, &end, 10);
            if (end == reply->str || *end != '\0')
                goto Done;
        }
        st = have >= cmd->limit ? SB_E_RATE_LIMITED : SB_OK;
        why = st == SB_OK ? NULL : "fetched bytes per run";
    }
Done:
    cmd->cb.quota(cmd->arg, st, why);
}

void sb_store__redis_quota_fetch_check(void *rcp, const sb_token_t *tok, sb_quota_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char bk[KEY_MAX];
    const char *argv[2] = {"GET", bk};
    size_t lens[2];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE, "the token store is unavailable");
        return;
    }
    lens[0] = 3;
    lens[1] = quota_key(rc->store, "bytes", tok->run_id, strlen(tok->run_id), bk, sizeof(bk));
    cmd = sb_store__redis_cmd_new(rc, "the fetched-bytes check", on_fetch_check, -1, 2, argv, lens);
    cmd->cb.quota = cb;
    cmd->arg = arg;
    cmd->limit = tok->quota.fetch_bytes;
    sb_store__redis_cmd_send(cmd);
}

/* ---- tools.call per run ------------------------------------------------------------------------------------------------- */

static void on_tool_call(cmd_t *cmd, redisReply *reply)
{
    if (reply == NULL || reply->type != REDIS_REPLY_INTEGER) {
        cmd->cb.quota(cmd->arg, SB_E_UNAVAILABLE, "the token store is unavailable");
        return;
    }
    if (reply->integer > cmd->limit)
        cmd->cb.quota(cmd->arg, SB_E_RATE_LIMITED, "tools.call per run");
    else
        cmd->cb.quota(cmd->arg, SB_OK, NULL);
}

void sb_store__redis_quota_tool_call(void *rcp, const sb_token_t *tok, unsigned max_calls, sb_quota_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char tk[KEY_MAX], ck[KEY_MAX], exp[32];
    const char *argv[4] = {"2", tk, ck, exp};
    size_t lens[4];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE, "the token store is unavailable");
        return;
    }
    lens[0] = 1;
    lens[1] = quota_key(rc->store, "tools", tok->run_id, strlen(tok->run_id), tk, sizeof(tk));
    lens[2] = quota_key(rc->store, "calls", tok->run_id, strlen(tok->run_id), ck, sizeof(ck));
    lens[3] = (size_t)snprintf(exp, sizeof(exp), "%lld", (long long)tok->expires_at_ms);
    cmd = sb_store__redis_cmd_new(rc, "the tools.call count", on_tool_call, SC_TOOL_CALL, 4, argv, lens);
    cmd->cb.quota = cb;
    cmd->arg = arg;
    cmd->limit = max_calls;
    sb_store__redis_cmd_send(cmd);
}

/* ---- import.fetch per run ---------------------------------------------------------------------------------------------- */

static void on_modules(cmd_t *cmd, redisReply *reply)
{
    const char *why;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
        reply->element[0]->type != REDIS_REPLY_INTEGER || reply->element[1]->type != REDIS_REPLY_INTEGER) {
        cmd->cb.quota(cmd->arg, SB_E_UNAVAILABLE, "the token store is unavailable");
        return;
    }
    why = sb_store__modules_verdict(reply->element[0]->integer, reply->element[1]->integer, cmd->add_modules, cmd->add_bytes,
                                    cmd->limit, cmd->limit2);
    cmd->cb.quota(cmd->arg, why != NULL ? SB_E_RATE_LIMITED : SB_OK, why);
}

void sb_store__redis_quota_modules(void *rcp, const sb_token_t *tok, unsigned add_modules, uint64_t add_bytes, int64_t max_modules,
                                   int64_t max_bytes, sb_quota_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char mk[KEY_MAX], bk[KEY_MAX], ck[KEY_MAX], exp[32], am[16], ab[32];
    const char *argv[7] = {"3", mk, bk, ck, exp, am, ab};
    size_t lens[7];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE, "the token store is unavailable");
        return;
    }
    lens[0] = 1;
    lens[1] = quota_key(rc->store, "modules", tok->run_id, strlen(tok->run_id), mk, sizeof(mk));
    lens[2] = quota_key(rc->store, "modbytes", tok->run_id, strlen(tok->run_id), bk, sizeof(bk));
    lens[3] = quota_key(rc->store, "calls", tok->run_id, strlen(tok->run_id), ck, sizeof(ck));
    lens[4] = (size_t)snprintf(exp, sizeof(exp), "%lld", (long long)tok->expires_at_ms);
    lens[5] = (size_t)snprintf(am, sizeof(am), "%u", add_modules);
    lens[6] = (size_t)snprintf(ab, sizeof(ab), "%llu", (unsigned long long)add_bytes);
    cmd = sb_store__redis_cmd_new(rc, "the import.fetch count", on_modules, SC_MODULES, 7, argv, lens);
    cmd->cb.quota = cb;
    cmd->arg = arg;
    cmd->limit = max_modules;
    cmd->limit2 = max_bytes;
    cmd->add_modules = add_modules;
    cmd->add_bytes = add_bytes;
    sb_store__redis_cmd_send(cmd);
}
