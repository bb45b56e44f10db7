/*
 * JSON benchmark: the RPC route's JSON work, old route against new, in one
 * run, reported as ratios new / old (lower is faster). Not a pass/fail test.
 *
 * For three representative calls it measures:
 *  - decode: the request body to the msgpack_object tree the broker reads.
 *    old: the jansson route (tests/json_ref.h: pre-scan, jansson tree, pack)
 *    + sb_mp_decode_packed, as broker/http/rpc.c did before; new:
 *    sb_json_parse, as rpc.c does now.
 *  - encode: the handler's packed reply to the {"ok":true,"value":...} text.
 *    old: sb_mp_decode_packed + sb_json_from_mp + json_pack + json_dumps +
 *    the cap check, as rpc.c's reply_value did; new: sb_mp_decode_packed +
 *    sb_json_write into an sb_buf_t capped at the response cap.
 * The calls: a collections.find (a where tree; 50 rows back), an http.fetch
 * with a 64 KiB body (base64 in the request, bin in the reply), a tools.call
 * (nested arguments; an MCP result with a 2 KiB text). Before timing, it
 * checks that both routes give the same tree and byte-identical text, and
 * exits 1 otherwise: numbers for routes that disagree mean nothing.
 *
 * Rounds alternate old and new; each timing is the median over rounds.
 * Build and run: tests/bench/json.sh (BENCH_ROUNDS, BENCH_MS per measurement).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jansson.h>
#include <msgpack.h>
#include "sb/buf.h"
#include "sb/limits.h"
#include "sb/mem.h"
#include "sb/value.h"
#include "json_cases.h"
#include "json_ref.h"

typedef struct st_case_t {
    const char *name;
    char *request;
    size_t request_len;
    msgpack_sbuffer reply; /* the handler's packed value */
    size_t response_cap;
} case_t;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *msg)
{
    fprintf(stderr, "bench_json: %s\n", msg);
    exit(1);
}

static char *text_of(sb_buf_t *b)
{
    char *t;
    size_t n;
    if (sb_buf_take(b, &t, &n) != SB_OK)
        die("out of memory");
    return t;
}

/* ---- the cases ---------------------------------------------------------------------------------------------------- */

static void make_find(case_t *c)
{
    sb_buf_t b;
    msgpack_packer pk;

    sb_buf_init(&b, SB_MAX_NATIVE_REQUEST);
    if (sb_buf_append_str(
            &b, "{\"method\":\"collections.posts.find\",\"args\":{\"where\":{\"status\":\"published\","
                "\"views\":{\"gt\":100},\"tags\":{\"in\":[\"news\",\"tech\",\"caf\\u00e9\"]},\"author\":{\"eq\":"
                "\"a-3f9c\"}},\"orderBy\":{\"createdAt\":\"desc\"},\"limit\":50,\"offset\":0,"
                "\"select\":[\"id\",\"title\",\"views\",\"score\",\"published\",\"createdAt\",\"meta\",\"body\"]}}") != SB_OK)
        die("request");
    c->name = "collections.find";
    c->request = text_of(&b);
    c->request_len = strlen(c->request);
    c->response_cap = SB_MAX_NATIVE_RESPONSE;
    msgpack_sbuffer_init(&c->reply);
    msgpack_packer_init(&pk, &c->reply, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 50);
    for (int r = 0; r < 50; ++r) {
        char id[40], title[80];
        int n = snprintf(id, sizeof(id), "post-%08d", r * 7919);
        int t = snprintf(title, sizeof(title), "Post number %d: \"quoted\" and caf\xc3\xa9", r);
        msgpack_pack_map(&pk, 8);
        msgpack_pack_str_with_body(&pk, "id", 2);
        msgpack_pack_str_with_body(&pk, id, (size_t)n);
        msgpack_pack_str_with_body(&pk, "title", 5);
        msgpack_pack_str_with_body(&pk, title, (size_t)t);
        msgpack_pack_str_with_body(&pk, "views", 5);
        msgpack_pack_int64(&pk, 100 + r * 37);
        msgpack_pack_str_with_body(&pk, "score", 5);
        msgpack_pack_double(&pk, r / 7.0);
        msgpack_pack_str_with_body(&pk, "published", 9);
        msgpack_pack_true(&pk);
        msgpack_pack_str_with_body(&pk, "createdAt", 9);
        msgpack_pack_str_with_body(&pk, "2026-11-30T07:47:00.123Z", 24);
        msgpack_pack_str_with_body(&pk, "meta", 4);
        msgpack_pack_map(&pk, 2);
        msgpack_pack_str_with_body(&pk, "n", 1);
        msgpack_pack_int64(&pk, r);
        msgpack_pack_str_with_body(&pk, "tags", 4);
        msgpack_pack_array(&pk, 2);
        msgpack_pack_str_with_body(&pk, "a", 1);
        msgpack_pack_str_with_body(&pk, "b", 1);
        msgpack_pack_str_with_body(&pk, "body", 4);
        msgpack_pack_nil(&pk);
    }
}

static void make_fetch(case_t *c)
{
    static uint8_t body[65536];
    char *b64 = malloc(sb_b64_encoded_len(sizeof(body)) + 1);
    sb_buf_t b;
    msgpack_packer pk;

    if (b64 == NULL)
        die("out of memory");
    for (size_t i = 0; i < sizeof(body); ++i)
        body[i] = (uint8_t)(i * 2654435761u >> 13);
    sb_b64_encode(body, sizeof(body), b64);
    sb_buf_init(&b, SB_MAX_RPC_WIRE);
    if (sb_buf_printf(&b,
                      "{\"method\":\"http.fetch\",\"args\":{\"url\":\"https://api.example.com/v1/upload?id=42\",\"method\":"
                      "\"POST\",\"headers\":{\"content-type\":\"application/octet-stream\",\"x-request-id\":\"5b1f0c3e\"},"
                      "\"bodyBase64\":\"%s\"}}",
                      b64) != SB_OK)
        die("request");
    free(b64);
    c->name = "http.fetch 64 KiB";
    c->request = text_of(&b);
    c->request_len = strlen(c->request);
    c->response_cap = SB_MAX_RPC_WIRE;
    msgpack_sbuffer_init(&c->reply);
    msgpack_packer_init(&pk, &c->reply, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5);
    msgpack_pack_str_with_body(&pk, "status", 6);
    msgpack_pack_int(&pk, 200);
    msgpack_pack_str_with_body(&pk, "statusText", 10);
    msgpack_pack_str_with_body(&pk, "OK", 2);
    msgpack_pack_str_with_body(&pk, "headers", 7);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "content-type", 12);
    msgpack_pack_str_with_body(&pk, "application/octet-stream", 24);
    msgpack_pack_str_with_body(&pk, "content-length", 14);
    msgpack_pack_str_with_body(&pk, "65536", 5);
    msgpack_pack_str_with_body(&pk, "date", 4);
    msgpack_pack_str_with_body(&pk, "Mon, 30 Nov 2026 07:47:00 GMT", 29);
    msgpack_pack_str_with_body(&pk, "bodyBase64", 10);
    msgpack_pack_bin_with_body(&pk, body, sizeof(body));
    msgpack_pack_str_with_body(&pk, "truncated", 9);
    msgpack_pack_false(&pk);
}

static void make_tools(case_t *c)
{
    char text[2048];
    sb_buf_t b;
    msgpack_packer pk;

    for (size_t i = 0; i < sizeof(text); ++i)
        text[i] = i % 64 == 63 ? '\n' : i % 97 == 0 ? '"' : (char)('a' + i % 26);
    sb_buf_init(&b, SB_MAX_TOOLS_CALL_REQUEST);
    if (sb_buf_append_str(&b, "{\"method\":\"tools.call\",\"args\":{\"name\":\"search_documents\",\"arguments\":{\"query\":"
                              "\"quarterly report \\\"draft\\\" 2026\",\"limit\":10,\"threshold\":0.75,\"filters\":{"
                              "\"folders\":[\"finance\",\"board\"],\"after\":\"2026-01-01\",\"owners\":[\"alice\",\"bob\","
                              "\"carol\"],\"archived\":false},\"highlight\":true}}}") != SB_OK)
        die("request");
    c->name = "tools.call";
    c->request = text_of(&b);
    c->request_len = strlen(c->request);
    c->response_cap = SB_MAX_NATIVE_RESPONSE;
    msgpack_sbuffer_init(&c->reply);
    msgpack_packer_init(&pk, &c->reply, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "content", 7);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "type", 4);
    msgpack_pack_str_with_body(&pk, "text", 4);
    msgpack_pack_str_with_body(&pk, "text", 4);
    msgpack_pack_str_with_body(&pk, text, sizeof(text));
    msgpack_pack_str_with_body(&pk, "structuredContent", 17);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "hits", 4);
    msgpack_pack_array(&pk, 10);
    for (int i = 0; i < 10; ++i) {
        msgpack_pack_map(&pk, 2);
        msgpack_pack_str_with_body(&pk, "id", 2);
        msgpack_pack_int(&pk, i);
        msgpack_pack_str_with_body(&pk, "score", 5);
        msgpack_pack_double(&pk, 1.0 - i * 0.05);
    }
    msgpack_pack_str_with_body(&pk, "total", 5);
    msgpack_pack_int(&pk, 123);
    msgpack_pack_str_with_body(&pk, "isError", 7);
    msgpack_pack_false(&pk);
}

/* ---- the two routes ----------------------------------------------------------------------------------------------- */

static volatile size_t sink;

static void decode_old(const case_t *c, int check, msgpack_object *out, msgpack_zone *z, msgpack_sbuffer *sb)
{
    const char *why;
    msgpack_object o;
    msgpack_sbuffer_clear(sb);
    if (sb_ref_json_decode(c->request, c->request_len, sb, &why) != SB_OK ||
        sb_mp_decode_packed((const uint8_t *)sb->data, sb->size, z, &o) != SB_OK)
        die("old decode failed");
    if (check)
        *out = o;
    sink += o.via.map.size;
}

static void decode_new(const case_t *c, int check, msgpack_object *out, msgpack_zone *z)
{
    const char *why;
    msgpack_object o;
    if (sb_json_parse(c->request, c->request_len, z, &o, &why) != SB_OK)
        die("new decode failed");
    if (check)
        *out = o;
    sink += o.via.map.size;
}

/* returns the text (caller frees) when keep is set */
static char *encode_old(const case_t *c, int keep)
{
    msgpack_zone z;
    msgpack_object v;
    json_t *j, *o;
    char *text;
    size_t n;

    msgpack_zone_init(&z, 4096);
    if (sb_mp_decode_packed((const uint8_t *)c->reply.data, c->reply.size, &z, &v) != SB_OK || sb_json_from_mp(&v, &j) != SB_OK)
        die("old encode failed");
    o = json_pack("{s:b, s:o}", "ok", 1, "value", j);
    text = json_dumps(o, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(o);
    msgpack_zone_destroy(&z);
    if (text == NULL || (n = strlen(text)) > c->response_cap)
        die("old encode: no text or over the cap");
    sink += n;
    if (keep)
        return text;
    free(text);
    return NULL;
}

static char *encode_new(const case_t *c, int keep)
{
    msgpack_zone z;
    msgpack_object v;
    sb_buf_t b;
    const char *why;
    char *text = NULL;

    msgpack_zone_init(&z, 4096);
    sb_buf_init(&b, c->response_cap);
    if (sb_mp_decode_packed((const uint8_t *)c->reply.data, c->reply.size, &z, &v) != SB_OK ||
        sb_buf_append(&b, "{\"ok\":true,\"value\":", 19) != SB_OK || sb_json_write(&b, &v, &why) != SB_OK ||
        sb_buf_append_char(&b, '}') != SB_OK)
        die("new encode failed");
    msgpack_zone_destroy(&z);
    sink += b.len;
    if (keep)
        text = text_of(&b);
    sb_buf_free(&b);
    return text;
}

/* ns per operation of `which` (0 decode old, 1 decode new, 2 encode old, 3 encode new) over about `ms` milliseconds */
static double measure(const case_t *c, int which, unsigned ms)
{
    msgpack_zone z;
    msgpack_sbuffer sb;
    uint64_t start = now_ns(), end = start + (uint64_t)ms * 1000000u, t;
    size_t n = 0;

    msgpack_zone_init(&z, 4096);
    msgpack_sbuffer_init(&sb);
    do {
        for (int i = 0; i < 16; ++i) {
            switch (which) {
            case 0:
                decode_old(c, 0, NULL, &z, &sb);
                break;
            case 1:
                decode_new(c, 0, NULL, &z);
                break;
            case 2:
                (void)encode_old(c, 0);
                break;
            default:
                (void)encode_new(c, 0);
                break;
            }
            /* a fresh zone per request, as each RPC call has */
            if (which < 2) {
                msgpack_zone_destroy(&z);
                msgpack_zone_init(&z, 4096);
            }
        }
        n += 16;
    } while ((t = now_ns()) < end);
    msgpack_zone_destroy(&z);
    msgpack_sbuffer_destroy(&sb);
    return (double)(t - start) / (double)n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void)
{
    case_t cases[3];
    unsigned rounds = 5, ms = 300;
    const char *e;

    if ((e = getenv("BENCH_ROUNDS")) != NULL && strtoul(e, NULL, 10) > 0)
        rounds = (unsigned)strtoul(e, NULL, 10);
    if ((e = getenv("BENCH_MS")) != NULL && strtoul(e, NULL, 10) > 0)
        ms = (unsigned)strtoul(e, NULL, 10);
    make_find(&cases[0]);
    make_fetch(&cases[1]);
    make_tools(&cases[2]);

    /* both routes must agree before their times mean anything */
    for (size_t i = 0; i < 3; ++i) {
        msgpack_zone z1, z2;
        msgpack_sbuffer sb;
        msgpack_object a, b;
        char *to, *tn;
        msgpack_zone_init(&z1, 4096);
        msgpack_zone_init(&z2, 4096);
        msgpack_sbuffer_init(&sb);
        decode_old(&cases[i], 1, &a, &z1, &sb);
        decode_new(&cases[i], 1, &b, &z2);
        if (!mp_same(&a, &b))
            die("the routes decode to different trees");
        to = encode_old(&cases[i], 1);
        tn = encode_new(&cases[i], 1);
        if (strcmp(to, tn) != 0)
            die("the routes write different text");
        printf("# %-18s request %7zu bytes, reply %7zu bytes of JSON: both routes agree\n", cases[i].name, cases[i].request_len,
               strlen(tn));
        free(to);
        sb_mem_free(tn);
        msgpack_sbuffer_destroy(&sb);
        msgpack_zone_destroy(&z1);
        msgpack_zone_destroy(&z2);
    }

    printf("# %u rounds, %u ms per measurement, medians; ratio = new / old (lower is faster)\n", rounds, ms);
    printf("%-18s %-7s %12s %12s %8s\n", "case", "step", "old ns/op", "new ns/op", "ratio");
    for (size_t i = 0; i < 3; ++i) {
        for (int step = 0; step < 2; ++step) {
            double *old_t = calloc(rounds, sizeof(double)), *new_t = calloc(rounds, sizeof(double)), om, nm;
            if (old_t == NULL || new_t == NULL)
                die("out of memory");
            (void)measure(&cases[i], 2 * step, ms / 4 + 1); /* warm-up */
            (void)measure(&cases[i], 2 * step + 1, ms / 4 + 1);
            for (unsigned r = 0; r < rounds; ++r) {
                /* alternate which route goes first */
                if (r % 2 == 0) {
                    old_t[r] = measure(&cases[i], 2 * step, ms);
                    new_t[r] = measure(&cases[i], 2 * step + 1, ms);
                } else {
                    new_t[r] = measure(&cases[i], 2 * step + 1, ms);
                    old_t[r] = measure(&cases[i], 2 * step, ms);
                }
            }
            qsort(old_t, rounds, sizeof(double), cmp_double);
            qsort(new_t, rounds, sizeof(double), cmp_double);
            om = old_t[rounds / 2];
            nm = new_t[rounds / 2];
            printf("%-18s %-7s %12.0f %12.0f %7.3fx\n", cases[i].name, step == 0 ? "decode" : "encode", om, nm, nm / om);
            free(old_t);
            free(new_t);
        }
    }
    for (size_t i = 0; i < 3; ++i) {
        sb_mem_free(cases[i].request);
        msgpack_sbuffer_destroy(&cases[i].reply);
    }
    return sink == 0;
}
