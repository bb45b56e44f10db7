/*
 * broker/authz: anchored glob matching (authz.h, sb_glob_match).
 *
 * Semantics are upstream's glob-to-regex translation (PROTOCOL.md
 * section 6, globs): "**" is ".*", "*" is "[^/]*", "?" is "[^/]", everything else
 * (including '[' and '{') is literal, and the whole string must match. A run of
 * three or more stars behaves as "**" (upstream yields ".*[^/]*", which is the
 * same language).
 *
 * Both the glob and the subject come from untrusted places (the manifest is
 * written by the host, the path by the guest), so backtracking is not an
 * option: "*a*a*a*a*a*b" against 4000 'a's would take exponential time in a
 * naive matcher. Instead we simulate the pattern as an NFA: a set of glob
 * positions that are alive after each subject byte. That is O(glen * slen)
 * time, O(glen) memory on the stack, no recursion, and obviously correct for
 * the two kinds of star (a single star may not consume '/', a double one may).
 */
#include <string.h>
#include "sb/limits.h"
#include "authz/authz.h"

/*
 * Globs longer than this never match. Manifest globs are capped far below it
 * (SB_MAX_MANIFEST_STRING), so this only bounds the stack of a caller that
 * passes something else.
 */
#define MAX_GLOB_LEN SB_MAX_PATH

/* length of the run of '*' starting at g[i] */
static size_t star_run(const char *g, size_t glen, size_t i)
{
    size_t j = i;

    while (j != glen && g[j] == '*')
        ++j;
    return j - i;
}

/*
 * Adds state i and everything reachable from it without consuming input: a
 * star run matches the empty string, so the position after it is alive too.
 */
static void add_state(unsigned char *set, const char *g, size_t glen, size_t i)
{
    for (;;) {
        size_t run;
        set[i] = 1;
        if (i == glen || (run = star_run(g, glen, i)) == 0)
            return;
        i += run;
    }
}

int sb_glob_match(const char *glob, size_t glen, const char *s, size_t slen)
{
    unsigned char a[MAX_GLOB_LEN + 1], b[MAX_GLOB_LEN + 1];
    unsigned char *cur = a, *next = b, *tmp;
    size_t i, t;

    if (glen > MAX_GLOB_LEN || (glen != 0 && glob == NULL) || (slen != 0 && s == NULL))
        return 0;

    memset(cur, 0, glen + 1);
    add_state(cur, glob, glen, 0);

    for (t = 0; t != slen; ++t) {
        unsigned char c = (unsigned char)s[t];
        int alive = 0;
        memset(next, 0, glen + 1);
        for (i = 0; i != glen; ++i) {
            size_t run;
            if (!cur[i])
                continue;
            if ((run = star_run(glob, glen, i)) != 0) {
                /* the star stays where it is and eats c: any byte for "**", anything but '/' for "*" */
                if (run >= 2 || c != '/') {
                    add_state(next, glob, glen, i);
                    alive = 1;
                }
            } else if (glob[i] == '?' ? c != '/' : (unsigned char)glob[i] == c) {
                add_state(next, glob, glen, i + 1);
                alive = 1;
            }
        }
        if (!alive)
            return 0;
        tmp = cur;
        cur = next;
        next = tmp;
    }
    return cur[glen];
}
