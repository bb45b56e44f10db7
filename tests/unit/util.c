/*
 * Unit tests for broker/util/util.c: the UTF-8 cuts every echo of a guest
 * string goes through (sb_utf8_cut, sb_utf8_trim_tail), with characters of
 * every length across the cut, and the printable quoting.
 */
#include <string.h>
#include "tap.h"
#include "sb/value.h"
#include "util/util.h"

static void test_cut(void)
{
    static const struct {
        const char *s;
        size_t max, want;
        const char *label;
    } cases[] = {
        {"abcdef", 3, 3, "ASCII cuts anywhere"},
        {"abc", 8, 3, "shorter than max: whole"},
        {"abc", 3, 3, "exactly max: whole"},
        {"", 4, 0, "empty"},
        {"ab\xc3\xa9z", 3, 2, "2-byte character across the cut: left out"},
        {"ab\xc3\xa9z", 4, 4, "2-byte character ending on the cut: kept"},
        {"a\xe2\x82\xac", 2, 1, "3-byte character, cut after its first byte"},
        {"a\xe2\x82\xac", 3, 1, "3-byte character, cut after its second byte"},
        {"a\xe2\x82\xac", 4, 4, "3-byte character ending on the cut"},
        {"\xf0\x9f\x98\x80x", 1, 0, "4-byte character, cut after 1"},
        {"\xf0\x9f\x98\x80x", 2, 0, "4-byte character, cut after 2"},
        {"\xf0\x9f\x98\x80x", 3, 0, "4-byte character, cut after 3"},
        {"\xf0\x9f\x98\x80x", 4, 4, "4-byte character ending on the cut"},
        {"\xf0\x9f\x98\x80\xf0\x9f\x98\x80", 6, 4, "two 4-byte characters, cut inside the second"},
        {"\x80\x80\x80\x80\x80", 2, 0, "not UTF-8 at all: nothing"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        size_t n = sb_utf8_cut(cases[i].s, strlen(cases[i].s), cases[i].max);
        is_int(n, cases[i].want, "cut: %s", cases[i].label);
        ok(sb_utf8_valid((const uint8_t *)cases[i].s, n) || i == sizeof(cases) / sizeof(cases[0]) - 1, "  prefix is valid UTF-8");
    }
    /* every cut of a mixed string is a valid prefix, and the longest one */
    {
        static const char mixed[] = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80z\xc3\xa9";
        size_t len = sizeof(mixed) - 1;
        int good = 1;
        for (size_t max = 0; max <= len + 1; ++max) {
            size_t n = sb_utf8_cut(mixed, len, max);
            if (n > max || !sb_utf8_valid((const uint8_t *)mixed, n))
                good = 0;
            /* the next code point would not fit: nothing longer was possible */
            if (n < len && n < max) {
                size_t next = n + 1;
                while (next < len && ((unsigned char)mixed[next] & 0xc0) == 0x80)
                    ++next;
                if (next <= max)
                    good = 0;
            }
        }
        ok(good, "every cut of a mixed string is the longest valid prefix");
    }
}

static void test_trim_tail(void)
{
    is_int(sb_utf8_trim_tail("abc", 3), 3, "trim: complete ASCII");
    is_int(sb_utf8_trim_tail("ab\xc3", 3), 2, "trim: a lone lead byte");
    is_int(sb_utf8_trim_tail("ab\xc3\xa9", 4), 4, "trim: a complete 2-byte character");
    is_int(sb_utf8_trim_tail("a\xe2\x82", 3), 1, "trim: 2 of 3 bytes");
    is_int(sb_utf8_trim_tail("a\xf0\x9f\x98", 4), 1, "trim: 3 of 4 bytes");
    is_int(sb_utf8_trim_tail("a\xf0\x9f\x98\x80", 5), 5, "trim: a complete 4-byte character");
    is_int(sb_utf8_trim_tail("", 0), 0, "trim: empty");
    is_int(sb_utf8_trim_tail("\x80\x80", 2), 0, "trim: only continuation bytes");
}

static void test_quote(void)
{
    char buf[16];
    is_str(sb_quote_printable("a\"b\xc3\xa9\n", 6, 64, buf, sizeof(buf)), "a?b???", "quote: non-printables become ?");
    is_str(sb_quote_printable("abcdef", 6, 3, buf, sizeof(buf)), "abc", "quote: at most max");
}

/* a token is exactly 64 lowercase hex digits: every other byte at every position is refused */
static void test_token_format(void)
{
    char t[66];
    int wrong = 0;
    memset(t, 'a', sizeof(t));
    memcpy(t, "0123456789abcdef", 16);
    ok(sb_is_token_format(t, 64), "64 lowercase hex digits are a token");
    ok(!sb_is_token_format(t, 63) && !sb_is_token_format(t, 65) && !sb_is_token_format(t, 0), "63, 65 and 0 bytes are not");
    for (int pos = 0; pos < 64; ++pos) {
        for (int c = 0; c < 256; ++c) {
            int hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
            char keep = t[pos];
            t[pos] = (char)c;
            if (sb_is_token_format(t, 64) != hex)
                ++wrong;
            t[pos] = keep;
        }
    }
    is_int(wrong, 0, "each of the 256 byte values at each of the 64 positions: accepted exactly when lowercase hex");
}

int main(void)
{
    test_token_format();
    test_cut();
    test_trim_tail();
    test_quote();
    return done_testing();
}
