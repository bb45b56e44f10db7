/*
 * Unit tests for proto/buf.c (sb_buf_t, sb_reader_t) and proto/mem.c (the
 * allocation helpers and their failure injection): every cap edge, overflow
 * of sizes, out-of-memory through sb_mem_fail_nth, and the reader's bounds.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>
#include "tap.h"
#include "sb/buf.h"
#include "sb/mem.h"

#define S(s) s, sizeof(s) - 1

/* 1 when the buffer's invariants hold: len <= cap, room for the NUL, NUL after the bytes */
static int sane(const sb_buf_t *b)
{
    if (b->len > b->_cap)
        return 0;
    if (b->base == NULL)
        return b->len == 0 && b->_alloc == 0;
    return b->_alloc >= b->len + 1 && b->base[b->len] == '\0';
}

static int holds(const sb_buf_t *b, const char *s, size_t n)
{
    return sane(b) && b->len == n && (n == 0 || memcmp(b->base, s, n) == 0);
}

static void test_mem(void)
{
    void *p, *q;
    char *s;
    unsigned long before;

    p = sb_mem_try_alloc(0);
    ok(p != NULL, "try_alloc(0) returns a block");
    sb_mem_free(p);
    ok(sb_mem_try_calloc(SIZE_MAX / 2, 3) == NULL, "try_calloc: n * sz overflows -> NULL");
    ok(sb_mem_try_alloc_array((SIZE_MAX >> 4) + 1, 16) == NULL, "try_alloc_array: n * sz overflows -> NULL");
    p = sb_mem_try_calloc(4, 8);
    ok(p != NULL && memcmp(p, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 32) == 0, "try_calloc zeroes");
    q = sb_mem_try_realloc_array(p, SIZE_MAX / 4, 8);
    ok(q == NULL, "try_realloc_array: overflow -> NULL");
    q = sb_mem_try_realloc_array(p, 8, 8);
    ok(q != NULL, "try_realloc_array grows the block");
    sb_mem_free(q);
    s = sb_mem_try_strndup("a\0bc", 3);
    ok(s != NULL && memcmp(s, "a\0b\0", 4) == 0, "try_strndup copies NUL bytes and terminates");
    sb_mem_free(s);
    s = sb_mem_strdup("fixed");
    is_str(s, "fixed", "sb_mem_strdup");
    sb_mem_free(s);
    s = sb_mem_try_strdup("try");
    is_str(s, "try", "sb_mem_try_strdup");
    sb_mem_free(s);
    sb_mem_fail_nth(1);
    ok(sb_mem_try_strdup("x") == NULL, "sb_mem_try_strdup is a try-allocation: fail_nth reaches it");
    sb_mem_fail_nth(0);
    /* a block a library made with the C allocator, for its caller to free() */
    s = strdup("foreign");
    ok(s != NULL, "a library's block");
    sb_mem_free_foreign(s);
    sb_mem_free_foreign(NULL); /* must not crash */
    p = sb_mem_calloc(3, 5);
    ok(p != NULL && ((char *)p)[14] == 0, "sb_mem_calloc");
    p = sb_mem_realloc(p, 100);
    ok(p != NULL, "sb_mem_realloc");
    sb_mem_free_secret(p, 100);
    sb_mem_free_secret(NULL, 10); /* must not crash */

    /* failure injection */
    before = sb_mem_try_count();
    p = sb_mem_try_alloc(10);
    is_int(sb_mem_try_count(), before + 1, "try_count counts a try-allocation");
    sb_mem_free(p);
    sb_mem_fail_nth(1);
    ok(sb_mem_try_alloc(10) == NULL, "fail_nth(1): the next try_alloc fails");
    p = sb_mem_try_alloc(10);
    ok(p != NULL, "fail_nth fails once only");
    sb_mem_free(p);
    sb_mem_fail_nth(2);
    p = sb_mem_try_alloc(10);
    ok(p != NULL, "fail_nth(2): the first succeeds");
    q = sb_mem_try_realloc(p, 1000);
    ok(q == NULL, "fail_nth(2): the second (a realloc) fails");
    ok(((char *)p)[0] == ((char *)p)[0], "failed try_realloc leaves the block usable");
    sb_mem_free(p);
    sb_mem_fail_nth(1);
    ok(sb_mem_try_calloc(1, 1) == NULL && sb_mem_try_count() != 0, "fail_nth reaches try_calloc");
    sb_mem_fail_nth(1);
    ok(sb_mem_try_strndup("x", 1) == NULL, "fail_nth reaches try_strndup");
    sb_mem_fail_nth(1);
    sb_mem_fail_nth(0);
    p = sb_mem_try_alloc(1);
    ok(p != NULL, "fail_nth(0) disarms");
    sb_mem_free(p);
    ok(sb_size_add(SIZE_MAX, 1, &(size_t){0}) == 0 && sb_size_mul(SIZE_MAX, 2, &(size_t){0}) == 0, "size helpers detect overflow");
    {
        size_t r = 7;
        ok(sb_size_mul(3, 4, &r) == 1 && r == 12 && sb_size_add(3, 4, &r) == 1 && r == 7, "size helpers compute");
    }
}

static void test_buf_caps(void)
{
    sb_buf_t b;
    char *room;

    sb_buf_init(&b, 10);
    ok(b.base == NULL && b.len == 0 && sb_buf_cap(&b) == 10 && sb_buf_room(&b) == 10, "init allocates nothing");
    is_int(sb_buf_append(&b, S("0123456789")), SB_OK, "cap 10: 10 bytes fit");
    ok(holds(&b, S("0123456789")) && b._alloc <= 11, "cap 10: holds them, NUL-terminated, storage <= cap + 1 (%zu)", b._alloc);
    is_int(sb_buf_append(&b, S("x")), SB_E_TOO_LARGE, "cap 10: the 11th byte is too large");
    is_int(sb_buf_append_char(&b, 'x'), SB_E_TOO_LARGE, "cap 10: append_char at the cap");
    is_int(sb_buf_append(&b, NULL, 0), SB_OK, "cap 10: 0 bytes at the cap are fine");
    ok(holds(&b, S("0123456789")), "cap 10: nothing changed by the refusals");
    sb_buf_reset(&b);
    is_int(sb_buf_append(&b, S("01234")), SB_OK, "5 bytes");
    is_int(sb_buf_append(&b, S("567890")), SB_E_TOO_LARGE, "5 + 6 > 10: refused whole");
    ok(holds(&b, S("01234")), "refused append left nothing behind");
    is_int(sb_buf_append(&b, "x", SIZE_MAX), SB_E_TOO_LARGE, "SIZE_MAX bytes: too large, no overflow");
    is_int(sb_buf_reserve(&b, SIZE_MAX - 2, &room), SB_E_TOO_LARGE, "reserve SIZE_MAX - 2: too large");
    sb_buf_free(&b);
    ok(b.base == NULL && b.len == 0 && b._alloc == 0 && sb_buf_cap(&b) == 10, "free: empty, cap kept");
    is_int(sb_buf_append(&b, S("again")), SB_OK, "usable after free");
    sb_buf_free(&b);

    /* cap 0 */
    sb_buf_init(&b, 0);
    is_int(sb_buf_append(&b, NULL, 0), SB_OK, "cap 0: nothing fits nothing");
    is_int(sb_buf_append_char(&b, 'a'), SB_E_TOO_LARGE, "cap 0: one byte is too large");
    ok(sane(&b) && b.len == 0, "cap 0: still empty");
    sb_buf_free(&b);

    /* a cap above the maximum is lowered; a request at the maximum + 1 is too large before allocating */
    sb_buf_init(&b, SIZE_MAX);
    is_int(sb_buf_cap(&b), SB_BUF_MAX_CAP, "cap SIZE_MAX is lowered to SB_BUF_MAX_CAP");
    is_int(sb_buf_reserve(&b, SB_BUF_MAX_CAP + 1, &room), SB_E_TOO_LARGE, "reserve SB_BUF_MAX_CAP + 1: too large");
    ok(b.base == NULL, "nothing allocated for it");
    sb_buf_free(&b);

    /* set_cap */
    sb_buf_init(&b, 100);
    is_int(sb_buf_append(&b, S("abcdef")), SB_OK, "6 bytes");
    sb_buf_set_cap(&b, 3);
    is_int(sb_buf_cap(&b), 6, "set_cap below len raises it to len");
    is_int(sb_buf_append_char(&b, 'g'), SB_E_TOO_LARGE, "and nothing more fits");
    sb_buf_set_cap(&b, 7);
    is_int(sb_buf_append_char(&b, 'g'), SB_OK, "set_cap up: one more fits");
    is_int(sb_buf_append_char(&b, 'h'), SB_E_TOO_LARGE, "but not two");
    ok(holds(&b, S("abcdefg")), "contents kept through cap changes");
    /* storage larger than a lowered cap does not let appends past the cap */
    is_int(sb_buf_reserve(&b, 0, &room), SB_OK, "reserve 0");
    sb_buf_reset(&b);
    sb_buf_set_cap(&b, 2);
    ok(b._alloc > 3, "storage (%zu) is larger than the new cap", b._alloc);
    is_int(sb_buf_append(&b, S("abc")), SB_E_TOO_LARGE, "fast path respects the lowered cap");
    is_int(sb_buf_append(&b, S("ab")), SB_OK, "up to the lowered cap");
    sb_buf_free(&b);
}

static void test_buf_growth(void)
{
    sb_buf_t b;
    int bounded = 1;
    char chunk[1000];

    memset(chunk, 'z', sizeof(chunk));
    sb_buf_init(&b, 1000000);
    is_int(sb_buf_append_char(&b, 'a'), SB_OK, "first byte");
    ok(b._alloc <= 256, "one byte: at most 256 bytes of storage (%zu)", b._alloc);
    for (int i = 0; i < 999; ++i) {
        if (sb_buf_append(&b, chunk, sizeof(chunk)) != SB_OK) {
            bounded = 0;
            break;
        }
        if (!sane(&b) || b._alloc > 2 * (b.len + 1) || b._alloc > sb_buf_cap(&b) + 1)
            bounded = 0;
    }
    ok(bounded, "growth: storage never above 2 x (len + 1), always NUL-terminated");
    is_int(b.len, 1 + 999 * 1000, "999001 bytes held");
    is_int(sb_buf_append(&b, chunk, 1000), SB_E_TOO_LARGE, "a full chunk past the 1000000 cap is refused");
    is_int(sb_buf_append(&b, chunk, 999), SB_OK, "exactly up to the cap");
    ok(sane(&b) && b.len == 1000000 && b._alloc == 1000001, "at the cap: storage is exactly cap + 1 (%zu)", b._alloc);
    sb_buf_free(&b);
}

static void test_buf_nomem(void)
{
    sb_buf_t b;
    char big[600], *out = NULL, *room;
    size_t n = 7;

    memset(big, 'q', sizeof(big));
    sb_buf_init(&b, 10000);
    sb_mem_fail_nth(1);
    is_int(sb_buf_append(&b, S("abc")), SB_E_NOMEM, "first allocation fails: NOMEM");
    ok(b.base == NULL && b.len == 0 && b._alloc == 0, "and the buffer is untouched");
    is_int(sb_buf_append(&b, S("abc")), SB_OK, "then it works");
    sb_mem_fail_nth(1);
    is_int(sb_buf_append(&b, big, sizeof(big)), SB_E_NOMEM, "growth fails: NOMEM");
    ok(holds(&b, S("abc")), "and the old contents are intact");
    sb_mem_fail_nth(1);
    is_int(sb_buf_printf(&b, "%600s", "x"), SB_E_NOMEM, "printf growth fails: NOMEM");
    ok(holds(&b, S("abc")), "printf failure leaves the contents");
    sb_mem_fail_nth(1);
    is_int(sb_buf_reserve(&b, 5000, &room), SB_E_NOMEM, "reserve growth fails: NOMEM");
    ok(holds(&b, S("abc")), "reserve failure leaves the contents");
    sb_mem_fail_nth(1);
    is_int(sb_buf_append_json_str(&b, big, sizeof(big)), SB_E_NOMEM, "json string growth fails: NOMEM");
    ok(holds(&b, S("abc")), "json string failure leaves the contents");
    sb_buf_free(&b);
    sb_mem_fail_nth(1);
    is_int(sb_buf_take(&b, &out, &n), SB_E_NOMEM, "take of a never-allocated buffer fails: NOMEM");
    ok(out == NULL && n == 7, "and hands nothing over");

    /* a secret buffer: growth allocates a fresh block (the old one is zeroed and freed) */
    sb_buf_init_secret(&b, 10000);
    is_int(sb_buf_append(&b, S("secret")), SB_OK, "secret: append");
    sb_mem_fail_nth(1);
    is_int(sb_buf_append(&b, big, sizeof(big)), SB_E_NOMEM, "secret: growth fails: NOMEM");
    ok(holds(&b, S("secret")), "secret: old contents intact");
    is_int(sb_buf_append(&b, big, sizeof(big)), SB_OK, "secret: growth");
    ok(b.len == 606 && memcmp(b.base, "secretqq", 8) == 0 && sane(&b), "secret: contents moved to the new block");
    sb_buf_free(&b);
}

static void test_buf_ops(void)
{
    sb_buf_t b;
    char *room, *out;
    size_t n;

    sb_buf_init(&b, 64);
    is_int(sb_buf_append_str(&b, "hello"), SB_OK, "append_str");
    is_int(sb_buf_append_char(&b, ' '), SB_OK, "append_char");
    is_int(sb_buf_reserve(&b, 5, &room), SB_OK, "reserve 5");
    memcpy(room, "world", 5);
    sb_buf_commit(&b, 5);
    ok(holds(&b, S("hello world")), "reserve + commit");
    is_int(sb_buf_reserve(&b, 54, &room), SB_E_TOO_LARGE, "reserve one past the cap");
    is_int(sb_buf_reserve(&b, 53, &room), SB_OK, "reserve exactly up to the cap");
    sb_buf_commit(&b, 0);
    ok(holds(&b, S("hello world")), "commit 0 changes nothing");
    sb_buf_truncate(&b, 5);
    ok(holds(&b, S("hello")), "truncate");
    sb_buf_truncate(&b, 50);
    ok(holds(&b, S("hello")), "truncate to a longer length changes nothing");
    sb_buf_consume(&b, 2);
    ok(holds(&b, S("llo")), "consume 2");
    sb_buf_consume(&b, 0);
    ok(holds(&b, S("llo")), "consume 0");
    sb_buf_consume(&b, 10);
    ok(holds(&b, "", 0) && b.base != NULL, "consume more than len empties, keeps storage");
    is_int(sb_buf_append(&b, S("a\0b")), SB_OK, "binary bytes");
    ok(holds(&b, S("a\0b")), "NUL inside is kept");
    {
        sb_view_t v = sb_buf_view(&b);
        ok(v.base == (const uint8_t *)b.base && v.len == 3, "view");
    }
    is_int(sb_buf_take(&b, &out, &n), SB_OK, "take");
    ok(n == 3 && memcmp(out, "a\0b\0", 4) == 0, "take hands over the bytes and the NUL");
    ok(b.base == NULL && b.len == 0 && b._alloc == 0 && sb_buf_cap(&b) == 64, "take leaves the buffer empty, cap kept");
    sb_mem_free(out);
    is_int(sb_buf_take(&b, &out, NULL), SB_OK, "take of an empty buffer");
    ok(out != NULL && out[0] == '\0', "yields \"\"");
    sb_mem_free(out);
    sb_buf_free(&b);

    /* secret: what is dropped is zeroed in place */
    sb_buf_init_secret(&b, 64);
    is_int(sb_buf_append(&b, S("tok-123456")), SB_OK, "secret append");
    sb_buf_truncate(&b, 4);
    ok(holds(&b, S("tok-")) && memcmp(b.base + 4, "\0\0\0\0\0\0\0", 7) == 0, "secret truncate zeroes the dropped bytes");
    is_int(sb_buf_append(&b, S("abcdef")), SB_OK, "secret append again");
    sb_buf_consume(&b, 4);
    ok(holds(&b, S("abcdef")) && memcmp(b.base + 6, "\0\0\0\0\0", 5) == 0, "secret consume zeroes the vacated tail");
    sb_buf_reset(&b);
    ok(memcmp(b.base, "\0\0\0\0\0\0\0", 7) == 0, "secret reset zeroes");
    sb_buf_free(&b);
}

static void test_buf_printf(void)
{
    sb_buf_t b;
    char want[500];

    sb_buf_init(&b, 300);
    is_int(sb_buf_printf(&b, "%d-%s", 42, "x"), SB_OK, "printf into an empty buffer");
    ok(holds(&b, S("42-x")), "printf output");
    is_int(sb_buf_printf(&b, "%280s", "y"), SB_OK, "printf that needs growth (284 bytes)");
    ok(sane(&b) && b.len == 284 && b.base[283] == 'y' && b.base[4] == ' ', "printf after growth");
    is_int(sb_buf_printf(&b, "%16s", "z"), SB_OK, "printf exactly up to the cap (300)");
    is_int(b.len, 300, "len 300");
    sb_buf_truncate(&b, 284);
    is_int(sb_buf_printf(&b, "%17s", "z"), SB_E_TOO_LARGE, "printf one byte past the cap: too large");
    ok(sane(&b) && b.len == 284 && b.base[283] == 'y', "no truncated output left behind");
    sb_buf_free(&b);
    /* a printf that needs no growth after a cut-off first try into existing storage */
    sb_buf_init(&b, 1000);
    is_int(sb_buf_append_char(&b, '<'), SB_OK, "one byte (256 bytes of storage)");
    is_int(sb_buf_printf(&b, "%400d>", 7), SB_OK, "printf larger than the storage");
    snprintf(want, sizeof(want), "<%400d>", 7);
    ok(sane(&b) && b.len == 402 && memcmp(b.base, want, 50) == 0 && b.base[401] == '>', "second attempt wrote it whole");
    sb_buf_free(&b);
    /* a format that fails (a wide character the C locale cannot encode) */
    sb_buf_init(&b, 100);
    is_int(sb_buf_append(&b, S("keep")), SB_OK, "keep");
    is_int(sb_buf_printf(&b, "%ls", L"\u00e9"), SB_E_BAD_ARGS, "printf whose conversion fails: BAD_ARGS");
    ok(holds(&b, S("keep")), "and nothing appended");
    sb_buf_free(&b);
}

/* byte-at-a-time reference of the JSON string escape (jansson's choices) */
static size_t ref_escape(const uint8_t *s, size_t n, char *out)
{
    size_t o = 0;
    out[o++] = '"';
    for (size_t i = 0; i < n; ++i) {
        uint8_t c = s[i];
        if (c == '"' || c == '\\')
            out[o++] = '\\', out[o++] = (char)c;
        else if (c == '\b')
            out[o++] = '\\', out[o++] = 'b';
        else if (c == '\f')
            out[o++] = '\\', out[o++] = 'f';
        else if (c == '\n')
            out[o++] = '\\', out[o++] = 'n';
        else if (c == '\r')
            out[o++] = '\\', out[o++] = 'r';
        else if (c == '\t')
            out[o++] = '\\', out[o++] = 't';
        else if (c < 0x20)
            o += (size_t)snprintf(out + o, 7, "\\u%04X", c);
        else
            out[o++] = (char)c;
    }
    out[o++] = '"';
    return o;
}

static void json_is(const void *in, size_t n, const char *want, const char *name)
{
    sb_buf_t b;
    sb_buf_init(&b, 1000);
    is_int(sb_buf_append_json_str(&b, in, n), SB_OK, "json str: %s", name);
    if (!ok(b.len == strlen(want) && memcmp(b.base, want, b.len) == 0, "json str: %s: output", name))
        printf("#   got %s\n#  want %s\n", b.base != NULL ? b.base : "(null)", want);
    sb_buf_free(&b);
}

static void test_json_str(void)
{
    static const struct {
        const char *in;
        size_t len;
        const char *name;
    } bad[] = {
        {S("\xff"), "byte 0xff"},
        {S("\x80"), "lone continuation"},
        {S("\xc0\xaf"), "overlong 2-byte"},
        {S("\xc1\xbf"), "overlong 2-byte (c1)"},
        {S("\xe0\x80\xaf"), "overlong 3-byte"},
        {S("\xf0\x80\x80\xaf"), "overlong 4-byte"},
        {S("\xed\xa0\x80"), "encoded high surrogate"},
        {S("\xed\xbf\xbf"), "encoded low surrogate"},
        {S("\xf4\x90\x80\x80"), "above U+10FFFF"},
        {S("\xf5\x80\x80\x80"), "lead byte f5"},
        {S("\xc3"), "truncated 2-byte"},
        {S("\xe2\x82"), "truncated 3-byte"},
        {S("abcdefgh\xe2\x82"), "truncated after an 8-byte run"},
        {S("\xc3\x28"), "bad continuation"},
    };
    sb_buf_t b;
    sb_buf_init(&b, 1000);

    json_is(S(""), "\"\"", "empty");
    json_is(S("plain"), "\"plain\"", "plain");
    json_is(S("\"\\/"), "\"\\\"\\\\/\"", "quote, backslash, slash as it is");
    json_is(S("\b\f\n\r\t"), "\"\\b\\f\\n\\r\\t\"", "short escapes");
    json_is(S("\x00\x01\x1f\x7f"), "\"\\u0000\\u0001\\u001F\x7f\"", "NUL, controls upper-case, DEL as it is");
    json_is(S("h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf \xef\xbf\xbf"),
            "\"h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf \xef\xbf\xbf\"", "UTF-8 as it is, up to U+10FFFF");
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        is_int(sb_buf_append(&b, S("pre")), SB_OK, "pre");
        is_int(sb_buf_append_json_str(&b, bad[i].in, bad[i].len), SB_E_BAD_ARGS, "json str refuses %s", bad[i].name);
        ok(holds(&b, S("pre")), "json str: %s: nothing appended", bad[i].name);
        sb_buf_reset(&b);
    }
    /* lossy: every bad byte becomes U+FFFD, good text is kept */
    is_int(sb_buf_append_json_str_lossy(&b, S("a\xff"
                                              "b\xed\xa0\x80"
                                              "c\xc3")),
           SB_OK, "lossy");
    ok(holds(&b, S("\"a\xef\xbf\xbd"
                   "b\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                   "c\xef\xbf\xbd\"")),
       "lossy: U+FFFD per bad byte");
    sb_buf_reset(&b);
    is_int(sb_buf_append_json_str_lossy(&b, S("ok \xc3\xa9\n")), SB_OK, "lossy on valid text");
    ok(holds(&b, S("\"ok \xc3\xa9\\n\"")), "lossy: valid text unchanged");
    sb_buf_reset(&b);
    /* bare text: the same replacement, no quotes, no escapes (ASCII controls, quotes, backslashes stay) */
    is_int(sb_buf_append_utf8_lossy(&b, S("a\xff"
                                          "b\xed\xa0\x80"
                                          "c\"\\\n\x01\xc3")),
           SB_OK, "utf8 lossy");
    ok(holds(&b, S("a\xef\xbf\xbd"
                   "b\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                   "c\"\\\n\x01\xef\xbf\xbd")),
       "utf8 lossy: U+FFFD per bad byte, nothing escaped");
    sb_buf_reset(&b);
    is_int(sb_buf_append_utf8_lossy(&b, S("twelve bytes \xc3\xa9\xf0\x9f\x98\x80 and more")), SB_OK, "utf8 lossy on valid text");
    ok(holds(&b, S("twelve bytes \xc3\xa9\xf0\x9f\x98\x80 and more")), "utf8 lossy: valid text unchanged");
    sb_buf_free(&b);
    sb_buf_init(&b, 4);
    is_int(sb_buf_append(&b, S("ab")), SB_OK, "a prefix");
    is_int(sb_buf_append_utf8_lossy(&b, S("c\xff")), SB_E_TOO_LARGE, "utf8 lossy: a replacement that passes the cap");
    ok(holds(&b, S("ab")), "utf8 lossy: nothing appended");
    sb_buf_free(&b);

    /* every special byte at every offset around the 8-byte runs, against the reference */
    {
        static const uint8_t specials[] = {'"', '\\', 0, 0x1f, '\n', 0x7f, 0x20, '/'};
        uint8_t in[40];
        char want[400];
        int all = 1;
        for (size_t len = 0; len <= sizeof(in) && all; ++len) {
            for (size_t pos = 0; pos < len && all; ++pos) {
                for (size_t k = 0; k < sizeof(specials) && all; ++k) {
                    size_t wn;
                    memset(in, 'a', sizeof(in));
                    in[pos] = specials[k];
                    wn = ref_escape(in, len, want);
                    sb_buf_init(&b, 1000);
                    if (sb_buf_append_json_str(&b, in, len) != SB_OK || b.len != wn || memcmp(b.base, want, wn) != 0)
                        all = 0;
                    sb_buf_free(&b);
                }
            }
        }
        ok(all, "json str agrees with a byte-at-a-time reference at every offset");
    }
    /* the cap: a string that does not fit is refused whole */
    sb_buf_init(&b, 10);
    is_int(sb_buf_append_json_str(&b, S("12345678")), SB_OK, "json str of 8 bytes fits a cap of 10");
    sb_buf_reset(&b);
    is_int(sb_buf_append_json_str(&b, S("123456789")), SB_E_TOO_LARGE, "json str of 9 bytes (11 quoted) does not");
    ok(holds(&b, "", 0), "and nothing is left");
    is_int(sb_buf_append_json_str(&b, S("1234567\n")), SB_E_TOO_LARGE, "an escape that passes the cap");
    ok(holds(&b, "", 0), "nothing is left");
    sb_buf_free(&b);
}

static void test_reader(void)
{
    static const uint8_t data[] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b};
    sb_reader_t r, saved;
    uint8_t u8 = 0;
    uint16_t u16 = 0;
    uint32_t u32 = 0;
    uint64_t u64 = 0;
    sb_view_t v = {NULL, 0};
    uint8_t copy[16];

    sb_reader_init(&r, data, sizeof(data));
    is_int(sb_reader_remaining(&r), 11, "remaining 11");
    is_int(sb_reader_u8(&r, &u8), SB_OK, "u8");
    is_int(u8, 1, "u8 value");
    is_int(sb_reader_be16(&r, &u16), SB_OK, "be16");
    is_int(u16, 0x0203, "be16 value");
    is_int(sb_reader_be32(&r, &u32), SB_OK, "be32");
    is_int(u32, 0x04050607, "be32 value");
    is_int(sb_reader_offset(&r), 7, "offset 7");
    is_int(sb_reader_be64(&r, &u64), SB_E_AGAIN, "be64 with 4 left: AGAIN");
    is_int(sb_reader_offset(&r), 7, "failed be64 did not move");
    is_int(sb_reader_be32(&r, &u32), SB_OK, "be32 of exactly the last 4");
    is_int(u32, 0x08090a0b, "be32 value");
    is_int(sb_reader_u8(&r, &u8), SB_E_AGAIN, "u8 at the end: AGAIN");
    is_int(sb_reader_peek(&r, &u8), SB_E_AGAIN, "peek at the end: AGAIN");
    is_int(sb_reader_be16(&r, &u16), SB_E_AGAIN, "be16 at the end: AGAIN");
    is_int(sb_reader_skip(&r, 1), SB_E_AGAIN, "skip 1 at the end: AGAIN");
    is_int(sb_reader_skip(&r, 0), SB_OK, "skip 0 at the end");
    is_int(sb_reader_bytes(&r, 0, &v), SB_OK, "0 bytes at the end");
    is_int(sb_reader_remaining(&r), 0, "nothing left");

    sb_reader_init(&r, data, sizeof(data));
    is_int(sb_reader_be64(&r, &u64), SB_OK, "be64");
    ok(u64 == 0x0102030405060708ull, "be64 value");
    is_int(sb_reader_be16(&r, &u16), SB_OK, "be16");
    is_int(sb_reader_be16(&r, &u16), SB_E_AGAIN, "be16 with 1 left: AGAIN");
    is_int(sb_reader_be32(&r, &u32), SB_E_AGAIN, "be32 with 1 left: AGAIN");
    is_int(sb_reader_remaining(&r), 1, "failed fetches did not move");

    sb_reader_init(&r, data, sizeof(data));
    is_int(sb_reader_peek(&r, &u8), SB_OK, "peek");
    ok(u8 == 1 && sb_reader_offset(&r) == 0, "peek does not consume");
    is_int(sb_reader_peek_at(&r, 10, &u8), SB_OK, "peek_at the last byte");
    is_int(u8, 0x0b, "peek_at value");
    is_int(sb_reader_peek_at(&r, 11, &u8), SB_E_AGAIN, "peek_at past the end: AGAIN");
    is_int(sb_reader_peek_at(&r, SIZE_MAX, &u8), SB_E_AGAIN, "peek_at SIZE_MAX: AGAIN");
    is_int(sb_reader_bytes(&r, 12, &v), SB_E_AGAIN, "bytes(remaining + 1): AGAIN");
    is_int(sb_reader_bytes(&r, SIZE_MAX, &v), SB_E_AGAIN, "bytes(SIZE_MAX): AGAIN, no pointer overflow");
    is_int(sb_reader_skip(&r, SIZE_MAX), SB_E_AGAIN, "skip(SIZE_MAX): AGAIN");
    is_int(sb_reader_copy(&r, copy, 12), SB_E_AGAIN, "copy(remaining + 1): AGAIN");
    is_int(sb_reader_offset(&r), 0, "none of them moved");
    is_int(sb_reader_peek_bytes(&r, 3, &v), SB_OK, "peek_bytes 3");
    ok(v.base == data && v.len == 3 && sb_reader_offset(&r) == 0, "peek_bytes: a view, not consumed");
    is_int(sb_reader_copy(&r, copy, 4), SB_OK, "copy 4");
    ok(memcmp(copy, data, 4) == 0 && sb_reader_offset(&r) == 4, "copy: bytes and offset");
    saved = r;
    is_int(sb_reader_bytes(&r, 7, &v), SB_OK, "bytes(exactly the rest)");
    ok(v.base == data + 4 && v.len == 7 && sb_reader_remaining(&r) == 0, "view of the rest");
    r = saved;
    is_int(sb_reader_offset(&r), 4, "a saved copy rolls back");
    ok(sb_reader_expect(&r, "\x05\x06", 2) == 1 && sb_reader_offset(&r) == 6, "expect a match consumes it");
    ok(sb_reader_expect(&r, "\x07\x09", 2) == 0 && sb_reader_offset(&r) == 6, "expect a mismatch consumes nothing");
    ok(sb_reader_expect(&r, "\x07\x08\x09\x0a\x0b\x0c", 6) == 0, "expect longer than the rest: 0");
    ok(sb_reader_expect(&r, "", 0) == 1 && sb_reader_offset(&r) == 6, "expect nothing: 1");
    v = sb_reader_rest(&r);
    ok(v.base == data + 6 && v.len == 5 && sb_reader_offset(&r) == 6, "rest: a view, not consumed");

    /* a reader over nothing */
    sb_reader_init(&r, NULL, 0);
    is_int(sb_reader_remaining(&r), 0, "empty reader: nothing left");
    is_int(sb_reader_u8(&r, &u8), SB_E_AGAIN, "empty reader: u8 AGAIN");
    is_int(sb_reader_until(&r, 'x', &v), SB_E_AGAIN, "empty reader: until AGAIN");
    is_int(sb_reader_until_seq(&r, "x", 1, &v), SB_E_AGAIN, "empty reader: until_seq AGAIN");
    is_int(sb_reader_take_charset(&r, " ", 1, &v), 0, "empty reader: take_charset 0");
    is_int(sb_reader_dec(&r, 10, &u64), SB_E_BAD_ARGS, "empty reader: dec BAD_ARGS");
}

static void test_reader_text(void)
{
    static const char text[] = "GET /x HTTP/1.1\r\nHost:  a\r\n\r\nbody";
    sb_reader_t r;
    sb_view_t v = {NULL, 0};
    uint64_t n = 0;

    sb_reader_init(&r, text, sizeof(text) - 1);
    is_int(sb_reader_until(&r, ' ', &v), SB_OK, "until ' '");
    ok(v.len == 3 && memcmp(v.base, "GET", 3) == 0 && sb_reader_offset(&r) == 3, "until: the bytes before, delimiter left");
    is_int(sb_reader_until(&r, ' ', &v), SB_OK, "until ' ' right at the delimiter");
    ok(v.len == 0 && sb_reader_offset(&r) == 3, "an empty view, nothing consumed");
    is_int(sb_reader_skip(&r, 1), SB_OK, "skip the delimiter");
    is_int(sb_reader_until_seq(&r, "\r\n", 2, &v), SB_OK, "until CRLF");
    ok(v.len == 11 && memcmp(v.base, "/x HTTP/1.1", 11) == 0, "until_seq: the line");
    ok(sb_reader_expect(&r, "\r\n", 2), "the CRLF is next");
    is_int(sb_reader_until(&r, ':', &v), SB_OK, "header name");
    ok(v.len == 4 && memcmp(v.base, "Host", 4) == 0, "Host");
    is_int(sb_reader_skip(&r, 1), SB_OK, "':'");
    is_int(sb_reader_take_charset(&r, " \t", 2, &v), 2, "take_charset: two spaces");
    ok(v.len == 2 && v.base[0] == ' ', "take_charset view");
    is_int(sb_reader_take_charset(&r, " \t", 2, NULL), 0, "take_charset: none left, NULL view is fine");
    is_int(sb_reader_until_seq(&r, "\r\n\r\n", 4, &v), SB_OK, "until the blank line");
    ok(v.len == 1 && v.base[0] == 'a', "header value");
    is_int(sb_reader_until_seq(&r, "\r\n\r\nbodyX", 9, &v), SB_E_AGAIN, "a sequence longer than the rest: AGAIN");
    is_int(sb_reader_until_seq(&r, "", 0, &v), SB_E_BAD_ARGS, "an empty sequence: BAD_ARGS");
    is_int(sb_reader_skip(&r, 4), SB_OK, "skip the blank line");
    is_int(sb_reader_until(&r, '\n', &v), SB_E_AGAIN, "no newline in the body: AGAIN");
    is_int(sb_reader_until_seq(&r, "dy", 2, &v), SB_OK, "a sequence at the very end");
    ok(v.len == 2 && memcmp(v.base, "bo", 2) == 0, "the bytes before it");

    /* numbers */
    sb_reader_init(&r, S("0042x"));
    is_int(sb_reader_dec(&r, 100, &n), SB_OK, "dec with leading zeros");
    ok(n == 42 && sb_reader_offset(&r) == 4, "42, the digits consumed");
    is_int(sb_reader_dec(&r, 100, &n), SB_E_BAD_ARGS, "dec at a non-digit: BAD_ARGS");
    sb_reader_init(&r, S("101"));
    is_int(sb_reader_dec(&r, 100, &n), SB_E_TOO_LARGE, "dec above max: TOO_LARGE");
    is_int(sb_reader_offset(&r), 0, "nothing consumed");
    is_int(sb_reader_dec(&r, 101, &n), SB_OK, "dec equal to max");
    sb_reader_init(&r, S("7"));
    is_int(sb_reader_dec(&r, 0, &n), SB_E_TOO_LARGE, "dec 7 with max 0: TOO_LARGE");
    sb_reader_init(&r, S("18446744073709551615"));
    is_int(sb_reader_dec(&r, UINT64_MAX, &n), SB_OK, "dec UINT64_MAX");
    ok(n == UINT64_MAX, "UINT64_MAX value");
    sb_reader_init(&r, S("18446744073709551616"));
    is_int(sb_reader_dec(&r, UINT64_MAX, &n), SB_E_TOO_LARGE, "dec UINT64_MAX + 1: TOO_LARGE, no wrap");
    sb_reader_init(&r, S("99999999999999999999999"));
    is_int(sb_reader_dec(&r, UINT64_MAX, &n), SB_E_TOO_LARGE, "dec of 23 nines: TOO_LARGE");
    sb_reader_init(&r, S("fFa0;"));
    is_int(sb_reader_hex(&r, 0xffffffff, &n), SB_OK, "hex of either case");
    ok(n == 0xffa0 && sb_reader_offset(&r) == 4, "0xffa0");
    sb_reader_init(&r, S("10000000000000000"));
    is_int(sb_reader_hex(&r, UINT64_MAX, &n), SB_E_TOO_LARGE, "hex of 17 digits: TOO_LARGE");
    sb_reader_init(&r, S("g"));
    is_int(sb_reader_hex(&r, 100, &n), SB_E_BAD_ARGS, "hex at a non-digit: BAD_ARGS");
}

/*
 * Views never reach outside the reader's bytes: the reader runs over an
 * exact-size heap copy, so under ASan any read past its end is an error.
 */
static void test_reader_exact_heap(void)
{
    uint8_t *p = malloc(3);
    sb_reader_t r;
    sb_view_t v;
    uint32_t u32;
    uint8_t u8;
    int fine = 1;

    if (p == NULL)
        abort();
    memcpy(p, "a\nb", 3);
    sb_reader_init(&r, p, 3);
    fine &= sb_reader_be32(&r, &u32) == SB_E_AGAIN;
    fine &= sb_reader_until_seq(&r, "b\n", 2, &v) == SB_E_AGAIN;
    fine &= sb_reader_until(&r, '\n', &v) == SB_OK && v.len == 1;
    fine &= sb_reader_skip(&r, 1) == SB_OK;
    fine &= sb_reader_until(&r, '\n', &v) == SB_E_AGAIN;
    fine &= sb_reader_take_charset(&r, "b", 1, &v) == 1;
    fine &= sb_reader_u8(&r, &u8) == SB_E_AGAIN;
    ok(fine, "every fetch stays inside an exact-size heap block");
    free(p);
}

int main(void)
{
    test_mem();
    test_buf_caps();
    test_buf_growth();
    test_buf_nomem();
    test_buf_ops();
    test_buf_printf();
    test_json_str();
    test_reader();
    test_reader_text();
    test_reader_exact_heap();
    return done_testing();
}
