/*
 * Shared by the two clients of tests/bench/relay.sh: relay_guest.c (a guest
 * behind `sandbox-shim relay`) and relay_direct.c (straight to the broker).
 * Both time N sequential round trips of the same call, services.svc.fn with
 * args {}, check every answer is the broker's not_implemented error, and
 * summarise the samples the same way (nearest-rank percentiles).
 */
#ifndef SB_BENCH_RELAY_COMMON_H
#define SB_BENCH_RELAY_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <msgpack.h>

#define RELAY_METHOD "services.svc.fn"
#define RELAY_MAX_N 1000000u

typedef struct st_relay_stats_t {
    uint64_t n, min_ns, p50_ns, p90_ns, p99_ns, max_ns, mean_ns;
} relay_stats_t;

static inline uint64_t relay_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* strict decimal in [lo, hi] */
static inline int relay_parse_u(const char *s, unsigned long lo, unsigned long hi, unsigned long *out)
{
    unsigned long v = 0;
    if (s == NULL || *s == '\0' || strlen(s) > 9)
        return -1;
    for (; *s != '\0'; ++s) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (unsigned long)(*s - '0');
    }
    if (v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static inline int relay_read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *)buf + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

static inline int relay_write_full(int fd, const void *buf, size_t n)
{
    size_t off = 0;
    while (off < n) {
        ssize_t k = write(fd, (const char *)buf + off, n - off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        off += (size_t)k;
    }
    return 0;
}

/* the value of `key` in a msgpack map, or NULL */
static inline const msgpack_object *relay_get(const msgpack_object *m, const char *key)
{
    size_t kl = strlen(key);
    if (m == NULL || m->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (uint32_t i = 0; i < m->via.map.size; ++i) {
        const msgpack_object *k = &m->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == kl && memcmp(k->via.str.ptr, key, kl) == 0)
            return &m->via.map.ptr[i].val;
    }
    return NULL;
}

/*
 * 1 if `p` holds a map with ok:false and error.code "not_implemented" (the
 * broker's answer to a granted call with no handler, and what the shim hands
 * the guest under --on-denial reply); with want_id, also id == *want_id.
 */
static inline int relay_is_not_implemented(const char *p, size_t len, const uint64_t *want_id)
{
    msgpack_unpacked u;
    const msgpack_object *ok, *code, *id;
    size_t off = 0;
    int good = 0;

    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, p, len, &off) == MSGPACK_UNPACK_SUCCESS && off == len) {
        ok = relay_get(&u.data, "ok");
        code = relay_get(relay_get(&u.data, "error"), "code");
        id = relay_get(&u.data, "id");
        good = ok != NULL && ok->type == MSGPACK_OBJECT_BOOLEAN && !ok->via.boolean && code != NULL &&
               code->type == MSGPACK_OBJECT_STR && code->via.str.size == 15 &&
               memcmp(code->via.str.ptr, "not_implemented", 15) == 0;
        if (want_id != NULL)
            good = good && id != NULL && id->type == MSGPACK_OBJECT_POSITIVE_INTEGER && id->via.u64 == *want_id;
    }
    msgpack_unpacked_destroy(&u);
    return good;
}

static inline int relay_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* nearest-rank percentile of sorted samples */
static inline uint64_t relay_pct(const uint64_t *s, size_t n, unsigned pct)
{
    size_t rank = (n * pct + 99) / 100;
    return s[rank == 0 ? 0 : rank - 1];
}

/* sorts the samples in place */
static inline void relay_summarise(uint64_t *s, size_t n, relay_stats_t *st)
{
    uint64_t sum = 0;
    memset(st, 0, sizeof(*st));
    if (n == 0)
        return;
    qsort(s, n, sizeof(*s), relay_cmp_u64);
    for (size_t i = 0; i < n; ++i)
        sum += s[i];
    st->n = n;
    st->min_ns = s[0];
    st->p50_ns = relay_pct(s, n, 50);
    st->p90_ns = relay_pct(s, n, 90);
    st->p99_ns = relay_pct(s, n, 99);
    st->max_ns = s[n - 1];
    st->mean_ns = sum / n;
}

#endif
