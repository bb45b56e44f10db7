/*
 * Unit tests for broker/call/path.c: files-axis path normalisation
 * (PROTOCOL.md section 6, "Paths") and the storage shape the files handler
 * opens (no empty or "." segment, no temporary names).
 */
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "sb/limits.h"
#include "call/path.h"

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

/* sb_path_normalize, then sb_path_storage_check, as the files decoder runs them */
static sb_status_t guest_path(const char *in, size_t len, char *out, size_t outsz, const char **why)
{
    if (sb_path_normalize(in, len, out, outsz) != SB_OK) {
        *why = SB_PATH_WHY_UNSAFE;
        return SB_E_FORBIDDEN;
    }
    return sb_path_storage_check(out, strlen(out), why);
}

/* ---- guest paths: what the typed files call holds after both checks -------------------------------------------- */

static void test_guest_path(void)
{
    static const struct {
        const char *in;
        size_t len; /* 0: strlen */
        const char *out;
        const char *why;
    } gcases[] = {
        {"a.txt", 0, "a.txt", NULL},
        {"a/b/c.txt", 0, "a/b/c.txt", NULL},
        {"a//b", 0, "a/b", NULL},
        {"./a", 0, "a", NULL},
        {"...", 0, "...", NULL},
        {"a/..b", 0, "a/..b", NULL},
        {".hidden", 0, ".hidden", NULL},
        {"x/.sb-tmp", 0, "x/.sb-tmp", NULL},
        {"sb-tmp-1", 0, "sb-tmp-1", NULL},
        {"a/./b", 0, NULL, SB_PATH_WHY_SEGMENT},
        {".", 0, NULL, SB_PATH_WHY_SEGMENT},
        {"a/.", 0, NULL, SB_PATH_WHY_SEGMENT},
        {"././a", 0, NULL, SB_PATH_WHY_SEGMENT},
        {"a/", 0, NULL, SB_PATH_WHY_SEGMENT},
        {"a//", 0, NULL, SB_PATH_WHY_SEGMENT},
        {"./", 0, NULL, SB_PATH_WHY_UNSAFE},
        {"", 0, NULL, SB_PATH_WHY_UNSAFE},
        {"..", 0, NULL, SB_PATH_WHY_UNSAFE},
        {"../x", 0, NULL, SB_PATH_WHY_UNSAFE},
        {"a/../../x", 0, NULL, SB_PATH_WHY_UNSAFE},
        {"a/..", 0, NULL, SB_PATH_WHY_UNSAFE},
        {"/etc/passwd", 0, NULL, SB_PATH_WHY_UNSAFE},
        {"a\\b", 0, NULL, SB_PATH_WHY_UNSAFE},
        {"a\0b", 3, NULL, SB_PATH_WHY_UNSAFE},
        {".sb-tmp-0011", 0, NULL, SB_PATH_WHY_RESERVED},
        {"d/.sb-tmp-", 0, NULL, SB_PATH_WHY_RESERVED},
        {".sb-tmp-x/y", 0, NULL, SB_PATH_WHY_RESERVED},
    };
    char out[SB_MAX_PATH + 1], *big;

    for (size_t i = 0; i != sizeof(gcases) / sizeof(gcases[0]); ++i) {
        const char *why = NULL;
        size_t len = gcases[i].len != 0 ? gcases[i].len : strlen(gcases[i].in);
        sb_status_t st = guest_path(gcases[i].in, len, out, sizeof(out), &why);
        if (gcases[i].out != NULL) {
            is_int(st, SB_OK, "path \"%s\" accepted", gcases[i].in);
            is_str(st == SB_OK ? out : why, gcases[i].out, "path \"%s\" normalised", gcases[i].in);
        } else {
            is_int(st, SB_E_FORBIDDEN, "path \"%s\" refused", gcases[i].in);
            is_str(why, gcases[i].why, "path \"%s\" reason", gcases[i].in);
        }
    }
    /* the length cap of the check applies here too */
    big = malloc(SB_MAX_PATH + 2);
    memset(big, 'a', SB_MAX_PATH + 1);
    {
        const char *why = NULL;
        ok(guest_path(big, SB_MAX_PATH, out, sizeof(out), &why) == SB_OK, "path of SB_MAX_PATH bytes accepted");
        ok(guest_path(big, SB_MAX_PATH + 1, out, sizeof(out), &why) == SB_E_FORBIDDEN, "path above SB_MAX_PATH refused");
    }
    free(big);
    ok(sb_path_is_tmp_name(".sb-tmp-0123456789abcdef", 24), "temporary name recognised");
    ok(!sb_path_is_tmp_name(".sb-tmp", 7), "a prefix of the prefix is not a temporary");
}

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

    test_guest_path();
    return done_testing();
}
