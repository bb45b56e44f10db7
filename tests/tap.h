/*
 * A tiny TAP producer for the unit tests. Each test file includes this header,
 * calls ok()/is_int()/is_str() as often as it likes and returns done_testing().
 * A test file that checks nothing fails: done_testing() refuses zero checks.
 */
#ifndef SB_TESTS_TAP_H
#define SB_TESTS_TAP_H

#include <stdio.h>
#include <string.h>
#include <stdarg.h>

static int tap_count_, tap_failed_;

static inline int tap_ok_(int cond, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    ++tap_count_;
    printf("%sok %d - ", cond ? "" : "not ", tap_count_);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (!cond) {
        ++tap_failed_;
        printf("#   failed at %s:%d\n", file, line);
    }
    return cond;
}

#define ok(cond, ...) tap_ok_(!!(cond), __FILE__, __LINE__, __VA_ARGS__)
#define is_int(got, want, ...)                                                                                                     \
    do {                                                                                                                           \
        long long g_ = (long long)(got), w_ = (long long)(want);                                                                   \
        if (!tap_ok_(g_ == w_, __FILE__, __LINE__, __VA_ARGS__))                                                                   \
            printf("#   got %lld, want %lld\n", g_, w_);                                                                           \
    } while (0)
#define is_str(got, want, ...)                                                                                                     \
    do {                                                                                                                           \
        const char *g_ = (got), *w_ = (want);                                                                                      \
        int c_ = g_ != NULL && w_ != NULL ? strcmp(g_, w_) == 0 : g_ == w_;                                                        \
        if (!tap_ok_(c_, __FILE__, __LINE__, __VA_ARGS__))                                                                         \
            printf("#   got \"%s\", want \"%s\"\n", g_ ? g_ : "(null)", w_ ? w_ : "(null)");                                     \
    } while (0)

static inline int done_testing(void)
{
    printf("1..%d\n", tap_count_);
    if (tap_count_ == 0) {
        printf("# no checks ran\n");
        return 1;
    }
    if (tap_failed_ != 0)
        printf("# %d of %d checks failed\n", tap_failed_, tap_count_);
    return tap_failed_ != 0;
}

#endif
