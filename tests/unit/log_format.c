/*
 * Unit tests for broker/obs/log.c, its hand-written formatting: the timestamp and the integers that
 * replaced snprintf on the call path give exactly what the printf formats gave ("%04d-%02d-%02dT
 * %02d:%02d:%02d.%03ldZ" of the wall clock, "%lld"), for log and audit lines alike.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>
#include "tap.h"
#include "obs/audit.h"
#include "obs/log.h"

static int cap_pipe[2] = {-1, -1}, saved_stderr = -1;
static char captured[65536];
static size_t captured_len;

static void capture_begin(void)
{
    fflush(stderr);
    if (pipe(cap_pipe) != 0 || (saved_stderr = dup(2)) < 0 || dup2(cap_pipe[1], 2) < 0)
        abort();
}

static void capture_end(void)
{
    ssize_t r;
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    close(cap_pipe[1]);
    captured_len = 0;
    while ((r = read(cap_pipe[0], captured + captured_len, sizeof(captured) - 1 - captured_len)) > 0)
        captured_len += (size_t)r;
    captured[captured_len] = '\0';
    close(cap_pipe[0]);
}

/* the wall clock as the printf format wrote it, to the millisecond */
static void printf_stamp(const struct timespec *ts, char out[64])
{
    struct tm tm;
    gmtime_r(&ts->tv_sec, &tm);
    snprintf(out, 64, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
             tm.tm_sec, ts->tv_nsec / 1000000);
}

/* the line's "ts" lies between two readings of the clock taken around it, in the printf format */
static void check_stamp(int audit, const char *what)
{
    struct timespec before, after;
    char lo[64], hi[64];
    sb_logline_t l;
    json_error_t jerr;
    json_t *o;
    const char *ts;

    clock_gettime(CLOCK_REALTIME, &before);
    if (audit) {
        char err[256];
        capture_begin();
        const char *a, *b;
        if (sb_audit_open("stderr", NULL, 0, err, sizeof(err)) != SB_OK)
            abort();
        sb_log_begin_always(&l, "audit");
        sb_log_end_audit(&l);
        sb_audit_close();
        capture_end();
        /* the stream is the genesis, the line, and the shutdown checkpoint: keep the line */
        a = memchr(captured, '\n', captured_len);
        b = a != NULL ? memchr(a + 1, '\n', captured_len - (size_t)(a + 1 - captured)) : NULL;
        if (b == NULL)
            abort();
        memmove(captured, a + 1, (size_t)(b + 1 - (a + 1)));
        captured_len = (size_t)(b + 1 - (a + 1));
    } else {
        capture_begin();
        sb_log_begin(&l, SB_LOG_WARN, "ev");
        sb_log_end(&l);
        capture_end();
    }
    clock_gettime(CLOCK_REALTIME, &after);
    printf_stamp(&before, lo);
    printf_stamp(&after, hi);
    o = json_loadb(captured, captured_len, 0, &jerr);
    ts = json_string_value(json_object_get(o, "ts"));
    if (ok(ts != NULL, "%s: a ts string", what)) {
        is_int((long long)strlen(ts), 24, "%s: ts is YYYY-MM-DDTHH:MM:SS.mmmZ (%s)", what, ts);
        ok(strcmp(lo, ts) <= 0 && strcmp(ts, hi) <= 0, "%s: ts %s within [%s, %s]", what, ts, lo, hi);
        ok(ts[4] == '-' && ts[7] == '-' && ts[10] == 'T' && ts[13] == ':' && ts[16] == ':' && ts[19] == '.' && ts[23] == 'Z',
           "%s: separators in place", what);
    }
    if (!audit) {
        const char *lv = json_string_value(json_object_get(o, "level"));
        ok(lv != NULL && strcmp(lv, "warn") == 0, "%s: level warn", what);
    }
    json_decref(o);
}

static void test_stamps(void)
{
    /* many lines: the per-second cache is refilled when the second turns */
    for (int i = 0; i < 3; ++i) {
        check_stamp(0, "log line");
        check_stamp(1, "audit line");
        if (i == 1)
            usleep(1100 * 1000);
    }
}

static void test_head_bytes(void)
{
    sb_logline_t l;
    capture_begin();
    sb_log_begin(&l, SB_LOG_ERROR, "a.b");
    sb_log_end(&l);
    capture_end();
    /* {"ts":"<24>","level":"error","event":"a.b"}\n */
    static const char tail[] = "\",\"level\":\"error\",\"event\":\"a.b\"}\n";
    ok(captured_len == 7 + 24 + sizeof(tail) - 1 && memcmp(captured, "{\"ts\":\"", 7) == 0 &&
           memcmp(captured + 31, tail, sizeof(tail) - 1) == 0,
       "log head byte for byte: %s", captured);
}

static void test_integers(void)
{
    static const long long values[] = {0,         1,          -1,           9,         10,        -10,          99, 100,
                                       123456789, -987654321, 4294967296LL, LLONG_MAX, LLONG_MIN, LLONG_MIN + 1};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); ++i) {
        char want[96];
        sb_logline_t l;
        capture_begin();
        sb_log_begin(&l, SB_LOG_ERROR, "n");
        sb_log_int(&l, "v", values[i]);
        sb_log_end(&l);
        capture_end();
        snprintf(want, sizeof(want), ",\"v\":%lld}\n", values[i]);
        ok(captured_len > strlen(want) && strcmp(captured + captured_len - strlen(want), want) == 0, "%lld as %%lld gives it (%s)",
           values[i], captured);
    }
}

/*
 * Plain runs are scanned eight bytes at a time: every byte that needs a look ('"', '\\', a control,
 * DEL, a UTF-8 lead or continuation byte) at every offset of a word, in strings of every length up to
 * three words, must come back from the JSON line as it went in (well-formed UTF-8 is kept as it is).
 */
static void test_specials_at_every_offset(void)
{
    static const struct {
        const char *b;
        size_t len;
    } specials[] = {{"\"", 1}, {"\\", 1},       {"\x01", 1},         {"\x1f", 1}, {"\x7f", 1},
                    {"\t", 1}, {"\xc3\xa9", 2}, {"\xe2\x82\xac", 3}, {"~", 1},    {" ", 1}};
    int bad = 0, checked = 0;
    for (size_t len = 0; len <= 24; ++len) {
        for (size_t at = 0; at <= len; ++at) {
            for (size_t k = 0; k < sizeof(specials) / sizeof(specials[0]); ++k) {
                char in[64];
                size_t n = 0;
                sb_logline_t l;
                json_error_t jerr;
                json_t *o, *v;
                for (size_t j = 0; j < at; ++j)
                    in[n++] = (char)('a' + j % 26);
                memcpy(in + n, specials[k].b, specials[k].len);
                n += specials[k].len;
                for (size_t j = at; j < len; ++j)
                    in[n++] = (char)('A' + j % 26);
                capture_begin();
                sb_log_begin(&l, SB_LOG_ERROR, "x");
                sb_log_str(&l, "v", in, n);
                sb_log_end(&l);
                capture_end();
                o = json_loadb(captured, captured_len, JSON_ALLOW_NUL, &jerr);
                v = json_object_get(o, "v");
                ++checked;
                if (!json_is_string(v) || json_string_length(v) != n || memcmp(json_string_value(v), in, n) != 0) {
                    if (bad++ < 3)
                        printf("#   mismatch: %s\n", captured);
                }
                json_decref(o);
            }
        }
    }
    is_int(bad, 0, "%d strings with a special byte at every offset come back as they went in", checked);
}

/* an empty value, even without storage, is an empty string */
static void test_empty_value(void)
{
    sb_logline_t l;
    capture_begin();
    sb_log_begin(&l, SB_LOG_ERROR, "e");
    sb_log_str(&l, "v", NULL, 0);
    sb_log_end(&l);
    capture_end();
    ok(captured_len > 9 && strcmp(captured + captured_len - 9, ",\"v\":\"\"}\n") == 0, "NULL, 0 gives \"v\":\"\" (%s)", captured);
}

int main(void)
{
    test_empty_value();
    test_specials_at_every_offset();
    test_head_bytes();
    test_integers();
    test_stamps();
    return done_testing();
}
