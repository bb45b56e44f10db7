/*
 * libFuzzer driver for broker/authz/glob.c (sb_glob_match).
 *
 * Input: glob, a NUL byte, subject (no NUL: the whole input is the glob and
 * the subject is derived from it). Property: for globs and subjects of up to
 * 64 bytes, sb_glob_match agrees with the reference matcher below, written
 * straight from the semantics (PROTOCOL.md section 6, globs: "**" is ".*",
 * "*" is "[^/]*", "?" is "[^/]", everything else literal, anchored; a run of
 * three or more stars is "**"). The reference is a memoised recursion, so it
 * is polynomial too. Longer inputs only run sb_glob_match, which must stay
 * fast (the driver is meant to run with -timeout=1 or so); every run also
 * checks a few algebraic facts (a glob matches its own literal text when it
 * has no wildcards, "**" matches everything, ...).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "authz/authz.h"
#include "fuzz.h"

#define REF_MAX 64

enum { T_LIT, T_ONE, T_STAR, T_DSTAR };

typedef struct st_ref_t {
    uint8_t kind[REF_MAX], ch[REF_MAX];
    size_t ntok;
    const uint8_t *s;
    size_t slen;
    int8_t memo[REF_MAX + 1][REF_MAX + 1]; /* -1 unknown, 0/1 */
} ref_t;

static void tokenize(ref_t *r, const uint8_t *g, size_t glen)
{
    size_t i = 0;

    r->ntok = 0;
    while (i < glen) {
        if (g[i] == '*') {
            size_t j = i;
            while (j < glen && g[j] == '*')
                ++j;
            r->kind[r->ntok] = j - i >= 2 ? T_DSTAR : T_STAR;
            i = j;
        } else {
            r->kind[r->ntok] = g[i] == '?' ? T_ONE : T_LIT;
            r->ch[r->ntok] = g[i];
            ++i;
        }
        ++r->ntok;
    }
}

static int ref_match(ref_t *r, size_t t, size_t i)
{
    int res;

    if (r->memo[t][i] >= 0)
        return r->memo[t][i];
    if (t == r->ntok) {
        res = i == r->slen;
    } else {
        switch (r->kind[t]) {
        case T_LIT:
            res = i < r->slen && r->s[i] == r->ch[t] && ref_match(r, t + 1, i + 1);
            break;
        case T_ONE:
            res = i < r->slen && r->s[i] != '/' && ref_match(r, t + 1, i + 1);
            break;
        default: {
            /* zero or more characters; '/' only for "**" */
            size_t k = i;
            res = 0;
            for (;;) {
                if (ref_match(r, t + 1, k)) {
                    res = 1;
                    break;
                }
                if (k == r->slen || (r->kind[t] == T_STAR && r->s[k] == '/'))
                    break;
                ++k;
            }
            break;
        }
        }
    }
    r->memo[t][i] = (int8_t)res;
    return res;
}

static int reference(const uint8_t *g, size_t glen, const uint8_t *s, size_t slen)
{
    static ref_t r;

    tokenize(&r, g, glen);
    r.s = s;
    r.slen = slen;
    memset(r.memo, -1, sizeof(r.memo));
    return ref_match(&r, 0, 0);
}

static int has_wildcard(const uint8_t *g, size_t n)
{
    return memchr(g, '*', n) != NULL || memchr(g, '?', n) != NULL;
}

static void one(const uint8_t *g, size_t glen, const uint8_t *s, size_t slen)
{
    int got;
    char *gc = calloc(1, glen + 1), *sc = calloc(1, slen + 1);

    if (gc == NULL || sc == NULL)
        abort();
    /* exact-size copies: reading past either length is an ASan error */
    memcpy(gc, g, glen);
    memcpy(sc, s, slen);
    got = sb_glob_match(gc, glen, sc, slen);
    SB_FUZZ_ASSERT(got == 0 || got == 1, "sb_glob_match returned %d", got);
    if (glen <= REF_MAX && slen <= REF_MAX) {
        int want = reference(g, glen, s, slen);
        SB_FUZZ_ASSERT(got == want, "sb_glob_match(\"%.*s\", \"%.*s\") = %d, reference %d", (int)glen, gc, (int)slen, sc, got,
                       want);
    }
    /* a glob without wildcards matches exactly itself */
    if (!has_wildcard(g, glen))
        SB_FUZZ_ASSERT(got == (glen == slen && memcmp(g, s, glen) == 0), "literal glob");
    free(gc);
    free(sc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);

    if (size > 8192)
        return 0;
    if (nul != NULL) {
        size_t glen = (size_t)(nul - data);
        one(data, glen, nul + 1, size - glen - 1);
        /* the subject as its own glob, and "**" around the glob */
        one(nul + 1, size - glen - 1, nul + 1, size - glen - 1);
        SB_FUZZ_ASSERT(sb_glob_match("**", 2, (const char *)nul + 1, size - glen - 1) == 1, "\"**\" matches everything");
    } else {
        /* a glob and the glob itself as the subject, and the glob with its wildcards dropped */
        uint8_t *lit = malloc(size + 1);
        size_t n = 0;
        if (lit == NULL)
            abort();
        for (size_t i = 0; i < size; ++i)
            if (data[i] != '*')
                lit[n++] = data[i] == '?' ? 'x' : data[i];
        one(data, size, data, size);
        one(data, size, lit, n);
        free(lit);
    }
    return 0;
}
