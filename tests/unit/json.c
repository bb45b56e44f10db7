/*
 * Unit tests for the JSON edge of proto/: JSON text -> msgpack through the
 * RPC route's decoder (sb_json_parse, packed here to compare bytes) with its
 * depth and node caps, and proto/json.c: msgpack -> jansson
 * (sb_json_from_mp, bin as base64 text), sb_mp_pack_json and sb_mp_get.
 * The exact reason of each refusal is tests/unit/json_parse.c's business.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <msgpack.h>
#include "tap.h"
#include "sb/limits.h"
#include "sb/value.h"

#define S(s) s, sizeof(s) - 1

/* JSON text -> (sb_json_parse) tree -> packed into sb */
static sb_status_t decode(const char *text, size_t len, msgpack_sbuffer *sb, const char **why)
{
    msgpack_zone z;
    msgpack_object o;
    msgpack_packer pk;
    sb_status_t st;

    msgpack_sbuffer_clear(sb);
    *why = NULL;
    msgpack_zone_init(&z, 1024);
    if ((st = sb_json_parse(text, len, &z, &o, why)) == SB_OK) {
        msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
        sb_mp_pack_object(&pk, &o);
    }
    msgpack_zone_destroy(&z);
    return st;
}

static void refuses(const char *text, size_t len, sb_status_t want, const char *want_why, const char *name)
{
    msgpack_sbuffer sb;
    const char *why;

    msgpack_sbuffer_init(&sb);
    is_int(decode(text, len, &sb, &why), want, "refused: %s: status", name);
    if (want_why != NULL)
        is_str(why, want_why, "refused: %s: why", name);
    else
        ok(why != NULL && why[0] != '\0', "refused: %s: with a reason (%s)", name, why != NULL ? why : "none");
    msgpack_sbuffer_destroy(&sb);
}

/* JSON -> msgpack -> (pre-check, unpack) -> JSON, compared with jansson's own parse of the text */
static void round_trip(const char *text, size_t len, const char *name)
{
    msgpack_sbuffer sb;
    msgpack_zone z;
    msgpack_object o;
    const char *why;
    json_t *want, *got = NULL;
    json_error_t err;
    sb_status_t st;

    msgpack_sbuffer_init(&sb);
    msgpack_zone_init(&z, 1024);
    want = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    st = decode(text, len, &sb, &why);
    if (!ok(st == SB_OK && want != NULL, "round trip: %s: decodes", name)) {
        printf("#   status %d, why \"%s\"\n", (int)st, why ? why : "(null)");
        goto Exit;
    }
    if (!ok(sb_mp_decode((const uint8_t *)sb.data, sb.size, &z, &o, &why) == SB_OK,
            "round trip: %s: packed form passes the pre-check", name))
        goto Exit;
    if (!ok(sb_json_from_mp(&o, &got) == SB_OK, "round trip: %s: back to JSON", name))
        goto Exit;
    ok(json_equal(want, got), "round trip: %s: equal", name);
Exit:
    json_decref(want);
    json_decref(got);
    msgpack_zone_destroy(&z);
    msgpack_sbuffer_destroy(&sb);
}

static void test_round_trips(void)
{
    static const char *const docs[] = {
        "null",
        "true",
        "false",
        "0",
        "-1",
        "127",
        "128",
        "-33",
        "65536",
        "9223372036854775807",
        "-9223372036854775808",
        "1.5",
        "-0.25",
        "1e300",
        "-1.7976931348623157e308",
        "2.2250738585072014e-308",
        "5e-324",
        "\"\"",
        "\"plain\"",
        "\"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80\"",
        "\"\\ud83d\\ude00\"",
        "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
        "\"\\u0001\\u001f\\u007f\\u0080\\uffff\"",
        "[]",
        "{}",
        "[1,[2,[3,[]]],{}]",
        "{\"a\":{\"b\":[true,null,false]},\"c\":\"d\"}",
        "{\"__proto__\":1,\"constructor\":{},\"toString\":[]}",
        "{\"method\":\"files.read\",\"args\":{\"path\":\"a.txt\"}}",
        "{\"\":\"\"}",
        "{\"\xc3\xa9\":1,\"e\":2,\"E\":3}",
        "[\"[[[[{{{{\",\"]]]]\",\"\\\"[\"]",
        "  {\"ws\" :\t[ 1 ,\n2 ]\r}  ",
        "[0.1,0.2,0.30000000000000004,1e-7,123456789012345678]",
        "[1.0,2.0,-0.0]",
    };

    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); ++i) {
        char name[96];
        size_t k;
        for (k = 0; docs[i][k] != '\0' && k + 1 < sizeof(name); ++k)
            name[k] = docs[i][k] >= 0x20 && docs[i][k] < 0x7f ? docs[i][k] : '.';
        name[k] = '\0';
        round_trip(docs[i], strlen(docs[i]), name);
    }
    /* NUL inside strings is allowed, and survives */
    round_trip(S("\"a\\u0000b\""), "NUL inside a string");
    round_trip(S("{\"k\":\"\\u0000\"}"), "NUL as a whole value");
    round_trip(S("[\"\\u0000\\u0000\"]"), "two NULs");

    /* 31 nested containers */
    {
        char buf[128];
        size_t n = 0;
        for (int i = 0; i < 30; ++i)
            buf[n++] = '[';
        buf[n++] = '{', buf[n++] = '"', buf[n++] = 'k', buf[n++] = '"', buf[n++] = ':', buf[n++] = '1', buf[n++] = '}';
        for (int i = 0; i < 30; ++i)
            buf[n++] = ']';
        round_trip(buf, n, "31 nested containers");
    }
}

static void test_packed_form(void)
{
    msgpack_sbuffer sb;
    const char *why;

    msgpack_sbuffer_init(&sb);
    is_int(decode(S("\"a\\u0000b\""), &sb, &why), SB_OK, "NUL inside a string: accepted");
    ok(sb.size == 4 && memcmp(sb.data,
                              "\xa3"
                              "a\0b",
                              4) == 0,
       "NUL inside a string: packed as a 3-byte str");
    is_int(decode(S("{\"a\":1}"), &sb, &why), SB_OK, "object packs");
    ok(sb.size == 4 && memcmp(sb.data,
                              "\x81\xa1"
                              "a\x01",
                              4) == 0,
       "object packs as fixmap with a str key");
    is_int(decode(S("-1"), &sb, &why), SB_OK, "negative integer packs");
    ok(sb.size == 1 && (uint8_t)sb.data[0] == 0xff, "-1 packs as a negative fixint");
    msgpack_sbuffer_destroy(&sb);
}

static void test_refusals(void)
{
    static const char *const bad = NULL; /* any reason: json_parse.c checks each one */

    /* not JSON */
    refuses(S(""), SB_E_BAD_ARGS, bad, "empty text");
    refuses(S("{"), SB_E_BAD_ARGS, bad, "unterminated object");
    refuses(S("[1,]"), SB_E_BAD_ARGS, bad, "trailing comma");
    refuses(S("{} {}"), SB_E_BAD_ARGS, bad, "two values");
    refuses(S("NaN"), SB_E_BAD_ARGS, bad, "NaN");
    refuses(S("Infinity"), SB_E_BAD_ARGS, bad, "Infinity");
    refuses(S("1e400"), SB_E_BAD_ARGS, bad, "real overflow");
    refuses(S("{'a':1}"), SB_E_BAD_ARGS, bad, "single quotes");
    refuses(S("\"a\nb\""), SB_E_BAD_ARGS, bad, "raw control character in a string");
    refuses(S("\"\x00\""), SB_E_BAD_ARGS, bad, "raw NUL byte in the text");
    /* strict UTF-8 */
    refuses(S("\"\xff\""), SB_E_BAD_ARGS, bad, "byte 0xff");
    refuses(S("\"\x80\""), SB_E_BAD_ARGS, bad, "lone continuation byte");
    refuses(S("\"\xc0\xaf\""), SB_E_BAD_ARGS, bad, "overlong '/'");
    refuses(S("\"\xe0\x80\xaf\""), SB_E_BAD_ARGS, bad, "overlong 3-byte '/'");
    refuses(S("\"\xed\xa0\x80\""), SB_E_BAD_ARGS, bad, "UTF-8 encoded surrogate");
    refuses(S("\"\xf4\x90\x80\x80\""), SB_E_BAD_ARGS, bad, "code point above U+10FFFF");
    refuses(S("\"\xc3\""), SB_E_BAD_ARGS, bad, "truncated sequence");
    refuses(S("{\"\xff\":1}"), SB_E_BAD_ARGS, bad, "invalid UTF-8 in a key");
    refuses(S("\xef\xbb\xbf{}"), SB_E_BAD_ARGS, bad, "byte order mark");
    /* lone surrogate escapes */
    refuses(S("\"\\ud800\""), SB_E_BAD_ARGS, bad, "lone high surrogate escape");
    refuses(S("\"\\udc00\""), SB_E_BAD_ARGS, bad, "lone low surrogate escape");
    refuses(S("\"\\ud800x\""), SB_E_BAD_ARGS, bad, "high surrogate followed by a letter");
    refuses(S("\"\\ud800\\u0041\""), SB_E_BAD_ARGS, bad, "high surrogate followed by a non-surrogate escape");
    refuses(S("\"\\ud800\\ud800\""), SB_E_BAD_ARGS, bad, "two high surrogates");
    refuses(S("\"\\ude00\\ud83d\""), SB_E_BAD_ARGS, bad, "surrogate pair in the wrong order");
    refuses(S("{\"\\udfff\":1}"), SB_E_BAD_ARGS, bad, "lone surrogate escape in a key");
    /* duplicate keys */
    refuses(S("{\"a\":1,\"a\":2}"), SB_E_BAD_ARGS, bad, "duplicate key");
    refuses(S("{\"a\":1,\"b\":2,\"a\":1}"), SB_E_BAD_ARGS, bad, "duplicate key with the same value");
    refuses(S("{\"x\":{\"a\":1,\"a\":2}}"), SB_E_BAD_ARGS, bad, "duplicate key in a nested object");
    refuses(S("{\"a\":1,\"\\u0061\":2}"), SB_E_BAD_ARGS, bad, "duplicate key spelled with an escape");
    /* NUL is allowed in string values but not in keys (jansson; sb_json_from_mp refuses them too) */
    refuses(S("{\"a\\u0000b\":1}"), SB_E_BAD_ARGS, bad, "NUL inside a key");
}

static void nested(char *buf, size_t *n, int depth, char open, char close)
{
    *n = 0;
    for (int i = 0; i < depth; ++i)
        buf[(*n)++] = open;
    for (int i = 0; i < depth; ++i)
        buf[(*n)++] = close;
}

static void test_depth(void)
{
    msgpack_sbuffer sb;
    char buf[256];
    size_t n;
    const char *why;

    msgpack_sbuffer_init(&sb);
    nested(buf, &n, 31, '[', ']');
    is_int(decode(buf, n, &sb, &why), SB_OK, "31 nested arrays accepted");
    nested(buf, &n, 32, '[', ']');
    refuses(buf, n, SB_E_TOO_LARGE, "value nesting is too deep", "32 nested arrays");
    nested(buf, &n, 100, '[', ']');
    refuses(buf, n, SB_E_TOO_LARGE, "value nesting is too deep", "100 nested arrays");
    /* text that is not JSON is refused as too deep once it nests too deep, before its end is read */
    memset(buf, '[', 40);
    refuses(buf, 40, SB_E_TOO_LARGE, "value nesting is too deep", "40 unclosed '['");
    /* objects */
    n = 0;
    for (int i = 0; i < 32; ++i) {
        memcpy(buf + n, "{\"a\":", 5);
        n += 5;
    }
    buf[n++] = '1';
    memset(buf + n, '}', 32);
    n += 32;
    refuses(buf, n, SB_E_TOO_LARGE, "value nesting is too deep", "32 nested objects");
    n -= 32 + 1 + 5;
    buf[n++] = '1';
    memset(buf + n, '}', 31);
    n += 31;
    is_int(decode(buf, n, &sb, &why), SB_OK, "31 nested objects accepted");
    /* brackets inside strings do not nest */
    {
        char s[128];
        size_t k = 0;
        s[k++] = '[', s[k++] = '"';
        memset(s + k, '[', 60);
        k += 60;
        s[k++] = '\\', s[k++] = '"';
        memset(s + k, '{', 20);
        k += 20;
        s[k++] = '"', s[k++] = ']';
        is_int(decode(s, k, &sb, &why), SB_OK, "brackets inside a string (after an escaped quote) do not count");
    }
    msgpack_sbuffer_destroy(&sb);
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

static void test_nodes(void)
{
    msgpack_sbuffer sb;
    const char *why;
    size_t len;
    char *t;

    msgpack_sbuffer_init(&sb);
    t = zeros(SB_MAX_NODES - 1, &len);
    is_int(decode(t, len, &sb, &why), SB_OK, "array of 99999 zeros (100000 nodes) accepted");
    free(t);
    t = zeros(SB_MAX_NODES, &len);
    refuses(t, len, SB_E_TOO_LARGE, "value has too many nodes", "array of 100000 zeros (100001 nodes)");
    free(t);
    t = zeros(SB_MAX_NODES + 1, &len);
    refuses(t, len, SB_E_TOO_LARGE, "value has too many nodes", "array of 100001 zeros");
    free(t);

    /* separators inside strings are not nodes */
    t = malloc(300010);
    if (t == NULL)
        abort();
    t[0] = '"';
    memset(t + 1, ',', 150000);
    memset(t + 150001, ':', 150000);
    t[300001] = '"';
    is_int(decode(t, 300002, &sb, &why), SB_OK, "300000 separators inside a string are not nodes");
    free(t);
    msgpack_sbuffer_destroy(&sb);
}

/* "{"0":0,...,"<n-1>":0}" */
static char *object_of(size_t n, size_t *len)
{
    size_t cap = n * 16 + 16, k = 0;
    char *t = malloc(cap);

    if (t == NULL)
        abort();
    t[k++] = '{';
    for (size_t i = 0; i < n; ++i)
        k += (size_t)snprintf(t + k, cap - k, "%s\"%zu\":0", i != 0 ? "," : "", i);
    t[k++] = '}';
    *len = k;
    return t;
}

/*
 * Regression (first found in the jansson route, fixed in 9522f65): counting an
 * object's keys as nodes on one side and not on the other let
 * {"0":0,...,"49999":0} through JSON and fail sb_mp_decode. Both sides count
 * values only (keys are not values): whatever the JSON decoder accepts passes
 * the msgpack pre-check, and the boundary is the same on both sides.
 */
static void test_json_output_passes_precheck(void)
{
    static const size_t sizes[] = {50000, SB_MAX_NODES - 1};
    msgpack_sbuffer sb;
    msgpack_zone z;
    msgpack_object o;
    const char *why;
    size_t n;
    char *t;

    msgpack_sbuffer_init(&sb);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
        t = object_of(sizes[i], &n);
        is_int(decode(t, n, &sb, &why), SB_OK, "object of %zu keys (%zu values): sb_json_parse accepts it", sizes[i], sizes[i] + 1);
        msgpack_zone_init(&z, 1024);
        is_int(sb_mp_decode((const uint8_t *)sb.data, sb.size, &z, &o, &why), SB_OK,
               "object of %zu keys: its packed form passes sb_mp_decode", sizes[i]);
        msgpack_zone_destroy(&z);
        free(t);
    }
    t = object_of(SB_MAX_NODES, &n);
    refuses(t, n, SB_E_TOO_LARGE, "value has too many nodes", "object of 100000 keys (100001 values)");
    free(t);
    msgpack_sbuffer_destroy(&sb);
}

/*
 * Regression (first found in the jansson route's pre-scan, fixed in 9522f65):
 * containers are values too, so 4000 elements of 30 nested empty arrays
 * ("[[[...]]]," 61 bytes each) are 120001 nodes, not 4000, and are refused.
 */
static void test_containers_count_as_nodes(void)
{
    msgpack_sbuffer sb;
    const char *why;
    size_t n = 0;
    char *t = malloc(4000 * 61 + 2);

    if (t == NULL)
        abort();
    t[n++] = '[';
    for (int i = 0; i < 4000; ++i) {
        if (i != 0)
            t[n++] = ',';
        memset(t + n, '[', 30);
        memset(t + n + 30, ']', 30);
        n += 60;
    }
    t[n++] = ']';
    msgpack_sbuffer_init(&sb);
    is_int(decode(t, n, &sb, &why), SB_E_TOO_LARGE, "4000 x 30 nested empty arrays (120001 nodes): too large");
    /* and the largest accepted shape of that kind still passes */
    n = 0;
    t[n++] = '[';
    for (int i = 0; i < 3000; ++i) {
        if (i != 0)
            t[n++] = ',';
        memset(t + n, '[', 30);
        memset(t + n + 30, ']', 30);
        n += 60;
    }
    t[n++] = ']';
    is_int(decode(t, n, &sb, &why), SB_OK, "3000 x 30 nested empty arrays (90001 nodes): accepted");
    msgpack_sbuffer_destroy(&sb);
    free(t);
}

/* msgpack bytes -> (msgpack-c, no pre-check) -> sb_json_from_mp */
static sb_status_t from_bytes(const char *p, size_t len, json_t **out)
{
    msgpack_zone z;
    msgpack_object o;
    size_t off = 0;
    sb_status_t st = SB_E_BAD_ARGS;

    *out = NULL;
    msgpack_zone_init(&z, 1024);
    if (msgpack_unpack(p, len, &off, &z, &o) == MSGPACK_UNPACK_SUCCESS)
        st = sb_json_from_mp(&o, out);
    msgpack_zone_destroy(&z);
    return st;
}

static void test_from_mp(void)
{
    json_t *j = NULL;

    /* bin becomes base64 text */
    is_int(from_bytes(S("\xc4\x04\x00\x01\x02\xff"), &j), SB_OK, "bin -> JSON");
    ok(json_is_string(j) && strcmp(json_string_value(j), "AAEC/w==") == 0, "bin 00 01 02 ff -> \"AAEC/w==\"");
    json_decref(j);
    is_int(from_bytes(S("\xc4\x00"), &j), SB_OK, "empty bin -> JSON");
    ok(json_is_string(j) && json_string_length(j) == 0, "empty bin -> \"\"");
    json_decref(j);
    is_int(from_bytes(S("\x81\xa1"
                        "b\xc5\x00\x06"
                        "foobar"),
                      &j),
           SB_OK, "bin16 in a map -> JSON");
    ok(json_is_string(json_object_get(j, "b")) && strcmp(json_string_value(json_object_get(j, "b")), "Zm9vYmFy") == 0,
       "bin \"foobar\" -> \"Zm9vYmFy\"");
    json_decref(j);
    /* numbers */
    is_int(from_bytes(S("\xcf\x7f\xff\xff\xff\xff\xff\xff\xff"), &j), SB_OK, "uint64 INT64_MAX -> JSON");
    ok(json_is_integer(j) && json_integer_value(j) == INT64_MAX, "INT64_MAX survives");
    json_decref(j);
    is_int(from_bytes(S("\xcf\x80\x00\x00\x00\x00\x00\x00\x00"), &j), SB_E_BAD_ARGS, "uint64 above INT64_MAX refused");
    is_int(from_bytes(S("\xd3\x80\x00\x00\x00\x00\x00\x00\x00"), &j), SB_OK, "int64 min -> JSON");
    ok(json_is_integer(j) && json_integer_value(j) == INT64_MIN, "INT64_MIN survives");
    json_decref(j);
    is_int(from_bytes(S("\xca\x3f\xc0\x00\x00"), &j), SB_OK, "float32 1.5 -> JSON");
    ok(json_is_real(j) && json_real_value(j) == 1.5, "float32 1.5 -> 1.5");
    json_decref(j);
    is_int(from_bytes(S("\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00"), &j), SB_E_BAD_ARGS, "float64 NaN refused");
    is_int(from_bytes(S("\xca\xff\x80\x00\x00"), &j), SB_E_BAD_ARGS, "float32 -inf refused");
    /* what the pre-check would have refused, sb_json_from_mp refuses on its own */
    is_int(from_bytes(S("\x81\x01\x01"), &j), SB_E_BAD_ARGS, "int key refused");
    is_int(from_bytes(S("\x81\xc4\x01"
                        "a\x01"),
                      &j),
           SB_E_BAD_ARGS, "bin key refused");
    is_int(from_bytes(S("\x81\xa1\x00\x01"), &j), SB_E_BAD_ARGS, "key holding NUL refused");
    is_int(from_bytes(S("\x81\xa1\xff\x01"), &j), SB_E_BAD_ARGS, "key with invalid UTF-8 refused");
    is_int(from_bytes(S("\xa2\xed\xa0"), &j), SB_E_BAD_ARGS, "str with invalid UTF-8 refused");
    is_int(from_bytes(S("\xd4\x01\x00"), &j), SB_E_BAD_ARGS, "ext refused");
    is_int(from_bytes(S("\x91\xd4\x01\x00"), &j), SB_E_BAD_ARGS, "ext inside an array refused");
    is_int(from_bytes(S("\x81\xa1"
                        "a\xd4\x01\x00"),
                      &j),
           SB_E_BAD_ARGS, "ext inside a map refused");
    /* NUL inside a str value is fine */
    is_int(from_bytes(S("\xa3"
                        "a\0b"),
                      &j),
           SB_OK, "str holding NUL -> JSON");
    ok(json_is_string(j) && json_string_length(j) == 3 && memcmp(json_string_value(j), "a\0b", 3) == 0, "str holding NUL survives");
    json_decref(j);
    /* depth: 32 nested arrays holding a scalar put the scalar at depth 32 */
    {
        char b[40];
        memset(b, 0x91, 32);
        b[32] = 0x01;
        is_int(from_bytes(b, 33, &j), SB_E_TOO_LARGE, "scalar under 32 containers: too deep");
        b[31] = 0x90;
        is_int(from_bytes(b, 32, &j), SB_OK, "32 nested arrays, innermost empty");
        json_decref(j);
    }
}

static void test_pack_json(void)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    json_t *root = json_array(), *cur = root;
    const char *why = NULL;

    for (int i = 0; i < 40; ++i) {
        json_t *next = json_array();
        json_array_append_new(cur, next);
        cur = next;
    }
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    is_int(sb_mp_pack_json(&pk, root, &why), SB_E_TOO_LARGE, "sb_mp_pack_json: 41 nested arrays");
    is_str(why, "value nesting is too deep", "sb_mp_pack_json: why");
    json_decref(root);

    root = json_pack("{s:i, s:[s, b, n, f]}", "a", 1, "b", "x", 1, 2.5);
    msgpack_sbuffer_clear(&sb);
    is_int(sb_mp_pack_json(&pk, root, &why), SB_OK, "sb_mp_pack_json: a small object");
    {
        msgpack_zone z;
        msgpack_object o;
        json_t *back = NULL;
        msgpack_zone_init(&z, 1024);
        is_int(sb_mp_decode((const uint8_t *)sb.data, sb.size, &z, &o, &why), SB_OK, "sb_mp_pack_json output passes the pre-check");
        is_int(sb_json_from_mp(&o, &back), SB_OK, "and converts back");
        ok(json_equal(root, back), "and is equal");
        json_decref(back);
        msgpack_zone_destroy(&z);
    }
    json_decref(root);
    msgpack_sbuffer_destroy(&sb);
}

/*
 * Regression (found by these tests, fixed in 9522f65): msgpack-c 4.0 leaves
 * via.str.ptr NULL for a zero-length str when no item with trailing bytes
 * precedes it in the buffer, and jansson's json_stringn_nocheck(NULL, 0) /
 * json_object_setn_new_nocheck(o, NULL, 0, v) fail, so sb_json_from_mp
 * answered SB_E_NOMEM for "" ("\xa0") and {"": 1} ("\x81\xa0\x01") while
 * ["x", ""] worked.
 */
static void test_empty_str_from_mp(void)
{
    static const struct {
        const char *bytes;
        size_t len;
        const char *json;
    } t[] = {
        {"\xa0", 1, "\"\""},
        {"\x81\xa0\x01", 3, "{\"\": 1}"},
        {"\x82\xa0\x01\xa1x\xa0", 6, "{\"\": 1, \"x\": \"\"}"},
        {"\x92\xa1x\xa0", 4, "[\"x\", \"\"]"},
    };

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); ++i) {
        msgpack_zone z;
        msgpack_object o;
        json_t *j = NULL, *want = json_loads(t[i].json, JSON_DECODE_ANY, NULL);
        const char *why = NULL;
        sb_status_t st;
        msgpack_zone_init(&z, 1024);
        is_int(sb_mp_decode((const uint8_t *)t[i].bytes, t[i].len, &z, &o, &why), SB_OK, "empty str case %zu: pre-check and unpack",
               i);
        st = sb_json_from_mp(&o, &j);
        is_int(st, SB_OK, "empty str case %zu: sb_json_from_mp converts %s", i, t[i].json);
        ok(st == SB_OK && json_equal(j, want), "empty str case %zu: equals %s", i, t[i].json);
        json_decref(j);
        json_decref(want);
        msgpack_zone_destroy(&z);
    }
}

/*
 * Open finding (proto/json.c, sb_mp_get line 274 and sb_mp_str_is line 283):
 * for an empty key or string that msgpack-c left with via.str.ptr == NULL (the
 * first item with a body in the buffer, as in {"": 1} = "\x81\xa0\x01"),
 * sb_mp_get(map, "") and sb_mp_str_is(o, "") call memcmp(NULL, "", 0), which
 * is undefined behaviour (glibc declares memcmp nonnull). The answers are
 * right in a plain build; under SB_SANITIZE (UBSan, no recover) this test
 * aborts with "null pointer passed as argument 1". Expected: no memcmp when
 * the length is 0. Reproducer: fuzz/corpus/mpcheck/empty-str-first.mp.
 */
static void test_mp_get_empty_key(void)
{
    msgpack_zone z;
    msgpack_object o;
    const char *why = NULL;

    msgpack_zone_init(&z, 1024);
    is_int(sb_mp_decode((const uint8_t *)"\x82\xa0\x01\xa1x\x02", 6, &z, &o, &why), SB_OK, "{\"\": 1, \"x\": 2} decodes");
    ok(sb_mp_get(&o, "") == &o.via.map.ptr[0].val, "sb_mp_get(map, \"\") finds the empty key");
    ok(sb_mp_get(&o, "x") == &o.via.map.ptr[1].val, "sb_mp_get(map, \"x\")");
    is_int(sb_mp_decode((const uint8_t *)"\xa0", 1, &z, &o, &why), SB_OK, "\"\" decodes");
    ok(sb_mp_str_is(&o, ""), "sb_mp_str_is(\"\", \"\")");
    ok(!sb_mp_str_is(&o, "a"), "sb_mp_str_is(\"\", \"a\") is false");
    msgpack_zone_destroy(&z);
}

int main(void)
{
    test_round_trips();
    test_packed_form();
    test_refusals();
    test_depth();
    test_nodes();
    test_from_mp();
    test_pack_json();
    test_json_output_passes_precheck();
    test_containers_count_as_nodes();
    test_empty_str_from_mp();
    test_mp_get_empty_key();
    return done_testing();
}
