/*
 * Log line benchmark: what one call log line costs, in one run, against two references measured
 * beside it. Not a pass/fail test.
 *
 *  - line:     the line broker/http/rpc.c writes for a call (event "rpc"; cid, requestId, runId,
 *              token, method, code, status, reason, us, bytesIn, bytesOut), built with sb_log_* and
 *              appended to the worker's batch, as a worker does (sb_log_thread_buffered), the batch
 *              flushed to /dev/null whenever it fills.
 *  - snprintf: the same fields with one snprintf into a stack buffer, no escaping, no clock: what
 *              formatting through stdio costs at the least.
 *  - memcpy:   copying the finished line into the batch: the floor.
 * Rounds alternate the three; each figure is the median over rounds, in ns per line.
 * Build and run: tests/bench/logline.sh (BENCH_ROUNDS, BENCH_LINES per measurement).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "obs/log.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static const char cid[] = "3f2b8c1e-9a4d-4e6f-8b2a-7c1d5e9f0a3b", reqid[] = "req-0123456789", run[] = "bench-run-42",
                  tokref[] = "a1b2c3d4e5f6", method[] = "services.svc.fn", code[] = "not_implemented",
                  reason[] = "services.svc.fn has no host handler";

static volatile size_t sink;

static void one_line(long long us)
{
    sb_logline_t l;
    sb_log_begin(&l, SB_LOG_WARN, "rpc");
    sb_log_cstr(&l, "cid", cid);
    sb_log_cstr(&l, "requestId", reqid);
    sb_log_cstr(&l, "runId", run);
    sb_log_cstr(&l, "token", tokref);
    sb_log_str(&l, "method", method, sizeof(method) - 1);
    sb_log_cstr(&l, "code", code);
    sb_log_int(&l, "status", 501);
    sb_log_cstr(&l, "reason", reason);
    sb_log_int(&l, "us", us);
    sb_log_int(&l, "bytesIn", 40);
    sb_log_int(&l, "bytesOut", 96);
    sb_log_end(&l);
}

static void one_snprintf(long long us)
{
    char buf[SB_LOGLINE_MAX];
    int n = snprintf(buf, sizeof(buf),
                     "{\"ts\":\"%s.%03dZ\",\"level\":\"%s\",\"event\":\"%s\",\"cid\":\"%s\",\"requestId\":\"%s\",\"runId\":\"%s\","
                     "\"token\":\"%s\",\"method\":\"%s\",\"code\":\"%s\",\"status\":%d,\"reason\":\"%s\",\"us\":%lld,"
                     "\"bytesIn\":%d,\"bytesOut\":%d}\n",
                     "2026-12-01T22:00:00", 123, "warn", "rpc", cid, reqid, run, tokref, method, code, 501, reason, us, 40, 96);
    sink += (size_t)n + (unsigned char)buf[n / 2];
}

static char finished[SB_LOGLINE_MAX];
static size_t finished_len;
static char batch[65536];
static size_t batch_len;

static void one_memcpy(long long us)
{
    (void)us;
    if (batch_len + finished_len > sizeof(batch))
        batch_len = 0;
    memcpy(batch + batch_len, finished, finished_len);
    batch_len += finished_len;
    sink += batch[batch_len - 1];
}

static double measure(void (*fn)(long long), long lines)
{
    uint64_t t0 = now_ns();
    for (long i = 0; i < lines; ++i)
        fn(i & 1023);
    sb_log_flush();
    return (double)(now_ns() - t0) / (double)lines;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void)
{
    int rounds = getenv("BENCH_ROUNDS") != NULL ? atoi(getenv("BENCH_ROUNDS")) : 7;
    long lines = getenv("BENCH_LINES") != NULL ? atol(getenv("BENCH_LINES")) : 200000;
    double t[3][64];
    int null_fd = open("/dev/null", O_WRONLY);

    if (rounds < 1 || rounds > 64 || lines < 1 || null_fd < 0) {
        fprintf(stderr, "bench_logline: BENCH_ROUNDS 1..64, BENCH_LINES >= 1, and /dev/null\n");
        return 1;
    }
    /* the finished line for the memcpy floor: one line captured through a pipe */
    {
        int p[2], saved = dup(2);
        if (pipe(p) != 0 || saved < 0 || dup2(p[1], 2) < 0)
            return 1;
        one_line(7);
        dup2(saved, 2);
        close(saved);
        close(p[1]);
        finished_len = (size_t)read(p[0], finished, sizeof(finished));
        close(p[0]);
    }
    dup2(null_fd, 2); /* the lines go nowhere; the report goes to stdout */
    sb_log_thread_buffered(1);
    for (int r = 0; r < rounds; ++r) {
        t[0][r] = measure(one_line, lines);
        t[1][r] = measure(one_snprintf, lines);
        t[2][r] = measure(one_memcpy, lines);
    }
    sb_log_thread_buffered(0);
    for (int k = 0; k < 3; ++k)
        qsort(t[k], (size_t)rounds, sizeof(double), cmp);
    printf("log line of %zu bytes, %d rounds x %ld lines, medians:\n", finished_len, rounds, lines);
    printf("  line (sb_log_*, batched)   %7.1f ns\n", t[0][rounds / 2]);
    printf("  one snprintf, no escaping  %7.1f ns   line / snprintf %.2fx\n", t[1][rounds / 2],
           t[0][rounds / 2] / t[1][rounds / 2]);
    printf("  memcpy of the line         %7.1f ns   line / memcpy %.1fx\n", t[2][rounds / 2], t[0][rounds / 2] / t[2][rounds / 2]);
    return 0;
}
