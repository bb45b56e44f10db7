/*
 * pg_direct: the libpq side of tests/bench/pg.sh. N threads, each with its
 * own connection, run the statement the broker sends for
 * collections.posts.findOne {where: {id}} (same text, same parameters, a
 * random key per call, PQexecParams like the broker's PQsendQueryParams) for
 * a fixed time, and print one line in the format of the wrk script:
 *
 *   BENCH rps=<calls/s> p50_us=<us> p99_us=<us> requests=<n> good=<n> bad=<n> last_bad=0 sockerr=0
 *
 * "good" counts calls that returned exactly one row (every key exists).
 * With MODE "prepared" each connection prepares the statement once and runs
 * it with PQexecPrepared, as the broker does with its per-connection cache;
 * "unnamed" (the default) sends it whole every call (PQexecParams).
 *
 * usage: pg_direct CONNINFO THREADS SECONDS MAX_ID TENANT [unnamed|prepared]
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <libpq-fe.h>

/* the broker's statement for findOne {where: {id: $1}} on the bench's posts table (tests/unit/pg_query.c pins it) */
static const char sql[] = "SELECT \"id\", \"tenant_id\", \"title\", \"views\", \"score\", \"price\", \"published\", \"meta\", \"blob\", "
                          "\"created\", \"uid\" FROM posts WHERE (\"id\" = $1::bigint) AND \"tenant_id\" = $2::text ORDER BY \"id\" "
                          "LIMIT 2 OFFSET 0";

typedef struct {
    const char *conninfo, *tenant;
    long max_id;
    double seconds;
    unsigned seed;
    int prepared;
    uint32_t *lat; /* microseconds, one per call */
    size_t nlat, cap;
    long good, bad;
    int failed;
} worker_t;

static pthread_barrier_t start_line;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *run(void *arg)
{
    worker_t *w = arg;
    PGconn *pg = PQconnectdb(w->conninfo);
    char id[32];
    const char *params[2] = {id, w->tenant};
    double end;

    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "pg_direct: connect: %s", PQerrorMessage(pg));
        w->failed = 1;
    }
    if (!w->failed && w->prepared) {
        PGresult *res = PQprepare(pg, "findone", sql, 2, NULL);
        if (PQresultStatus(res) != PGRES_COMMAND_OK) {
            fprintf(stderr, "pg_direct: prepare: %s", PQerrorMessage(pg));
            w->failed = 1;
        }
        PQclear(res);
    }
    pthread_barrier_wait(&start_line);
    if (w->failed) {
        PQfinish(pg);
        return NULL;
    }
    end = now_s() + w->seconds;
    for (;;) {
        double t0 = now_s(), t1;
        PGresult *res;
        if (t0 >= end)
            break;
        snprintf(id, sizeof(id), "%ld", 1 + (long)(rand_r(&w->seed) % w->max_id));
        if (w->prepared)
            res = PQexecPrepared(pg, "findone", 2, params, NULL, NULL, 0);
        else
            res = PQexecParams(pg, sql, 2, NULL, params, NULL, NULL, 0);
        t1 = now_s();
        if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
            ++w->good;
        else
            ++w->bad;
        PQclear(res);
        if (w->nlat == w->cap) {
            w->cap = w->cap ? 2 * w->cap : 65536;
            if ((w->lat = realloc(w->lat, w->cap * sizeof(*w->lat))) == NULL)
                abort();
        }
        w->lat[w->nlat++] = (uint32_t)((t1 - t0) * 1e6);
    }
    PQfinish(pg);
    return NULL;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int n;
    worker_t *w;
    pthread_t *t;
    uint32_t *all;
    size_t total = 0, k = 0;
    long good = 0, bad = 0;
    double t0, elapsed;
    int failed = 0;

    if ((argc != 6 && argc != 7) || (n = atoi(argv[2])) < 1 || n > 1024 ||
        (argc == 7 && strcmp(argv[6], "prepared") != 0 && strcmp(argv[6], "unnamed") != 0)) {
        fprintf(stderr, "usage: pg_direct CONNINFO THREADS SECONDS MAX_ID TENANT [unnamed|prepared]\n");
        return 2;
    }
    w = calloc((size_t)n, sizeof(*w));
    t = calloc((size_t)n, sizeof(*t));
    if (w == NULL || t == NULL)
        abort();
    pthread_barrier_init(&start_line, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; ++i) {
        w[i].conninfo = argv[1];
        w[i].seconds = atof(argv[3]);
        w[i].max_id = atol(argv[4]);
        w[i].tenant = argv[5];
        w[i].prepared = argc == 7 && strcmp(argv[6], "prepared") == 0;
        w[i].seed = 0x9e3779b9u * (unsigned)(i + 1);
        if (w[i].max_id < 1)
            w[i].max_id = 1;
        pthread_create(&t[i], NULL, run, &w[i]);
    }
    /* every connection is up before the clock starts */
    pthread_barrier_wait(&start_line);
    t0 = now_s();
    for (int i = 0; i < n; ++i)
        pthread_join(t[i], NULL);
    elapsed = now_s() - t0;
    for (int i = 0; i < n; ++i) {
        total += w[i].nlat;
        good += w[i].good;
        bad += w[i].bad;
        failed |= w[i].failed;
    }
    if ((all = malloc((total ? total : 1) * sizeof(*all))) == NULL)
        abort();
    for (int i = 0; i < n; ++i) {
        if (w[i].nlat != 0)
            memcpy(all + k, w[i].lat, w[i].nlat * sizeof(*all));
        k += w[i].nlat;
        free(w[i].lat);
    }
    qsort(all, total, sizeof(*all), cmp_u32);
    printf("BENCH rps=%.1f p50_us=%u p99_us=%u requests=%zu good=%ld bad=%ld last_bad=0 sockerr=%d\n", (double)total / elapsed,
           total ? all[total / 2] : 0, total ? all[(size_t)((double)total * 0.99)] : 0, total, good, bad, failed);
    free(all);
    free(w);
    free(t);
    return failed || bad != 0;
}
