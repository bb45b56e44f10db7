/*
 * Unit tests for proto/mpcheck.c: the msgpack pre-check (sb_mp_check,
 * sb_mp_decode, sb_utf8_valid) that runs before msgpack-c sees a byte.
 *
 * Besides every refusal (exact status and `why`), this file pins down the
 * contract with msgpack-c 4.0: whatever sb_mp_check accepts, msgpack_unpack
 * unpacks, consuming exactly obj_len bytes. msgpack-c's own nesting limit is
 * MSGPACK_EMBED_STACK_SIZE (32) non-empty containers; we stop at 31.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <msgpack.h>
#include "tap.h"
#include "sb/limits.h"
#include "sb/mem.h"
#include "sb/value.h"

#define B(s) (const uint8_t *)(s), sizeof(s) - 1

/* msgpack-c's verdict on a whole buffer: its return code, and how much it consumed */
static int mp_unpack(const uint8_t *p, size_t len, size_t *off)
{
    msgpack_zone z;
    msgpack_object o;
    int rc;

    *off = 0;
    msgpack_zone_init(&z, 1024);
    rc = msgpack_unpack((const char *)p, len, off, &z, &o);
    msgpack_zone_destroy(&z);
    return rc;
}

/* sb_mp_check accepts; obj_len is exact; msgpack-c agrees and consumes the same bytes */
static void accepts(const uint8_t *p, size_t len, const char *name)
{
    size_t obj_len = 0, off;
    const char *why = NULL;
    sb_status_t st = sb_mp_check(p, len, &obj_len, &why);
    int rc;

    if (!ok(st == SB_OK, "accepted: %s", name)) {
        printf("#   status %d, why \"%s\"\n", (int)st, why ? why : "(null)");
        return;
    }
    is_int(obj_len, len, "accepted: %s: obj_len", name);
    rc = mp_unpack(p, len, &off);
    ok(rc == MSGPACK_UNPACK_SUCCESS && off == len, "accepted: %s: msgpack_unpack succeeds (rc %d, off %zu)", name, rc, off);
}

static void refuses(const uint8_t *p, size_t len, sb_status_t want, const char *want_why, const char *name)
{
    size_t obj_len = 12345;
    const char *why = NULL;
    sb_status_t st = sb_mp_check(p, len, &obj_len, &why);

    is_int(st, want, "refused: %s: status", name);
    is_str(why, want_why, "refused: %s: why", name);
    is_int(obj_len, 12345, "refused: %s: obj_len untouched", name);
}

static void test_accepts(void)
{
    static const struct {
        const char *bytes;
        size_t len;
        const char *name;
    } t[] = {
#define T(s, n) {s, sizeof(s) - 1, n}
        T("\x00", "positive fixint 0"),
        T("\x7f", "positive fixint 127"),
        T("\xe0", "negative fixint -32"),
        T("\xff", "negative fixint -1"),
        T("\xc0", "nil"),
        T("\xc2", "false"),
        T("\xc3", "true"),
        T("\xcc\xff", "uint8"),
        T("\xcd\xff\xff", "uint16"),
        T("\xce\xff\xff\xff\xff", "uint32"),
        T("\xcf\xff\xff\xff\xff\xff\xff\xff\xff", "uint64 max"),
        T("\xd0\x80", "int8 -128"),
        T("\xd0\x05", "int8 holding a positive value"),
        T("\xd1\x80\x00", "int16"),
        T("\xd2\x80\x00\x00\x00", "int32"),
        T("\xd3\x80\x00\x00\x00\x00\x00\x00\x00", "int64 min"),
        T("\xca\x3f\x80\x00\x00", "float32 1.0"),
        T("\xca\x80\x00\x00\x00", "float32 -0.0"),
        T("\xca\x7f\x7f\xff\xff", "float32 max"),
        T("\xca\x00\x00\x00\x01", "float32 denormal"),
        T("\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00", "float64 1.0"),
        T("\xcb\x7f\xef\xff\xff\xff\xff\xff\xff", "float64 max"),
        T("\xa0", "empty fixstr"),
        T("\xa3" "abc", "fixstr"),
        T("\xa1\x00", "str holding NUL"),
        T("\xd9\x03" "abc", "str8"),
        T("\xda\x00\x03" "abc", "str16"),
        T("\xdb\x00\x00\x00\x03" "abc", "str32"),
        T("\xa2\xc3\xa9", "str U+00E9"),
        T("\xa3\xe2\x82\xac", "str U+20AC"),
        T("\xa3\xef\xbf\xbf", "str U+FFFF"),
        T("\xa4\xf0\x9f\x98\x80", "str U+1F600"),
        T("\xa4\xf4\x8f\xbf\xbf", "str U+10FFFF"),
        T("\xa3\xed\x9f\xbf", "str U+D7FF"),
        T("\xa3\xee\x80\x80", "str U+E000"),
        T("\xc4\x00", "empty bin8"),
        T("\xc4\x02\xff\x00", "bin8 (not UTF-8, fine)"),
        T("\xc5\x00\x01\xc1", "bin16 holding 0xc1"),
        T("\xc6\x00\x00\x00\x01\xff", "bin32"),
        T("\x90", "empty fixarray"),
        T("\x93\x01\xc0\xa1x", "fixarray"),
        T("\xdc\x00\x01\x01", "array16"),
        T("\xdd\x00\x00\x00\x01\x01", "array32"),
        T("\x80", "empty fixmap"),
        T("\x81\xa1" "a\x01", "fixmap"),
        T("\x82\xa1" "a\x01\xa2" "ab\x02", "keys that share a prefix"),
        T("\x82\xa0\x01\xa1" "a\x02", "empty key next to another"),
        T("\x81\xa1\x00\x01", "key holding NUL"),
        T("\xde\x00\x01\xa1" "a\x01", "map16"),
        T("\xdf\x00\x00\x00\x01\xa1" "a\x01", "map32"),
        T("\x81\xd9\x01" "a\x01", "str8 key"),
        T("\x82\xa1" "a\x80\xa1" "b\x80", "same inner key in sibling maps"),
        T("\x81\xa1" "a\x81\xa1" "a\x81\xa1" "a\xc0", "same key at three levels"),
        T("\x81\xa6" "method\xaa" "files.read", "a request-like map"),
#undef T
    };

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); ++i)
        accepts((const uint8_t *)t[i].bytes, t[i].len, t[i].name);
}

static void test_refusals(void)
{
    static const char truncated[] = "truncated msgpack", arr[] = "msgpack array count exceeds the bytes left",
                      map[] = "msgpack map count exceeds the bytes left", key[] = "msgpack map key is not a string",
                      c1[] = "reserved msgpack byte 0xc1", ext[] = "msgpack ext types are not accepted",
                      fl[] = "non-finite msgpack float", utf8[] = "msgpack string is not valid UTF-8",
                      dup[] = "duplicate msgpack map key";

    /* declared sizes beyond the bytes left */
    refuses((const uint8_t *)"", 0, SB_E_BAD_ARGS, truncated, "empty input");
    refuses(B("\xa5" "ab"), SB_E_BAD_ARGS, truncated, "fixstr longer than the input");
    refuses(B("\xd9"), SB_E_BAD_ARGS, truncated, "str8 without its length");
    refuses(B("\xda\x00"), SB_E_BAD_ARGS, truncated, "str16 with half a length");
    refuses(B("\xdb\xff\xff\xff\xff"), SB_E_BAD_ARGS, truncated, "str32 declaring 4 GiB");
    refuses(B("\xc4\x05\x01"), SB_E_BAD_ARGS, truncated, "bin8 longer than the input");
    refuses(B("\xc6\xff\xff\xff\xff"), SB_E_BAD_ARGS, truncated, "bin32 declaring 4 GiB");
    refuses(B("\xcd\x01"), SB_E_BAD_ARGS, truncated, "uint16 cut short");
    refuses(B("\xcf\x00\x00\x00"), SB_E_BAD_ARGS, truncated, "uint64 cut short");
    refuses(B("\xd3"), SB_E_BAD_ARGS, truncated, "int64 without a body");
    refuses(B("\xca\x00\x00"), SB_E_BAD_ARGS, truncated, "float32 cut short");
    refuses(B("\xcb\x00\x00\x00\x00"), SB_E_BAD_ARGS, truncated, "float64 cut short");
    refuses(B("\x91"), SB_E_BAD_ARGS, arr, "fixarray of 1 with no bytes left");
    refuses(B("\x92\x01"), SB_E_BAD_ARGS, arr, "fixarray of 2 with 1 byte left");
    refuses(B("\xdc\x00\x03\x01\x01"), SB_E_BAD_ARGS, arr, "array16 of 3 with 2 bytes left");
    refuses(B("\xdd\xff\xff\xff\xff"), SB_E_BAD_ARGS, arr, "array32 of 4G elements");
    refuses(B("\xdd\x0f\xff\xff\xff\x00\x00\x00\x00"), SB_E_BAD_ARGS, arr, "array32 of 0x0fffffff elements");
    refuses(B("\x92\x91\x01"), SB_E_BAD_ARGS, truncated, "array whose last element is missing");
    refuses(B("\xdf\x29\xa6\x7a\x7e"), SB_E_BAD_ARGS, map, "the 5-byte df 29 a6 7a 7e (32 GiB in msgpack-c)");
    refuses(B("\x81"), SB_E_BAD_ARGS, map, "fixmap of 1 with no bytes left");
    refuses(B("\x81\xa1"), SB_E_BAD_ARGS, map, "fixmap of 1 with 1 byte left");
    refuses(B("\x82\xa1" "a\x01"), SB_E_BAD_ARGS, map, "fixmap of 2 with 3 bytes left");
    refuses(B("\xde\xff\xff"), SB_E_BAD_ARGS, map, "map16 of 65535 pairs");
    refuses(B("\x81\xa1" "a"), SB_E_BAD_ARGS, truncated, "map pair without its value");
    /* keys */
    refuses(B("\x81\x01\x01"), SB_E_BAD_ARGS, key, "int key");
    refuses(B("\x81\xc0\x01"), SB_E_BAD_ARGS, key, "nil key");
    refuses(B("\x81\xc4\x01" "a\x01"), SB_E_BAD_ARGS, key, "bin key");
    refuses(B("\x81\x90\x01"), SB_E_BAD_ARGS, key, "array key");
    refuses(B("\x81\x80\x01"), SB_E_BAD_ARGS, key, "map key");
    refuses(B("\x81\xc1\x01"), SB_E_BAD_ARGS, key, "0xc1 as a key (the key rule fires first)");
    refuses(B("\x81\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00\x01"), SB_E_BAD_ARGS, key, "NaN key");
    refuses(B("\x82\xa1" "a\x01\x02\x03"), SB_E_BAD_ARGS, key, "second key not a string");
    refuses(B("\x81\xa1" "a\x81\x01\x01"), SB_E_BAD_ARGS, key, "non-str key in a nested map");
    /* 0xc1 and ext */
    refuses(B("\xc1"), SB_E_BAD_ARGS, c1, "0xc1");
    refuses(B("\x91\xc1"), SB_E_BAD_ARGS, c1, "0xc1 inside an array");
    refuses(B("\x81\xa1" "a\xc1"), SB_E_BAD_ARGS, c1, "0xc1 as a map value");
    refuses(B("\xc7\x01\x01\x00"), SB_E_BAD_ARGS, ext, "ext8");
    refuses(B("\xc8\x00\x01\x01\x00"), SB_E_BAD_ARGS, ext, "ext16");
    refuses(B("\xc9\x00\x00\x00\x01\x01\x00"), SB_E_BAD_ARGS, ext, "ext32");
    refuses(B("\xd4\x01\x00"), SB_E_BAD_ARGS, ext, "fixext1");
    refuses(B("\xd5\x01\x00\x00"), SB_E_BAD_ARGS, ext, "fixext2");
    refuses(B("\xd6\x01\x00\x00\x00\x00"), SB_E_BAD_ARGS, ext, "fixext4");
    refuses(B("\xd7\xff\x00\x00\x00\x00\x00\x00\x00\x00"), SB_E_BAD_ARGS, ext, "fixext8 (timestamp)");
    refuses(B("\xd8\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"), SB_E_BAD_ARGS, ext, "fixext16");
    refuses(B("\xc7"), SB_E_BAD_ARGS, ext, "ext8 header alone");
    /* non-finite floats */
    refuses(B("\xca\x7f\x80\x00\x00"), SB_E_BAD_ARGS, fl, "float32 +inf");
    refuses(B("\xca\xff\x80\x00\x00"), SB_E_BAD_ARGS, fl, "float32 -inf");
    refuses(B("\xca\x7f\xc0\x00\x00"), SB_E_BAD_ARGS, fl, "float32 NaN");
    refuses(B("\xca\xff\xff\xff\xff"), SB_E_BAD_ARGS, fl, "float32 negative NaN with payload");
    refuses(B("\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00"), SB_E_BAD_ARGS, fl, "float64 +inf");
    refuses(B("\xcb\xff\xf0\x00\x00\x00\x00\x00\x00"), SB_E_BAD_ARGS, fl, "float64 -inf");
    refuses(B("\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00"), SB_E_BAD_ARGS, fl, "float64 NaN");
    refuses(B("\xcb\x7f\xf0\x00\x00\x00\x00\x00\x01"), SB_E_BAD_ARGS, fl, "float64 signalling NaN");
    refuses(B("\x91\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00"), SB_E_BAD_ARGS, fl, "inf inside an array");
    /* UTF-8 */
    refuses(B("\xa1\xff"), SB_E_BAD_ARGS, utf8, "str 0xff");
    refuses(B("\xa1\x80"), SB_E_BAD_ARGS, utf8, "str lone continuation byte");
    refuses(B("\xa2\xc0\x80"), SB_E_BAD_ARGS, utf8, "str overlong NUL c0 80");
    refuses(B("\xa2\xc1\xbf"), SB_E_BAD_ARGS, utf8, "str overlong c1 bf");
    refuses(B("\xa3\xe0\x80\x80"), SB_E_BAD_ARGS, utf8, "str overlong 3-byte");
    refuses(B("\xa3\xe0\x9f\xbf"), SB_E_BAD_ARGS, utf8, "str overlong U+07FF");
    refuses(B("\xa4\xf0\x8f\xbf\xbf"), SB_E_BAD_ARGS, utf8, "str overlong 4-byte");
    refuses(B("\xa3\xed\xa0\x80"), SB_E_BAD_ARGS, utf8, "str surrogate U+D800");
    refuses(B("\xa3\xed\xbf\xbf"), SB_E_BAD_ARGS, utf8, "str surrogate U+DFFF");
    refuses(B("\xa6\xed\xa0\xbd\xed\xb8\x80"), SB_E_BAD_ARGS, utf8, "str CESU-8 surrogate pair");
    refuses(B("\xa4\xf4\x90\x80\x80"), SB_E_BAD_ARGS, utf8, "str U+110000");
    refuses(B("\xa4\xf5\x80\x80\x80"), SB_E_BAD_ARGS, utf8, "str lead byte f5");
    refuses(B("\xa2\xc3\x28"), SB_E_BAD_ARGS, utf8, "str bad continuation");
    refuses(B("\xa1\xc3"), SB_E_BAD_ARGS, utf8, "str truncated 2-byte sequence");
    refuses(B("\xa2\xe2\x82"), SB_E_BAD_ARGS, utf8, "str truncated 3-byte sequence");
    refuses(B("\xa3\xf0\x9f\x98"), SB_E_BAD_ARGS, utf8, "str truncated 4-byte sequence");
    refuses(B("\xd9\x01\xfe"), SB_E_BAD_ARGS, utf8, "str8 0xfe");
    refuses(B("\x81\xa1\xff\x01"), SB_E_BAD_ARGS, utf8, "key with invalid UTF-8");
    /* duplicate keys */
    refuses(B("\x82\xa1" "a\x01\xa1" "a\x02"), SB_E_BAD_ARGS, dup, "duplicate key");
    refuses(B("\x82\xa1" "a\x01\xd9\x01" "a\x02"), SB_E_BAD_ARGS, dup, "duplicate key spelled fixstr and str8");
    refuses(B("\x82\xa0\x01\xa0\x02"), SB_E_BAD_ARGS, dup, "duplicate empty key");
    refuses(B("\x83\xa1" "b\x01\xa1" "a\x02\xa1" "b\x03"), SB_E_BAD_ARGS, dup, "duplicate key, not adjacent");
    refuses(B("\x81\xa1" "x\x82\xa1" "a\x01\xa1" "a\x02"), SB_E_BAD_ARGS, dup, "duplicate key in a nested map");
}

/* more than 16 keys: the key list moves to the heap */
static void test_big_maps(void)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    char k[8];
    size_t obj_len;
    const char *why = NULL;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 40);
    for (int i = 0; i < 40; ++i) {
        int n = snprintf(k, sizeof(k), "k%d", i);
        msgpack_pack_str_with_body(&pk, k, (size_t)n);
        msgpack_pack_int(&pk, i);
    }
    accepts((const uint8_t *)sb.data, sb.size, "map of 40 distinct keys");
    msgpack_sbuffer_clear(&sb);

    msgpack_pack_map(&pk, 40);
    for (int i = 0; i < 40; ++i) {
        int n = snprintf(k, sizeof(k), "k%d", i == 39 ? 3 : i);
        msgpack_pack_str_with_body(&pk, k, (size_t)n);
        msgpack_pack_int(&pk, i);
    }
    is_int(sb_mp_check((const uint8_t *)sb.data, sb.size, &obj_len, &why), SB_E_BAD_ARGS, "map of 40 keys, last repeats k3");
    is_str(why, "duplicate msgpack map key", "map of 40 keys: why");
    msgpack_sbuffer_destroy(&sb);
}

/* d nested containers; innermost empty, or holding one scalar */
static size_t nest(uint8_t *buf, unsigned d, int map, int scalar)
{
    size_t n = 0;

    for (unsigned i = 0; i + 1 < d; ++i) {
        if (map) {
            buf[n++] = 0x81;
            buf[n++] = 0xa1;
            buf[n++] = 'k';
        } else {
            buf[n++] = 0x91;
        }
    }
    if (!scalar) {
        buf[n++] = map ? 0x80 : 0x90;
    } else if (map) {
        buf[n++] = 0x81, buf[n++] = 0xa1, buf[n++] = 'k', buf[n++] = 0x01;
    } else {
        buf[n++] = 0x91, buf[n++] = 0x01;
    }
    return n;
}

static void test_depth(void)
{
    uint8_t buf[256];
    int contract = 1, ours = 1, theirs = 1;

    for (int map = 0; map <= 1; ++map) {
        for (int scalar = 0; scalar <= 1; ++scalar) {
            for (unsigned d = 1; d <= 40; ++d) {
                size_t n = nest(buf, d, map, scalar), obj_len = 0, off;
                const char *why = NULL;
                sb_status_t st = sb_mp_check(buf, n, &obj_len, &why);
                int rc = mp_unpack(buf, n, &off);
                if ((st == SB_OK) != (d <= 31))
                    ours = 0;
                if (st != SB_OK && (st != SB_E_TOO_LARGE || strcmp(why, "value nesting is too deep") != 0))
                    ours = 0;
                if (st == SB_OK && (rc != MSGPACK_UNPACK_SUCCESS || off != n || obj_len != n))
                    contract = 0;
                /* msgpack-c 4.0: at most 32 non-empty containers on its stack; deeper is NOMEM_ERROR */
                if ((rc == MSGPACK_UNPACK_SUCCESS) != (d <= 32))
                    theirs = 0;
            }
        }
    }
    ok(ours, "sb_mp_check: nesting 1..31 accepted, 32..40 refused as too deep (arrays and maps, empty or not)");
    ok(contract, "every nesting sb_mp_check accepts, msgpack_unpack unpacks");
    ok(theirs, "msgpack-c itself accepts nesting up to 32 and refuses 33 (our cap of 31 is inside it)");

    {
        size_t n = nest(buf, 31, 0, 1), obj_len;
        const char *why = NULL;
        is_int(sb_mp_check(buf, n, &obj_len, &why), SB_OK, "31 nested arrays accepted");
        n = nest(buf, 32, 0, 0);
        is_int(sb_mp_check(buf, n, &obj_len, &why), SB_E_TOO_LARGE, "32 nested arrays refused");
        is_str(why, "value nesting is too deep", "32 nested arrays: why");
        n = nest(buf, 32, 1, 0);
        is_int(sb_mp_check(buf, n, &obj_len, &why), SB_E_TOO_LARGE, "32 nested maps refused");
        /* the depth check comes before the count check: a deep, lying header is too deep, not truncated */
        memset(buf, 0x91, 31);
        buf[31] = 0xdd, buf[32] = buf[33] = buf[34] = buf[35] = 0xff;
        is_int(sb_mp_check(buf, 36, &obj_len, &why), SB_E_TOO_LARGE, "32nd container with a 4G count: too deep");
    }
}

static void pack_nils(msgpack_sbuffer *sb, size_t n)
{
    msgpack_packer pk;

    msgpack_sbuffer_clear(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, n);
    for (size_t i = 0; i < n; ++i)
        msgpack_pack_nil(&pk);
}

static void pack_pairs(msgpack_sbuffer *sb, size_t n)
{
    msgpack_packer pk;
    char k[16];

    msgpack_sbuffer_clear(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, n);
    for (size_t i = 0; i < n; ++i) {
        int len = snprintf(k, sizeof(k), "%zu", i);
        msgpack_pack_str_with_body(&pk, k, (size_t)len);
        msgpack_pack_nil(&pk);
    }
}

static void test_nodes(void)
{
    msgpack_sbuffer sb;
    size_t obj_len = 0;
    const char *why = NULL;

    msgpack_sbuffer_init(&sb);
    /* an array and its elements are nodes: 1 + 99999 = SB_MAX_NODES */
    pack_nils(&sb, SB_MAX_NODES - 1);
    accepts((const uint8_t *)sb.data, sb.size, "array of 99999 nils (100000 nodes)");
    pack_nils(&sb, SB_MAX_NODES);
    is_int(sb_mp_check((const uint8_t *)sb.data, sb.size, &obj_len, &why), SB_E_TOO_LARGE, "array of 100000 nils (100001 nodes)");
    is_str(why, "value has too many nodes", "array of 100000 nils: why");
    /* map keys are not nodes (values are, as in JSON): 1 + pairs */
    pack_pairs(&sb, SB_MAX_NODES - 1);
    accepts((const uint8_t *)sb.data, sb.size, "map of 99999 pairs (100000 nodes)");
    pack_pairs(&sb, SB_MAX_NODES);
    is_int(sb_mp_check((const uint8_t *)sb.data, sb.size, &obj_len, &why), SB_E_TOO_LARGE, "map of 100000 pairs (100001 nodes)");
    is_str(why, "value has too many nodes", "map of 100000 pairs: why");
    msgpack_sbuffer_destroy(&sb);
}

static void test_decode(void)
{
    msgpack_zone z;
    msgpack_object o;
    const char *why = NULL;
    size_t obj_len = 0;
    static const uint8_t req[] = "\x82\xa6" "method\xaa" "files.read\xa4" "args\x81\xa4" "path\xa5" "a.txt";

    msgpack_zone_init(&z, 1024);
    is_int(sb_mp_decode(req, sizeof(req) - 1, &z, &o, &why), SB_OK, "sb_mp_decode: request map");
    ok(o.type == MSGPACK_OBJECT_MAP && o.via.map.size == 2, "sb_mp_decode: a map of 2");
    ok(sb_mp_str_is(sb_mp_get(&o, "method"), "files.read"), "sb_mp_get(method)");
    ok(sb_mp_str_is(sb_mp_get(sb_mp_get(&o, "args"), "path"), "a.txt"), "sb_mp_get(args).path");
    ok(sb_mp_get(&o, "__proto__") == NULL, "sb_mp_get: no inherited keys");
    ok(sb_mp_get(&o, "metho") == NULL && sb_mp_get(&o, "methods") == NULL, "sb_mp_get: exact key length");
    ok(sb_mp_get(sb_mp_get(&o, "method"), "x") == NULL, "sb_mp_get on a non-map is NULL");
    ok(sb_mp_get(NULL, "x") == NULL, "sb_mp_get(NULL) is NULL");
    ok(!sb_mp_str_is(sb_mp_get(&o, "method"), "files.rea"), "sb_mp_str_is: exact length");
    ok(!sb_mp_str_is(NULL, ""), "sb_mp_str_is(NULL)");

    is_int(sb_mp_check(B("\x01\x02"), &obj_len, &why), SB_OK, "sb_mp_check stops after one object");
    is_int(obj_len, 1, "sb_mp_check: obj_len excludes trailing bytes");
    is_int(sb_mp_decode(B("\x01\x02"), &z, &o, &why), SB_E_BAD_ARGS, "sb_mp_decode: trailing bytes refused");
    is_str(why, "trailing bytes after the msgpack value", "sb_mp_decode: trailing bytes why");
    is_int(sb_mp_decode(B("\xdf\x29\xa6\x7a\x7e"), &z, &o, &why), SB_E_BAD_ARGS, "sb_mp_decode: df 29 a6 7a 7e refused before msgpack-c");
    is_str(why, "msgpack map count exceeds the bytes left", "sb_mp_decode: df 29 a6 7a 7e why");
    is_int(sb_mp_decode(B("\x91\xc1"), &z, &o, NULL), SB_E_BAD_ARGS, "sb_mp_decode: why may be NULL");
    is_int(sb_mp_check(B("\x91\xc1"), &obj_len, NULL), SB_E_BAD_ARGS, "sb_mp_check: why may be NULL");
    msgpack_zone_destroy(&z);
}

static void test_utf8(void)
{
    ok(sb_utf8_valid((const uint8_t *)"", 0), "utf8: empty");
    ok(sb_utf8_valid(B("plain ascii\x7f")), "utf8: ASCII incl. DEL");
    ok(sb_utf8_valid(B("\x00")), "utf8: NUL is valid");
    ok(sb_utf8_valid(B("\xc2\x80\xdf\xbf\xe0\xa0\x80\xf0\x90\x80\x80\xf4\x8f\xbf\xbf")), "utf8: boundary code points");
    ok(!sb_utf8_valid(B("\xc2")), "utf8: truncated at the end");
    ok(!sb_utf8_valid(B("a\xf0\x9f\x98")), "utf8: truncated 4-byte at the end");
    ok(!sb_utf8_valid(B("\xf8\x88\x80\x80\x80")), "utf8: 5-byte form");
}

/* the validator as it was before it learned to skip ASCII eight bytes at a time: the reference */
static int ref_utf8_valid(const uint8_t *p, size_t len)
{
    size_t i = 0;

    while (i < len) {
        uint8_t b = p[i];
        uint32_t cp;
        size_t n;
        if (b < 0x80) {
            ++i;
            continue;
        } else if (b >= 0xc2 && b <= 0xdf) {
            n = 1, cp = b & 0x1f;
        } else if (b >= 0xe0 && b <= 0xef) {
            n = 2, cp = b & 0x0f;
        } else if (b >= 0xf0 && b <= 0xf4) {
            n = 3, cp = b & 0x07;
        } else {
            return 0;
        }
        if (len - i - 1 < n)
            return 0;
        for (size_t k = 1; k <= n; ++k) {
            if ((p[i + k] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (p[i + k] & 0x3f);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += n + 1;
    }
    return 1;
}

/* every input of up to 3 bytes, and 4-byte forms, alone and after 7 ASCII bytes (so the 8-byte skip straddles them) */
static void test_utf8_exhaustive(void)
{
    static const uint8_t last[] = {0x00, 0x7f, 0x80, 0x8f, 0x90, 0xbf, 0xc0, 0xff};
    uint8_t b[7 + 4];
    size_t differ = 0, checked = 0;

    memset(b, 'a', 7);
    for (size_t len = 1; len <= 3; ++len) {
        uint32_t total = 1u << (8 * len);
        for (uint32_t v = 0; v < total; ++v) {
            for (size_t i = 0; i < len; ++i)
                b[7 + i] = (uint8_t)(v >> (8 * i));
            differ += sb_utf8_valid(b + 7, len) != ref_utf8_valid(b + 7, len);
            differ += sb_utf8_valid(b, 7 + len) != ref_utf8_valid(b, 7 + len);
            checked += 2;
        }
    }
    for (uint32_t lead = 0xe0; lead <= 0xf7; ++lead) {
        for (uint32_t v = 0; v < 65536; ++v) {
            for (size_t k = 0; k < sizeof(last); ++k) {
                b[7] = (uint8_t)lead, b[8] = (uint8_t)v, b[9] = (uint8_t)(v >> 8), b[10] = last[k];
                differ += sb_utf8_valid(b + 7, 4) != ref_utf8_valid(b + 7, 4);
                differ += sb_utf8_valid(b, 11) != ref_utf8_valid(b, 11);
                checked += 2;
            }
        }
    }
    ok(differ == 0, "utf8: agrees with the byte-at-a-time reference on %zu inputs (%zu differ)", checked, differ);
}

/* the key list of a map of more than 16 pairs cannot be allocated: NOMEM, with its reason */
static void test_nomem(void)
{
    uint8_t m[3 + 17 * 3];
    size_t n = 0, obj_len = 0;
    const char *why = NULL;

    /* map16 of 17 pairs: "a".."q" -> 1 */
    m[n++] = 0xde, m[n++] = 0, m[n++] = 17;
    for (int i = 0; i < 17; ++i)
        m[n++] = 0xa1, m[n++] = (uint8_t)('a' + i), m[n++] = 1;
    is_int(sb_mp_check(m, n, &obj_len, &why), SB_OK, "map of 17 pairs passes");
    sb_mem_fail_nth(1);
    is_int(sb_mp_check(m, n, &obj_len, &why), SB_E_NOMEM, "map of 17 pairs, key list allocation fails: NOMEM");
    is_str(why, "out of memory", "NOMEM: why");
}

/*
 * Exhaustive over every input of up to 3 bytes: whenever sb_mp_check accepts,
 * msgpack_unpack succeeds and consumes exactly obj_len bytes (and whenever
 * msgpack-c says PARSE_ERROR, we refused too).
 */
static void test_exhaustive_small(void)
{
    uint8_t b[3];
    size_t accepted = 0, bad = 0;

    for (size_t len = 1; len <= 3; ++len) {
        uint32_t total = 1u << (8 * len);
        for (uint32_t v = 0; v < total; ++v) {
            size_t obj_len = 0, off;
            const char *why;
            for (size_t i = 0; i < len; ++i)
                b[i] = (uint8_t)(v >> (8 * i));
            if (sb_mp_check(b, len, &obj_len, &why) != SB_OK)
                continue;
            ++accepted;
            if (obj_len == 0 || obj_len > len || mp_unpack(b, obj_len, &off) != MSGPACK_UNPACK_SUCCESS || off != obj_len)
                ++bad;
        }
    }
    ok(accepted > 1000, "exhaustive: %zu inputs of 1..3 bytes accepted", accepted);
    is_int(bad, 0, "exhaustive: msgpack_unpack agrees with every accepted input of 1..3 bytes");
}

/* address space limits and ASan do not mix: the allocation test below is skipped under ASan */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

/*
 * Regression (found by this test, fixed in e1cf254; proto/mpcheck.c, walk_map):
 * a map count was bounded only by the bytes left (n <= left / 2), not by
 * SB_MAX_NODES, and the key list (16 bytes per pair) was allocated before the
 * first pair was walked: a 7.1 MB frame holding map32 with 3,560,000 pairs of
 * "": nil made the pre-check malloc 56,960,000 bytes (8x the input) before it
 * refused the value for having too many nodes (STYLE.md rule 7, "bound first,
 * then allocate").
 *
 * The test runs the pre-check in a child with 24 MB of address space to spare:
 * with the bound in place it answers SB_E_TOO_LARGE; without it the malloc
 * fails and it answers SB_E_NOMEM. (Skipped under ASan.)
 */
static void test_map_count_bounded_before_alloc(void)
{
    size_t pairs = 3560000, len = 5 + pairs * 2;
    uint8_t *b;
    pid_t pid;
    int status = 0;

    if (UNDER_ASAN) {
        ok(1, "# SKIP map key list allocation test (address space limits do not work under ASan)");
        return;
    }
    if ((b = malloc(len)) == NULL)
        abort();
    b[0] = 0xdf, b[1] = (uint8_t)(pairs >> 24), b[2] = (uint8_t)(pairs >> 16), b[3] = (uint8_t)(pairs >> 8), b[4] = (uint8_t)pairs;
    for (size_t i = 0; i < pairs; ++i)
        b[5 + 2 * i] = 0xa0, b[6 + 2 * i] = 0xc0;
    fflush(stdout);
    if ((pid = fork()) == 0) {
        FILE *f = fopen("/proc/self/statm", "r");
        unsigned long pages = 0;
        struct rlimit rl;
        size_t obj_len;
        const char *why = NULL;
        sb_status_t st;
        if (f == NULL || fscanf(f, "%lu", &pages) != 1)
            _exit(4);
        fclose(f);
        rl.rlim_cur = rl.rlim_max = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + 24u * 1024 * 1024;
        if (setrlimit(RLIMIT_AS, &rl) != 0)
            _exit(4);
        st = sb_mp_check(b, len, &obj_len, &why);
        /* too many nodes (or, for an implementation that looks at keys first, duplicate keys): anything but NOMEM */
        _exit(st == SB_E_TOO_LARGE || st == SB_E_BAD_ARGS ? 0 : st == SB_E_NOMEM ? 2 : 3);
    }
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        status = -1;
    free(b);
    is_int(WIFEXITED(status) ? WEXITSTATUS(status) : 99, 0,
           "map32 of 3.56M pairs in a 7.1 MB frame: too many nodes, refused without a 57 MB key list (2: it answered NOMEM)");
}

int main(void)
{
    test_accepts();
    test_refusals();
    test_big_maps();
    test_depth();
    test_nodes();
    test_decode();
    test_utf8();
    test_utf8_exhaustive();
    test_nomem();
    test_exhaustive_small();
    test_map_count_bounded_before_alloc();
    return done_testing();
}
