/*
 * Unit tests for broker/authz/path.c: files-axis path normalisation
 * (questpie-wire.md section 4.2).
 */
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "sb/limits.h"
#include "authz/authz.h"

static const struct {
    const char *in;
    const char *out; /* NULL: refused as unsafe */
} cases[] = {
    {"a", "a"},
    {"a/b/c.txt", "a/b/c.txt"},
    {"a//b///c", "a/b/c"},
    {"./a", "a"},
    {".//a", "a"},
    {"././a", "./a"},   /* only one leading "./" is stripped */
    {"a/./b", "a/./b"}, /* single "." segments are kept verbatim */
    {".", "."},
    {"a/", "a/"},
    {"a//", "a/"},
    {"...", "..."},
    {"..a", "..a"},
    {"a..", "a.."},
    {"a/..b/c", "a/..b/c"},
    {"a/b..", "a/b.."},
    {"[x]{y}*?", "[x]{y}*?"},
    {"dir name/é", "dir name/é"},
    /* unsafe */
    {"", NULL},
    {"/", NULL},
    {"/etc/passwd", NULL},
    {"//a", NULL},
    {"..", NULL},
    {"../a", NULL},
    {"a/..", NULL},
    {"a/../b", NULL},
    {"a/b/../../..", NULL},
    {"./..", NULL},
    {".//../a", NULL},
    {"a//..//b", NULL},
    {"./", NULL},
    {"a\\b", NULL},
    {"..\\a", NULL},
    {"\\a", NULL},
};

int main(void)
{
    char out[SB_MAX_PATH + 1];
    size_t i;
    char *big;

    for (i = 0; i != sizeof(cases) / sizeof(cases[0]); ++i) {
        sb_status_t st = sb_path_normalize(cases[i].in, strlen(cases[i].in), out, sizeof(out));
        if (cases[i].out != NULL) {
            is_int(st, SB_OK, "\"%s\" is safe", cases[i].in);
            if (st == SB_OK)
                is_str(out, cases[i].out, "\"%s\" normalises", cases[i].in);
        } else {
            is_int(st, SB_E_FORBIDDEN, "\"%s\" is unsafe", cases[i].in);
        }
    }

    /* embedded NUL: the length is authoritative */
    is_int(sb_path_normalize("a\0b", 3, out, sizeof(out)), SB_E_FORBIDDEN, "embedded NUL is unsafe");
    is_int(sb_path_normalize(NULL, 0, out, sizeof(out)), SB_E_FORBIDDEN, "NULL is unsafe");

    /* sizes */
    is_int(sb_path_normalize("abc", 3, out, 4), SB_OK, "exact fit (3 bytes + NUL)");
    is_str(out, "abc", "exact fit output");
    is_int(sb_path_normalize("abcd", 4, out, 4), SB_E_TOO_LARGE, "output buffer too small");
    is_int(sb_path_normalize("a//b", 4, out, 4), SB_OK, "collapsed output fits");
    is_int(sb_path_normalize("a", 1, out, 0), SB_E_TOO_LARGE, "zero-sized output");
    big = malloc(SB_MAX_PATH + 2);
    memset(big, 'a', SB_MAX_PATH + 1);
    is_int(sb_path_normalize(big, SB_MAX_PATH, out, sizeof(out)), SB_OK, "SB_MAX_PATH bytes accepted");
    is_int(sb_path_normalize(big, SB_MAX_PATH + 1, out, sizeof(out)), SB_E_TOO_LARGE, "SB_MAX_PATH + 1 bytes too large");
    free(big);

    return done_testing();
}
