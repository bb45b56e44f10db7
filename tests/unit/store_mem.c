/*
 * Unit tests for broker/store/store.c's memory backend and token.c's
 * records: tokens minted with the same manifest share one manifest object,
 * revoking (or expiring) one of them leaves the others working, the
 * record keeps its own copies, the tables grow past their first size and
 * stay bounded by max_tokens, and quotas count per run as before. The memory
 * backend answers synchronously, so every callback has run when the call
 * returns.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "sb/mem.h"
#include "store/store_int.h"
#include "authz/manifest_int.h"
#include "obs/log.h"
#include "util/util.h"

#define CAPS                                                                                                                       \
    "{\"data\": {\"collections\": {\"posts\": [\"read\", \"create\"], \"comments\": [\"read\"]}}, \"files\": {\"read\": "          \
    "[\"uploads/**\"]}, \"net\": [\"api.example.com:443\"], \"timeoutMs\": 60000}"

typedef struct st_result_t {
    int called;
    sb_status_t st;
    sb_token_t *tok;
    const char *why;
    /* a timeline read */
    size_t n, first_len;
    char last[SB_LOGLINE_MAX + 1];
} result_t;

static void on_done(void *arg, sb_status_t st)
{
    result_t *r = arg;
    ++r->called;
    r->st = st;
}

static void on_revoked(void *arg, sb_status_t st, const char *run_id)
{
    result_t *r = arg;
    ++r->called;
    r->st = st;
    snprintf(r->last, sizeof(r->last), "%s", run_id != NULL ? run_id : "(none)");
}

static void on_get(void *arg, sb_status_t st, sb_token_t *tok)
{
    result_t *r = arg;
    ++r->called;
    r->st = st;
    r->tok = tok;
}

static void on_lookup(void *arg, sb_status_t st, sb_token_t *tok, const char *why)
{
    result_t *r = arg;
    ++r->called;
    r->st = st;
    r->tok = tok;
    r->why = why;
}

static sb_store_t *create(size_t max_tokens)
{
    sb_store_config_t c = {"memory", "sb:", max_tokens, 1000, NULL, NULL, NULL, NULL, 0, 0};
    sb_store_t *s = NULL;
    const char *err;
    if (sb_store_create(&c, &s, &err) != SB_OK)
        printf("# memory store: %s\n", err);
    return s;
}

static void hash_of(unsigned n, uint8_t hash[32])
{
    char text[32];
    snprintf(text, sizeof(text), "token-%u", n);
    sb_sha256(text, strlen(text), hash);
}

/* a record with the manifest `caps_text`, one hour to live and the given quotas; NULL on failure */
static sb_token_t *mint(unsigned n, const char *run_id, const char *caps_text, int64_t calls, int64_t concurrent)
{
    json_t *caps = caps_text != NULL ? json_loads(caps_text, 0, NULL) : NULL;
    json_t *scope = json_pack("{s:s}", "tenantId", "t1");
    sb_token_t *t = NULL;
    uint8_t hash[32];
    char err[256];

    hash_of(n, hash);
    if (sb_token_build(hash, run_id, caps, NULL, scope, sb_now_ms() + 3600000, &t, err, sizeof(err)) != SB_OK)
        printf("# build failed: %s\n", err);
    else
        t->quota = (sb_quota_t){calls, concurrent, 1 << 20};
    json_decref(caps);
    json_decref(scope);
    return t;
}

static sb_status_t put(sb_store_conn_t *c, sb_token_t *t)
{
    result_t r = {0};
    sb_store_put(c, t, NULL, on_done, &r);
    return r.called == 1 ? r.st : SB_E_EXECUTION;
}

/* the outcome of sb_store_lookup_acquire; the slot (if any) is given back and the reference released */
static sb_status_t call_once(sb_store_conn_t *c, unsigned n, const char **why)
{
    result_t r = {0};
    uint8_t hash[32];

    hash_of(n, hash);
    sb_store_lookup_acquire(c, hash, on_lookup, &r);
    if (r.called != 1)
        return SB_E_EXECUTION;
    if (why != NULL)
        *why = r.why;
    if (r.st == SB_OK)
        sb_store_quota_release(c, r.tok);
    sb_token_release(r.tok);
    return r.st;
}

static int grants_posts_create(sb_store_conn_t *c, unsigned n)
{
    result_t r = {0};
    uint8_t hash[32];
    int granted;

    hash_of(n, hash);
    sb_store_get(c, hash, on_get, &r);
    if (r.st != SB_OK)
        return 0;
    granted = (sb_manifest__collection_verbs(r.tok->manifest, "posts", 5) & SB_MANIFEST_VERB_BIT(SB_OP_CREATE)) != 0;
    sb_token_release(r.tok);
    return granted;
}

static void test_shared_manifest(void)
{
    size_t base = sb_manifest_interned_count();
    sb_store_t *s = create(100);
    sb_store_conn_t *c = sb_store_conn_create(s, NULL);
    sb_token_t *t[4];
    result_t r = {0};
    uint8_t hash[32];

    t[0] = mint(1, "run-a", CAPS, 100, 4);
    t[1] = mint(2, "run-a", CAPS, 100, 4);
    t[2] = mint(3, "run-b", CAPS, 100, 4);
    t[3] = mint(4, "run-c", "{\"services\": [\"svc\"]}", 100, 4);
    ok(t[0] != NULL && t[1] != NULL && t[2] != NULL && t[3] != NULL, "four records built");
    ok(t[0]->manifest == t[1]->manifest && t[1]->manifest == t[2]->manifest, "three tokens with one manifest share it");
    ok(t[3]->manifest != t[0]->manifest, "  a token with another manifest has its own");
    is_int(sb_manifest_interned_count(), base + 2, "  two manifests alive");
    for (int i = 0; i < 4; ++i) {
        is_int(put(c, t[i]), SB_OK, "token %d stored", i + 1);
        sb_token_release(t[i]); /* the store holds the records now */
    }
    is_int(put(c, t[0]), SB_E_BAD_ARGS, "a token stored twice is refused");

    hash_of(1, hash);
    sb_store_revoke_token(c, hash, on_revoked, &r);
    is_int(r.st, SB_OK, "token 1 revoked");
    is_str(r.last, "run-a", "  the revocation names its run");
    sb_store_revoke_token(c, hash, on_revoked, &r);
    is_int(r.st, SB_OK, "token 1 revoked again: nothing to do, still OK");
    is_str(r.last, "(none)", "  and no run is named");
    is_int(call_once(c, 1, NULL), SB_E_UNAUTHORIZED, "  token 1 is refused");
    is_int(call_once(c, 2, NULL), SB_OK, "  token 2 (same run, same manifest) still works");
    ok(grants_posts_create(c, 2), "  and its manifest still grants posts.create");
    is_int(call_once(c, 3, NULL), SB_OK, "  token 3 (same manifest) still works");
    is_int(sb_manifest_interned_count(), base + 2, "  the shared manifest lives on");

    r.called = 0;
    sb_store_revoke_run(c, "run-a", on_done, &r);
    is_int(r.called, 1, "run-a revoked");
    is_int(call_once(c, 2, NULL), SB_E_UNAUTHORIZED, "  token 2 is refused");
    is_int(call_once(c, 3, NULL), SB_OK, "  token 3 (run-b, same manifest) still works");
    ok(grants_posts_create(c, 3), "  and grants posts.create");
    is_int(call_once(c, 4, NULL), SB_OK, "  token 4 (run-c) still works");
    is_int((long long)sb_store_live_tokens(s), 2, "  two live tokens");

    hash_of(3, hash);
    sb_store_revoke_token(c, hash, on_revoked, &r);
    is_int(sb_manifest_interned_count(), base + 1, "revoking the last token of a manifest frees it");
    is_int(call_once(c, 4, NULL), SB_OK, "  token 4 still works");
    sb_store_conn_destroy(c);
    sb_store_destroy(s);
    is_int(sb_manifest_interned_count(), base, "destroying the store frees the rest");
}

static void test_record(void)
{
    json_t *scope = json_pack("{s:s,s:s}", "tenantId", "tenant-0042", "userId", "u-7");
    sb_token_t *t = NULL;
    uint8_t hash[32];
    char err[256], run[SB_MAX_RUN_ID + 2];

    hash_of(9, hash);
    is_int(sb_token_build(hash, "run-x", NULL, "main", scope, 1234, &t, err, sizeof(err)), SB_OK, "a record with target and scope");
    is_str(t->run_id, "run-x", "  run id");
    is_str(t->target, "main", "  target");
    is_int((long long)t->scope_len, 2, "  two scope bindings");
    is_str(t->scope[0].key, "tenantId", "  first key");
    is_str(t->scope[0].value, "tenant-0042", "  first value");
    is_str(t->scope[1].key, "userId", "  second key");
    is_str(t->scope[1].value, "u-7", "  second value");
    is_int(t->expires_at_ms, 1234, "  expiry");
    ok(memcmp(t->hash, hash, 32) == 0, "  hash");
    is_int(sb_manifest_timeout_ms(t->manifest), -1, "  the empty manifest");
    /* the strings are the record's own: the JSON they came from may go */
    json_decref(scope);
    is_str(t->scope[0].value, "tenant-0042", "  the scope outlives its JSON");
    sb_token_release(t);

    t = NULL;
    is_int(sb_token_build(hash, "run-y", NULL, NULL, NULL, 0, &t, err, sizeof(err)), SB_OK, "a record without target or scope");
    is_str(t->target, "", "  target is empty");
    is_int((long long)t->scope_len, 0, "  no scope");
    sb_token_release(t);

    /* the limits and messages of the mint are unchanged */
    memset(run, 'r', SB_MAX_RUN_ID + 1);
    run[SB_MAX_RUN_ID + 1] = '\0';
    is_int(sb_token_build(hash, run, NULL, NULL, NULL, 0, &t, err, sizeof(err)), SB_E_BAD_ARGS, "a run id one byte too long");
    is_str(err, "runId: expected 1-256 printable bytes", "  message");
    run[SB_MAX_RUN_ID] = '\0';
    t = NULL;
    is_int(sb_token_build(hash, run, NULL, NULL, NULL, 0, &t, err, sizeof(err)), SB_OK, "a run id of the maximum length");
    is_int((long long)strlen(t->run_id), SB_MAX_RUN_ID, "  kept whole");
    sb_token_release(t);
    scope = json_pack("{s:i}", "tenantId", 1);
    is_int(sb_token_build(hash, "r", NULL, NULL, scope, 0, &t, err, sizeof(err)), SB_E_BAD_ARGS, "a scope value that is no string");
    is_str(err, "scope.tenantId: expected a string of 1-256 printable bytes", "  message");
    json_decref(scope);
    {
        json_t *caps = json_loads("{\"net\": [\"a b\"]}", 0, NULL);
        scope = json_pack("{s:s}", "tenantId", "t1");
        is_int(sb_token_build(hash, "r", caps, NULL, scope, 0, &t, err, sizeof(err)), SB_E_BAD_ARGS, "a bad manifest");
        is_str(err, "capabilities.net[0]: whitespace or control character", "  message");
        json_decref(caps);
        json_decref(scope);
    }

    /* every allocation of a build failing in turn */
    {
        json_t *caps = json_loads(CAPS, 0, NULL);
        size_t base = sb_manifest_interned_count();
        unsigned long before, n;
        int all_nomem = 1;
        scope = json_pack("{s:s}", "tenantId", "t1");
        before = sb_mem_try_count();
        if (sb_token_build(hash, "r", caps, NULL, scope, 0, &t, err, sizeof(err)) != SB_OK)
            all_nomem = 0;
        n = sb_mem_try_count() - before;
        sb_token_release(t);
        for (unsigned long i = 1; i <= n; ++i) {
            sb_status_t st;
            t = NULL;
            sb_mem_fail_nth(i);
            st = sb_token_build(hash, "r", caps, NULL, scope, 0, &t, err, sizeof(err));
            sb_mem_fail_nth(0);
            if (st != SB_E_NOMEM || t != NULL) {
                printf("# allocation %lu of %lu failing: status %d\n", i, n, (int)st);
                all_nomem = 0;
            }
        }
        ok(n >= 2 && all_nomem, "each of a build's %lu try-allocations failing gives SB_E_NOMEM", n);
        is_int(sb_manifest_interned_count(), base, "  and leaves no manifest behind");
        json_decref(caps);
        json_decref(scope);
    }
}

static void test_growth_and_bounds(void)
{
    enum { MAX = 5000 };
    sb_store_t *s = create(MAX);
    sb_store_conn_t *c = sb_store_conn_create(s, NULL);
    int stored = 1, found = 1;
    sb_token_t *t;
    const char *why = NULL;

    for (unsigned i = 0; i < MAX; ++i) {
        char run[32];
        snprintf(run, sizeof(run), "run-%u", i);
        t = mint(100 + i, run, CAPS, 1, 1);
        stored &= t != NULL && put(c, t) == SB_OK;
        sb_token_release(t);
    }
    ok(stored, "%d tokens stored (the table grew from its first size)", MAX);
    ok(s->nbuckets >= MAX && s->nbuckets <= 8192, "  %zu buckets for %d tokens", s->nbuckets, MAX);
    for (unsigned i = 0; i < MAX; ++i)
        found &= call_once(c, 100 + i, NULL) == SB_OK;
    ok(found, "  every one found, each run's counters created");
    ok(s->nqbuckets >= MAX && s->nqbuckets <= 16384, "  %zu counter buckets for %d runs", s->nqbuckets, MAX);
    is_int(call_once(c, 100, &why), SB_E_RATE_LIMITED, "  a second call of a one-call run is refused");
    is_str(why, "calls per run", "  by its calls quota");
    t = mint(99, "run-more", CAPS, 1, 1);
    is_int(put(c, t), SB_E_RATE_LIMITED, "one token more than max_tokens is refused");
    sb_token_release(t);

    /* expired records make room, and are refused when met */
    {
        uint8_t hash[32];
        result_t r = {0};
        hash_of(100, hash);
        sb_store_get(c, hash, on_get, &r);
        r.tok->expires_at_ms = sb_now_ms() - 1; /* as if its time had passed */
        sb_token_release(r.tok);
        is_int(call_once(c, 100, NULL), SB_E_UNAUTHORIZED, "an expired token is refused");
        is_int((long long)sb_store_live_tokens(s), MAX - 1, "  and dropped");
        t = mint(99, "run-more", CAPS, 1, 1);
        is_int(put(c, t), SB_OK, "  which made room for one more");
        sb_token_release(t);
        is_int(call_once(c, 99, NULL), SB_OK, "  which works");
    }
    sb_store_conn_destroy(c);
    sb_store_destroy(s);
}

static void test_quotas(void)
{
    sb_store_t *s = create(100);
    sb_store_conn_t *c = sb_store_conn_create(s, NULL);
    sb_token_t *a = mint(200, "run-q", CAPS, 3, 1), *b = mint(201, "run-q", CAPS, 3, 1);
    result_t r1 = {0}, r2 = {0};
    uint8_t ha[32], hb[32];
    const char *why = NULL;

    is_int(put(c, a), SB_OK, "two tokens of one run stored");
    is_int(put(c, b), SB_OK, "  the second");
    hash_of(200, ha);
    hash_of(201, hb);
    sb_store_lookup_acquire(c, ha, on_lookup, &r1);
    is_int(r1.st, SB_OK, "a call holds the run's one concurrency slot");
    sb_store_lookup_acquire(c, hb, on_lookup, &r2);
    is_int(r2.st, SB_E_RATE_LIMITED, "  a call with the other token of the run is refused meanwhile");
    is_str(r2.why, "concurrent calls per run", "  by the concurrency quota");
    sb_token_release(r2.tok);
    sb_store_quota_release(c, r1.tok);
    sb_token_release(r1.tok);
    is_int(call_once(c, 201, NULL), SB_OK, "the slot given back, the run's third call goes ahead (refused ones count)");
    is_int(call_once(c, 201, &why), SB_E_RATE_LIMITED, "  its fourth is over its calls quota");
    is_str(why, "calls per run", "  named");
    sb_token_release(a);
    sb_token_release(b);
    sb_store_conn_destroy(c);
    sb_store_destroy(s);
}

static void on_quota(void *arg, sb_status_t st, const char *why)
{
    result_t *r = arg;
    ++r->called;
    r->st = st;
    r->why = why;
}

/* import.fetch's counters (PROTOCOL.md section 6c): modules counted before a fetch, bytes after, per run */
static sb_status_t modules(sb_store_conn_t *c, const sb_token_t *t, unsigned add, uint64_t bytes, const char **why)
{
    result_t r = {0};
    sb_store_quota_modules(c, t, add, bytes, 3, 1000, on_quota, &r);
    *why = r.why;
    return r.called == 1 ? r.st : SB_E_EXECUTION;
}

static void test_modules(void)
{
    sb_store_t *s = create(100);
    sb_store_conn_t *c = sb_store_conn_create(s, NULL);
    sb_token_t *a = mint(300, "run-m", CAPS, 100, 4), *b = mint(301, "run-m", CAPS, 100, 4),
               *other = mint(302, "run-n", CAPS, 100, 4);
    const char *why = NULL;

    is_int(modules(c, a, 1, 0, &why), SB_OK, "a run's first module");
    is_int(modules(c, a, 0, 600, &why), SB_OK, "  its 600 bytes");
    is_int(modules(c, b, 1, 0, &why), SB_OK, "the second, with another token of the run");
    is_int(modules(c, b, 0, 401, &why), SB_E_RATE_LIMITED, "  its 401 bytes take the run over 1000");
    is_str(why, "module bytes per run", "  named");
    is_int(modules(c, a, 1, 0, &why), SB_E_RATE_LIMITED, "the third is refused before it is fetched: no bytes are left");
    is_str(why, "module bytes per run", "  named");
    is_int(modules(c, other, 1, 0, &why), SB_OK, "another run counts on its own");
    is_int(modules(c, other, 1, 0, &why), SB_OK, "  its second");
    is_int(modules(c, other, 1, 0, &why), SB_OK, "  its third");
    is_int(modules(c, other, 1, 0, &why), SB_E_RATE_LIMITED, "  its fourth is over the count");
    is_str(why, "modules per run", "  named");
    ok(sb_store__modules_verdict(3, 1000, 0, 0, 3, 1000) != NULL && sb_store__modules_verdict(3, 999, 0, 0, 3, 1000) == NULL &&
           sb_store__modules_verdict(3, 1000, 0, 1, 3, 1000) == NULL && sb_store__modules_verdict(4, 0, 1, 0, 3, 1000) != NULL &&
           sb_store__modules_verdict(4, 0, 0, 5, 3, 1000) == NULL,
       "the verdict's edges: the byte cap reached, and the count checked only when a module is added");
    sb_token_release(a);
    sb_token_release(b);
    sb_token_release(other);
    sb_store_conn_destroy(c);
    sb_store_destroy(s);
}

static void got_events(void *arg, sb_status_t st, const sb_view_t *events, size_t n)
{
    result_t *r = arg;
    ++r->called;
    r->st = st;
    r->n = n;
    r->first_len = n != 0 ? events[0].len : 0;
    if (n != 0 && events[n - 1].len < sizeof(r->last))
        memcpy(r->last, events[n - 1].base, events[n - 1].len);
    if (n != 0 && events[n - 1].len < sizeof(r->last))
        r->last[events[n - 1].len] = '\0';
}

static void add_event(sb_store_conn_t *c, const char *run, long long v, int64_t expires_at)
{
    sb_logline_t l;
    sb_store_timeline_begin(&l, "call");
    sb_log_int(&l, "v", v);
    sb_store_timeline_end(&l, c, run, expires_at);
}

/* the memory store's run timeline: capped per run (the newest kept, the rest counted), bounded in runs */
static void test_timeline(void)
{
    sb_store_config_t conf = {"memory", "sb:", 16, 1000, NULL, NULL, NULL, NULL, 2, 60000};
    sb_store_t *s = NULL;
    sb_store_conn_t *c;
    const char *err;
    result_t r;
    uint64_t dropped0 = sb_store_timeline_dropped();
    char run[32];

    if (!ok(sb_store_create(&conf, &s, &err) == SB_OK, "store with a timeline of 2 events per run"))
        return;
    c = sb_store_conn_create(s, NULL);
    ok(sb_store_timeline_enabled(c), "the timeline is on");
    for (int i = 1; i <= 3; ++i)
        add_event(c, "r1", i, 0);
    memset(&r, 0, sizeof(r));
    sb_store_timeline_get(c, "r1", got_events, &r);
    is_int(r.called, 1, "answered at once");
    is_int((int)r.n, 2, "two events kept of three");
    ok(strstr(r.last, "\"v\":3") != NULL && r.last[strlen(r.last) - 1] == '}', "the newest is last, closed: %s", r.last);
    ok(sb_store_timeline_dropped() - dropped0 == 1, "the oldest was dropped and counted");
    /* more runs than the store keeps: the one that would expire first goes, with its events counted */
    for (int i = 0; i < SB_TIMELINE_MAX_RUNS; ++i) {
        snprintf(run, sizeof(run), "run-%d", i);
        add_event(c, run, i, sb_now_ms() + 3600000);
    }
    ok(s->tl_nruns <= SB_TIMELINE_MAX_RUNS, "at most SB_TIMELINE_MAX_RUNS runs (%zu)", s->tl_nruns);
    memset(&r, 0, sizeof(r));
    sb_store_timeline_get(c, "r1", got_events, &r);
    is_int((int)r.n, 0, "the run that expires first was evicted");
    ok(sb_store_timeline_dropped() - dropped0 == 3, "its two events were counted");
    memset(&r, 0, sizeof(r));
    sb_store_timeline_get(c, "run-9999", got_events, &r);
    is_int((int)r.n, 1, "the newest run is kept");
    /* the bytes are bounded too: under a small budget the runs that expire first give way, the rest fits */
    s->tl_max_bytes = 8192;
    for (int i = 0; i < 50; ++i) {
        snprintf(run, sizeof(run), "bytes-%d", i);
        add_event(c, run, i, sb_now_ms() + 7200000 + i);
        add_event(c, run, i, sb_now_ms() + 7200000 + i);
    }
    ok(s->tl_bytes <= s->tl_max_bytes, "within the byte budget (%zu of %zu)", s->tl_bytes, s->tl_max_bytes);
    memset(&r, 0, sizeof(r));
    sb_store_timeline_get(c, "bytes-49", got_events, &r);
    is_int((int)r.n, 2, "the run that expires last is kept whole");
    memset(&r, 0, sizeof(r));
    sb_store_timeline_get(c, "bytes-0", got_events, &r);
    is_int((int)r.n, 0, "the one that expires first gave way");
    sb_store_conn_destroy(c);
    sb_store_destroy(s);
}

int main(void)
{
    test_shared_manifest();
    test_record();
    test_growth_and_bounds();
    test_quotas();
    test_modules();
    test_timeline();
    return done_testing();
}
