/*
 * Unit tests for proto/json_write.c (sb_json_write): byte-for-byte agreement
 * with the old jansson route (sb_json_from_mp + json_dumps with JSON_COMPACT
 * | JSON_ENCODE_ANY) on numbers, strings, bin, containers and maps that
 * repeat keys; every refusal with its reason; the buffer's cap enforced as
 * the text is written; out-of-memory; and parse -> write -> parse identity.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <msgpack.h>
#include "tap.h"
#include "json_cases.h"
#include "sb/buf.h"
#include "sb/limits.h"
#include "sb/mem.h"
#include "sb/value.h"

#define S(s) s, sizeof(s) - 1

/* what the old route printed for `o`, or NULL when it refused */
static char *old_text(const msgpack_object *o)
{
    json_t *j = NULL;
    char *t;
    if (sb_json_from_mp(o, &j) != SB_OK)
        return NULL;
    t = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(j);
    return t;
}

/* packs with `fill`, unpacks, and compares the two writers */
static void same_as_old(const char *name, const char *packed, size_t len)
{
    msgpack_zone z;
    msgpack_object o;
    sb_buf_t b;
    const char *why = NULL;
    char *want;
    sb_status_t st;

    msgpack_zone_init(&z, 1024);
    if (!ok(sb_mp_decode_packed((const uint8_t *)packed, len, &z, &o) == SB_OK, "%s: unpacks", name)) {
        msgpack_zone_destroy(&z);
        return;
    }
    want = old_text(&o);
    sb_buf_init(&b, SB_MAX_RPC_WIRE);
    st = sb_json_write(&b, &o, &why);
    if (want == NULL) {
        ok(st == SB_E_BAD_ARGS, "%s: refused by both (%s)", name, why ? why : "");
    } else if (!ok(st == SB_OK && b.len == strlen(want) && memcmp(b.base, want, b.len) == 0, "%s: same text as jansson", name)) {
        printf("#   got  %s (%d %s)\n#   want %s\n", b.base ? b.base : "(null)", (int)st, why ? why : "", want);
    }
    free(want);
    sb_buf_free(&b);
    msgpack_zone_destroy(&z);
}

static void test_scalars(void)
{
    static const double reals[] = {0.1,
                                   1.0,
                                   -0.0,
                                   1e300,
                                   1e-300,
                                   5e-324,
                                   1.5,
                                   123456789012345678.0,
                                   1e21,
                                   1e16,
                                   1e15,
                                   1e17,
                                   0.3,
                                   1e-7,
                                   2.5e-5,
                                   100.0,
                                   1e100,
                                   1e-10,
                                   -1.7976931348623157e308,
                                   2.2250738585072014e-308,
                                   3.14159,
                                   0.30000000000000004,
                                   4503599627370496.5,
                                   9007199254740993.0,
                                   1e-5,
                                   12345.678,
                                   -2.0,
                                   1e22,
                                   1e23};
    static const int64_t ints[] = {
        0,         1,         -1,           127,    128,    -32,       -33,       255,
        256,       65535,     65536,        -32768, -32769, INT32_MAX, INT32_MIN, (int64_t)UINT32_MAX + 1,
        INT64_MAX, INT64_MIN, INT64_MIN + 1};
    msgpack_sbuffer sb;
    msgpack_packer pk;
    char name[64];

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    for (size_t i = 0; i < sizeof(reals) / sizeof(reals[0]); ++i) {
        msgpack_sbuffer_clear(&sb);
        msgpack_pack_double(&pk, reals[i]);
        snprintf(name, sizeof(name), "float64 %.17g", reals[i]);
        same_as_old(name, sb.data, sb.size);
        msgpack_sbuffer_clear(&sb);
        msgpack_pack_float(&pk, (float)reals[i]);
        if (isfinite((float)reals[i])) {
            snprintf(name, sizeof(name), "float32 %.9g", (double)(float)reals[i]);
            same_as_old(name, sb.data, sb.size);
        }
    }
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); ++i) {
        msgpack_sbuffer_clear(&sb);
        msgpack_pack_int64(&pk, ints[i]);
        snprintf(name, sizeof(name), "int %lld", (long long)ints[i]);
        same_as_old(name, sb.data, sb.size);
    }
    msgpack_sbuffer_clear(&sb);
    msgpack_pack_uint64(&pk, (uint64_t)INT64_MAX + 1);
    same_as_old("uint64 INT64_MAX + 1 (refused)", sb.data, sb.size);
    msgpack_sbuffer_clear(&sb);
    msgpack_pack_uint64(&pk, UINT64_MAX);
    same_as_old("uint64 UINT64_MAX (refused)", sb.data, sb.size);
    msgpack_sbuffer_clear(&sb);
    msgpack_pack_nil(&pk);
    msgpack_pack_true(&pk);
    same_as_old("nil", sb.data, 1);
    same_as_old("true", sb.data + 1, 1);
    same_as_old("false", "\xc2", 1);
    same_as_old("str with escapes and UTF-8", S("\xb4"
                                                "a\"\\/\b\f\n\r\t\x01\x1f\x7f\xc3\xa9\xf0\x9f\x98\x80\x00z"));
    same_as_old("empty str", S("\xa0"));
    same_as_old("bin", S("\xc4\x04\x00\x01\x02\xff"));
    same_as_old("empty bin", S("\xc4\x00"));
    same_as_old("bin of 5", S("\xc4\x05hello"));
    msgpack_sbuffer_destroy(&sb);
}

static void test_containers(void)
{
    same_as_old("empty array", S("\x90"));
    same_as_old("empty map", S("\x80"));
    same_as_old("nested", S("\x82\xa1"
                            "a\x93\x01\xc0\x91\x80\xa1"
                            "b\x81\xa0\xc3"));
    same_as_old("map with a repeated key: first position, last value", S("\x83\xa1"
                                                                         "a\x01\xa1"
                                                                         "b\x02\xa1"
                                                                         "a\x03"));
    same_as_old("map with a key three times", S("\x84\xa1"
                                                "k\x01\xa1"
                                                "x\x02\xa1"
                                                "k\x03\xa1"
                                                "k\x04"));
    same_as_old("map with two repeated keys", S("\x84\xa1"
                                                "a\x01\xa1"
                                                "b\x02\xa1"
                                                "b\x03\xa1"
                                                "a\x04"));
    same_as_old("map with an empty key twice", S("\x82\xa0\x01\xa0\x02"));
    same_as_old("repeated key whose first value is an ext (refused by both)", S("\x82\xa1"
                                                                                "a\xd4\x01\x00\xa1"
                                                                                "a\x01"));
    same_as_old("repeated key whose first value is NaN (refused by both)", S("\x82\xa1"
                                                                             "a\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00\xa1"
                                                                             "a\x01"));
    /* 20 keys (the sorting path), with and without repeats */
    {
        char m[3 + 20 * 3], n2[3 + 20 * 3];
        size_t k = 0, k2 = 0;
        m[k++] = (char)0xde, m[k++] = 0, m[k++] = 20;
        n2[k2++] = (char)0xde, n2[k2++] = 0, n2[k2++] = 20;
        for (int i = 0; i < 20; ++i) {
            m[k++] = (char)0xa1, m[k++] = (char)('a' + i), m[k++] = (char)i;
            n2[k2++] = (char)0xa1, n2[k2++] = (char)('a' + i % 7), n2[k2++] = (char)i;
        }
        same_as_old("20 distinct keys", m, k);
        same_as_old("20 keys, 7 distinct", n2, k2);
        n2[3 + 5 * 3 + 2] = (char)0xc0; /* a value that a later one replaces becomes nil */
        same_as_old("20 keys, 7 distinct, a replaced nil", n2, k2);
    }
}

static void test_refusals(void)
{
    static const struct {
        const char *bytes;
        size_t len;
        const char *why;
        const char *name;
    } t[] = {
        {S("\xd4\x01\x00"), "msgpack ext has no JSON form", "ext"},
        {S("\x91\xd4\x01\x00"), "msgpack ext has no JSON form", "ext in an array"},
        {S("\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00"), "non-finite float", "NaN"},
        {S("\xca\xff\x80\x00\x00"), "non-finite float", "float32 -inf"},
        {S("\xcf\x80\x00\x00\x00\x00\x00\x00\x00"), "integer above INT64_MAX", "uint64 above INT64_MAX"},
        {S("\x81\x01\x01"), "map key is not a string", "int key"},
        {S("\x81\xc4\x01"
           "a\x01"),
         "map key is not a string", "bin key"},
        {S("\x81\xa1\x00\x01"), "map key holds NUL", "key holding NUL"},
        {S("\x81\xa1\xff\x01"), "string is not valid UTF-8", "key with invalid UTF-8"},
        {S("\xa2\xed\xa0"), "string is not valid UTF-8", "str with invalid UTF-8"},
        {S("\xa3\xed\xa0\x80"), "string is not valid UTF-8", "encoded surrogate"},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); ++i) {
        msgpack_zone z;
        msgpack_object o;
        sb_buf_t b;
        const char *why = NULL;
        msgpack_zone_init(&z, 1024);
        sb_buf_init(&b, 1000);
        is_int(sb_buf_append(&b, S("pre")), SB_OK, "pre");
        if (sb_mp_decode_packed((const uint8_t *)t[i].bytes, t[i].len, &z, &o) == SB_OK) {
            is_int(sb_json_write(&b, &o, &why), SB_E_BAD_ARGS, "refused: %s", t[i].name);
            is_str(why, t[i].why, "refused: %s: why", t[i].name);
            ok(b.len == 3 && memcmp(b.base, "pre", 4) == 0, "refused: %s: the buffer is as it was", t[i].name);
        } else {
            ok(0, "%s: unpacks", t[i].name);
        }
        sb_buf_free(&b);
        msgpack_zone_destroy(&z);
    }
    /* depth: a scalar under 32 containers is too deep, 32 nested arrays with nothing inside are not */
    {
        sb_buf_t b;
        const char *why = NULL;
        sb_buf_init(&b, 1000);
        /* msgpack-c's own unpack stack stops at 32 containers: the tree is built by hand */
        {
            msgpack_object nodes[33];
            for (int i = 0; i < 32; ++i) {
                nodes[i].type = MSGPACK_OBJECT_ARRAY;
                nodes[i].via.array.size = 1;
                nodes[i].via.array.ptr = &nodes[i + 1];
            }
            nodes[32].type = MSGPACK_OBJECT_POSITIVE_INTEGER;
            nodes[32].via.u64 = 1;
            is_int(sb_json_write(&b, &nodes[0], &why), SB_E_BAD_ARGS, "a scalar under 32 containers: refused");
            is_str(why, "value nesting is too deep", "why");
            nodes[31].via.array.size = 0;
            is_int(sb_json_write(&b, &nodes[0], &why), SB_OK, "32 nested arrays, the innermost empty: written");
            is_int(b.len, 64, "as 64 brackets");
            {
                json_t *j = NULL;
                char *want;
                is_int(sb_json_from_mp(&nodes[0], &j), SB_OK, "(the old route agrees)");
                want = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
                ok(want != NULL && strcmp(want, b.base) == 0, "same text");
                free(want);
                json_decref(j);
            }
        }
        sb_buf_free(&b);
    }
    /* nodes: 100000 values written, 100001 refused */
    {
        msgpack_object root, *e = calloc(SB_MAX_NODES, sizeof(*e));
        sb_buf_t b;
        const char *why = NULL;
        if (e == NULL)
            abort();
        for (size_t i = 0; i < SB_MAX_NODES; ++i)
            e[i].type = MSGPACK_OBJECT_NIL;
        root.type = MSGPACK_OBJECT_ARRAY;
        root.via.array.ptr = e;
        root.via.array.size = SB_MAX_NODES - 1;
        sb_buf_init(&b, SB_MAX_RPC_WIRE);
        is_int(sb_json_write(&b, &root, &why), SB_OK, "an array of 99999 nils (100000 values): written");
        sb_buf_reset(&b);
        root.via.array.size = SB_MAX_NODES;
        is_int(sb_json_write(&b, &root, &why), SB_E_BAD_ARGS, "an array of 100000 nils (100001 values): refused");
        is_str(why, "value has too many nodes", "why");
        ok(b.len == 0, "and nothing is left in the buffer");
        sb_buf_free(&b);
        free(e);
    }
}

/* the cap is enforced while writing: a text of N bytes fits a cap of N, not N - 1, and a huge value stops early */
static void test_cap(void)
{
    static const char doc[] = "{\"ok\":[1,2.5,\"x\\n\",null,true,{\"b\":\"\\u0000\"}],\"bin\":\"\"}";
    msgpack_zone z;
    msgpack_object o;
    sb_buf_t b;
    const char *why = NULL;
    size_t n;

    msgpack_zone_init(&z, 1024);
    is_int(sb_json_parse(doc, sizeof(doc) - 1, &z, &o, &why), SB_OK, "a document");
    sb_buf_init(&b, SB_MAX_RPC_WIRE);
    is_int(sb_json_write(&b, &o, &why), SB_OK, "written without a cap");
    n = b.len;
    sb_buf_free(&b);
    {
        int fine = 1;
        for (size_t cap = 0; cap <= n; ++cap) {
            sb_status_t st;
            sb_buf_init(&b, cap);
            st = sb_json_write(&b, &o, &why);
            if (cap < n && (st != SB_E_TOO_LARGE || b.len != 0 || strcmp(why, "JSON text exceeds the cap") != 0))
                fine = 0;
            if (cap == n && (st != SB_OK || b.len != n))
                fine = 0;
            sb_buf_free(&b);
        }
        ok(fine, "every cap below %zu bytes is TOO_LARGE with nothing left, %zu fits", n, n);
    }
    msgpack_zone_destroy(&z);

    /* a 50000-element array of 100-byte strings (5 MB of text) into a 1000-byte cap: stops at once, never holds more */
    {
        msgpack_object root, *e = calloc(50000, sizeof(*e));
        static char s100[100];
        unsigned long before;
        memset(s100, 'x', sizeof(s100));
        if (e == NULL)
            abort();
        for (size_t i = 0; i < 50000; ++i) {
            e[i].type = MSGPACK_OBJECT_STR;
            e[i].via.str.ptr = s100;
            e[i].via.str.size = sizeof(s100);
        }
        root.type = MSGPACK_OBJECT_ARRAY;
        root.via.array.ptr = e;
        root.via.array.size = 50000;
        sb_buf_init(&b, 1000);
        before = sb_mem_try_count();
        is_int(sb_json_write(&b, &root, &why), SB_E_TOO_LARGE, "5 MB of text into a 1000-byte cap: too large");
        ok(b._alloc <= 1001, "storage never above the cap (%zu)", b._alloc);
        ok(sb_mem_try_count() - before <= 4, "a few allocations (%lu)", sb_mem_try_count() - before);
        sb_buf_free(&b);
        free(e);
    }
    /* a bin whose base64 passes the cap is refused before its text is reserved */
    {
        msgpack_object bin;
        static char raw[3000];
        bin.type = MSGPACK_OBJECT_BIN;
        bin.via.bin.ptr = raw;
        bin.via.bin.size = sizeof(raw);
        sb_buf_init(&b, 4001);
        is_int(sb_json_write(&b, &bin, &why), SB_E_TOO_LARGE, "3000-byte bin (4002 bytes of JSON) into 4001: too large");
        ok(b.base == NULL, "nothing allocated for it");
        sb_buf_set_cap(&b, 4002);
        is_int(sb_json_write(&b, &bin, &why), SB_OK, "into 4002: written");
        sb_buf_free(&b);
    }
}

/* every allocation of a write failed in turn: NOMEM with the buffer as it was */
static void test_nomem(void)
{
    static const char doc[] =
        "{\"a\":1,\"b\":2,\"c\":3,\"d\":4,\"e\":5,\"f\":6,\"g\":7,\"h\":8,\"i\":9,\"j\":10,\"k\":11,\"l\":12,"
        "\"m\":13,\"n\":14,\"o\":15,\"p\":16,\"q\":[\"a long enough string to make the buffer grow past its "
        "first allocation of 256 bytes, which it does a few times over, here and now, really\",\"and a second string that "
        "takes it past 512 bytes as well, so that the storage is moved twice while the text is written; "
        "that is the point of this second, rather long and otherwise entirely unremarkable string, which "
        "goes on for a while longer than it strictly needs to\"]}";
    msgpack_zone z;
    msgpack_object o;
    sb_buf_t b;
    const char *why = NULL;
    unsigned long before, count;
    int fine = 1;

    msgpack_zone_init(&z, 1024);
    is_int(sb_json_parse(doc, sizeof(doc) - 1, &z, &o, &why), SB_OK, "a document");
    sb_buf_init(&b, 100000);
    is_int(sb_buf_append(&b, S("pre")), SB_OK, "pre");
    before = sb_mem_try_count();
    is_int(sb_json_write(&b, &o, &why), SB_OK, "written");
    count = sb_mem_try_count() - before;
    sb_buf_free(&b);
    ok(count >= 2, "the write makes %lu try-allocations (growth, and the sort of 17 keys)", count);
    for (unsigned long i = 1; i <= count; ++i) {
        sb_status_t st;
        sb_buf_init(&b, 100000);
        if (sb_buf_append(&b, S("pre")) != SB_OK)
            fine = 0;
        sb_mem_fail_nth(i);
        st = sb_json_write(&b, &o, &why);
        sb_mem_fail_nth(0);
        if (st != SB_E_NOMEM || b.len != 3 || strcmp(why, "out of memory") != 0) {
            printf("#   allocation %lu: status %d, len %zu, why %s\n", i, (int)st, b.len, why);
            fine = 0;
        }
        sb_buf_free(&b);
    }
    ok(fine, "each failed allocation is NOMEM, \"out of memory\", the buffer as it was");
    msgpack_zone_destroy(&z);
}

/* JSON -> tree -> JSON -> tree: the trees are the same, and the text is what jansson prints */
static void test_round_trips(void)
{
    for (size_t i = 0; i < sizeof(json_valid) / sizeof(json_valid[0]); ++i) {
        msgpack_zone z1, z2;
        msgpack_object a, b2;
        sb_buf_t b;
        const char *why = NULL;
        json_t *j;
        char *want;
        int fine;
        msgpack_zone_init(&z1, 1024);
        msgpack_zone_init(&z2, 1024);
        sb_buf_init(&b, SB_MAX_RPC_WIRE);
        fine = sb_json_parse(json_valid[i].text, json_valid[i].len, &z1, &a, &why) == SB_OK &&
               sb_json_write(&b, &a, &why) == SB_OK && sb_json_parse(b.base, b.len, &z2, &b2, &why) == SB_OK && mp_same(&a, &b2);
        ok(fine, "round trip %zu: parse, write, parse: the same tree", i);
        j = json_loadb(json_valid[i].text, json_valid[i].len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        want = j != NULL ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        ok(want != NULL && b.len == strlen(want) && memcmp(b.base, want, b.len) == 0, "round trip %zu: the text jansson prints", i);
        free(want);
        json_decref(j);
        sb_buf_free(&b);
        msgpack_zone_destroy(&z1);
        msgpack_zone_destroy(&z2);
    }
}

int main(void)
{
    test_scalars();
    test_containers();
    test_refusals();
    test_cap();
    test_nomem();
    test_round_trips();
    return done_testing();
}
