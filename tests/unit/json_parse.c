/*
 * Unit tests for proto/json_parse.c (sb_json_parse): every rule with the
 * exact refusal it gets, the caps (checked before the zone grows), numbers,
 * strings, out-of-memory through sb_mem_fail_nth, and agreement with the old
 * jansson route (tests/json_ref.h: sb_ref_json_decode + unpack) on every document the JSON tests
 * and the fuzz corpus hold: the same verdict, and the same tree.
 */
#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <msgpack.h>
#include "tap.h"
#include "json_cases.h"
#include "json_ref.h"
#include "sb/limits.h"
#include "sb/mem.h"
#include "sb/value.h"

#define S(s) s, sizeof(s) - 1

/* a printable name for a document */
static const char *name_of(const char *t, size_t len)
{
    static char name[72];
    size_t k;
    for (k = 0; k < len && k + 1 < sizeof(name); ++k)
        name[k] = t[k] >= 0x20 && t[k] < 0x7f ? t[k] : '.';
    name[k] = '\0';
    return name;
}

/* the old route: jansson, packed, unpacked */
static sb_status_t old_route(const char *t, size_t len, msgpack_sbuffer *sb, msgpack_zone *z, msgpack_object *o)
{
    const char *why;
    sb_status_t st = sb_ref_json_decode(t, len, sb, &why);
    if (st != SB_OK)
        return st;
    return sb_mp_decode_packed((const uint8_t *)sb->data, sb->size, z, o);
}

/* 1 when the new route and the old one agree on `t`: both refuse, or both accept the same tree */
static int agrees(const char *t, size_t len, sb_status_t *new_st, const char **new_why)
{
    msgpack_sbuffer sb;
    msgpack_zone z1, z2;
    msgpack_object a, b;
    sb_status_t so, sn;
    int same;

    msgpack_sbuffer_init(&sb);
    msgpack_zone_init(&z1, 1024);
    msgpack_zone_init(&z2, 1024);
    *new_why = NULL;
    so = old_route(t, len, &sb, &z1, &a);
    sn = sb_json_parse(t, len, &z2, &b, new_why);
    same = so == SB_OK ? sn == SB_OK && mp_same(&a, &b) : sn != SB_OK;
    *new_st = sn;
    msgpack_zone_destroy(&z1);
    msgpack_zone_destroy(&z2);
    msgpack_sbuffer_destroy(&sb);
    return same;
}

static void test_cases_agree(void)
{
    for (size_t i = 0; i < sizeof(json_valid) / sizeof(json_valid[0]); ++i) {
        sb_status_t st;
        const char *why;
        int same = agrees(json_valid[i].text, json_valid[i].len, &st, &why);
        ok(same && st == SB_OK, "valid: %s: accepted, same tree as the old route", name_of(json_valid[i].text, json_valid[i].len));
        if (st != SB_OK)
            printf("#   status %d why %s\n", (int)st, why);
    }
    for (size_t i = 0; i < sizeof(json_invalid) / sizeof(json_invalid[0]); ++i) {
        sb_status_t st;
        const char *why;
        int same = agrees(json_invalid[i].text, json_invalid[i].len, &st, &why);
        ok(same, "invalid: %s: both routes refuse", name_of(json_invalid[i].text, json_invalid[i].len));
        is_int(st, SB_E_BAD_ARGS, "invalid: %s: bad_args", name_of(json_invalid[i].text, json_invalid[i].len));
        is_str(why, json_invalid[i].why, "invalid: %s: why", name_of(json_invalid[i].text, json_invalid[i].len));
    }
}

/* every seed of the JSON fuzzer: the same verdict and tree as the old route (but for a raw NUL, see test_raw_nul) */
static void test_corpus_agrees(void)
{
    static const char dir[] = SB_SOURCE_DIR "/fuzz/corpus/json";
    DIR *d = opendir(dir);
    struct dirent *e;
    size_t files = 0, differ = 0;

    if (!ok(d != NULL, "corpus directory %s opens", dir))
        return;
    while ((e = readdir(d)) != NULL) {
        char path[4096], *buf;
        FILE *f;
        long n;
        sb_status_t st;
        const char *why;
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if ((f = fopen(path, "rb")) == NULL)
            continue;
        fseek(f, 0, SEEK_END);
        n = ftell(f);
        fseek(f, 0, SEEK_SET);
        buf = malloc((size_t)n + 1);
        if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n)
            abort();
        fclose(f);
        ++files;
        if (n != 0 && memchr(buf, 0, (size_t)n) != NULL) {
            /* the one place the old route was wrong (test_raw_nul): a raw NUL is refused, whatever jansson said */
            msgpack_zone z;
            msgpack_object o;
            msgpack_zone_init(&z, 1024);
            if (sb_json_parse(buf, (size_t)n, &z, &o, &why) == SB_OK) {
                ++differ;
                printf("#   %s: a raw NUL accepted\n", e->d_name);
            }
            msgpack_zone_destroy(&z);
        } else if (!agrees(buf, (size_t)n, &st, &why)) {
            ++differ;
            printf("#   %s: the routes differ (new: %d %s)\n", e->d_name, (int)st, why ? why : "");
        }
        free(buf);
    }
    closedir(d);
    ok(files >= 10, "corpus: %zu seeds read", files);
    is_int(differ, 0, "corpus: every seed gets the same verdict and tree from both routes");
}

static sb_status_t parse(const char *t, size_t len, msgpack_zone *z, msgpack_object *o, const char **why)
{
    *why = NULL;
    return sb_json_parse(t, len, z, o, why);
}

static void test_numbers(void)
{
    msgpack_zone z;
    msgpack_object o;
    const char *why;

    msgpack_zone_init(&z, 1024);
    is_int(parse(S("-0"), &z, &o, &why), SB_OK, "-0");
    ok(o.type == MSGPACK_OBJECT_POSITIVE_INTEGER && o.via.u64 == 0, "-0 is the integer 0 (as jansson)");
    is_int(parse(S("9223372036854775807"), &z, &o, &why), SB_OK, "INT64_MAX");
    ok(o.type == MSGPACK_OBJECT_POSITIVE_INTEGER && o.via.u64 == INT64_MAX, "INT64_MAX is a positive integer");
    is_int(parse(S("-9223372036854775808"), &z, &o, &why), SB_OK, "INT64_MIN");
    ok(o.type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o.via.i64 == INT64_MIN, "INT64_MIN is a negative integer");
    is_int(parse(S("-1"), &z, &o, &why), SB_OK, "-1");
    ok(o.type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o.via.i64 == -1, "-1 is a negative integer");
    is_int(parse(S("-0.0"), &z, &o, &why), SB_OK, "-0.0");
    ok(o.type == MSGPACK_OBJECT_FLOAT64 && o.via.f64 == 0 && signbit(o.via.f64), "-0.0 is a float64 with its sign");
    is_int(parse(S("1.0"), &z, &o, &why), SB_OK, "1.0");
    ok(o.type == MSGPACK_OBJECT_FLOAT64 && o.via.f64 == 1.0, "1.0 is a float64, not an integer");
    is_int(parse(S("1e2"), &z, &o, &why), SB_OK, "1e2");
    ok(o.type == MSGPACK_OBJECT_FLOAT64 && o.via.f64 == 100.0, "1e2 is a float64");
    is_int(parse(S("1e-400"), &z, &o, &why), SB_OK, "1e-400 underflows");
    ok(o.type == MSGPACK_OBJECT_FLOAT64 && o.via.f64 == 0, "to 0 (as strtod and jansson)");
    is_int(parse(S("4.9406564584124654e-324"), &z, &o, &why), SB_OK, "the smallest subnormal");
    ok(o.via.f64 == 5e-324, "is kept");
    is_int(parse(S("1.7976931348623157e308"), &z, &o, &why), SB_OK, "DBL_MAX");
    ok(o.via.f64 == DBL_MAX, "DBL_MAX is kept");
    is_int(parse(S("1.7976931348623159e308"), &z, &o, &why), SB_E_BAD_ARGS, "just above DBL_MAX rounds to infinity: refused");
    is_str(why, "JSON number out of range", "why");
    is_int(parse(S("1e99999999999999999999"), &z, &o, &why), SB_E_BAD_ARGS, "a huge exponent: refused");
    is_int(parse(S("1e-99999999999999999999"), &z, &o, &why), SB_OK, "a huge negative exponent: 0");
    ok(o.via.f64 == 0, "0");
    msgpack_zone_destroy(&z);
}

/*
 * Every float token gets exactly strtod's double: the fast path (Clinger's)
 * must never round differently from the slow one. Random mantissas of up to
 * 20 digits with exponents from -40 to 40, plus decimal point positions.
 */
static void test_floats_match_strtod(void)
{
    msgpack_zone z;
    uint64_t s = 0x9e3779b97f4a7c15u;
    size_t differ = 0, n = 200000;

    msgpack_zone_init(&z, 4096);
    for (size_t i = 0; i < n; ++i) {
        char t[64];
        msgpack_object o;
        const char *why;
        size_t k = 0;
        int digits, point, exp, dot = 0;
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        digits = 1 + (int)(s % 20);
        point = (int)((s >> 8) % (uint64_t)(digits + 1));
        exp = (int)((s >> 16) % 81) - 40;
        if ((s >> 30) & 1)
            t[k++] = '-';
        for (int d = 0; d < digits; ++d) {
            uint64_t v = (s >> (d * 3 % 60)) % 10;
            if (d == 0 && v == 0 && digits > 1 && point != 1)
                v = 1;
            t[k++] = (char)('0' + v);
            if (d + 1 == point && d + 1 < digits)
                t[k++] = '.', dot = 1;
        }
        if (((s >> 40) & 3) != 0)
            k += (size_t)snprintf(t + k, sizeof(t) - k, "e%d", exp);
        else if (!dot)
            k += (size_t)snprintf(t + k, sizeof(t) - k, ".5");
        t[k] = '\0';
        /* leading zeros are not JSON: skip them (the generator makes few) */
        if ((t[0] == '0' || (t[0] == '-' && t[1] == '0')) && t[t[0] == '-' ? 2 : 1] >= '0' && t[t[0] == '-' ? 2 : 1] <= '9')
            continue;
        if (sb_json_parse(t, k, &z, &o, &why) != SB_OK) {
            ++differ;
            printf("#   refused %s (%s)\n", t, why);
            continue;
        }
        {
            double want = strtod(t, NULL);
            double got = o.type == MSGPACK_OBJECT_FLOAT64            ? o.via.f64
                         : o.type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? (double)o.via.i64
                                                                     : (double)o.via.u64;
            if (o.type == MSGPACK_OBJECT_FLOAT64 && memcmp(&want, &got, sizeof(got)) != 0) {
                if (differ++ < 5)
                    printf("#   %s: got %.17g want %.17g\n", t, got, want);
            }
        }
    }
    msgpack_zone_destroy(&z);
    is_int(differ, 0, "%zu random float tokens: exactly strtod's double", n);
}

static void test_strings(void)
{
    static const char text[] = "[\"plain\",\"\",\"esc\\n\\u00e9\\ud83d\\ude00\",\"a\\u0000b\",\"\x7f/\"]";
    msgpack_zone z;
    msgpack_object o;
    const char *why;

    msgpack_zone_init(&z, 1024);
    is_int(parse(S(text), &z, &o, &why), SB_OK, "strings");
    if (o.type == MSGPACK_OBJECT_ARRAY && o.via.array.size == 5) {
        const msgpack_object *e = o.via.array.ptr;
        ok(e[0].via.str.size == 5 && e[0].via.str.ptr == text + 2, "a string without escapes points into the text");
        ok(e[1].via.str.size == 0 && e[1].via.str.ptr != NULL, "an empty string has a valid pointer");
        ok(e[2].via.str.size == 10 && memcmp(e[2].via.str.ptr, "esc\n\xc3\xa9\xf0\x9f\x98\x80", 10) == 0,
           "escapes decoded to UTF-8");
        ok(e[2].via.str.ptr < text || e[2].via.str.ptr >= text + sizeof(text), "an escaped string is a copy in the zone");
        ok(e[3].via.str.size == 3 && memcmp(e[3].via.str.ptr, "a\0b", 3) == 0, "\\u0000 inside a value");
        ok(e[4].via.str.size == 2 && memcmp(e[4].via.str.ptr, "\x7f/", 2) == 0, "DEL and '/' raw");
    } else {
        ok(0, "strings: an array of 5");
    }
    is_int(parse(S("{\"\":1}"), &z, &o, &why), SB_OK, "an empty key");
    ok(o.via.map.size == 1 && o.via.map.ptr[0].key.via.str.size == 0 && o.via.map.ptr[0].key.via.str.ptr != NULL,
       "an empty key has a valid pointer");
    is_int(parse(S("{\"b\":1,\"a\":2,\"c\":3}"), &z, &o, &why), SB_OK, "key order");
    ok(o.via.map.size == 3 && o.via.map.ptr[0].key.via.str.ptr[0] == 'b' && o.via.map.ptr[2].key.via.str.ptr[0] == 'c' &&
           o.via.map.ptr[1].val.via.u64 == 2,
       "map pairs keep the text's order");
    msgpack_zone_destroy(&z);
}

static void nested(char *buf, size_t *n, int depth)
{
    *n = 0;
    for (int i = 0; i < depth; ++i)
        buf[(*n)++] = '[';
    for (int i = 0; i < depth; ++i)
        buf[(*n)++] = ']';
}

/* "[0,0,...]" with n zeros */
static char *zeros(size_t n, size_t *len)
{
    char *t = malloc(2 * n + 2);
    size_t k = 0;

    if (t == NULL)
        abort();
    t[k++] = '[';
    for (size_t i = 0; i < n; ++i) {
        if (i != 0)
            t[k++] = ',';
        t[k++] = '0';
    }
    t[k++] = ']';
    *len = k;
    return t;
}

static void test_caps(void)
{
    msgpack_zone z;
    msgpack_object o;
    const char *why;
    char buf[300];
    size_t n;
    char *t;

    msgpack_zone_init(&z, 1024);
    nested(buf, &n, 31);
    is_int(parse(buf, n, &z, &o, &why), SB_OK, "31 nested arrays accepted");
    nested(buf, &n, 32);
    is_int(parse(buf, n, &z, &o, &why), SB_E_TOO_LARGE, "32 nested arrays: too large");
    is_str(why, "value nesting is too deep", "why");
    memset(buf, '[', 40);
    is_int(parse(buf, 40, &z, &o, &why), SB_E_TOO_LARGE, "40 unclosed '[': too large (the cap is met before the end)");
    n = 0;
    for (int i = 0; i < 31; ++i) {
        memcpy(buf + n, "{\"a\":", 5);
        n += 5;
    }
    buf[n++] = '1';
    memset(buf + n, '}', 31);
    n += 31;
    is_int(parse(buf, n, &z, &o, &why), SB_OK, "31 nested objects accepted");
    memmove(buf + 5, buf, n);
    memcpy(buf, "{\"a\":", 5);
    buf[n + 5] = '}';
    is_int(parse(buf, n + 6, &z, &o, &why), SB_E_TOO_LARGE, "32 nested objects: too large");
    msgpack_zone_destroy(&z);

    /* nodes: 1 + 99999 = 100000 accepted, one more refused, and the zone has not grown for it */
    msgpack_zone_init(&z, 1024);
    t = zeros(SB_MAX_NODES - 1, &n);
    is_int(parse(t, n, &z, &o, &why), SB_OK, "array of 99999 zeros (100000 nodes) accepted");
    ok(o.via.array.size == SB_MAX_NODES - 1, "all of them");
    free(t);
    msgpack_zone_destroy(&z);
    msgpack_zone_init(&z, 1024);
    t = zeros(SB_MAX_NODES, &n);
    {
        char *ptr_before = z.chunk_list.ptr;
        size_t free_before = z.chunk_list.free;
        unsigned long allocs = sb_mem_try_count();
        is_int(parse(t, n, &z, &o, &why), SB_E_TOO_LARGE, "array of 100000 zeros (100001 nodes): too large");
        is_str(why, "value has too many nodes", "why");
        ok(z.chunk_list.ptr == ptr_before && z.chunk_list.free == free_before, "refused before the zone grew at all");
        ok(sb_mem_try_count() - allocs <= 20, "scratch stack grew by doubling only (%lu allocations)", sb_mem_try_count() - allocs);
    }
    free(t);
    msgpack_zone_destroy(&z);

    /*
     * Nodes are values, counted as sb_mp_check counts them. The old route's
     * pre-scan counted 1 + commas + containers, one too many for every empty
     * container, so it refused 50000 empty arrays (50001 values); both the
     * msgpack route and this decoder accept that tree.
     */
    msgpack_zone_init(&z, 1024);
    t = malloc(50000 * 3 + 2);
    if (t == NULL)
        abort();
    n = 0;
    t[n++] = '[';
    for (int i = 0; i < 50000; ++i) {
        if (i != 0)
            t[n++] = ',';
        t[n++] = '[', t[n++] = ']';
    }
    t[n++] = ']';
    is_int(parse(t, n, &z, &o, &why), SB_OK, "50000 empty arrays (50001 values) accepted");
    {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        size_t obj_len;
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        sb_mp_pack_object(&pk, &o);
        is_int(sb_mp_check((const uint8_t *)sb.data, sb.size, &obj_len, &why), SB_OK,
               "and the msgpack route accepts the same tree");
        msgpack_sbuffer_destroy(&sb);
    }
    free(t);
    msgpack_zone_destroy(&z);
}

/*
 * Where the old route was wrong: jansson 2.14 drops a raw NUL byte right
 * after a number or a literal, so it took "[1\0]" for [1]. RFC 8259 allows no
 * raw NUL anywhere (inside a string it is a control character).
 */
static void test_raw_nul(void)
{
    static const json_case_t t[] = {JC("[1\0]"), JC("1\0"), JC("[true\0]"), JC("{\"a\":null\0}"), JC("[-1\0,2]")};
    msgpack_sbuffer sb;
    msgpack_zone z;
    msgpack_object o;
    const char *why;

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); ++i) {
        msgpack_sbuffer_init(&sb);
        msgpack_zone_init(&z, 1024);
        is_int(old_route(t[i].text, t[i].len, &sb, &z, &o), SB_OK, "raw NUL case %zu: the old route accepted it", i);
        is_int(parse(t[i].text, t[i].len, &z, &o, &why), SB_E_BAD_ARGS, "raw NUL case %zu: refused", i);
        is_str(why, i == 1 ? "trailing bytes after the JSON value" : "invalid JSON", "raw NUL case %zu: why", i);
        msgpack_zone_destroy(&z);
        msgpack_sbuffer_destroy(&sb);
    }
}

/* every allocation of a parse failed in turn: NOMEM (or success), never a crash or a leak */
static void torture(const char *t, size_t len, const char *name)
{
    unsigned long before, count;
    msgpack_zone z;
    msgpack_object o;
    const char *why;
    int fine = 1;

    msgpack_zone_init(&z, 1024);
    before = sb_mem_try_count();
    is_int(parse(t, len, &z, &o, &why), SB_OK, "torture %s: parses", name);
    count = sb_mem_try_count() - before;
    msgpack_zone_destroy(&z);
    ok(count >= 1, "torture %s: makes %lu try-allocations", name, count);
    for (unsigned long i = 1; i <= count; ++i) {
        sb_status_t st;
        msgpack_zone_init(&z, 1024);
        sb_mem_fail_nth(i);
        st = parse(t, len, &z, &o, &why);
        sb_mem_fail_nth(0);
        if (st != SB_E_NOMEM || strcmp(why, "out of memory") != 0)
            fine = 0;
        msgpack_zone_destroy(&z);
    }
    ok(fine, "torture %s: each failed allocation is NOMEM, \"out of memory\"", name);
}

static void test_nomem(void)
{
    char *t, big[200];
    size_t n, k = 0;

    /* the scratch stack leaves the parser for the heap after 64 pending values */
    t = zeros(200, &n);
    torture(t, n, "200 zeros");
    free(t);
    /* an object of 17 keys is checked for duplicates by sorting */
    torture(
        S("{\"a\":1,\"b\":2,\"c\":3,\"d\":4,\"e\":5,\"f\":6,\"g\":7,\"h\":8,\"i\":9,\"j\":10,\"k\":11,\"l\":12,\"m\":13,\"n\":14,"
          "\"o\":15,\"p\":16,\"q\":17}"),
        "17 keys");
    /* a number token of more than 64 bytes is copied to the heap for strtod */
    big[k++] = '1', big[k++] = '.';
    memset(big + k, '3', 100);
    k += 100;
    torture(big, k, "a 102-byte number");
}

int main(void)
{
    test_cases_agree();
    test_corpus_agrees();
    test_numbers();
    test_floats_match_strtod();
    test_strings();
    test_caps();
    test_raw_nul();
    test_nomem();
    return done_testing();
}
