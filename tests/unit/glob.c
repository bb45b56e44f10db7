/*
 * Unit tests for broker/authz/glob.c: anchored glob matching with upstream's
 * semantics (PROTOCOL.md section 6, globs), its edge cases, pathological
 * patterns, and a randomised comparison against upstream's own definition
 * (the glob translated to an anchored regex, run by POSIX regexec).
 */
#include <regex.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tap.h"
#include "authz/authz.h"

static const struct {
    const char *glob, *s;
    int match;
} cases[] = {
    /* literals */
    {"a", "a", 1},
    {"a", "b", 0},
    {"a", "aa", 0},
    {"abc", "ab", 0},
    {"", "", 1},
    {"", "a", 0},
    {"a/b", "a/b", 1},
    /* '*' does not cross '/' */
    {"*", "abc", 1},
    {"*", "", 1},
    {"*", "a/b", 0},
    {"a/*", "a/b", 1},
    {"a/*", "a/", 1},
    {"a/*", "a/b/c", 0},
    {"a/*/c", "a/b/c", 1},
    {"a/*/c", "a/b/x/c", 0},
    {"*.txt", "notes.txt", 1},
    {"*.txt", "dir/notes.txt", 0},
    {"a*b*c", "abc", 1},
    {"a*b*c", "axxbyyc", 1},
    {"a*b*c", "axxb/yc", 0},
    /* '**' crosses '/' */
    {"**", "", 1},
    {"**", "a/b/c", 1},
    {"a/**/b", "a/x/b", 1},
    {"a/**/b", "a/x/y/b", 1},
    {"a/**/b", "a/b", 0},
    {"a/**/b", "a//b", 1},
    {"dir/**", "dir/x", 1},
    {"dir/**", "dir/x/y", 1},
    {"dir/**", "dir/", 1},
    {"dir/**", "dir", 0},
    {"dir/**", "dirx/y", 0},
    {"**/*.md", "a/b/c.md", 1},
    {"**/*.md", "c.md", 0},
    {"**.md", "c.md", 1},
    {"**.md", "a/c.md", 1},
    {"a**b", "a/x/b", 1},
    {"***", "a/b", 1}, /* a run of three stars is "**" */
    {"a/***/b", "a/x/y/b", 1},
    /* '?' is one character other than '/' */
    {"?", "a", 1},
    {"?", "", 0},
    {"?", "/", 0},
    {"?", "ab", 0},
    {"a?c", "abc", 1},
    {"a?c", "a/c", 0},
    {"??", "é", 1}, /* bytes, not characters: é is two bytes in UTF-8 */
    /* no classes, no braces: '[' and '{' are literal */
    {"[ab]", "a", 0},
    {"[ab]", "[ab]", 1},
    {"{a,b}", "a", 0},
    {"{a,b}", "{a,b}", 1},
    {"a[0-9]", "a[0-9]", 1},
    {"a\\*", "a*", 0}, /* backslash escapes nothing: it is a literal byte */
    {"a\\*", "a\\xyz", 1},
    {".*", "abc", 0},
    {".*", ".abc", 1},
    {"+", "+", 1},
    {"(a|b)", "a", 0},
    {"^a$", "^a$", 1},
    /* tool-name style */
    {"github.*", "github.create_issue", 1},
    {"github.*", "gitlab.x", 0},
    {"*", "github.create_issue", 1},
};

/* upstream's definition: "**" -> ".*", "*" -> "[^/]*", "?" -> "[^/]", the rest escaped, anchored */
static int reference_match(const char *glob, const char *s)
{
    char re[1024];
    size_t i, n = 0;
    regex_t rx;
    int r;

    re[n++] = '^';
    for (i = 0; glob[i] != '\0'; ++i) {
        if (glob[i] == '*' && glob[i + 1] == '*') {
            memcpy(re + n, ".*", 2);
            n += 2;
            ++i;
        } else if (glob[i] == '*') {
            memcpy(re + n, "[^/]*", 5);
            n += 5;
        } else if (glob[i] == '?') {
            memcpy(re + n, "[^/]", 4);
            n += 4;
        } else {
            re[n++] = '[';
            re[n++] = glob[i];
            re[n++] = ']';
        }
    }
    re[n++] = '$';
    re[n] = '\0';
    if (regcomp(&rx, re, REG_EXTENDED | REG_NOSUB) != 0)
        return -1;
    r = regexec(&rx, s, 0, NULL, 0) == 0;
    regfree(&rx);
    return r;
}

static uint32_t rng_state = 0x9e3779b9u;

static uint32_t next_rand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static void test_table(void)
{
    size_t i;

    for (i = 0; i != sizeof(cases) / sizeof(cases[0]); ++i)
        is_int(sb_glob_match(cases[i].glob, strlen(cases[i].glob), cases[i].s, strlen(cases[i].s)), cases[i].match,
               "\"%s\" vs \"%s\"", cases[i].glob, cases[i].s);
    /* lengths are authoritative */
    is_int(sb_glob_match("a*", 1, "ab", 1), 1, "glob and subject lengths bound the strings");
    is_int(sb_glob_match("a", 1, "a\0b", 3), 0, "embedded NUL in the subject is a byte like any other");
    is_int(sb_glob_match("a?b", 3, "a\0b", 3), 1, "'?' matches a NUL byte");
}

static void test_random(void)
{
    static const char galpha[] = "ab/*?", salpha[] = "ab/";
    int i, mismatches = 0;

    for (i = 0; i != 20000; ++i) {
        char g[9], s[13];
        size_t gl = next_rand() % 9, sl = next_rand() % 13, j;
        int want, got;
        for (j = 0; j != gl; ++j)
            g[j] = galpha[next_rand() % 5];
        g[gl] = '\0';
        for (j = 0; j != sl; ++j)
            s[j] = salpha[next_rand() % 3];
        s[sl] = '\0';
        want = reference_match(g, s);
        got = sb_glob_match(g, gl, s, sl);
        if (want != got && mismatches++ < 10)
            ok(0, "random: \"%s\" vs \"%s\": got %d, regex says %d", g, s, got, want);
    }
    is_int(mismatches, 0, "20000 random globs agree with the regex definition");
}

static double seconds_since(clock_t start)
{
    return (double)(clock() - start) / CLOCKS_PER_SEC;
}

static void test_pathological(void)
{
    static const char *const globs[] = {
        "*a*a*a*a*a*b", "**a**a**a**a**a**b", "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b", "**a*a**a*a**a*a**b", "?*?*?*?*?*?*b",
    };
    char *s = malloc(4001);
    clock_t start;
    size_t i;

    memset(s, 'a', 4000);
    s[4000] = '\0';
    for (i = 0; i != sizeof(globs) / sizeof(globs[0]); ++i) {
        start = clock();
        is_int(sb_glob_match(globs[i], strlen(globs[i]), s, 4000), 0, "\"%s\" vs 4000 'a's does not match", globs[i]);
        ok(seconds_since(start) < 1.0, "... and finishes quickly (%.3fs)", seconds_since(start));
    }
    /* the same with slashes sprinkled in, and a final match */
    for (i = 0; i < 4000; i += 97)
        s[i] = '/';
    s[3999] = 'b';
    start = clock();
    is_int(sb_glob_match("**a**a**a**b", 12, s, 4000), 1, "\"**a**a**a**b\" matches across slashes");
    is_int(sb_glob_match("*a*a*a*b", 8, s, 4000), 0, "\"*a*a*a*b\" cannot cross slashes");
    ok(seconds_since(start) < 1.0, "... quickly (%.3fs)", seconds_since(start));
    free(s);
}

static void test_limits(void)
{
    char *g = malloc(5000);

    memset(g, '*', 5000);
    is_int(sb_glob_match(g, 4096, "abc", 3), 1, "4096-byte glob is matched");
    is_int(sb_glob_match(g, 4097, "abc", 3), 0, "a glob longer than SB_MAX_PATH never matches");
    free(g);
    is_int(sb_glob_match(NULL, 0, "", 0), 1, "empty glob, empty subject");
    is_int(sb_glob_match(NULL, 0, NULL, 0), 1, "NULL with zero lengths");
}

int main(void)
{
    test_table();
    test_random();
    test_pathological();
    test_limits();
    return done_testing();
}
