/*
 * Unit tests for broker/obs/metrics.c: the Prometheus text goes into a capped
 * sb_buf_t, whole or not at all. Over the cap is SB_E_TOO_LARGE; each
 * allocation of a render failed in turn (sb_mem_fail_nth) is SB_E_NOMEM; and
 * after either the buffer holds exactly what it held before (the sanitizer
 * build adds: no leak, no bad access on any of those paths).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "tap.h"
#include "obs/metrics.h"
#include "sb/buf.h"
#include "sb/mem.h"

static int holds(const sb_buf_t *b, const char *s)
{
    size_t n = strlen(s);
    return b->len == n && (n == 0 || (b->base != NULL && memcmp(b->base, s, n) == 0 && b->base[n] == '\0'));
}

static void test_render(void)
{
    sb_buf_t b;
    sb_status_t st;
    char line[256];

    sb_metrics_call(SB_MK_FILES, SB_OK, 300);
    sb_metrics_call(SB_MK_COUNT_, SB_E_BAD_ARGS, 5);
    sb_metrics_egress("rule \"quoted\" \\ back\nline", 1);
    sb_metrics_egress("plain", 0);
    st = sb_metrics_render(&b);
    is_int(st, SB_OK, "render succeeds");
    ok(b.base != NULL && b.len == strlen(b.base), "the text is NUL-terminated and has no NUL inside");
    ok(b.base != NULL && strncmp(b.base, "# HELP sb_build_info ", 21) == 0, "the text starts with sb_build_info");
    snprintf(line, sizeof(line), "sb_calls_total{kind=\"%s\",code=\"%s\",status=\"%d\"} 1\n", sb_method_kind_name(SB_MK_FILES),
             sb_status_code(SB_OK), sb_status_http(SB_OK));
    ok(b.base != NULL && strstr(b.base, line) != NULL, "a recorded call is counted");
    ok(b.base != NULL && strstr(b.base, "sb_calls_total{kind=\"invalid\",") != NULL, "an unparsed method counts as invalid");
    ok(b.base != NULL &&
           strstr(b.base, "sb_egress_decisions_total{decision=\"allow\",rule=\"rule \\\"quoted\\\" \\\\ back\\nline\"} 1\n") !=
               NULL,
       "a rule label has its quote, backslash and line feed escaped");
    ok(b.base != NULL && strstr(b.base, "sb_egress_decisions_total{decision=\"deny\",rule=\"plain\"} 1\n") != NULL,
       "a denied decision is counted");
    ok(b.base != NULL && b.len >= 1 && b.base[b.len - 1] == '\n', "the text ends with a line end");
    is_int(sb_buf_cap(&b), SB_METRICS_MAX_TEXT, "the buffer has the metrics cap");
    sb_buf_free(&b);
}

/* the cap: the exact length fits, one byte less is SB_E_TOO_LARGE and leaves the buffer as it was */
static void test_cap(void)
{
    sb_buf_t b, full;
    size_t need;
    sb_status_t st;

    if (sb_metrics_render(&full) != SB_OK) {
        ok(0, "render for the length");
        sb_buf_free(&full);
        return;
    }
    need = full.len;

    sb_buf_init(&b, need + 4);
    ok(sb_buf_append_str(&b, "pre\n") == SB_OK, "prefix");
    st = sb_metrics_render_into(&b);
    is_int(st, SB_OK, "a cap of exactly prefix + text fits");
    ok(b.len == need + 4 && memcmp(b.base + 4, full.base, need) == 0, "the text follows the prefix, byte for byte");
    sb_buf_free(&b);

    sb_buf_init(&b, need + 3);
    ok(sb_buf_append_str(&b, "pre\n") == SB_OK, "prefix");
    st = sb_metrics_render_into(&b);
    is_int(st, SB_E_TOO_LARGE, "one byte below: SB_E_TOO_LARGE");
    ok(holds(&b, "pre\n"), "over the cap, the buffer holds only what it held before");
    sb_buf_free(&b);

    sb_buf_init(&b, 0);
    is_int(sb_metrics_render_into(&b), SB_E_TOO_LARGE, "a zero cap: SB_E_TOO_LARGE");
    ok(b.len == 0, "nothing appended");
    sb_buf_free(&b);
    sb_buf_free(&full);
}

/* fails each try-allocation of a render in turn: SB_E_NOMEM, the buffer unchanged, then a clean render */
static void test_alloc_failures(void)
{
    sb_buf_t b;
    unsigned long n, points = 0, bad = 0;
    sb_status_t st = SB_E_NOMEM;

    for (n = 1; n < 10000; ++n) {
        sb_buf_init(&b, SB_METRICS_MAX_TEXT);
        if (sb_buf_append_str(&b, "keep") != SB_OK) {
            ok(0, "prefix");
            sb_buf_free(&b);
            return;
        }
        sb_mem_fail_nth(n);
        st = sb_metrics_render_into(&b);
        sb_mem_fail_nth(0);
        if (st == SB_OK) {
            sb_buf_free(&b);
            break;
        }
        ++points;
        if (st != SB_E_NOMEM || !holds(&b, "keep"))
            ++bad;
        sb_buf_free(&b);
    }
    is_int(st, SB_OK, "the render succeeds once no allocation is failed");
    ok(points >= 2, "the render's buffer grew through several allocations (%lu failure points)", points);
    is_int(bad, 0, "every failure point gives SB_E_NOMEM and leaves the buffer as it was");
}

int main(void)
{
    test_render();
    test_cap();
    test_alloc_failures();
    return done_testing();
}
