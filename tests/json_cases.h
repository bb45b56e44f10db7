/*
 * JSON documents shared by the JSON unit tests (tests/unit/json_parse.c,
 * tests/unit/json_write.c): the inputs of tests/unit/json.c, which the old
 * jansson route was tested with, plus the edges of the one-pass decoder.
 * Each document is a byte string with its length (they may hold NUL).
 */
#ifndef SB_TESTS_JSON_CASES_H
#define SB_TESTS_JSON_CASES_H

#include <math.h>
#include <stddef.h>
#include <string.h>
#include <msgpack.h>

typedef struct st_json_case_t {
    const char *text;
    size_t len;
} json_case_t;

#define JC(s)                                                                                                                      \
    {                                                                                                                              \
        s, sizeof(s) - 1                                                                                                           \
    }

/* valid JSON that both routes accept */
static const json_case_t json_valid[] = {
    JC("null"),
    JC("true"),
    JC("false"),
    JC("0"),
    JC("-0"),
    JC("-1"),
    JC("127"),
    JC("128"),
    JC("-33"),
    JC("65536"),
    JC("9223372036854775807"),
    JC("-9223372036854775808"),
    JC("1.5"),
    JC("-0.25"),
    JC("-0.0"),
    JC("0e0"),
    JC("1E5"),
    JC("1e+2"),
    JC("1e-2"),
    JC("1e300"),
    JC("1e-400"),
    JC("-1e-400"),
    JC("-1.7976931348623157e308"),
    JC("2.2250738585072014e-308"),
    JC("5e-324"),
    JC("0.1"),
    JC("123456789012345678901234567890.5"),
    JC("0.000000000000000000000000000001"),
    JC("9007199254740993.0"),
    JC("1.00000000000000000000000000000000000000000000000000000000000000000000000000001"),
    JC("\"\""),
    JC("\"plain\""),
    JC("\"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80\""),
    JC("\"\\ud83d\\ude00\""),
    JC("\"\\uD83D\\uDE00\""),
    JC("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\""),
    JC("\"\\u0001\\u001f\\u007f\\u0080\\uffff\""),
    JC("\"\\u00e9 and \\u20ac\""),
    JC("\"a\\u0000b\""),
    JC("{\"k\":\"\\u0000\"}"),
    JC("[\"\\u0000\\u0000\"]"),
    JC("\"\x7f\""),
    JC("\"\xf4\x8f\xbf\xbf\""),
    JC("[]"),
    JC("{}"),
    JC("[[]]"),
    JC("[{}]"),
    JC("[1,[2,[3,[]]],{}]"),
    JC("{\"a\":{\"b\":[true,null,false]},\"c\":\"d\"}"),
    JC("{\"__proto__\":1,\"constructor\":{},\"toString\":[]}"),
    JC("{\"method\":\"files.read\",\"args\":{\"path\":\"a.txt\"}}"),
    JC("{\"\":\"\"}"),
    JC("{\"\xc3\xa9\":1,\"e\":2,\"E\":3}"),
    JC("{\"a\":1,\"\\u0062\":2}"),
    JC("[\"[[[[{{{{\",\"]]]]\",\"\\\"[\"]"),
    JC("  {\"ws\" :\t[ 1 ,\n2 ]\r}  "),
    JC("[0.1,0.2,0.30000000000000004,1e-7,123456789012345678]"),
    JC("[1.0,2.0,-0.0]"),
    JC("{\"a\":1,\"b\":2,\"c\":3,\"d\":4,\"e\":5,\"f\":6,\"g\":7,\"h\":8,\"i\":9,\"j\":10,\"k\":11,\"l\":12,\"m\":13,\"n\":14,"
       "\"o\":15,\"p\":16,\"q\":17,\"r\":18}"),
    JC("\"a long string with more than eight bytes and an escape at the end\\n\""),
    JC("\"12345678\\\"12345678\""),
};

/* text both routes refuse (the reason is the new decoder's) */
typedef struct st_json_bad_t {
    const char *text;
    size_t len;
    const char *why;
} json_bad_t;

#define JB(s, why)                                                                                                                 \
    {                                                                                                                              \
        s, sizeof(s) - 1, why                                                                                                      \
    }

static const json_bad_t json_invalid[] = {
    JB("", "invalid JSON"),
    JB("   ", "invalid JSON"),
    JB("{", "invalid JSON"),
    JB("[", "invalid JSON"),
    JB("[1", "invalid JSON"),
    JB("[1,", "invalid JSON"),
    JB("{\"a\"", "invalid JSON"),
    JB("{\"a\":", "invalid JSON"),
    JB("{\"a\":1", "invalid JSON"),
    JB("[1,]", "invalid JSON"),
    JB("[,1]", "invalid JSON"),
    JB("{\"a\":1,}", "invalid JSON"),
    JB("{,}", "invalid JSON"),
    JB("{\"a\" 1}", "invalid JSON"),
    JB("{1:2}", "invalid JSON"),
    JB("{'a':1}", "invalid JSON"),
    JB("[1 2]", "invalid JSON"),
    JB("[1true]", "invalid JSON"),
    JB("{} {}", "trailing bytes after the JSON value"),
    JB("1 2", "trailing bytes after the JSON value"),
    JB("[1]x", "trailing bytes after the JSON value"),
    JB("nul", "invalid JSON"),
    JB("nulll", "trailing bytes after the JSON value"),
    JB("True", "invalid JSON"),
    JB("NaN", "invalid JSON"),
    JB("Infinity", "invalid JSON"),
    JB("-Infinity", "invalid JSON number"),
    JB("+1", "invalid JSON"),
    JB(".5", "invalid JSON"),
    JB("01", "invalid JSON number"),
    JB("-01", "invalid JSON number"),
    JB("1.", "invalid JSON number"),
    JB("1.e5", "invalid JSON number"),
    JB("1e", "invalid JSON number"),
    JB("1e+", "invalid JSON number"),
    JB("-", "invalid JSON number"),
    JB("0x10", "trailing bytes after the JSON value"),
    JB("1e400", "JSON number out of range"),
    JB("-1e400", "JSON number out of range"),
    JB("9223372036854775808", "JSON integer out of range"),
    JB("-9223372036854775809", "JSON integer out of range"),
    JB("18446744073709551616", "JSON integer out of range"),
    JB("123456789012345678901234567890", "JSON integer out of range"),
    JB("\"abc", "unterminated JSON string"),
    JB("\"abc\\\"", "unterminated JSON string"),
    JB("\"\\", "unterminated JSON string"),
    JB("\"a\nb\"", "control character in a JSON string"),
    JB("\"\x00\"", "control character in a JSON string"),
    JB("\"\\u0041\x1f\"", "control character in a JSON string"),
    JB("\"\\x41\"", "invalid JSON string escape"),
    JB("\"\\U0041\"", "invalid JSON string escape"),
    JB("\"\\u00g1\"", "invalid JSON string escape"),
    JB("\"\\u004\"", "invalid JSON string escape"),
    JB("\"\xff\"", "invalid UTF-8 in a JSON string"),
    JB("\"\x80\"", "invalid UTF-8 in a JSON string"),
    JB("\"\xc0\xaf\"", "invalid UTF-8 in a JSON string"),
    JB("\"\xe0\x80\xaf\"", "invalid UTF-8 in a JSON string"),
    JB("\"\xed\xa0\x80\"", "invalid UTF-8 in a JSON string"),
    JB("\"\xf4\x90\x80\x80\"", "invalid UTF-8 in a JSON string"),
    JB("\"\xc3\"", "invalid UTF-8 in a JSON string"),
    JB("\"\\n\xc3\"", "invalid UTF-8 in a JSON string"),
    JB("{\"\xff\":1}", "invalid UTF-8 in a JSON string"),
    JB("\xef\xbb\xbf{}", "invalid JSON"),
    JB("\"\\ud800\"", "unpaired UTF-16 surrogate escape in a JSON string"),
    JB("\"\\udc00\"", "unpaired UTF-16 surrogate escape in a JSON string"),
    JB("\"\\ud800x\"", "unpaired UTF-16 surrogate escape in a JSON string"),
    JB("\"\\ud800\\u0041\"", "unpaired UTF-16 surrogate escape in a JSON string"),
    JB("\"\\ud800\\ud800\"", "unpaired UTF-16 surrogate escape in a JSON string"),
    JB("\"\\ude00\\ud83d\"", "unpaired UTF-16 surrogate escape in a JSON string"),
    JB("{\"\\udfff\":1}", "unpaired UTF-16 surrogate escape in a JSON string"),
    JB("{\"a\":1,\"a\":2}", "duplicate JSON object key"),
    JB("{\"a\":1,\"b\":2,\"a\":1}", "duplicate JSON object key"),
    JB("{\"x\":{\"a\":1,\"a\":2}}", "duplicate JSON object key"),
    JB("{\"a\":1,\"\\u0061\":2}", "duplicate JSON object key"),
    JB("{\"\":1,\"\":2}", "duplicate JSON object key"),
    JB("{\"a\":1,\"b\":2,\"c\":3,\"d\":4,\"e\":5,\"f\":6,\"g\":7,\"h\":8,\"i\":9,\"j\":10,\"k\":11,\"l\":12,\"m\":13,\"n\":14,"
       "\"o\":15,\"p\":16,\"q\":17,\"h\":18}",
       "duplicate JSON object key"),
    JB("{\"a\\u0000b\":1}", "NUL in a JSON object key"),
    JB("{\"\\u0000\":1}", "NUL in a JSON object key"),
    JB("\f1", "invalid JSON"),
    JB("1\v", "trailing bytes after the JSON value"),
    JB("\xc2\xa0"
       "1",
       "invalid JSON"),
};

/*
 * 1 when two trees are the same: same types (float32 and float64 apart), the
 * same bits for floats (so -0.0 differs from 0.0), the same bytes, the same
 * order of map pairs.
 */
static inline int mp_same(const msgpack_object *a, const msgpack_object *b)
{
    if (a->type != b->type)
        return 0;
    switch (a->type) {
    case MSGPACK_OBJECT_NIL:
        return 1;
    case MSGPACK_OBJECT_BOOLEAN:
        return a->via.boolean == b->via.boolean;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return a->via.u64 == b->via.u64;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return a->via.i64 == b->via.i64;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return memcmp(&a->via.f64, &b->via.f64, sizeof(double)) == 0;
    case MSGPACK_OBJECT_STR:
    case MSGPACK_OBJECT_BIN:
        return a->via.str.size == b->via.str.size &&
               (a->via.str.size == 0 || memcmp(a->via.str.ptr, b->via.str.ptr, a->via.str.size) == 0);
    case MSGPACK_OBJECT_ARRAY:
        if (a->via.array.size != b->via.array.size)
            return 0;
        for (uint32_t i = 0; i < a->via.array.size; ++i)
            if (!mp_same(&a->via.array.ptr[i], &b->via.array.ptr[i]))
                return 0;
        return 1;
    case MSGPACK_OBJECT_MAP:
        if (a->via.map.size != b->via.map.size)
            return 0;
        for (uint32_t i = 0; i < a->via.map.size; ++i)
            if (!mp_same(&a->via.map.ptr[i].key, &b->via.map.ptr[i].key) ||
                !mp_same(&a->via.map.ptr[i].val, &b->via.map.ptr[i].val))
                return 0;
        return 1;
    default:
        return 0;
    }
}

#endif
